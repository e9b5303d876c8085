#!/usr/bin/env bash
# Unit tests of the chart's alerts: renders the chart's PrometheusRule (prometheusRule.enabled, the
# default durations) into a rule file, checks it with `promtool check rules` and runs the tests of
# tests/rules/*_test.yaml against it with `promtool test rules` (make test-chart).
# HELM (default $CACHE_DIR/bin/helm, else helm on PATH) and PROMTOOL (default promtool on PATH,
# Debian's prometheus package; hack/ci-bootstrap.sh installs it) are the binaries used.
set -euo pipefail

CHART_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_DIR="${CACHE_DIR:-$HOME/.cache/gpu-operator-rs}"
HELM="${HELM:-$CACHE_DIR/bin/helm}"
[[ -x "$HELM" ]] || HELM="$(command -v helm)" || { echo "rules: no helm (run make hack-tools)" >&2; exit 2; }
PROMTOOL="${PROMTOOL:-$(command -v promtool || true)}"
[[ -n "$PROMTOOL" ]] || { echo "rules: no promtool (apt-get install prometheus, or run hack/ci-bootstrap.sh)" >&2; exit 2; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$HELM" template gpu-operator "$CHART_DIR" --namespace gpu-operator --set prometheusRule.enabled=true \
  --set driver.enabled=false >"$work/chart.yaml"
# The rule file promtool reads is the PrometheusRule's spec (its groups), as Prometheus gets it.
python3 - "$work/chart.yaml" "$work/rules.yaml" <<'PYEOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
rules = [d for d in docs if d["kind"] == "PrometheusRule"]
assert rules, "the chart rendered no PrometheusRule"
groups = [g for r in rules for g in r["spec"]["groups"]]
yaml.safe_dump({"groups": groups}, open(sys.argv[2], "w"), sort_keys=False)
PYEOF
"$PROMTOOL" check rules "$work/rules.yaml"
cp "$CHART_DIR"/tests/rules/*_test.yaml "$work/"
(cd "$work" && "$PROMTOOL" test rules ./*_test.yaml)
