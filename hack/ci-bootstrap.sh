#!/usr/bin/env bash
# Installs the toolchain pieces a fresh machine may lack. Idempotent and quiet when all is present.
set -euo pipefail

if ! command -v cargo >/dev/null 2>&1; then
  echo "ci-bootstrap: installing Rust with rustup" >&2
  if ! command -v rustup >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq rustup >/dev/null
  fi
  rustup default stable
fi
for comp in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$comp" || rustup component add "$comp"
done
if ! command -v cc >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq build-essential >/dev/null
fi
# make lint checks the shell scripts.
if ! command -v shellcheck >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null
fi
# make test-chart tests the chart's alerts with promtool (Debian ships it in prometheus) and reads
# the rendered chart with PyYAML.
if ! command -v promtool >/dev/null 2>&1 || ! python3 -c 'import yaml' 2>/dev/null; then
  echo "ci-bootstrap: installing prometheus (promtool) and python3-yaml" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus python3-yaml >/dev/null
fi
# The local cluster's real nodes: runc, the CNI plugins, iptables and nftables (kube-proxy and CNI
# inside the nodes' network namespaces), busybox-static for the test image.
real_node_pkgs=()
command -v runc >/dev/null 2>&1 || real_node_pkgs+=(runc)
[[ -x /usr/lib/cni/bridge ]] || real_node_pkgs+=(containernetworking-plugins)
command -v iptables >/dev/null 2>&1 || real_node_pkgs+=(iptables)
command -v nft >/dev/null 2>&1 || real_node_pkgs+=(nftables)
[[ -x /bin/busybox ]] || real_node_pkgs+=(busybox-static)
if ((${#real_node_pkgs[@]})); then
  echo "ci-bootstrap: installing ${real_node_pkgs[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${real_node_pkgs[@]}" >/dev/null
fi
