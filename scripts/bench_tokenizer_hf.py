#!/usr/bin/env python3
"""Encode throughput of HF `tokenizers` on one thread, measured the way
`lair bench tokenizer` measures LAIR, so the two can be set side by side.

The whole corpus as one text, then line by line (each line with its '\\n'),
without special tokens. Each mode runs once cold (the first run, which fills
the tokenizer's word cache) and then --repeat times warm; the cold run and the
best warm run are reported in MB/s (10^6 bytes) and tokens/s, by the wall
clock and by process CPU time (steadier on a shared machine).

Usage: scripts/bench_tokenizer_hf.py --tokenizer DIR [--corpus FILE] [--repeat N]
Needs: pip install tokenizers (the goldens come from 0.23.2).
"""
import argparse
import os
import pathlib
import time

# One thread: set before tokenizers starts its Rayon pool.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"

import tokenizers  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = ROOT.parent / "shared" / "corpus" / "tinyshakespeare.txt"


def time_once(encode):
    start, cpu_start = time.perf_counter(), time.process_time()
    tokens = encode()
    return tokens, time.perf_counter() - start, time.process_time() - cpu_start


def report(mode, size, result):
    tokens, wall, cpu = result
    print(f"{mode:<11} {tokens:9d} tokens  wall {wall:7.3f} s {size / wall / 1e6:7.2f} MB/s "
          f"{tokens / wall:9.0f} tok/s  |  cpu {cpu:7.3f} s {size / cpu / 1e6:7.2f} MB/s "
          f"{tokens / cpu:9.0f} tok/s")


def measure(mode, size, repeat, encode):
    report(mode + " cold", size, time_once(encode))
    runs = [time_once(encode) for _ in range(repeat)]
    report(mode + " warm", size,
           (runs[0][0], min(r[1] for r in runs), min(r[2] for r in runs)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True,
                        help="folder holding tokenizer.json (or the file itself)")
    parser.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    path = pathlib.Path(args.tokenizer)
    if path.is_dir():
        path = path / "tokenizer.json"
    start = time.perf_counter()
    tok = tokenizers.Tokenizer.from_file(str(path))
    load = time.perf_counter() - start
    data = pathlib.Path(args.corpus).read_bytes()
    text = data.decode("utf-8")
    lines = text.split("\n")
    lines = [line + "\n" for line in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    print(f"tokenizer {args.tokenizer} (HF tokenizers {tokenizers.__version__}, loaded in "
          f"{load:.2f} s), corpus {args.corpus}: {len(data)} bytes, {len(lines)} lines, "
          f"1 thread, warm: best of {args.repeat}")
    # Lines first: the whole-text runs would otherwise warm the cache for them.
    measure("lines", len(data), args.repeat,
            lambda: sum(len(tok.encode(line, add_special_tokens=False).ids) for line in lines))
    measure("whole", len(data), args.repeat,
            lambda: len(tok.encode(text, add_special_tokens=False).ids))


if __name__ == "__main__":
    main()
