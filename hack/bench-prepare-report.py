#!/usr/bin/env python3
"""The arithmetic of hack/bench-prepare.sh.

  count FILE METHOD   calls of METHOD (NodePrepareResources, ...) in a scrape of the mini-kubelet's
                      DRA gRPC histogram
  quantiles BEFORE AFTER METHOD   p50 and p99 (ms) and the number of METHOD's calls between two
                      scrapes (hack/bench-mig.sh)
  report --work DIR ...  the Markdown report, from the scrapes, strace, dd and curl files in DIR
"""
import argparse
import math
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r'^(?P<name>\w+?)(?P<kind>_bucket|_count|_sum)\{(?P<labels>[^}]*)\} (?P<value>\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


def histogram(path, method):
    """Cumulative buckets {le: count} and the total count of METHOD's calls, all status codes."""
    buckets, count = defaultdict(float), 0.0
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if not m:
                continue
            labels = dict(LABEL.findall(m["labels"]))
            if not labels.get("method_name", "").endswith("/" + method):
                continue
            if m["kind"] == "_bucket":
                le = labels["le"]
                buckets[math.inf if le == "+Inf" else float(le)] += float(m["value"])
            elif m["kind"] == "_count":
                count += float(m["value"])
    return buckets, count


def delta(before, after, method):
    (b0, c0), (b1, c1) = histogram(before, method), histogram(after, method)
    return {le: b1[le] - b0.get(le, 0.0) for le in b1}, c1 - c0


def quantile(buckets, q):
    """Seconds at quantile q, interpolated inside the bucket that crosses it (buckets 2% apart)."""
    edges = sorted(buckets)
    total = buckets[edges[-1]] if edges else 0
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for le in edges:
        if buckets[le] >= rank:
            if math.isinf(le):
                return lower
            inside = buckets[le] - below
            return lower + (le - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = le, buckets[le]
    return lower


def mean_rpc(before, after, method):
    """Mean seconds of METHOD's calls between two scrapes of the kubelet's histogram (exact, from _sum)."""
    def total(path):
        s = c = 0.0
        with open(path) as f:
            for line in f:
                m = LINE.match(line.strip())
                if m and dict(LABEL.findall(m["labels"])).get("method_name", "").endswith("/" + method):
                    if m["kind"] == "_sum":
                        s += float(m["value"])
                    elif m["kind"] == "_count":
                        c += float(m["value"])
        return s, c
    (s0, c0), (s1, c1) = total(before), total(after)
    return (s1 - s0) / (c1 - c0) if c1 > c0 else float("nan")


def plugin_value(path, series):
    """The value of one series (name with labels, as exposed) in a scrape of the plugin's metrics."""
    with open(path) as f:
        for line in f:
            if line.startswith(series + " "):
                return float(line.split()[-1])
    return 0.0


def plugin_breakdown(work, phase):
    """Means per claim from the plugin's own metrics: whole prepare, its claim read; writes per call."""
    before, after = f"{work}/ours-{phase}.plugin.before", f"{work}/ours-{phase}.plugin.after"
    d = lambda series: plugin_value(after, series) - plugin_value(before, series)
    op = 'gpu_kubelet_plugin_claim_duration_seconds_{}{{operation="{}"}}'
    prepares, unprepares = d(op.format("count", "Prepare")), d(op.format("count", "Unprepare"))
    reads = d("gpu_kubelet_plugin_claim_read_duration_seconds_count")
    return {
        "claim": d(op.format("sum", "Prepare")) / prepares if prepares else float("nan"),
        "read": d("gpu_kubelet_plugin_claim_read_duration_seconds_sum") / reads if reads else float("nan"),
        "writes": d("gpu_kubelet_plugin_checkpoint_writes_total"),
        "claims": prepares + unprepares,
    }


def ms(seconds):
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.2f} ms"


def strace_counts(path):
    counts = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and parts[-1].isidentifier() and parts[3].isdigit():
                counts[parts[-1]] = int(parts[3])
    return counts


