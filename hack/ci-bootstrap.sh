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
