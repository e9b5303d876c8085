#!/usr/bin/env python3
"""The chart's Grafana dashboard as text, drawn from a live Prometheus: for each panel, each series
of each query over the last MINUTES (default 30), with its latest value (or `gone` when the series
ended before now) and its maximum, in the panel's unit.

  dashboard-text.py PROMETHEUS_URL [MINUTES]    e.g. "$(cat .cluster/real-41000/prometheus-url)"
"""
import json
import pathlib
import re
import sys
import time
import urllib.parse
import urllib.request

DASHBOARD = pathlib.Path(__file__).resolve().parents[2] / "charts/gpu-operator/dashboards/gpu-operator.json"


def query_range(url, expr, start, end):
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 15})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=10) as answer:
        return json.load(answer)["data"]["result"]


def shown(value, unit):
    return f"{value * 1000:.1f} ms" if unit == "s" else f"{value:.3g}"


def main():
    url = sys.argv[1].rstrip("/")
    minutes = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    end = time.time()
    start = end - 60 * minutes
    dashboard = json.loads(DASHBOARD.read_text())
    print(f"{dashboard['title']} — last {minutes} minutes")
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            print(f"\n== {panel['title']} ==")
            continue
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        print(panel["title"])
        for target in panel["targets"]:
            expr = target["expr"].replace("$namespace", "gpu-operator")
            for series in query_range(url, expr, start, end):
                samples = [(t, float(v)) for t, v in series["values"] if v != "NaN"]
                if not samples:
                    continue
                legend = re.sub(r"\{\{(\w+)\}\}", lambda m: series["metric"].get(m.group(1), ""),
                                target.get("legendFormat", "")).strip() or "value"
                last_time, last = samples[-1]
                now = shown(last, unit) if last_time >= end - 30 else "gone"
                peak = shown(max(v for _, v in samples), unit)
                print(f"    {legend:<44} now {now:>9}   max {peak:>9}")


if __name__ == "__main__":
    main()
