// Command mini-kubelet is the DRA half of a kubelet for one fake (KWOK) node. It runs the upstream
// kubelet plugin manager on the node's plugins_registry directory and the upstream DRA manager
// (k8s.io/kubernetes/pkg/kubelet/cm/dra), so plugins are registered, versions negotiated, claims
// checkpointed and NodePrepareResources/NodeUnprepareResources called exactly as a real kubelet
// would. What it adds is the pod loop a kubelet normally owns: for every pod bound to the node it
// prepares the pod's claims and then sets an annotation that the KWOK pod-ready stage waits for, and
// it unprepares them once the pod is being deleted or gone.
//
// With --metrics-addr it serves the DRA manager's gRPC latency histogram
// (dra_grpc_operations_duration_seconds, timed by the kubelet's own client interceptor around each
// NodePrepareResources/NodeUnprepareResources) with buckets 2% apart instead of the kubelet's 15,
// so that benchmarks read percentiles of the RPCs as the kubelet sees them (make bench-prepare).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	kubeletmetrics "k8s.io/kubernetes/pkg/kubelet/metrics"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

// Annotation keys the mini-kubelet writes on pods of its node. The KWOK pod-ready stage of the local
// cluster only moves a pod to Running once annotationPrepared is "true".
const (
	annotationDomain   = "minikubelet.gpu-operator-rs.dev/"
	annotationPrepared = annotationDomain + "prepared"
	// annotationCDI holds a JSON object: container name -> the CDI device IDs the DRA plugins
	// returned for the claims that container uses.
	annotationCDI = annotationDomain + "cdi-devices"
	// annotationError holds the last prepare error while the pod is held back.
	annotationError = annotationDomain + "error"
)

// alwaysReady tells the DRA manager's reconcile loop that the pod list it gets is complete.
type alwaysReady struct{}

func (alwaysReady) AddSource(string) {}
func (alwaysReady) AllReady() bool   { return true }

type miniKubelet struct {
	node      string
	client    kubernetes.Interface
	dra       *dra.Manager
	podLister func() []*v1.Pod
	podByKey  func(key string) (*v1.Pod, bool, error)
	queue     workqueue.TypedRateLimitingInterface[string]

	mu sync.Mutex
	// prepared remembers the last copy of every pod whose claims were handed to the DRA manager, so
	// that the claims can still be unprepared after the pod object has disappeared.
	prepared map[string]*v1.Pod
}

func main() {
	var (
		kubeconfig   = flag.String("kubeconfig", "", "kubeconfig of the cluster")
		nodeName     = flag.String("node-name", "", "name of the fake node this kubelet stands in for")
		rootDir      = flag.String("root-dir", "", "kubelet root directory of the node; plugins_registry, plugins and dra state live below it")
		featureGates = flag.String("feature-gates", "", "feature gates, as for the kubelet (comma-separated Name=bool)")
		workers      = flag.Int("workers", 2, "pods handled in parallel")
		metricsAddr  = flag.String("metrics-addr", "", "serve the DRA gRPC latency histogram on this address (host:port, port 0 for any); the address taken is written to <root-dir>/metrics-addr")
	)
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" || *nodeName == "" || *rootDir == "" {
		fmt.Fprintln(os.Stderr, "mini-kubelet: --kubeconfig, --node-name and --root-dir are required")
		os.Exit(2)
	}
	if *featureGates != "" {
		if err := utilfeature.DefaultMutableFeatureGate.Set(*featureGates); err != nil {
			klog.ErrorS(err, "feature gates")
			os.Exit(2)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background().WithValues("node", *nodeName))
	if *metricsAddr != "" {
		if err := serveMetrics(*metricsAddr, *rootDir); err != nil {
			klog.ErrorS(err, "metrics")
			os.Exit(1)
		}
	}
	if err := run(ctx, *kubeconfig, *nodeName, *rootDir, *workers); err != nil {
		klog.ErrorS(err, "mini-kubelet failed")
		os.Exit(1)
	}
}

// serveMetrics swaps the kubelet's DRA gRPC histogram (which its client interceptor looks up on every
// call) for one with fine buckets, 50µs to 5s, and serves it.
func serveMetrics(addr, rootDir string) error {
	kubeletmetrics.DRAGRPCOperationsDuration = metrics.NewHistogramVec(
		&metrics.HistogramOpts{
			Subsystem:      kubeletmetrics.DRASubsystem,
			Name:           kubeletmetrics.DRAGRPCOperationsDurationKey,
			Help:           "Duration in seconds of the DRA gRPC operations (buckets 2% apart)",
			Buckets:        metrics.ExponentialBucketsRange(50e-6, 5, 582),
			StabilityLevel: metrics.ALPHA,
		},
		[]string{"driver_name", "method_name", "grpc_status_code"},
	)
	legacyregistry.MustRegister(kubeletmetrics.DRAGRPCOperationsDuration)
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(rootDir, 0o750); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(rootDir, "metrics-addr"), []byte(listener.Addr().String()+"\n"), 0o640); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", legacyregistry.Handler())
	go func() { _ = http.Serve(listener, mux) }()
	return nil
}

