#!/usr/bin/env bash
# make images: the product's container images without a Docker daemon, written as OCI archives into
# $CACHE_DIR/images, from which the local cluster's real nodes import them (at start, or now with
# `hack/cluster load-images` when a cluster runs). The Dockerfiles in images/ stay the publishing path;
# hack/test/images.sh checks both put the same binaries at the same paths with the same user.
#
# Images (names and tags the chart and the operator use by default):
#   ghcr.io/gpu-operator-rs/gpu-operator:<appVersion>        gpu-operator, node-labeler, dra-driver-validator
#   ghcr.io/gpu-operator-rs/gpu-kubelet-plugin:<appVersion>  gpu-kubelet-plugin, gpu-device-plugin,
#                                                             gpu-node-discovery
# Stand-ins for images that cannot be fetched here (each says so in its log):
#   nvcr.io/nvidia/cuda:12.6.2-base-ubi9                      the guide's workload image and a plain one:
#   docker.io/library/ubuntu:24.04                            a shell, busybox tools and the C library,
#                                                             no NVIDIA tool; nvidia-smi comes, as on a
#                                                             real node, from the driver root through CDI
#   nvcr.io/nvidia/k8s/dcgm-exporter, .../cloud-native/dcgm, nvcr.io/nvidia/dra-driver-nvidia-gpu
#                                                             hack/cmd/standin: keeps the container alive
#
# The glibc the binaries link against comes from this host (Debian 12, as distroless cc-debian12).
# PROFILE=release (default) or debug selects the cargo profile; IMAGES_OUT another output folder.
# For an earlier release (hack/release-images.sh): SOURCE_DIR builds that source tree instead of this
# one, IMAGE_TAG tags its images instead of the chart's appVersion, PRODUCT_ONLY=1 skips the stand-ins.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$HACK_DIR")"
cd "${SOURCE_DIR:-$REPO_DIR}"
CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
PROFILE="${PROFILE:-release}"
BIN_DIR="$CACHE_DIR/bin"
OUT="${IMAGES_OUT:-$CACHE_DIR/images}"
APP_VERSION="${IMAGE_TAG:-$(sed -n 's/^appVersion: *//p' charts/gpu-operator/Chart.yaml | tr -d '"')}"
REPO=ghcr.io/gpu-operator-rs
# Images NVIDIA builds, by the names the operator and the chart default to.
NVIDIA_STANDINS=(
  "$(sed -n 's/.*default_value = "\(nvcr.io\/nvidia\/k8s\/dcgm-exporter:[^"]*\)".*/\1/p' crates/operator/src/main.rs)"
  "$(sed -n 's/.*default_value = "\(nvcr.io\/nvidia\/cloud-native\/dcgm:[^"]*\)".*/\1/p' crates/operator/src/main.rs)"
  "$(sed -n 's/.*default_value = "\(nvcr.io\/nvidia\/dra-driver-nvidia-gpu:[^"]*\)".*/\1/p' crates/operator/src/main.rs)"
)
STANDIN_NAMES=(bash sh dcgm-exporter nv-hostengine compute-domain-kubelet-plugin compute-domain-controller)
BUSYBOX_TOOLS=(sh cat ls env echo sleep test grep stat find head)

[[ -x "$BIN_DIR/oci-image" && -x "$BIN_DIR/standin" ]] || make --no-print-directory -C "$REPO_DIR" hack-tools
[[ -x /bin/busybox ]] || { echo "images: /bin/busybox is missing: run hack/ci-bootstrap.sh" >&2; exit 1; }
mkdir -p "$OUT"

cargo_flags=(--locked -p operator -p node-labeler -p validator -p kubelet-plugin -p device-plugin -p node-discovery)
[[ -n "${PRODUCT_ONLY:-}" ]] || cargo_flags+=(-p nvidia-smi)
[[ "$PROFILE" == release ]] && cargo_flags+=(--release)
echo "images: building the binaries (cargo, $PROFILE)"
cargo build -q "${cargo_flags[@]}"
TARGET="$CARGO_TARGET_DIR/$PROFILE"

# glibc_args BINARY...: -add/-link arguments for the shared libraries the binaries load, laid out as
# on a merged-/usr Debian (libraries in /usr/lib/x86_64-linux-gnu, /lib a link to usr/lib).
glibc_args() {
  local lib real
  ldd "$@" | awk '/=>/ {print $3} /^\t\/lib64/ {print $1}' | sort -u | while read -r lib; do
    [[ -n "$lib" ]] || continue
    real="$(readlink -f "$lib")"
    case "$lib" in
      /lib64/*) echo "-add $real:/usr/lib/x86_64-linux-gnu/$(basename "$real"):0755 -link $lib:/lib/x86_64-linux-gnu/$(basename "$real")" ;;
      *) echo "-add $real:/usr/lib/x86_64-linux-gnu/$(basename "$lib"):0755" ;;
    esac
  done
  echo "-link lib:usr/lib"
}

# base_args: what distroless cc-debian12 gives every image: users, groups, a /tmp.
base_args() {
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$OUT/.passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$OUT/.group"
  echo "-add $OUT/.passwd:/etc/passwd:0644 -add $OUT/.group:/etc/group:0644 -dir tmp:1777 -dir home/nonroot:0700"
}

image() { # FILE ARGS...
  local file=$1
  shift
  "$BIN_DIR/oci-image" -o "$OUT/$file" "$@"
  echo "images: $OUT/$file ($(du -h "$OUT/$file" | cut -f1))"
}

# shellcheck disable=SC2046 # the helpers print several arguments
image gpu-operator.tar -name "$REPO/gpu-operator:$APP_VERSION" -user 65532:65532 -entrypoint /usr/local/bin/gpu-operator \
  -env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox \
  -add "$TARGET/gpu-operator:/usr/local/bin/gpu-operator:0755" -add "$TARGET/node-labeler:/usr/local/bin/node-labeler:0755" \
  -add "$TARGET/dra-driver-validator:/usr/local/bin/dra-driver-validator:0755" \
  -add /bin/busybox:/busybox/busybox:0755 $(for t in "${BUSYBOX_TOOLS[@]}"; do echo "-link busybox/$t:busybox"; done) \
  $(glibc_args "$TARGET/gpu-operator" "$TARGET/node-labeler" "$TARGET/dra-driver-validator") $(base_args)

# shellcheck disable=SC2046
image gpu-kubelet-plugin.tar -name "$REPO/gpu-kubelet-plugin:$APP_VERSION" -entrypoint /usr/local/bin/gpu-kubelet-plugin \
  -add "$TARGET/gpu-kubelet-plugin:/usr/local/bin/gpu-kubelet-plugin:0755" \
  -add "$TARGET/gpu-device-plugin:/usr/local/bin/gpu-device-plugin:0755" \
  -add "$TARGET/gpu-node-discovery:/usr/local/bin/gpu-node-discovery:0755" \
  $(glibc_args "$TARGET/gpu-kubelet-plugin" "$TARGET/gpu-device-plugin" "$TARGET/gpu-node-discovery") $(base_args)

if [[ -n "${PRODUCT_ONLY:-}" ]]; then
  rm -f "$OUT/.passwd" "$OUT/.group"
  exit 0
fi

# workload_args: a plain Linux userland for the workload stand-ins: busybox's shell and tools and the
# C library a binary of this host (the driver's nvidia-smi stand-in, injected by CDI) needs.
workload_args() {
  echo "-add /bin/busybox:/usr/bin/busybox:0755 -link bin:usr/bin"
  for t in "${BUSYBOX_TOOLS[@]}"; do echo "-link usr/bin/$t:busybox"; done
  glibc_args "$TARGET/nvidia-smi"
  base_args
}

# shellcheck disable=SC2046
image cuda-standin.tar -name nvcr.io/nvidia/cuda:12.6.2-base-ubi9 -entrypoint /bin/sh \
  -env NVIDIA_VISIBLE_DEVICES=all $(workload_args)
# shellcheck disable=SC2046
image ubuntu-standin.tar -name docker.io/library/ubuntu:24.04 -cmd /bin/sh $(workload_args)

for ref in "${NVIDIA_STANDINS[@]}"; do
  [[ -n "$ref" ]] || { echo "images: an NVIDIA image name was not found in crates/operator/src/main.rs" >&2; exit 1; }
  name="${ref##*/}"
  # shellcheck disable=SC2046
  image "standin-${name%%:*}.tar" -name "$ref" -entrypoint /usr/local/bin/standin -env "STANDIN_IMAGE=$ref" \
    -add "$BIN_DIR/standin:/usr/local/bin/standin:0755" $(for n in "${STANDIN_NAMES[@]}"; do echo "-link usr/bin/$n:../local/bin/standin"; done) \
    -link bin:usr/bin $(base_args)
done
rm -f "$OUT/.passwd" "$OUT/.group"
