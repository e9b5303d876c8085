#!/usr/bin/env python3
"""The measuring half of make bench-time-to-gpu (hack/bench-time-to-gpu.sh installs the product).

  bench-time-to-gpu.py NODE SPEC WORKLOAD_YAML

Watches, with `kubectl get --watch`, the Node NODE, every pod bound to it and its ResourceSlices;
creates the workload (a claim template and a pod pinned to NODE, Pending until it can run), then runs
`hack/cluster add-node SPEC`, and notes when each step of bringing up a GPU node is first seen:
the kubelet registering the Node, the Node Ready, GPU discovery's PCI label, the labeler's
gpu.present, discovery's NVML labels, each operand pod Running, the first ResourceSlice with a GPU,
the readiness labels, the workload scheduled and Running. Prints a Markdown table for BENCHMARKS.md:
each step's time from the Node's registration and its share of the total.
"""

import json
import queue
import subprocess
import sys
import threading
import time

NODE, SPEC, WORKLOAD = sys.argv[1], sys.argv[2], sys.argv[3]
WORKLOAD_POD = "time-to-gpu"
TIMEOUT_S = 600


def watch(events, kind, *args):
    """Streams each version of the watched objects into EVENTS as (arrival time, kind, object)."""
    proc = subprocess.Popen(["kubectl", "get", *args, "--watch", "-o", "json"],
                            stdout=subprocess.PIPE, text=True)
    decoder, buf = json.JSONDecoder(), ""
    for line in proc.stdout:
        buf += line
        while buf.strip():
            try:
                obj, end = decoder.raw_decode(buf.lstrip())
            except ValueError:
                break
            buf = buf.lstrip()[end:]
            events.put((time.monotonic(), kind, obj))


def condition(obj, kind):
    return any(c.get("type") == kind and c.get("status") == "True"
               for c in obj.get("status", {}).get("conditions", []))


def milestones(kind, obj):
    """The steps this version of an object shows as done."""
    done = []
    if kind == "node":
        labels = obj["metadata"].get("labels", {})
        done.append("kubelet registered the Node")
        if condition(obj, "Ready"):
            done.append("Node Ready")
        if labels.get("feature.node.kubernetes.io/pci-10de.present") == "true":
            done.append("discovery: PCI label (pci-10de.present)")
        if labels.get("nvidia.com/gpu.present") == "true":
            done.append("labeler: gpu.present, operands may deploy")
        if "nvidia.com/gpu.product" in labels:
            done.append("discovery: NVML labels (gpu.product, count, ...)")
        if labels.get("gpu-operator-rs.dev/gpu-setup-complete") == "true":
            done.append("labeler: readiness labels (validator passed)")
    elif kind == "pod":
        name = obj["metadata"].get("labels", {}).get("app.kubernetes.io/name") or \
            obj["metadata"].get("labels", {}).get("app") or obj["metadata"]["name"]
        if obj["metadata"]["name"] == WORKLOAD_POD:
            if condition(obj, "PodScheduled"):
                done.append("workload scheduled (claim allocated)")
            if obj.get("status", {}).get("phase") == "Running":
                done.append("workload Running (claim prepared)")
        elif obj.get("status", {}).get("phase") == "Running" and condition(obj, "Ready"):
            done.append(f"pod Ready: {name}")
    elif kind == "slice":
        if obj["spec"].get("driver") == "gpu.nvidia.com" and obj["spec"].get("devices"):
            done.append("plugin: ResourceSlice with the GPU")
    return done


def main():
    events = queue.Queue()
    for kind, args in [("node", ["nodes", "--field-selector", f"metadata.name={NODE}"]),
                       ("pod", ["pods", "-A", "--field-selector", f"spec.nodeName={NODE}"]),
                       ("pod", ["pods", "-n", "default", "--field-selector", f"metadata.name={WORKLOAD_POD}"]),
                       ("slice", ["resourceslices", "--field-selector", f"spec.nodeName={NODE}"])]:
        threading.Thread(target=watch, args=(events, kind, *args), daemon=True).start()
    time.sleep(2)  # the watches are open before anything happens
    subprocess.run(["kubectl", "apply", "-f", WORKLOAD], check=True, stdout=subprocess.DEVNULL)
    start = time.monotonic()
    subprocess.Popen(["hack/cluster", "add-node", SPEC], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = {}
    while "workload Running (claim prepared)" not in seen:
        try:
            at, kind, obj = events.get(timeout=max(0.1, start + TIMEOUT_S - time.monotonic()))
        except queue.Empty:
            sys.exit(f"bench-time-to-gpu: no GPU pod Running within {TIMEOUT_S}s; seen: {sorted(seen)}")
        for step in milestones(kind, obj):
            seen.setdefault(step, at)
    zero = seen["kubelet registered the Node"]
    print(f"| Step (node {NODE}, {SPEC}) | seen at, s after the Node registered | step, s | share |")
    print("|---|---:|---:|---:|")
    print(f"| add-node started the node's containerd, image import, kubelet | {start - zero:+.1f} | | |")
    total = seen["workload Running (claim prepared)"] - zero
    previous = zero
    for step, at in sorted(seen.items(), key=lambda kv: kv[1]):
        delta = at - previous
        print(f"| {step} | {at - zero:.1f} | {delta:.1f} | {100 * delta / total:.0f}% |")
        previous = at
    print(f"| **Node registered to GPU pod Running** | **{total:.1f}** | | |")


if __name__ == "__main__":
    main()