func run(ctx context.Context, kubeconfig, nodeName, rootDir string, workers int) error {
	logger := klog.FromContext(ctx)
	registryDir := filepath.Join(rootDir, "plugins_registry")
	for _, dir := range []string{registryDir, filepath.Join(rootDir, "plugins"), filepath.Join(rootDir, "dra")} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.UserAgent = "mini-kubelet/" + nodeName
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}

	factory := informers.NewSharedInformerFactoryWithOptions(client, 10*time.Minute,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
		}))
	podInformer := factory.Core().V1().Pods()
	lister := podInformer.Lister()

	draManager, err := dra.NewManager(logger, client, filepath.Join(rootDir, "dra"))
	if err != nil {
		return fmt.Errorf("DRA manager: %w", err)
	}
	k := &miniKubelet{
		node:     nodeName,
		client:   client,
		dra:      draManager,
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 10*time.Second)),
		prepared: map[string]*v1.Pod{},
	}
	k.podLister = func() []*v1.Pod {
		pods, _ := lister.List(labels.Everything())
		active := pods[:0]
		for _, p := range pods {
			if !podFinished(p) {
				active = append(active, p)
			}
		}
		return active
	}
	k.podByKey = func(key string) (*v1.Pod, bool, error) {
		ns, name, err := cache.SplitMetaNamespaceKey(key)
		if err != nil {
			return nil, false, err
		}
		p, err := lister.Pods(ns).Get(name)
		if apierrors.IsNotFound(err) {
			return nil, false, nil
		}
		return p, err == nil, err
	}
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	}
	if err := draManager.Start(ctx, k.podLister, getNode, alwaysReady{}); err != nil {
		return fmt.Errorf("start DRA manager: %w", err)
	}

	// The upstream plugin manager watches the registry directory and hands sockets of type
	// DRAPlugin to the DRA manager's registration handler, as the kubelet does.
	plugins := pluginmanager.NewPluginManager(registryDir, &record.FakeRecorder{})
	plugins.AddHandler(pluginwatcherapi.DRAPlugin, draManager.GetWatcherHandler())
	go plugins.Run(ctx, alwaysReady{}, ctx.Done())

	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := podInformer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.Informer().HasSynced) {
		return fmt.Errorf("pod informer did not sync")
	}
	// Pods that were prepared by an earlier run of this kubelet are found again through the DRA
	// manager's checkpoint; remember them so their claims get unprepared when they go.
	for _, p := range k.podLister() {
		if p.Annotations[annotationPrepared] == "true" {
			k.remember(p)
		}
	}
	if err := os.WriteFile(filepath.Join(rootDir, "ready"), []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o640); err != nil {
		return err
	}
	logger.Info("mini-kubelet running", "pluginsRegistry", registryDir)

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for k.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	k.queue.ShutDown()
	wg.Wait()
	return nil
}

func (k *miniKubelet) processNext(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil {
		klog.FromContext(ctx).Info("pod not handled yet, retrying", "pod", key, "err", err)
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

func podFinished(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

func hasClaims(p *v1.Pod) bool {
	return len(p.Spec.ResourceClaims) > 0 || p.Status.ExtendedResourceClaimStatus != nil
}

func (k *miniKubelet) remember(p *v1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.prepared[podKey(p)] = p.DeepCopy()
}

func podKey(p *v1.Pod) string { return p.Namespace + "/" + p.Name }

func (k *miniKubelet) sync(ctx context.Context, key string) error {
	logger := klog.FromContext(ctx).WithValues("pod", key)
	pod, exists, err := k.podByKey(key)
	if err != nil {
		return err
	}
	k.mu.Lock()
	last := k.prepared[key]
	k.mu.Unlock()

	// A pod that is gone, being deleted, finished, or replaced by a new pod of the same name no
	// longer needs its claims: unprepare them (the DRA manager skips claims another pod still uses).
	if last != nil && (!exists || pod.UID != last.UID || pod.DeletionTimestamp != nil || podFinished(pod)) {
		if err := k.dra.UnprepareResources(ctx, last); err != nil {
			return err
		}
		logger.Info("unprepared pod resources", "uid", last.UID)
		k.mu.Lock()
		if k.prepared[key] == last {
			delete(k.prepared, key)
		}
		k.mu.Unlock()
		if exists && pod.UID != last.UID {
			k.queue.Add(key) // handle the new pod of that name from scratch
		}
		return nil
	}
	if !exists || pod.DeletionTimestamp != nil || podFinished(pod) || pod.Annotations[annotationPrepared] == "true" {
		return nil
	}

	annotations := map[string]any{annotationPrepared: "true", annotationError: nil}
	if hasClaims(pod) {
		if err := k.dra.PrepareResources(ctx, pod); err != nil {
			k.patch(ctx, pod, map[string]any{annotationError: err.Error()})
			return err
		}
		k.remember(pod)
		cdi, err := k.cdiDevices(pod)
		if err != nil {
			return err
		}
		annotations[annotationCDI] = cdi
		logger.Info("prepared pod resources", "uid", pod.UID, "cdiDevices", cdi)
	}
	return k.patch(ctx, pod, annotations)
}

// cdiDevices returns the JSON for annotationCDI: each container's CDI device IDs, as the kubelet
// would pass them to the container runtime.
func (k *miniKubelet) cdiDevices(pod *v1.Pod) (string, error) {
	perContainer := map[string][]string{}
	containers := append(append([]v1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range containers {
		info, err := k.dra.GetResources(pod, &containers[i])
		if err != nil {
			return "", err
		}
		ids := make([]string, 0, len(info.CDIDevices))
		for _, d := range info.CDIDevices {
			ids = append(ids, d.Name)
		}
		if len(ids) > 0 {
			sort.Strings(ids)
			perContainer[containers[i].Name] = ids
		}
	}
	out, err := json.Marshal(perContainer)
	return string(out), err
}

// patch merges annotations into the pod; a nil value removes that annotation.
func (k *miniKubelet) patch(ctx context.Context, pod *v1.Pod, annotations map[string]any) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         pod.UID, // fail rather than annotate a different pod of the same name
		"annotations": annotations,
	}})
	if err != nil {
		return err
	}
	_, err = k.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, body, metav1.PatchOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // the pod was replaced or is gone; its successor gets its own sync
	}
	return err
}
