"""Interleaved A/B of stop rules on the benchmark's greedy prompts: fixed γ against pre-verifiers.

    python examples/compare_stop_rules.py hub_cards/demo-preverifier /path/to/other-preverifier --runs 2

Every setting decodes every prompt once per run, interleaved (so machine load hits them alike), and every
output is checked against plain decoding. Prints tokens/s and speed over the target alone per category,
the median over categories, and each pre-verifier's speed over the best fixed γ of the same category;
writes them as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import pacer_hf
from pacer_hf.bench.prompts import CATEGORIES, build_prompts
from pacer_hf.pairs import load_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preverifiers", nargs="*", help="pre-verifier folders")
    parser.add_argument("--gammas", default="1,2,3,4")
    parser.add_argument("--prompts", type=int, default=3, help="prompts per category")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair("stdlib")
    target, draft, tokenizer = pacer_hf.enable(pair.target), pair.draft, pair.tokenizer
    prompts, _ = build_prompts(list(CATEGORIES), lambda text: tokenizer(text).input_ids, args.prompts, 256,
                               target_dir=pair.target.name_or_path)
    settings = {"ar": None, **{f"sd-fixed-{g}": f"sd-fixed-{g}" for g in args.gammas.split(",")}}
    settings.update({path: pacer_hf.PacerPreVerifier.from_pretrained(path) for path in args.preverifiers})
    tokens = {(c, name): 0 for c in prompts for name in settings}
    seconds, drafted = dict.fromkeys(tokens, 0.0), {key: [] for key in tokens}
    for _ in range(args.runs):
        for category, chosen in prompts.items():
            for prompt in chosen:
                ids, expected = torch.tensor([prompt.ids]), None
                for name, pacer in settings.items():
                    start = time.perf_counter()
                    out = target.generate(ids, max_new_tokens=args.max_new_tokens, do_sample=False,
                                          assistant_model=draft if pacer else None, pacer=pacer)
                    seconds[category, name] += time.perf_counter() - start
                    tokens[category, name] += out.shape[1] - ids.shape[1]
                    drafted[category, name].append(pacer_hf.last_stats(target).mean_draft_len if pacer else 0.0)
                    expected = out if expected is None else expected
                    if not torch.equal(out, expected):
                        raise AssertionError(f"{name} changed the output of a {category} prompt")
    results = {}
    for category in prompts:
        speed = {name: tokens[category, name] / seconds[category, name] for name in settings}
        best_fixed = max(v for k, v in speed.items() if k.startswith("sd-fixed"))
        for name in settings:
            results.setdefault(name, {})[category] = {
                "tokens_per_s": speed[name], "vs_ar": speed[name] / speed["ar"], "vs_best_fixed": speed[name] / best_fixed,
                "mean_draft": statistics.mean(drafted[category, name])}
            print(f"{category:<20} {name:<40} {speed[name]:6.1f} tok/s  {speed[name] / speed['ar']:.3f}x ar  "
                  f"{speed[name] / best_fixed:.3f}x best fixed  mean draft {results[name][category]['mean_draft']:.2f}")
    print("median over categories (x ar, x best fixed γ of the category):")
    for name, rows in results.items():
        print(f"  {name:<40} {statistics.median(r['vs_ar'] for r in rows.values()):.3f}x  "
              f"{statistics.median(r['vs_best_fixed'] for r in rows.values()):.3f}x")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
