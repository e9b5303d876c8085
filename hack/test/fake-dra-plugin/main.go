// Command fake-dra-plugin is a test fixture, not product code: the smallest DRA kubelet plugin that
// registers itself in a node's plugins_registry and answers NodePrepareResources /
// NodeUnprepareResources. It reads each claim's allocation from the API server, returns one CDI ID
// per allocated device of its driver, and appends every call to an event log so that a test can see
// what the kubelet asked and when.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerpb "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type plugin struct {
	drapb.UnimplementedDRAPluginServer
	registerpb.UnimplementedRegistrationServer

	driver   string
	endpoint string
	client   kubernetes.Interface

	logMu sync.Mutex
	log   *os.File
}

// event appends one line "<RFC3339Nano> <what> <details>" to the event log.
func (p *plugin) event(what, details string) {
	p.logMu.Lock()
	defer p.logMu.Unlock()
	fmt.Fprintf(p.log, "%s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), what, details)
}

func (p *plugin) GetInfo(context.Context, *registerpb.InfoRequest) (*registerpb.PluginInfo, error) {
	p.event("get-info", p.driver)
	return &registerpb.PluginInfo{
		Type:              registerpb.DRAPlugin,
		Name:              p.driver,
		Endpoint:          p.endpoint,
		SupportedVersions: []string{drapb.DRAPluginService},
	}, nil
}

func (p *plugin) NotifyRegistrationStatus(_ context.Context, s *registerpb.RegistrationStatus) (*registerpb.RegistrationStatusResponse, error) {
	p.event("registration", fmt.Sprintf("registered=%t error=%q", s.PluginRegistered, s.Error))
	return &registerpb.RegistrationStatusResponse{}, nil
}

func (p *plugin) NodePrepareResources(ctx context.Context, req *drapb.NodePrepareResourcesRequest) (*drapb.NodePrepareResourcesResponse, error) {
	resp := &drapb.NodePrepareResourcesResponse{Claims: map[string]*drapb.NodePrepareResourceResponse{}}
	for _, c := range req.Claims {
		p.event("prepare", fmt.Sprintf("%s/%s uid=%s", c.Namespace, c.Name, c.Uid))
		result := &drapb.NodePrepareResourceResponse{}
		resp.Claims[c.Uid] = result
		claim, err := p.client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
		switch {
		case err != nil:
			result.Error = err.Error()
			continue
		case string(claim.UID) != c.Uid:
			result.Error = "claim was replaced"
			continue
		case claim.Status.Allocation == nil:
			result.Error = "claim is not allocated"
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != p.driver {
				continue
			}
			result.Devices = append(result.Devices, &drapb.Device{
				RequestNames: []string{r.Request},
				PoolName:     r.Pool,
				DeviceName:   r.Device,
				CdiDeviceIds: []string{fmt.Sprintf("%s/fake=%s-%s", p.driver, c.Uid, r.Device)},
			})
		}
	}
	return resp, nil
}

func (p *plugin) NodeUnprepareResources(_ context.Context, req *drapb.NodeUnprepareResourcesRequest) (*drapb.NodeUnprepareResourcesResponse, error) {
	resp := &drapb.NodeUnprepareResourcesResponse{Claims: map[string]*drapb.NodeUnprepareResourceResponse{}}
	for _, c := range req.Claims {
		p.event("unprepare", fmt.Sprintf("%s/%s uid=%s", c.Namespace, c.Name, c.Uid))
		resp.Claims[c.Uid] = &drapb.NodeUnprepareResourceResponse{}
	}
	return resp, nil
}

func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	_ = os.Remove(path)
	return net.Listen("unix", path)
}

func main() {
	var (
		kubeconfig  = flag.String("kubeconfig", "", "kubeconfig of the cluster")
		driver      = flag.String("driver", "gpu.fake.example.com", "DRA driver name")
		registryDir = flag.String("registry-dir", "", "the node's plugins_registry directory")
		pluginsDir  = flag.String("plugins-dir", "", "the node's plugins directory; the DRA socket goes to <plugins-dir>/<driver>/dra.sock")
		eventLog    = flag.String("event-log", "", "file the calls are appended to")
	)
	flag.Parse()
	if *kubeconfig == "" || *registryDir == "" || *pluginsDir == "" || *eventLog == "" {
		fmt.Fprintln(os.Stderr, "fake-dra-plugin: --kubeconfig, --registry-dir, --plugins-dir and --event-log are required")
		os.Exit(2)
	}
	if err := run(*kubeconfig, *driver, *registryDir, *pluginsDir, *eventLog); err != nil {
		fmt.Fprintln(os.Stderr, "fake-dra-plugin:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, driver, registryDir, pluginsDir, eventLog string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	logFile, err := os.OpenFile(eventLog, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
	if err != nil {
		return err
	}
	defer logFile.Close()
	p := &plugin{driver: driver, endpoint: filepath.Join(pluginsDir, driver, "dra.sock"), client: client, log: logFile}

	// The DRA service must be up before the registration socket appears: the kubelet may connect
	// to the endpoint as soon as it has read GetInfo.
	draListener, err := listen(p.endpoint)
	if err != nil {
		return err
	}
	draServer := grpc.NewServer()
	drapb.RegisterDRAPluginServer(draServer, p)
	go func() { _ = draServer.Serve(draListener) }()

	regPath := filepath.Join(registryDir, driver+"-reg.sock")
	regListener, err := listen(regPath)
	if err != nil {
		return err
	}
	regServer := grpc.NewServer()
	registerpb.RegisterRegistrationServer(regServer, p)
	go func() { _ = regServer.Serve(regListener) }()
	p.event("listening", regPath)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
	regServer.Stop()
	draServer.Stop()
	_ = os.Remove(regPath)
	_ = os.Remove(p.endpoint)
	p.event("stopped", driver)
	return nil
}
