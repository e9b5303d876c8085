#!/usr/bin/env python3
"""The measuring half of make bench-health (hack/bench-health.sh sets up the cluster and the plugin).

  bench-health.py CONTROL_FILE NODE ROUNDS IDLE_SECONDS

Taint latency: each round queues XID 79 on one mock GPU (the next one each round) by replacing the
mock NVML's control file, and times how long until a `kubectl get --watch` of the node's
ResourceSlices shows that device tainted gpu.nvidia.com/gpu-lost; then clears the fault and waits for
the taint to go (after the plugin's recovery period). Idle: with every device healthy, counts the
slice changes the watch sees and the apiserver's write requests on ResourceSlices, Events and
PhysicalGPUs
(apiserver_request_total) over IDLE_SECONDS. Prints Markdown for BENCHMARKS.md.
"""

import json
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time

CONTROL, NODE, ROUNDS, IDLE = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
GPUS = 8
WRITE_VERBS = {"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"}


def faults(json_faults):
    tmp = CONTROL + ".tmp"
    with open(tmp, "w") as f:
        f.write('{"profile": "a100-sxm4-40gb", "gpu_count": %d, "faults": %s}\n' % (GPUS, json_faults))
    os.rename(tmp, CONTROL)


def watch():
    """Each version of the node's slices as `device=taint-keys;...`, with when it arrived."""
    out = queue.Queue()
    proc = subprocess.Popen(
        ["kubectl", "get", "resourceslices", "--field-selector", f"spec.nodeName={NODE}",
         "--watch", "-o", "json"],
        stdout=subprocess.PIPE, text=True)

    def pump():
        # kubectl prints one JSON object per version, over several lines.
        decoder, text = json.JSONDecoder(), ""
        for line in proc.stdout:
            text += line
            try:
                obj, _ = decoder.raw_decode(text.strip())
            except ValueError:
                continue
            text = ""
            devices = (obj.get("spec") or {}).get("devices") or []
            summary = ";".join(
                d["name"] + "=" + ",".join(t["key"] for t in d.get("taints") or []) for d in devices)
            out.put((time.monotonic(), summary))
    threading.Thread(target=pump, daemon=True).start()
    return proc, out


def taints(line):
    return dict(part.split("=", 1) for part in line.split(";") if "=" in part)


def wait(lines, until, timeout):
    deadline = time.monotonic() + timeout
    last = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SystemExit(f"bench-health: timed out waiting for {until.__doc__}; last seen: {last}")
        try:
            at, line = lines.get(timeout=left)
        except queue.Empty:
            continue
        last = line
        if until(taints(line)):
            return at


def writes():
    metrics = subprocess.run(["kubectl", "get", "--raw", "/metrics"], capture_output=True, text=True,
                             check=True).stdout
    total = {"resourceslices": 0, "events": 0, "physicalgpus": 0}
    pattern = re.compile(r'^apiserver_request_total\{([^}]*)\} (\S+)$')
    for line in metrics.splitlines():
        m = pattern.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("verb") in WRITE_VERBS and labels.get("resource") in total:
            total[labels["resource"]] += int(float(m.group(2)))
    return total


def main():
    proc, lines = watch()
    wait(lines, lambda t: len(t) == GPUS and not any(t.values()), 60)
    took = []
    for r in range(ROUNDS):
        gpu = r % GPUS
        device = f"gpu-{gpu}"

        def tainted(t, device=device):
            """the taint"""
            return "gpu.nvidia.com/gpu-lost" in t.get(device, "")

        def untainted(t, device=device):
            """the taint to go"""
            return t.get(device) == ""
        start = time.monotonic()
        faults('{"xid_events": [{"gpu": %d, "xid": 79}]}' % gpu)
        took.append((wait(lines, tainted, 30) - start) * 1000)
        faults("{}")
        wait(lines, untainted, 60)

    time.sleep(5)
    while not lines.empty():
        lines.get()
    before = writes()
    time.sleep(IDLE)
    after = writes()
    changes = lines.qsize()
    proc.terminate()

    took.sort()
    p90 = took[max(0, int(len(took) * 0.9) - 1)]
    print(f"| XID 79 to a tainted device, as `kubectl get --watch` sees it ({ROUNDS} rounds) | "
          f"p50 {statistics.median(took):.0f} ms, p90 {p90:.0f} ms, max {took[-1]:.0f} ms |")
    print(f"| Slice changes seen while every device is healthy, {IDLE} s | {changes} |")
    print(f"| apiserver writes on ResourceSlices / Events / PhysicalGPUs over those {IDLE} s | "
          f"{after['resourceslices'] - before['resourceslices']} / {after['events'] - before['events']} / "
          f"{after['physicalgpus'] - before['physicalgpus']} |")
    pgpus = subprocess.run(["kubectl", "get", "physicalgpus", "--no-headers"], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    print(f"| PhysicalGPUs the plugin keeps, all Ready | {len(pgpus)} "
          f"({sum(1 for p in pgpus if ' Ready ' in p)} Ready) |")


main()
