# Image ghcr.io/gpu-operator-rs/gpu-operator: gpu-operator, node-labeler and dra-driver-validator.
# Build from the repository root: `make images` (docker build -f images/gpu-operator.Dockerfile .).
#
# gpu-operator and node-labeler are static musl binaries. dra-driver-validator dlopen()s the host's
# libnvidia-ml.so.1, which a static musl binary cannot do, so it is linked against glibc and the
# base image carries glibc (distroless cc). The :debug-nonroot variant is used because the
# nvidia-dra-validator pod's readiness probe runs `cat` (busybox in /busybox).
ARG RUST_VERSION=1.95
FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/* \
    && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry --mount=type=cache,target=/src/target \
    cargo build --release --locked --target x86_64-unknown-linux-musl -p operator -p node-labeler \
    && cargo build --release --locked -p validator \
    && mkdir -p /out \
    && cp target/x86_64-unknown-linux-musl/release/gpu-operator target/x86_64-unknown-linux-musl/release/node-labeler /out/ \
    && cp target/release/dra-driver-validator /out/

FROM gcr.io/distroless/cc-debian12:debug-nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpu-operator"]
