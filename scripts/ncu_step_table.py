#!/usr/bin/env python3
"""Summarizes an Nsight Compute CSV of `lair bench decode --no-graphs` runs.

The run's kernels are: the prefill, then --steps identical decode steps. The
decode steps are the trailing kernels; this takes the last step (the kernel
count after the prefill divided by --steps) and prints its kernels grouped by
name: count, total microseconds and share, plus the step's sum. Kernel times
exclude launch gaps, so the sum is a lower bound of the step's wall time.
--list prints the step's kernels in launch order instead, with the DRAM bytes
each moved and its rate when the CSV has dram__bytes_read.sum and
dram__bytes_write.sum.
"""
import argparse
import collections
import csv
import io


def read_kernels(path):
    """(name, {metric: value}) per kernel launch, in launch order."""
    text = open(path, errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        return []
    kernels = collections.OrderedDict()
    for r in csv.DictReader(io.StringIO(text[start:])):
        entry = kernels.setdefault(r["ID"], (r["Kernel Name"], {}))
        try:
            entry[1][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            pass
    return [k for k in kernels.values() if "gpu__time_duration.sum" in k[1]]


def step_period(names, steps):
    """The length of the repeating decode step at the end of the run, or 0."""
    for p in range(1, len(names) // steps + 1):
        if names[-p:] == names[-2 * p:-p]:
            return p
    return 0


def short_name(name):
    return name.split("(")[0][-60:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--all", action="store_true", help="every kernel (a prefill), not one decode step")
    ap.add_argument("--list", action="store_true", help="the step's kernels in order, not grouped")
    args = ap.parse_args()
    kernels = read_kernels(args.csv)
    if not kernels:
        print("no kernel rows in", args.csv)
        return
    names = [k for k, _ in kernels]
    period = len(names) if args.all else step_period(names, args.steps)
    if period == 0:
        print(f"{len(kernels)} kernels, no repeating step found")
        return
    step = kernels[-period:]
    total = sum(m["gpu__time_duration.sum"] for _, m in step)
    what = "all kernels" if args.all else "one decode step"
    print(f"{what}: {period} kernels, {total / 1e3:.1f} us of kernel time")
    if args.list:
        print(f"{'#':>4} {'kernel':<60} {'us':>7} {'MB':>8} {'GB/s':>7}")
        for i, (name, m) in enumerate(step):
            t = m["gpu__time_duration.sum"]
            moved = m.get("dram__bytes_read.sum", 0.0) + m.get("dram__bytes_write.sum", 0.0)
            print(f"{i:>4} {short_name(name):<60} {t / 1e3:>7.2f} {moved / 1e6:>8.2f} "
                  f"{moved / t if t else 0.0:>7.0f}")
        return
    groups = collections.defaultdict(lambda: [0, 0.0])
    for name, m in step:
        groups[short_name(name)][0] += 1
        groups[short_name(name)][1] += m["gpu__time_duration.sum"]
    print(f"{'kernel':<60} {'count':>5} {'us':>9} {'share':>6}")
    for name, (count, t) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{name:<60} {count:>5} {t / 1e3:>9.1f} {t / total:>6.1%}")


if __name__ == "__main__":
    main()
