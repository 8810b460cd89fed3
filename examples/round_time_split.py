"""Where a speculative call's time goes on the demo pair: the target's verify forwards (timed with forward hooks,
by width) against everything else (drafting, the stop rule, the loop's bookkeeping).

    python examples/round_time_split.py --pacer sd-fixed-7
    python examples/round_time_split.py                      # the shipped pre-verifier

One warm-up pass over the prompts, then one timed pass; 1 torch thread, greedy.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

import pacer_hf
from pacer_hf.data.prompts import humaneval_prompts
from pacer_hf.pairs import load_demo_pair, load_demo_preverifier


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pacer", default=None, help="a strategy name (e.g. sd-fixed-7); default: the pre-verifier")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, draft, tokenizer = load_demo_pair()[:3]
    pacer = args.pacer or load_demo_preverifier(draft)[0]
    target = pacer_hf.enable(target)
    forwards: dict[int, list[float]] = defaultdict(list)
    prefill: list[float] = []
    started = {"first": False}

    def before(module, args_, kwargs):
        started["t"], started["width"] = time.perf_counter(), kwargs["input_ids"].shape[1]

    def after(module, args_, kwargs, output):
        seconds = time.perf_counter() - started["t"]
        if started["first"]:  # a call's first target forward reads the prompt
            prefill.append(seconds)
            started["first"] = False
        else:
            forwards[started["width"]].append(seconds)

    target.register_forward_pre_hook(before, with_kwargs=True)
    target.register_forward_hook(after, with_kwargs=True)
    texts = humaneval_prompts(args.prompts)

    def one_pass() -> tuple[int, float, int]:
        tokens, seconds, drafted = 0, 0.0, 0
        for text in texts:
            ids = tokenizer(text, return_tensors="pt")
            started["first"], start = True, time.perf_counter()
            out = target.generate(**ids, assistant_model=draft, pacer=pacer, do_sample=False,
                                  max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.eos_token_id)
            seconds += time.perf_counter() - start
            tokens += out.shape[1] - ids["input_ids"].shape[1]
            drafted += sum(pacer_hf.last_stats(target).draft_lengths)
        return tokens, seconds, drafted

    one_pass()
    forwards.clear()
    prefill.clear()
    tokens, seconds, drafted = one_pass()
    verify = dict(forwards)
    verify_s = sum(sum(v) for v in verify.values())
    rounds = sum(len(v) for v in verify.values())
    rest = seconds - verify_s - sum(prefill)
    print(f"{args.pacer or 'pacer'}: {tokens / seconds:.1f} tok/s, {rounds} rounds, {drafted} drafted tokens")
    print(f"verify forwards {verify_s:.3f} s; everything else (prefill excluded) {rest:.3f} s = "
          f"{1000 * rest / rounds:.2f} ms per round, {1000 * rest / max(drafted, 1):.2f} ms per drafted token")
    print("verify forward by width (tokens: calls, median ms): " + ", ".join(
        f"{w}: {len(v)}, {1000 * sorted(v)[len(v) // 2]:.2f}" for w, v in sorted(verify.items())))


if __name__ == "__main__":
    main()
