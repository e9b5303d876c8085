#!/usr/bin/env bash
# hack/release-images.sh [COMMIT...]: earlier releases of the product, for the upgrade scenario
# (e2e/tests/real_nodes/upgrade.rs): each COMMIT's chart and its two product images, built from that
# commit's source as `make images` builds today's (debug profile), tagged `<appVersion>-<commit>` so
# they sit beside today's images on a node. Without arguments, the releases in hack/releases.
#
# Each release lands in $CACHE_DIR/releases/<commit>/ (chart/, images/*.tar, tag) and is built once:
# the folder is complete only once its `tag` file exists. The releases share one cargo target folder
# of their own ($CACHE_DIR/releases/target), apart from today's build. Prints each release's folder,
# one a line (what it does goes to stderr).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$HACK_DIR")"
CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
RELEASES_DIR="$CACHE_DIR/releases"

if (($# == 0)); then
  mapfile -t commits < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$HACK_DIR/releases" | awk '{print $1}')
else
  commits=("$@")
fi

for commit in "${commits[@]}"; do
  [[ "$commit" =~ ^[0-9a-f]{7,40}$ ]] || { echo "release-images: $commit is not a commit hash (7 digits or more)" >&2; exit 1; }
  short="${commit:0:7}"
  out="$RELEASES_DIR/$short"
  if [[ -s "$out/tag" ]]; then
    echo "$out"
    continue
  fi
  full="$(git -C "$REPO_DIR" rev-parse --verify --quiet "$commit^{commit}")" || {
    echo "release-images: $commit is not a commit of this clone (a shallow clone? fetch its history)" >&2
    exit 1
  }
  rm -rf "$out"
  mkdir -p "$out/src"
  git -C "$REPO_DIR" archive "$full" | tar -x -C "$out/src"
  app_version="$(sed -n 's/^appVersion: *//p' "$out/src/charts/gpu-operator/Chart.yaml" | tr -d '"')"
  tag="$app_version-$short"
  echo "release-images: building $short as $tag" >&2
  SOURCE_DIR="$out/src" IMAGE_TAG="$tag" PRODUCT_ONLY=1 PROFILE=debug IMAGES_OUT="$out/images" \
    CARGO_TARGET_DIR="$RELEASES_DIR/target" "$HACK_DIR/images.sh" >&2
  mv "$out/src/charts/gpu-operator" "$out/chart"
  rm -rf "$out/src"
  echo "$tag" >"$out/tag"
  echo "$out"
done
