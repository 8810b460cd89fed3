"""Quick τ check: sd-fixed-γ vs ouroboros (cold and warm pool) on held-out source files.

    python scripts/ouroboros_tau.py --target runs/tiny/target --draft runs/tiny/draft \
        --files runs/tiny/heldout.txt --prompts 6 --prompt-tokens 128 --new-tokens 96

Greedy by default (every strategy's output is checked against sd-fixed, all are exact, so a mismatch
aborts), or sampling with --temperature. CPU, one thread. τ = new tokens / target forwards (docs/ALGORITHM.md §5).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import pacer_hf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True, help="a model folder, or noisy:<scale> for a perturbed copy of the target")
    parser.add_argument("--files", required=True, help="a text file listing one source file per line")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--preverifier", help="a trained pre-verifier for the draft: adds pacer and pacer+ouroboros")
    parser.add_argument("--temperature", type=float, default=0.0, help="> 0: sample (outputs then differ per strategy)")
    parser.add_argument("--variants", action="store_true", help="also run pool variants (no prompt, +target tail)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = pacer_hf.enable(AutoModelForCausalLM.from_pretrained(args.target).eval())
    if args.draft.startswith("noisy:"):  # a stand-in for a well-aligned draft: the target, perturbed
        draft = AutoModelForCausalLM.from_pretrained(args.target).eval()
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in draft.parameters():
                param.add_(float(args.draft[6:]) * param.std() * torch.randn(param.shape, generator=generator))
    else:
        draft = AutoModelForCausalLM.from_pretrained(args.draft).eval()
    files = [line.strip() for line in Path(args.files).read_text().splitlines() if line.strip()]
    prompts = []
    for name in files[: args.prompts]:
        ids = tokenizer(Path(name).read_text(errors="replace"), return_tensors="pt").input_ids
        prompts.append(ids[:, : args.prompt_tokens])
    gamma = {"ouroboros": {"draft_tokens": args.gamma}}
    strategies = [
        (f"sd-fixed-{args.gamma}", f"sd-fixed-{args.gamma}", {}, False),
        ("ouroboros cold", "ouroboros", gamma, True),
        ("ouroboros warm", "ouroboros", gamma, False),
    ]
    if args.variants:
        strategies += [
            ("ouroboros warm, no prompt", "ouroboros", {"ouroboros": {**gamma["ouroboros"], "from_prompt": False}},
             False),
            ("ouroboros warm, +target tail", "ouroboros", {"ouroboros": {**gamma["ouroboros"],
                                                                       "from_target_tail": True}}, False),
        ]
    if args.preverifier:
        pacer_hf.attach(draft, pacer_hf.load_preverifier(args.preverifier).eval())
        strategies += [("pacer", True, {}, False), ("pacer+ouroboros cold", "pacer+ouroboros", {}, True),
                       ("pacer+ouroboros warm", "pacer+ouroboros", {}, False)]
    reference = {}
    for label, pacer, extra, cold in strategies:
        pacer_hf.reset_phrase_pool(target)
        new = forwards = pool_acc = pool_prop = 0
        start = time.perf_counter()
        for i, ids in enumerate(prompts):
            if cold:
                pacer_hf.reset_phrase_pool(target)
            torch.manual_seed(i)
            sampling = {"do_sample": True, "temperature": args.temperature, "top_k": 0} if args.temperature else {
                "do_sample": False}
            out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                                  assistant_model=draft, pacer=pacer, **sampling, **extra)
            if i in reference and not args.temperature:
                assert torch.equal(out, reference[i]), f"{label}: output differs on prompt {i}"
            reference[i] = out
            stats = pacer_hf.last_stats(target)
            new += stats.new_tokens
            forwards += stats.target_forwards
            pool_acc += sum(getattr(stats, "pool_accepted", []))
            pool_prop += sum(getattr(stats, "pool_lengths", []))
        seconds = time.perf_counter() - start
        print(f"{label:30s} tau={new / forwards:.2f}  tokens/s={new / seconds:6.1f}  "
              f"pool accepted/proposed={pool_acc}/{pool_prop}", flush=True)


if __name__ == "__main__":
    main()
