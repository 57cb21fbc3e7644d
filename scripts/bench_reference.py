#!/usr/bin/env python3
"""Times the reference kernels on the shapes of `lair bench kernels`.

fla (flash-linear-attention) chunk_gla, chunk_simple_gla and chunk_gsa, and
mlstm_kernels' TFLA kernels (chunkwise--triton_xl_chunk for the exponential
gate, chunkwise--triton_xl_chunk_siging for the sigmoid gate), bf16 inputs,
B*T = 65,536 tokens, H = 16, K = V = 128 (GSA: 64 slots), forward and
forward+backward, median of triton.testing.do_bench. A kernel that raises is
reported as REFUSED with the exception's first line, never skipped silently;
scripts/gpu-check.sh runs one (op, mode) per process under a time limit and
reports TIMEOUT for one that hangs (compiling or autotuning past the limit).

Prints one line per measurement: `ref <op> T=<T> <fwd|fwdbwd> <ms>` or
`ref <op> T=<T> <fwd|fwdbwd> REFUSED <reason>`.
"""
import argparse
import traceback

import torch
import torch.nn.functional as F
import triton


def bench(fn, warmup_ms, rep_ms):
    return triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=65536)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--slots", type=int, default=64)
    ap.add_argument("--seq-lens", default="1024,4096,16384")
    ap.add_argument("--warmup-ms", type=float, default=50)
    ap.add_argument("--rep-ms", type=float, default=300)
    ap.add_argument("--ops", default="gla,simple_gla,gsa,mlstm_exp,mlstm_sig")
    ap.add_argument("--modes", default="fwd,fwdbwd")
    args = ap.parse_args()
    dev = "cuda"
    H, D, M = args.heads, args.dim, args.slots
    bf = torch.bfloat16
    print(f"ref device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")

    def ops(B, T):
        def rnd(*shape, dtype=bf):
            return torch.randn(*shape, device=dev, dtype=dtype)

        def gla():
            from fla.ops.gla import chunk_gla
            q, k, v = rnd(B, T, H, D), rnd(B, T, H, D), rnd(B, T, H, D)
            g = F.logsigmoid(rnd(B, T, H, D, dtype=torch.float32)) / 16
            return (lambda q, k, v, g: chunk_gla(q, k, v, g, scale=D ** -0.5)[0]), [q, k, v, g]

        def simple_gla():
            from fla.ops.simple_gla import chunk_simple_gla
            q, k, v = rnd(B, T, H, D), rnd(B, T, H, D), rnd(B, T, H, D)
            g = F.logsigmoid(rnd(B, T, H, dtype=torch.float32)) / 16
            return (lambda q, k, v, g: chunk_simple_gla(q, k, v, g, scale=D ** -0.5)[0]), [q, k, v, g]

        def gsa():
            from fla.ops.gsa import chunk_gsa
            q, k, v = rnd(B, T, H, D), rnd(B, T, H, D), rnd(B, T, H, D)
            g = F.logsigmoid(rnd(B, T, H, M, dtype=torch.float32)) / 8
            s = (1 - g.exp()).to(bf)
            return (lambda q, k, v, s, g: chunk_gsa(q, k, v, s, g, scale=D ** -0.5)[0]), [q, k, v, s, g]

        def mlstm(name):
            def make():
                from mlstm_kernels.torch import get_mlstm_kernel
                kern = get_mlstm_kernel(name)
                q, k, v = rnd(B, H, T, D), rnd(B, H, T, D), rnd(B, H, T, D)
                i = rnd(B, H, T, dtype=torch.float32)
                f = 3.0 + rnd(B, H, T, dtype=torch.float32)
                return (lambda q, k, v, i, f: kern(q, k, v, i, f)), [q, k, v, i, f]
            return make

        return [("gla", gla), ("simple_gla", simple_gla), ("gsa", gsa),
                ("mlstm_exp", mlstm("chunkwise--triton_xl_chunk")),
                ("mlstm_sig", mlstm("chunkwise--triton_xl_chunk_siging"))]

    for T in [int(x) for x in args.seq_lens.split(",")]:
        B = args.tokens // T
        for name, make in ops(B, T):
            if name not in args.ops.split(","):
                continue
            for mode in args.modes.split(","):
                try:
                    fn, inputs = make()
                    if mode == "fwd":
                        with torch.no_grad():
                            ms = bench(lambda: fn(*inputs), args.warmup_ms, args.rep_ms)
                    else:
                        leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
                        out = fn(*leaves)
                        do = torch.randn_like(out)

                        def step():
                            for x in leaves:
                                x.grad = None
                            fn(*leaves).backward(do)
                        ms = bench(step, args.warmup_ms, args.rep_ms)
                    print(f"ref {name} T={T} {mode} {ms:.3f}", flush=True)
                except Exception as e:  # report the refusal, keep going
                    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
                    print(f"ref {name} T={T} {mode} REFUSED {type(e).__name__}: {first}", flush=True)
                    traceback.print_exc(limit=2)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