def dd_latency(path):
    """Seconds per synced write, from dd's summary line (N bytes copied, T s)."""
    text = open(path).read()
    m = re.search(r"copied, ([0-9.,e-]+) s", text)
    records = re.search(r"(\d+)\+0 records out", text)
    return float(m[1].replace(",", ".")) / int(records[1]) if m and records else float("nan")


def report(args):
    work = args.work
    phases = [("single", 1, args.single), ("burst8", 8, args.burst_rounds), ("burst32", 32, args.burst_rounds)]
    rows, p = {}, {}
    for plugin in args.plugin:
        for phase, size, rounds in phases:
            for method in ("NodePrepareResources", "NodeUnprepareResources"):
                buckets, count = delta(f"{work}/{plugin}-{phase}.before", f"{work}/{plugin}-{phase}.after", method)
                p[plugin, phase, method] = (quantile(buckets, 0.5), quantile(buckets, 0.99), int(count))
    sync = dd_latency(f"{work}/dd.txt")
    gets = [float(x) for x in open(f"{work}/get.txt").read().split()]
    get_p50 = statistics.median(gets) if gets else float("nan")

    print("RPC times in the kubelet's DRA manager (its gRPC client interceptor), one pod per claim:\n")
    print("| plugin | phase | prepare calls | prepare p50 | prepare p99 | unprepare calls | unprepare p50 | unprepare p99 |")
    print("|---|---|---|---|---|---|---|---|")
    for plugin in args.plugin:
        for phase, size, rounds in phases:
            pp, up = p[plugin, phase, "NodePrepareResources"], p[plugin, phase, "NodeUnprepareResources"]
            label = "one at a time" if size == 1 else f"bursts of {size} ({rounds} rounds)"
            print(f"| {plugin} | {label} | {pp[2]} | {ms(pp[0])} | {ms(pp[1])} | {up[2]} | {ms(up[0])} | {ms(up[1])} |")
    if "upstream" in args.plugin and "ours" in args.plugin:
        print("\nRatios, upstream / ours (above 1: ours is faster):\n")
        print("| phase | prepare p50 | prepare p99 | unprepare p50 | unprepare p99 |")
        print("|---|---|---|---|---|")
        for phase, size, _ in phases:
            cells = []
            for method in ("NodePrepareResources", "NodeUnprepareResources"):
                for i in (0, 1):
                    ours, theirs = p["ours", phase, method][i], p["upstream", phase, method][i]
                    cells.append(f"{theirs / ours:.2f}x" if ours and not math.isnan(ours) else "n/a")
            print(f"| {phase} | " + " | ".join(cells) + " |")

    print("\nWhere our prepare's time goes (means per claim, from the plugin's own metrics beside the kubelet's):\n")
    print("| phase | RPC in the kubelet | claim in the plugin | of which the claim GET | of which the rest (CDI spec, commit) | outside the plugin (gRPC, sockets) | checkpoint writes per claim |")
    print("|---|---|---|---|---|---|---|")
    for phase, size, _ in phases:
        b = plugin_breakdown(work, phase)
        rpc = mean_rpc(f"{work}/ours-{phase}.before", f"{work}/ours-{phase}.after", "NodePrepareResources")
        writes = f"{b['writes'] / b['claims']:.2f}" if b["claims"] else "n/a"
        print(f"| {phase} | {ms(rpc)} | {ms(b['claim'])} | {ms(b['read'])} | {ms(b['claim'] - b['read'])} | {ms(rpc - b['claim'])} | {writes} |")

    def cpu(name):
        """(plugin CPU s, machine busy CPU s, cores, wall s) spent between the two samples."""
        before = [float(x) for x in open(f"{work}/ours-{name}.cpu.before").read().split()]
        after = [float(x) for x in open(f"{work}/ours-{name}.cpu.after").read().split()]
        return after[0] - before[0], after[1] - before[1], int(after[2]), after[3] - before[3]

    idle_plugin, idle_machine, _, idle_wall = cpu("idle")
    print("\nCPU per claim prepared and unprepared (ours; /proc of the plugin and of the machine over each phase, "
          f"less what they use idle: plugin {ms(idle_plugin / idle_wall)}/s, machine {ms(idle_machine / idle_wall)}/s):\n")
    print("| phase | plugin CPU per claim | machine busy CPU per claim (control plane, kubelet, kubectl included) | burst floor: N x plugin CPU / cores |")
    print("|---|---|---|---|")
    for phase, size, rounds in phases:
        plugin, machine, cores, wall = cpu(phase)
        claims = size * rounds
        plugin = max(plugin - idle_plugin / idle_wall * wall, 0) / claims
        machine = max(machine - idle_machine / idle_wall * wall, 0) / claims
        print(f"| {phase} | {ms(plugin)} | {ms(machine)} | {ms(size * plugin / cores)} ({cores} cores) |")

    print("\nWhat the times rest on, and what the plugins cost:\n")
    print("| plugin | fsync+fdatasync per claim | openat per claim | getdents64 per claim | rename per claim | idle VmRSS, 8 GPUs | idle VmRSS, 32 GPUs | VmHWM after the load |")
    print("|---|---|---|---|---|---|---|---|")
    for plugin, idle8, idle32, hwm in zip(args.plugin, args.idle8, args.idle32, args.hwm):
        c = strace_counts(f"{work}/{plugin}.strace")
        per = lambda *names: f"{sum(c.get(n, 0) for n in names) / args.straced:.1f}"
        print(f"| {plugin} | {per('fsync', 'fdatasync')} | {per('openat', 'open')} | {per('getdents64')} | {per('rename', 'renameat', 'renameat2')} | {idle8} MiB | {idle32} MiB | {hwm} MiB |")
    print(f"\nPer claim = strace -f -c over {args.straced} pods prepared and unprepared one at a time, divided by {args.straced}.")
    print(f"Disk: {ms(sync)} per synced 4 KiB write (dd oflag=dsync, 200 writes, in the cluster's folder).")
    print(f"One claim GET on a kept-alive connection: p50 {ms(get_p50)} (curl, 100 GETs).")
    ours_single = p.get(("ours", "single", "NodePrepareResources"))
    ours_burst = p.get(("ours", "burst32", "NodePrepareResources"))
    if ours_single and ours_burst:
        bound = sync + get_p50 + 0.002
        print(f"\nPrepare p50 one at a time {ms(ours_single[0])}; bound disk sync + claim GET + 2 ms = {ms(bound)}: "
              f"{'met' if ours_single[0] <= bound else 'NOT met'}.")
        print(f"Bursts of 32: prepare p99 {ms(ours_burst[1])}, {ours_burst[1] / ours_single[1]:.2f}x the one-at-a-time p99 "
              f"{ms(ours_single[1])} (bound 3x): {'met' if ours_burst[1] < 3 * ours_single[1] else 'NOT met'}.")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "count":
        print(int(histogram(sys.argv[2], sys.argv[3])[1]))
        return
    if len(sys.argv) == 5 and sys.argv[1] == "quantiles":
        buckets, calls = delta(sys.argv[2], sys.argv[3], sys.argv[4])
        p50, p99 = (quantile(buckets, q) * 1000 for q in (0.5, 0.99))
        print(f"{p50:.2f} {p99:.2f} {int(calls)}")
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["report"])
    parser.add_argument("--work", required=True)
    parser.add_argument("--single", type=int, required=True)
    parser.add_argument("--burst-rounds", type=int, required=True)
    parser.add_argument("--straced", type=int, required=True)
    parser.add_argument("--plugin", action="append", default=[])
    parser.add_argument("--idle8", action="append", default=[])
    parser.add_argument("--idle32", action="append", default=[])
    parser.add_argument("--hwm", action="append", default=[])
    report(parser.parse_args())


if __name__ == "__main__":
    main()
