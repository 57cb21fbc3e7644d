#!/usr/bin/env python3
"""The anchor of issue 6: Hugging Face `generate` with flash-linear-attention.

Builds a randomly initialised fla GLA model of the GLA 1.3B shape (the shape of
`lair init --preset gla-1.3b`: hidden 2048, 24 layers, 4 heads, vocabulary
32000), in bf16 on the GPU, and times greedy `generate` of --gen-len tokens
after a random prompt of --prompt-len tokens, at each batch size. The timed
region is the whole generate call (prefill included, as the anchor figures
count it), after one untimed warm-up call that compiles the Triton kernels.

Prints one line per batch size:
  `hf <model> batch=<B> prompt=<P> gen=<G> <tokens/s> tok/s <ms> ms/step`
or `hf <model> batch=<B> REFUSED <reason>` when fla or transformers refuse.
"""
import argparse
import time
import traceback

import torch


def build_model(args):
    from fla.models import GLAConfig, GLAForCausalLM

    config = GLAConfig(hidden_size=args.hidden, num_hidden_layers=args.layers,
                       num_heads=args.heads, vocab_size=args.vocab)
    torch.manual_seed(0)
    model = GLAForCausalLM(config).to(device="cuda", dtype=torch.bfloat16)
    return model.eval()


def time_generate(model, batch, args):
    prompt = torch.randint(0, args.vocab, (batch, args.prompt_len), device="cuda")
    kwargs = dict(max_new_tokens=args.gen_len, min_new_tokens=args.gen_len, do_sample=False,
                  use_cache=True, pad_token_id=0)
    with torch.inference_mode():
        model.generate(prompt, **kwargs)  # compiles and autotunes the kernels
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(prompt, **kwargs)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    generated = out.shape[1] - args.prompt_len
    return batch * generated / seconds, 1e3 * seconds / generated


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    args = ap.parse_args()
    name = f"gla-{args.hidden}x{args.layers}"
    try:
        model = build_model(args)
    except Exception as e:  # report the refusal, never skip silently
        print(f"hf {name} batch=all REFUSED {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        traceback.print_exc()
        return
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters", flush=True)
    for batch in (int(b) for b in args.batches.split(",")):
        try:
            tok_s, ms_step = time_generate(model, batch, args)
            print(f"hf {name} batch={batch} prompt={args.prompt_len} gen={args.gen_len} "
                  f"{tok_s:.1f} tok/s {ms_step:.2f} ms/step", flush=True)
        except Exception as e:
            print(f"hf {name} batch={batch} REFUSED {type(e).__name__}: {str(e).splitlines()[0][:200]}")
            traceback.print_exc()


if __name__ == "__main__":
    main()
