"""Per-step and per-kernel table of a kernel timeline (scripts/kernel_timeline.cc).

Usage: python3 kernel_timeline.py TIMELINE.tsv [--nodes N] [--show K]
                                   [--layer L --offset F]

A replay of a decode step's graphs is a run of kernels with no gap over
20 µs between one's end and the next's start. Of the replays with N kernels
(default: the most common count), the middle half are summarized:
- per kernel kind (name and grid): launches a step, the median time from
  start to end, and the median increment of the step's critical path, the
  kernel's end minus the previous kernel's end (the kernels form a chain);
- the first K kernels of one replay, with their start against the previous
  kernel's end (negative: started under it, as programmatic dependents do);
- with --layer L: kernels F, F + 1, ... taken as layers of L kernels each
  (GLA 1.3B's decode step: L = 8 after F = 1, the embedding), and per place
  in a layer, over the layers but the first and last two, the medians of
  how early it started, how long it ran and its increment.
"""
import argparse
import collections
import re
import statistics
import subprocess


def short_name(mangled_names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(mangled_names), capture_output=True,
                             text=True).stdout.splitlines()
    except FileNotFoundError:
        out = list(mangled_names)
    names = {}
    for mangled, full in zip(mangled_names, out):
        full = re.sub(r"^void ", "", full.replace("(anonymous namespace)::", ""))
        full = re.sub(r"\([^()]*\)$", "", full)
        full = re.sub(r"lair::kernels::cuda::(dense::)?(small_product::)?", "", full)
        full = full.replace("__nv_bfloat16", "bf16")
        names[mangled] = full[:70]
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("timeline")
    ap.add_argument("--nodes", type=int, default=0)
    ap.add_argument("--show", type=int, default=24)
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--offset", type=int, default=1)
    args = ap.parse_args()
    rows = []
    for line in open(args.timeline):
        start, end, node, grid, name = line.rstrip("\n").split("\t")
        rows.append((int(start), int(end), int(node), int(grid), name))
    rows.sort()
    names = short_name(sorted({r[4] for r in rows}))
    replays, current = [], []
    for r in rows:
        if current and r[0] - current[-1][1] > 20_000:
            replays.append(current)
            current = []
        current.append(r)
    if current:
        replays.append(current)
    counts = collections.Counter(len(r) for r in replays)
    nodes = args.nodes or counts.most_common(1)[0][0]
    chosen = [r for r in replays if len(r) == nodes]
    chosen = chosen[len(chosen) // 4: max(len(chosen) * 3 // 4, len(chosen) // 4 + 1)]
    print(f"{len(replays)} replays; {len(chosen)} of {nodes} kernels summarized")
    spans = [(r[-1][1] - r[0][0]) / 1000 for r in chosen]
    print(f"replay span (first start to last end): median {statistics.median(spans):.1f} us")

    kinds = collections.defaultdict(lambda: {"dur": [], "inc": [], "n": 0})
    for replay in chosen:
        for i, (start, end, _, grid, name) in enumerate(replay):
            kind = kinds[(names[name], grid)]
            kind["dur"].append((end - start) / 1000)
            kind["inc"].append((end - (replay[i - 1][1] if i else start)) / 1000)
            kind["n"] += 1
    print(f"\n{'kernel':<72}{'grid':>7}{'/step':>7}{'dur us':>9}{'inc us':>9}{'inc/step':>10}")
    per_step = len(chosen)
    table = sorted(kinds.items(), key=lambda kv: -sum(kv[1]["inc"]))
    for (name, grid), k in table:
        print(f"{name:<72}{grid:>7}{k['n'] / per_step:>7.1f}{statistics.median(k['dur']):>9.2f}"
              f"{statistics.median(k['inc']):>9.2f}{sum(k['inc']) / per_step:>10.1f}")

    replay = chosen[len(chosen) // 2]
    print(f"\nthe first {args.show} kernels of one replay (us from its first start)")
    print(f"{'kernel':<72}{'grid':>7}{'start':>9}{'dur':>8}{'vs prev end':>12}{'inc':>8}")
    t0 = replay[0][0]
    for i, (start, end, _, grid, name) in enumerate(replay[:args.show]):
        prev_end = replay[i - 1][1] if i else start
        print(f"{names[name]:<72}{grid:>7}{(start - t0) / 1000:>9.2f}{(end - start) / 1000:>8.2f}"
              f"{(start - prev_end) / 1000:>12.2f}{(end - prev_end) / 1000:>8.2f}")

    if args.layer:
        layers = (nodes - args.offset) // args.layer
        print(f"\nper place in a layer ({layers} layers of {args.layer}; medians over layers "
              f"2 to {layers - 3}, us)")
        print(f"{'kernel':<72}{'grid':>7}{'started early':>15}{'runs':>8}{'increment':>11}")
        for place in range(args.layer):
            early, runs, inc = [], [], []
            for replay in chosen:
                for layer in range(2, layers - 2):
                    i = args.offset + layer * args.layer + place
                    start, end = replay[i][0], replay[i][1]
                    prev_end = replay[i - 1][1]
                    early.append((prev_end - start) / 1000)
                    runs.append((end - start) / 1000)
                    inc.append((end - prev_end) / 1000)
            _, _, _, grid, name = chosen[0][args.offset + 2 * args.layer + place]
            print(f"{names[name]:<72}{grid:>7}{statistics.median(early):>15.2f}"
                  f"{statistics.median(runs):>8.2f}{statistics.median(inc):>11.2f}")
        per_layer = [(r[args.offset + (layers - 2) * args.layer][1] -
                      r[args.offset + 2 * args.layer][1]) / 1000 / (layers - 4) for r in chosen]
        print(f"a layer: {statistics.median(per_layer):.2f} us (median)")


if __name__ == "__main__":
    main()
