#!/usr/bin/env python3
"""Summarizes an Nsight Compute CSV of `lair bench decode --no-graphs` runs.

The run's kernels are: the prefill, then --steps identical decode steps. The
decode steps are the trailing kernels; this takes the last step (the kernel
count after the prefill divided by --steps) and prints its kernels grouped by
name: count, total microseconds and share, plus the step's sum. Kernel times
exclude launch gaps, so the sum is a lower bound of the step's wall time.
"""
import argparse
import collections
import csv
import io


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--all", action="store_true", help="every kernel (a prefill), not one decode step")
    args = ap.parse_args()
    text = open(args.csv, errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        print("no kernel rows in", args.csv)
        return
    rows = [r for r in csv.DictReader(io.StringIO(text[start:]))
            if r.get("Metric Name") == "gpu__time_duration.sum"]
    kernels = [(r["Kernel Name"], float(r["Metric Value"].replace(",", ""))) for r in rows]
    # The decode steps repeat the same kernel sequence: find its period from the end.
    names = [k for k, _ in kernels]
    period = len(names) if args.all else 0
    for p in range(1, 0 if args.all else len(names) // args.steps + 1):
        if names[-p:] == names[-2 * p:-p]:
            period = p
            break
    if period == 0:
        print(f"{len(kernels)} kernels, no repeating step found")
        return
    step = kernels[-period:]
    total = sum(t for _, t in step)
    groups = collections.defaultdict(lambda: [0, 0.0])
    for name, t in step:
        short = name.split("(")[0][-60:]
        groups[short][0] += 1
        groups[short][1] += t
    what = "all kernels" if args.all else "one decode step"
    print(f"{what}: {period} kernels, {total / 1e3:.1f} us of kernel time")
    print(f"{'kernel':<60} {'count':>5} {'us':>9} {'share':>6}")
    for name, (count, t) in sorted(groups.items(), key=lambda kv: -kv[1][1])[:args.top]:
        print(f"{name:<60} {count:>5} {t / 1e3:>9.1f} {t / total:>6.1%}")


if __name__ == "__main__":
    main()
