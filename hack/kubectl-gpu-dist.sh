#!/usr/bin/env bash
# Builds `kubectl gpu` for release: dist/kubectl-gpu_<version>_linux_amd64.tar.gz (the binary) and
# dist/gpu.yaml, the krew manifest (plugins/krew/gpu.yaml) with the version, the
# archive's address under RELEASE_URL and its SHA-256 filled in. Checks what it wrote: the archive
# holds the binary, the manifest names the archive's digest, and the binary runs.
set -euo pipefail

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_DIR"
CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
PROFILE="${PROFILE:-release}"
OUT="${DIST_DIR:-$REPO_DIR/dist}"
VERSION="v$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
HOMEPAGE="$(sed -n 's/^repository = "\(.*\)"/\1/p' Cargo.toml | head -1)"
RELEASE_URL="${RELEASE_URL:-$HOMEPAGE/releases/download/$VERSION}"
ARCHIVE="kubectl-gpu_${VERSION}_linux_amd64.tar.gz"

flags=(--locked -p kubectl-gpu)
[[ "$PROFILE" == release ]] && flags+=(--release)
cargo build -q "${flags[@]}"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
cp "$CARGO_TARGET_DIR/$PROFILE/kubectl-gpu" "$stage/"
mkdir -p "$OUT"
# Reproducible: fixed owner, order and times.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$stage" -czf "$OUT/$ARCHIVE" .
sha="$(sha256sum "$OUT/$ARCHIVE" | cut -d' ' -f1)"
sed -e "s|^  version: VERSION|  version: $VERSION|" -e "s|HOMEPAGE|$HOMEPAGE|" \
  -e "s|uri: URI|uri: $RELEASE_URL/$ARCHIVE|" -e "s|sha256: SHA256|sha256: $sha|" \
  plugins/krew/gpu.yaml >"$OUT/gpu.yaml"

tar -tzf "$OUT/$ARCHIVE" | grep -qx './kubectl-gpu' || { echo "dist: $ARCHIVE lacks kubectl-gpu" >&2; exit 1; }
grep -q "sha256: $sha" "$OUT/gpu.yaml" || { echo "dist: gpu.yaml does not name the archive's digest" >&2; exit 1; }
! grep -qE ': (VERSION|URI|SHA256|HOMEPAGE)$' "$OUT/gpu.yaml" || { echo "dist: gpu.yaml has a placeholder left" >&2; exit 1; }
"$stage/kubectl-gpu" --version >/dev/null
echo "dist: $OUT/$ARCHIVE ($sha) and $OUT/gpu.yaml"
