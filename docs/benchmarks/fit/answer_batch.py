"""Throughput of the fit's answer stage at several batch sizes, on the same prompts (the fit's default prompt set:
one block of training prompts, sorted by length as `fit_data._batches` sorts them).

    OMP_NUM_THREADS=1 python docs/benchmarks/fit/answer_batch.py --target DIR --out results.json
"""

import argparse
import json
import platform
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pacer_hf.costs import processor_name
from pacer_hf.training.fit_data import _batches, _eos_ids, answer_batch, build_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--sizes", default="16,8,4")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    train = [r for r in build_prompts(tokenizer) if not r["heldout"]]
    prompts = [r["prompt"] for r in _batches(train, max(sizes))[0]]
    eos, pad = _eos_ids(model.generation_config.eos_token_id), tokenizer.pad_token_id
    rows = []
    with torch.no_grad():
        answer_batch(model, prompts[:2], 8, pad, eos, False)  # warm-up
        for size in sizes:
            start, tokens = time.perf_counter(), 0
            for i in range(0, len(prompts), size):
                tokens += sum(len(a["response"]) for a in answer_batch(model, prompts[i:i + size],
                                                                       args.max_new_tokens, pad, eos, False))
            seconds = time.perf_counter() - start
            rows.append({"batch_size": size, "seconds": round(seconds, 1), "answer_tokens": tokens,
                         "tokens_per_s": round(tokens / seconds, 2)})
            print(rows[-1], flush=True)
    result = {"target": args.target, "prompts": len(prompts), "prompt_tokens": sorted(map(len, prompts)),
              "max_new_tokens": args.max_new_tokens, "greedy": True, "dtype": "float32", "threads": args.threads,
              "processor": processor_name(), "platform": platform.platform(), "torch": torch.__version__, "rows": rows}
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
