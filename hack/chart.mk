# The Helm chart (charts/gpu-operator) and the container images. Included by the root Makefile.
# See docs/chart.md.

CHART_DIR := charts/gpu-operator
# helm is built by hack-tools (hack/cluster.mk); the recipes build it if it is missing.
CHART_HELM := $(CACHE_DIR)/bin/helm
IMAGE_REGISTRY ?= ghcr.io/gpu-operator-rs
IMAGE_TAG ?= v$(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
# docker, podman or anything with `build -f FILE -t TAG CONTEXT`.
CONTAINER_TOOL ?= docker

.PHONY: chart-helm lint-chart test-chart update-chart-snapshots images-docker

chart-helm:
	@[ -x $(CHART_HELM) ] || $(MAKE) --no-print-directory $(HACK_HELM_STAMP)

lint-chart: chart-helm ## helm lint the chart (defaults and the guide's pre-installed-driver values)
	$(CHART_HELM) lint --strict $(CHART_DIR)
	$(CHART_HELM) lint --strict $(CHART_DIR) --set driver.enabled=false \
		--set 'operator.env[0].name=DEFAULT_GPU_ALLOCATION_MODE' --set 'operator.env[0].value=dra'

test-chart: lint-chart ## helm lint, `helm template` snapshot tests and promtool tests of the chart's alerts (no cluster needed)
	HELM=$(CHART_HELM) $(CHART_DIR)/tests/snapshot.sh
	HELM=$(CHART_HELM) $(CHART_DIR)/tests/rules.sh

update-chart-snapshots: chart-helm ## Rewrite the chart's snapshot files after an intended change
	HELM=$(CHART_HELM) UPDATE=1 $(CHART_DIR)/tests/snapshot.sh

images-docker: ## Build the two published images from images/*.Dockerfile (needs a container engine; make images needs none)
	@command -v $(CONTAINER_TOOL) >/dev/null || { echo "images-docker: $(CONTAINER_TOOL) not found (set CONTAINER_TOOL)" >&2; exit 2; }
	@$(CONTAINER_TOOL) info >/dev/null 2>&1 || { echo "images-docker: $(CONTAINER_TOOL) cannot reach a container engine; no image can be built here" >&2; exit 2; }
	$(CONTAINER_TOOL) build -f images/gpu-operator.Dockerfile -t $(IMAGE_REGISTRY)/gpu-operator:$(IMAGE_TAG) .
	$(CONTAINER_TOOL) build -f images/gpu-kubelet-plugin.Dockerfile -t $(IMAGE_REGISTRY)/gpu-kubelet-plugin:$(IMAGE_TAG) .

TEST_TARGETS += test-chart
