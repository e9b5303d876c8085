# Local Kubernetes cluster (no containers): tools built from Go modules into $(CACHE_DIR), the
# hack/cluster script, and the cluster smoke test that `make test` runs. Included by the root Makefile.
# See hack/README.md.

HACK_K8S_VERSION := v1.37.2
# The oldest supported minor: make test runs a subset of the real-node test on it (hack/k8s-1.34, a
# module of its own), and the default run gives one real node this kubelet under the newer apiserver.
HACK_K8S_OLDEST := v1.34.12
HACK_KWOK_VERSION := v0.8.0
HACK_HELM_VERSION := v4.3.2
# Prometheus 3.16 (its Go module's v0.316.0): Debian's package is built without Kubernetes service
# discovery, which the chart's PodMonitors need.
HACK_PROMETHEUS_VERSION := v0.316.0
# The real nodes' container runtime (a module of its own: hack/containerd/go.mod).
HACK_CONTAINERD_VERSION := v2.4.2

HACK_BIN := $(CACHE_DIR)/bin
HACK_STAMPS := $(CACHE_DIR)/stamps
# Go caches live next to the binaries, so a fresh clone on a warm machine builds nothing.
# GOFLAGS=-p=2: this is a 2-core machine and the Kubernetes packages are heavy.
HACK_GOENV := GOMODCACHE=$(CACHE_DIR)/go/mod GOCACHE=$(CACHE_DIR)/go/build GOFLAGS='-p=2 -buildvcs=false' GOWORK=off
HACK_GO := cd hack && env $(HACK_GOENV) go

# Version strings stamped into the Kubernetes components (a plain build reports v0.0.0-master).
hack_k8s_ldflags = -s -w $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
	-X $(p).gitVersion=$(1) -X $(p).gitMajor=1 -X $(p).gitMinor=$(word 2,$(subst ., ,$(1))) \
	-X $(p).gitTreeState=clean -X $(p).buildDate=1970-01-01T00:00:00Z)

