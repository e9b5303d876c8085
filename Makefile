# gpu-operator-rs — developer entry points. `make test` is what CI runs; `make demo` runs the product on
# the local cluster. Build outputs live in fixed folders outside the clone so a warm machine rebuilds
# only what changed (override with CARGO_TARGET_DIR / GOCACHE if you like).
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c

CACHE_DIR ?= $(HOME)/.cache/gpu-operator-rs
export CARGO_TARGET_DIR ?= $(CACHE_DIR)/target
export CARGO_TERM_COLOR ?= never
CARGO ?= cargo
# Where rustup and the Go tarball put their tools on a fresh machine (hack/ci-bootstrap.sh).
export PATH := $(HOME)/.cargo/bin:/usr/local/go/bin:$(PATH)

# Test targets that other make fragments add to (hack/*.mk: the local cluster and its smoke test).
TEST_TARGETS :=
-include hack/*.mk

.PHONY: bootstrap build test lint fmt generate test-rust test-e2e bench-scale bench-requests bench-prepare bench-mig bench-health bench-time-to-gpu dist test-dist demo help

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | sort

# What a fresh machine lacks (Rust components, shellcheck, promtool, the real nodes' Debian packages):
# idempotent and quiet when all is there, so every entry point a new user types runs it first.
bootstrap: ## Install what a fresh machine lacks (hack/ci-bootstrap.sh; idempotent)
	@hack/ci-bootstrap.sh

build: ## Build every binary and test target of the workspace
	$(CARGO) build --workspace --all-targets --locked

# Every shell script of the repository (hack/, e2e/, the chart's and the plugin's test scripts).
# Every tracked shell script: `*.sh`, and any file whose first line is a bash or sh shebang.
SHELL_SCRIPTS = $(sort $(shell git ls-files '*.sh') $(shell git ls-files -z | xargs -0 awk 'FNR == 1 && /^\#!.*[/ ](ba)?sh( |$$)/ { print FILENAME } { nextfile }'))

lint: ## rustfmt, clippy, shellcheck and the import-cycle check, warnings are errors
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	shellcheck $(SHELL_SCRIPTS)
	hack/import-cycles

fmt: ## Format the code
	$(CARGO) fmt --all

generate: ## Regenerate the CRD YAML from crates/api
	$(CARGO) run -q --locked --bin crdgen > charts/gpu-operator/crds/nvidia.com_gpuclusters.yaml
	$(CARGO) run -q --locked --bin crdgen gpuclasses > charts/gpu-operator/crds/gpu-operator-rs.dev_gpuclasses.yaml
	$(CARGO) run -q --locked --bin crdgen physicalgpus > charts/gpu-operator/crds/gpu-operator-rs.dev_physicalgpus.yaml

test-rust: ## Every Rust test in the workspace (unit, snapshot, dlopen of the mock NVML, wire tests)
	$(CARGO) test --workspace --locked --no-fail-fast

test-e2e: hack-tools ## End-to-end suite on a local cluster of its own (e2e/run.sh)
	$(CARGO) build --workspace --bins --locked
	CACHE_DIR=$(CACHE_DIR) e2e/run.sh

dist: ## kubectl gpu for release: dist/kubectl-gpu_<version>_linux_amd64.tar.gz and its krew manifest dist/gpu.yaml
	CACHE_DIR=$(CACHE_DIR) hack/kubectl-gpu-dist.sh

TEST_TARGETS += test-dist
test-dist: ## The release archive and krew manifest of kubectl gpu, built (debug) and checked in a scratch folder
	d="$$(mktemp -d)" && CACHE_DIR=$(CACHE_DIR) PROFILE=debug DIST_DIR="$$d" hack/kubectl-gpu-dist.sh && rm -rf "$$d"

test: bootstrap lint test-rust $(TEST_TARGETS) ## What CI runs: lint, then every test (the cluster suites on one cluster)
	@echo "make test: all suites passed"

bench-scale: hack-tools ## Labeler and operator at 1,000 and 5,000 fake GPU nodes (not part of make test)
	CACHE_DIR=$(CACHE_DIR) hack/bench-scale.sh

bench-requests: hack-tools ## API requests of the slice publisher and the operator (BASELINE_BIN_DIR for a side-by-side row; not part of make test)
	CACHE_DIR=$(CACHE_DIR) hack/bench-requests.sh

bench-prepare: hack-tools ## Prepare/unprepare as the kubelet times them, one at a time and in bursts (UPSTREAM_PLUGIN for a side-by-side run; not part of make test)
	CACHE_DIR=$(CACHE_DIR) hack/bench-prepare.sh

bench-mig: hack-tools ## Prepare/unprepare of a MIG claim, static beside dynamic (made at prepare), as the kubelet times them (not part of make test)
	CACHE_DIR=$(CACHE_DIR) hack/bench-mig.sh

bench-health: hack-tools ## NVML fault to device taint latency, and API writes of a healthy node over 5 idle minutes (not part of make test)
	CACHE_DIR=$(CACHE_DIR) hack/bench-health.sh

bench-time-to-gpu: hack-tools ## A new real GPU node's kubelet registering to its first GPU pod Running, step by step (root; not part of make test)
	CACHE_DIR=$(CACHE_DIR) hack/bench-time-to-gpu.sh

demo: bootstrap ## Run the product end to end on the local cluster (leaves it up; make cluster-down stops it)
	CACHE_DIR=$(CACHE_DIR) hack/demo.sh
