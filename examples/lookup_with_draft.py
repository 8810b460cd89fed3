"""Prompt lookup with a draft model too, on SmolLM2-135M-Instruct: is the draft worth having next to lookup?

    OMP_NUM_THREADS=1 python examples/lookup_with_draft.py --draft PATH --out lookup_with_draft.json

Greedy, interleaved per prompt, every output checked identical to the target alone:
  ar                 the target alone
  sd-fixed-<γ>       the draft alone (pacer_hf's loop)
  pacer-lookup       Pacer-gated prompt lookup, no draft (the gate load_pair attaches)
  lookup+draft       the same gate; in rounds where it proposes no lookup token, the draft drafts γ tokens
                     (generate(assistant_model=draft, prompt_lookup_num_tokens=10, pacer=LookupConfig(...)))
`--draft` is a SmolLM2 draft folder (e.g. the one `pacer-hf build-draft` writes); none ships yet.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import pacer_hf
from pacer_hf.data.chat_prompts import chat_prompts
from pacer_hf.pairs import load_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", required=True, help="a draft folder for SmolLM2-135M-Instruct")
    parser.add_argument("--gamma", type=int, default=3, help="draft tokens per round (sd-fixed and lookup+draft)")
    parser.add_argument("--categories", default="chat-extract,chat-qa,chat-humaneval")
    parser.add_argument("--prompts", type=int, default=2, help="bench-split prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--out", default=None, help="write the numbers here as JSON")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    pair = load_pair("smollm2")
    draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
    pacer_hf.generate_checks.check_vocabularies(pair.target, draft, "pass a draft built for SmolLM2-135M-Instruct.")
    settings = {
        "ar": {"pacer": None},
        f"sd-fixed-{args.gamma}": {"pacer": f"sd-fixed-{args.gamma}", "assistant_model": draft},
        "pacer-lookup": {"pacer": True, "prompt_lookup_num_tokens": 10},
        "lookup+draft": {"pacer": pacer_hf.LookupConfig(use_gate=True, draft_tokens=args.gamma),
                         "prompt_lookup_num_tokens": 10, "assistant_model": draft},
    }
    results: dict[str, dict] = {}
    for category in args.categories.split(","):
        prompts = chat_prompts(pair.tokenizer, category, "bench", n=args.prompts)
        tokens, seconds, rounds = dict.fromkeys(settings, 0), dict.fromkeys(settings, 0.0), dict.fromkeys(settings, 0)
        for prompt in prompts:
            ids = torch.tensor([prompt.ids])
            expected = None
            for name, kwargs in settings.items():
                start = time.perf_counter()
                out = pair.target.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False, **kwargs)
                seconds[name] += time.perf_counter() - start
                tokens[name] += out.shape[1] - ids.shape[1]
                stats = pacer_hf.last_stats(pair.target) if kwargs["pacer"] is not None else None
                rounds[name] += stats.target_forwards if stats else out.shape[1] - ids.shape[1]
                expected = out if expected is None else expected
                if not torch.equal(out, expected):
                    raise SystemExit(f"{name} differs from ar on {prompt.id}: not lossless")
        ar = tokens["ar"] / seconds["ar"]
        results[category] = {name: {"tokens_per_s": round(tokens[name] / seconds[name], 2),
                                    "vs_ar": round(tokens[name] / seconds[name] / ar, 3),
                                    "tau": round(tokens[name] / rounds[name], 2)} for name in settings}
        print(category, json.dumps(results[category]))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"args": vars(args), "results": results}, handle, indent=1)


if __name__ == "__main__":
    main()