# Stamps are keyed by content, not file times: a fresh clone has new mtimes but needs no rebuild.
hack_key = $(shell cat $(1) 2>/dev/null | sha256sum | cut -c1-16)
HACK_MOD := hack/go.mod hack/go.sum
HACK_K8S_STAMP := $(HACK_STAMPS)/k8s-$(HACK_K8S_VERSION)-$(call hack_key,$(HACK_MOD) hack/cmd/k8s/main.go)
HACK_K8S_OLDEST_STAMP := $(HACK_STAMPS)/k8s-$(HACK_K8S_OLDEST)-$(call hack_key,hack/k8s-1.34/go.mod hack/k8s-1.34/go.sum hack/cmd/k8s/main.go)
HACK_MINIKUBELET_STAMP := $(HACK_STAMPS)/mini-kubelet-$(call hack_key,$(HACK_MOD) $(wildcard hack/cmd/mini-kubelet/*.go))
HACK_CDIVALIDATE_STAMP := $(HACK_STAMPS)/cdi-validate-$(call hack_key,$(HACK_MOD) $(wildcard hack/cmd/cdi-validate/*.go))
HACK_FIXTURE_STAMP := $(HACK_STAMPS)/fake-dra-plugin-$(call hack_key,$(HACK_MOD) $(wildcard hack/test/fake-dra-plugin/*.go))
HACK_KWOK_STAMP := $(HACK_STAMPS)/kwok-$(HACK_KWOK_VERSION)
HACK_HELM_STAMP := $(HACK_STAMPS)/helm-$(HACK_HELM_VERSION)
HACK_PROMETHEUS_STAMP := $(HACK_STAMPS)/prometheus-$(HACK_PROMETHEUS_VERSION)
HACK_CONTAINERD_MOD := hack/containerd/go.mod hack/containerd/go.sum
HACK_CONTAINERD_STAMP := $(HACK_STAMPS)/containerd-$(HACK_CONTAINERD_VERSION)-$(call hack_key,$(HACK_CONTAINERD_MOD))
HACK_IMAGES := $(CACHE_DIR)/images
HACK_IMAGES_STAMP := $(HACK_STAMPS)/images-$(call hack_key,$(HACK_MOD) hack/cmd/pause/main.go hack/cmd/oci-image/main.go hack/cmd/standin/main.go hack/cluster.mk)
# A test image for the real nodes: Debian's static busybox.
HACK_BUSYBOX_IMAGE := gpu-operator-rs.dev/test/busybox:1
HACK_BUSYBOX_TOOLS := sh ls cat env echo sleep test grep true false wget nc ip mount stat find head tail wc
HACK_K8S_LINKS := etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy

.PHONY: images test-images hack-tools hack-k8s-oldest cluster-up cluster-down cluster-status test-cluster test-kubelet-plugin-cluster test-cluster-suites test-real-nodes test-real-nodes-oldest

hack-tools: $(HACK_K8S_STAMP) $(HACK_MINIKUBELET_STAMP) $(HACK_CDIVALIDATE_STAMP) $(HACK_FIXTURE_STAMP) $(HACK_KWOK_STAMP) $(HACK_HELM_STAMP) $(HACK_PROMETHEUS_STAMP) $(HACK_CONTAINERD_STAMP) $(HACK_IMAGES_STAMP) ## Build the local-cluster tools into $(CACHE_DIR)/bin (only what changed)
	@for l in $(HACK_K8S_LINKS); do [ -L $(HACK_BIN)/$$l ] || ln -sfn k8s $(HACK_BIN)/$$l; done

$(HACK_K8S_STAMP):
	@mkdir -p $(HACK_BIN) $(HACK_STAMPS)
	@echo "hack: building the Kubernetes $(HACK_K8S_VERSION) multi-call binary (cold: ~30 min on 2 cores)"
	$(HACK_GO) build -trimpath -ldflags '$(call hack_k8s_ldflags,$(HACK_K8S_VERSION))' -o $(HACK_BIN)/k8s ./cmd/k8s
	@for l in $(HACK_K8S_LINKS); do ln -sfn k8s $(HACK_BIN)/$$l; done
	@rm -f $(HACK_STAMPS)/k8s-$(HACK_K8S_VERSION)-* && touch $@

# The same multi-call binary at the oldest supported minor, as $(HACK_BIN)/k8s-<version>: hack/cluster
# runs it for K8S_VERSION or KUBELET_VERSIONS naming that version.
hack-k8s-oldest: $(HACK_K8S_OLDEST_STAMP) ## Build Kubernetes $(HACK_K8S_OLDEST) for K8S_VERSION=$(HACK_K8S_OLDEST) hack/cluster up (make test builds it too)

$(HACK_K8S_OLDEST_STAMP):
	@mkdir -p $(HACK_BIN) $(HACK_STAMPS)
	@echo "hack: building the Kubernetes $(HACK_K8S_OLDEST) multi-call binary (cold: ~11 min on 2 cores)"
	cd hack/k8s-1.34 && env $(HACK_GOENV) go build -trimpath -ldflags '$(call hack_k8s_ldflags,$(HACK_K8S_OLDEST))' -o $(HACK_BIN)/k8s-$(HACK_K8S_OLDEST) .
	@rm -f $(HACK_STAMPS)/k8s-$(HACK_K8S_OLDEST)-* && touch $@

# containerd, ctr and the runc shim for the real nodes. Static (no cgo; btrfs, which needs cgo, left out).
$(HACK_CONTAINERD_STAMP):
	@mkdir -p $(HACK_BIN) $(HACK_STAMPS)
	@echo "hack: building containerd $(HACK_CONTAINERD_VERSION) (cold: ~8 min on 2 cores)"
	cd hack/containerd && env $(HACK_GOENV) CGO_ENABLED=0 go build -trimpath -tags no_btrfs \
		-ldflags '-s -w -X github.com/containerd/containerd/v2/version.Version=$(HACK_CONTAINERD_VERSION)' -o $(HACK_BIN)/ \
		github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr \
		github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
	@rm -f $(HACK_STAMPS)/containerd-* && touch $@

# The real nodes' sandbox image (a static pause of ours), the OCI image writer behind it and make images,
# and the stand-in for NVIDIA's images.
$(HACK_IMAGES_STAMP): | bootstrap
	@mkdir -p $(HACK_BIN) $(HACK_STAMPS) $(HACK_IMAGES)
	$(HACK_GO) build -trimpath -ldflags '-s -w' -o $(HACK_BIN)/oci-image ./cmd/oci-image
	cd hack && env $(HACK_GOENV) CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o $(HACK_BIN)/pause ./cmd/pause
	cd hack && env $(HACK_GOENV) CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o $(HACK_BIN)/standin ./cmd/standin
	$(HACK_BIN)/oci-image -o $(HACK_IMAGES)/pause.tar -name registry.k8s.io/pause:3.10.1 -entrypoint /pause -add $(HACK_BIN)/pause:/pause:0755
	@[ -x /bin/busybox ] || { echo "hack: /bin/busybox is missing: run hack/ci-bootstrap.sh (apt-get install busybox-static)" >&2; exit 1; }
	$(HACK_BIN)/oci-image -o $(HACK_IMAGES)/busybox.tar -name $(HACK_BUSYBOX_IMAGE) -entrypoint /bin/sh -add /bin/busybox:/bin/busybox:0755 \
		$(foreach t,$(HACK_BUSYBOX_TOOLS),-link bin/$(t):busybox) -dir tmp:1777
	@rm -f $(HACK_STAMPS)/images-* && touch $@

$(HACK_MINIKUBELET_STAMP):
	@mkdir -p $(HACK_BIN) $(HACK_STAMPS)
	$(HACK_GO) build -trimpath -ldflags '-s -w' -o $(HACK_BIN)/mini-kubelet ./cmd/mini-kubelet
	@rm -f $(HACK_STAMPS)/mini-kubelet-* && touch $@

# cdi-validate checks the plugin's CDI specs with the container runtimes' own library (e2e runs it).
$(HACK_CDIVALIDATE_STAMP):
	@mkdir -p $(HACK_BIN) $(HACK_STAMPS)
	$(HACK_GO) build -trimpath -ldflags '-s -w' -o $(HACK_BIN)/cdi-validate ./cmd/cdi-validate
	@rm -f $(HACK_STAMPS)/cdi-validate-* && touch $@

$(HACK_FIXTURE_STAMP):
	@mkdir -p $(HACK_BIN) $(HACK_STAMPS)
	$(HACK_GO) build -trimpath -ldflags '-s -w' -o $(HACK_BIN)/fake-dra-plugin ./test/fake-dra-plugin
	@rm -f $(HACK_STAMPS)/fake-dra-plugin-* && touch $@

# kwok and helm have no replace directives, so `go install module@version` builds them in their own
# dependency graphs, apart from the Kubernetes one above.
$(HACK_KWOK_STAMP):
	@mkdir -p $(HACK_BIN) $(HACK_STAMPS)
	cd /tmp && env $(HACK_GOENV) GOBIN=$(HACK_BIN) go install -trimpath -ldflags '-s -w' sigs.k8s.io/kwok/cmd/kwok@$(HACK_KWOK_VERSION)
	@rm -f $(HACK_STAMPS)/kwok-* && touch $@

$(HACK_HELM_STAMP):
	@mkdir -p $(HACK_BIN) $(HACK_STAMPS)
	cd /tmp && env $(HACK_GOENV) GOBIN=$(HACK_BIN) go install -trimpath \
		-ldflags '-s -w -X helm.sh/helm/v4/internal/version.version=$(HACK_HELM_VERSION)' helm.sh/helm/v4/cmd/helm@$(HACK_HELM_VERSION)
	@rm -f $(HACK_STAMPS)/helm-* && touch $@

$(HACK_PROMETHEUS_STAMP):
	@mkdir -p $(HACK_BIN) $(HACK_STAMPS)
	cd /tmp && env $(HACK_GOENV) GOBIN=$(HACK_BIN) go install \
		-ldflags '-s -w -X github.com/prometheus/common/version.Version=$(HACK_PROMETHEUS_VERSION)' \
		github.com/prometheus/prometheus/cmd/prometheus@$(HACK_PROMETHEUS_VERSION)
	@rm -f $(HACK_STAMPS)/prometheus-* && touch $@

# K8S_VERSION or KUBELET_VERSIONS naming the oldest supported version builds it first.
cluster-up: hack-tools $(if $(filter $(HACK_K8S_OLDEST),$(K8S_VERSION) $(KUBELET_VERSIONS)),$(HACK_K8S_OLDEST_STAMP)) ## Start the local cluster (NODES fake GPU nodes, default 3; K8S_VERSION, KUBELET_VERSIONS); see hack/README.md
	CACHE_DIR=$(CACHE_DIR) hack/cluster up

cluster-down: ## Stop every process of the local cluster and remove its state
	CACHE_DIR=$(CACHE_DIR) hack/cluster down

cluster-status: ## Show the local cluster's processes and nodes
	CACHE_DIR=$(CACHE_DIR) hack/cluster status

# The smoke test needs no helm; leaving it out saves its cold build (~6 min) in CI.
test-cluster: $(HACK_K8S_STAMP) $(HACK_MINIKUBELET_STAMP) $(HACK_FIXTURE_STAMP) $(HACK_KWOK_STAMP) ## Smoke test: own cluster, real scheduler allocates a claim, mini-kubelet prepares it
	CACHE_DIR=$(CACHE_DIR) hack/test/smoke.sh


# The kubelet plugin alone against the kubelet's DRA code: slices, prepare, kubelet and plugin
# restarts, SIGTERM, a corrupted checkpoint (about 30 s).
test-kubelet-plugin-cluster: $(HACK_K8S_STAMP) $(HACK_MINIKUBELET_STAMP) $(HACK_KWOK_STAMP) ## Kubelet plugin on its own local cluster (crates/kubelet-plugin/tests/cluster/check.sh)
	CACHE_DIR=$(CACHE_DIR) crates/kubelet-plugin/tests/cluster/check.sh

# The three suites above on one cluster, brought up once: what `make test` runs.
test-cluster-suites: hack-tools ## Smoke test, kubelet plugin check and e2e suite on one local cluster (hack/test/cluster-suites.sh)
	$(CARGO) build --workspace --bins --locked
	CACHE_DIR=$(CACHE_DIR) hack/test/cluster-suites.sh

TEST_TARGETS += test-cluster-suites

# Real nodes (a real kubelet, containerd and kube-proxy each) beside a KWOK node: pods, logs, exec,
# Service VIP, pod to pod, a DRA claim prepared through the real kubelet with CDI injection, clean down.
# One of its real nodes runs the oldest supported kubelet under the default apiserver.
test-real-nodes: hack-tools $(HACK_K8S_OLDEST_STAMP) ## Real-node test: own cluster with 4 real nodes, one on the oldest kubelet (hack/test/real-nodes.sh)
	CACHE_DIR=$(CACHE_DIR) hack/test/real-nodes.sh

TEST_TARGETS += test-real-nodes

# The subset on the oldest supported minor, control plane and kubelets: install, a claim, a MIG claim,
# health, a hand-over and back, uninstall.
test-real-nodes-oldest: hack-tools $(HACK_K8S_OLDEST_STAMP) ## Real-node subset on Kubernetes $(HACK_K8S_OLDEST) (hack/test/real-nodes.sh with K8S_VERSION and SUBSET)
	CACHE_DIR=$(CACHE_DIR) K8S_VERSION=$(HACK_K8S_OLDEST) SUBSET=oldest hack/test/real-nodes.sh

TEST_TARGETS += test-real-nodes-oldest

images: hack-tools ## The product's images (and stand-ins) as OCI archives in $(CACHE_DIR)/images, loaded into running real nodes
	CACHE_DIR=$(CACHE_DIR) hack/images.sh
	@if [ -s .cluster/real-nodes ]; then CACHE_DIR=$(CACHE_DIR) hack/cluster load-images; fi

# make images and the Dockerfiles put the same binaries at the same paths with the same user.
test-images: hack-tools ## The OCI archives of make images match the Dockerfiles (hack/test/images.sh)
	CACHE_DIR=$(CACHE_DIR) hack/test/images.sh

TEST_TARGETS += test-images
