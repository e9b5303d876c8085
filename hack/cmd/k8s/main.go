// Command k8s is one binary for the whole local control plane. It picks the component from the name it
// was started under (a symlink named etcd, kube-apiserver, ...) or from its first argument, so that the
// heavy shared packages are compiled and linked once.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	_ "time/tzdata" // CronJob time zones, as the upstream apiserver binary does

	etcdmain "go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kubeproxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

// components maps a component name to a function that runs it with the process arguments after the
// component name and returns the exit code.
var components = map[string]func() int{
	"etcd": func() int {
		// etcdmain reads os.Args itself and expects the program name first.
		etcdmain.Main(os.Args)
		return 0
	},
	"kube-apiserver":          func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int { return cli.Run(controllermanager.NewControllerManagerCommand()) },
	"kube-scheduler":          func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	// The real nodes' kubelet and kube-proxy share the control plane's compiled packages and link.
	"kubelet":    func() int { return cli.Run(kubelet.NewKubeletCommand(context.Background())) },
	"kube-proxy": func() int { return cli.Run(kubeproxy.NewProxyCommand()) },
	"kubectl":    runKubectl,
}

func runKubectl() int {
	// kubectl sets its log verbosity before parsing flags so that construction-time logging obeys -v.
	_, _ = logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args))
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := components[name]; !ok && len(os.Args) > 1 {
		// Called as `k8s <component> args...`: drop our own name so the component sees a normal argv.
		name = os.Args[1]
		os.Args = append([]string{name}, os.Args[2:]...)
	}
	run, ok := components[name]
	if !ok {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: k8s <component> [args...] (or a symlink named after it); components: %v\n", names)
		os.Exit(2)
	}
	os.Exit(run())
}
