# Image ghcr.io/gpu-operator-rs/gpu-kubelet-plugin: the DRA kubelet plugin (container `gpus` of the
# nvidia-dra-driver-kubelet-plugin DaemonSet), the device plugin (nvidia-device-plugin-daemonset) and
# GPU node discovery (the chart's gpu-node-discovery DaemonSet).
# Build from the repository root: `make images`.
#
# The plugin dlopen()s libnvidia-ml.so.1 from the validated driver root, so it is a glibc binary
# on the minimal glibc base (distroless cc). It runs privileged, as the operator renders it.
ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kubelet-plugin -p device-plugin -p node-discovery \
    && mkdir -p /out && cp target/release/gpu-kubelet-plugin target/release/gpu-device-plugin \
       target/release/gpu-node-discovery /out/

FROM gcr.io/distroless/cc-debian12
COPY --from=build /out/ /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/gpu-kubelet-plugin"]
