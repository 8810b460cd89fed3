"""What a gated-lookup round that proposes nothing costs, against transformers' own sampling step.

At T = 1 a lookup gate mostly proposes nothing, so a round with k = 0 must cost what one plain decoding step
costs, or gated lookup loses to the target alone exactly where it should tie. This times, interleaved, on
SmolLM2-135M-Instruct at T = 1 (same seed per prompt):
  plain        generate(do_sample=True), transformers' sampling loop;
  k0-lean      prompt lookup + the default gate with costs that never let it propose (pacer_costs=[1, 100, ...]):
               every round runs the lookup search, the gate and pacer_hf's lean loop, and verifies one token;
  k0-hf-loop   the same through transformers' _assisted_decoding (pacer_loop="transformers").
Prints and saves ms per token: per prompt the fastest of --runs (the least disturbed), then the median over
prompts of each kind's ratio to plain on the same prompt, to --out.

    OMP_NUM_THREADS=1 python scripts/lookup_zero_round_bench.py --out docs/benchmarks/lookup_zero_round
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import pacer_hf
from pacer_hf.costs import processor_name
from pacer_hf.data.chat_prompts import chat_prompts
from pacer_hf.pairs import load_pair

NEVER = [1.0] + [100.0] * 10  # proposing any lookup token costs 100 plain steps: the gate proposes none


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--categories", default="chat-qa,chat-rewrite,chat-humaneval")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair("smollm2")
    target = pair.target
    prompts = [torch.tensor([chat_prompts(pair.tokenizer, c, "bench", n=1)[0].ids]) for c in args.categories.split(",")]
    gate = pacer_hf.default_lookup_gate()
    kinds = {
        "plain": {"pacer": None},
        "k0-lean": {"prompt_lookup_num_tokens": 10, "pacer": gate, "pacer_costs": NEVER},
        "k0-hf-loop": {"prompt_lookup_num_tokens": 10, "pacer": gate, "pacer_costs": NEVER,
                       "pacer_loop": "transformers"},
    }
    n = args.max_new_tokens
    seconds: dict[str, list[list[float]]] = {k: [[] for _ in prompts] for k in kinds}
    gate_share: list[float] = []

    def call(kind: str, ids: torch.Tensor, seed: int) -> float:
        torch.manual_seed(seed)
        start = time.perf_counter()
        target.generate(ids, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=n, min_new_tokens=n,
                        **kinds[kind])
        elapsed = time.perf_counter() - start
        if kind != "plain":
            stats = pacer_hf.last_stats(target)
            assert sum(stats.draft_lengths) == 0, "the gate proposed lookup tokens"
            gate_share.append(stats.preverifier_seconds / elapsed)
        return elapsed / n

    for kind in kinds:  # warm-up
        call(kind, prompts[0], 0)
    for _ in range(args.runs):
        for p, ids in enumerate(prompts):
            for kind in kinds:
                seconds[kind][p].append(call(kind, ids, p))
    best = {kind: [min(v) for v in per_prompt] for kind, per_prompt in seconds.items()}
    result = {kind: {"ms_per_token_per_prompt": [round(1000 * x, 2) for x in best[kind]],
                     "vs_plain": round(statistics.median(a / b for a, b in zip(best["plain"], best[kind])), 3),
                     "all": [[round(1000 * x, 2) for x in v] for v in seconds[kind]]} for kind in kinds}
    summary = {"results": result, "lookup_search_and_gate_share": round(statistics.median(gate_share), 4),
               "max_new_tokens": n, "runs": args.runs, "categories": args.categories,
               "machine": processor_name(), "threads": 1,
               "torch": torch.__version__, "transformers": __import__("transformers").__version__}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    for kind, row in result.items():
        print(f"{kind:12s} ms/token per prompt {row['ms_per_token_per_prompt']}  speed vs plain {row['vs_plain']:.3f}")
    print(f"lookup search + gate: {100 * summary['lookup_search_and_gate_share']:.2f} % of decode time")


if __name__ == "__main__":
    main()
