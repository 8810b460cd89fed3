"""The same held-out rounds replayed under more than one machine's cost curve: which lengths the stop rule picks
against the oracle's under each, and what that costs (issue 54: the Qwen pair on the Intel Xeon and the AMD EPYC).

    OMP_NUM_THREADS=1 python scripts/curve_replay.py --answers 3 --skip 1 --work runs/curve_replay \
        --curves docs/benchmarks/qwen_coder/cost_curves/intel_xeon.json docs/benchmarks/qwen_coder/cost_curves/amd_epyc.json \
        --out docs/benchmarks/qwen_coder/cost_curves/replay.json

Rounds: the target's greedy answers (64 tokens, as `examples/compare_stop_rules.py` decodes them) to BENCH-split chat
requests the pre-verifier was not trained on (`--skip` leaves out the first ones per category, which the measured
comparison times), traced teacher-forced along the answers with the shipped cheap draft (`collect_along_answers`,
24-token rounds), scored by the shipped greedy pre-verifier. Under each curve (`--curves`, recorded by
`scripts/record_cost_curve.py`) the simulator (`training.simulate`, in target steps, no loop overheads) scores fixed
γ, the shipped rule, the shipped rule's stopped rounds trimmed (`pacer_trim`), the rule with
`trim_failed_block` (`pacer_trimming_rule`: it also stops where proposing a prefix, none included, beats drafting
on) and the oracles, and counts the rounds by the length each picks.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from pacer_hf.costs import CostModel, cpu_name
from pacer_hf.costs.cost_model import recorded_calibration
from pacer_hf.data.chat_prompts import chat_prompts
from pacer_hf.pairs import load_pair
from pacer_hf.training import simulate
from pacer_hf.training.collect_answers import collect_along_answers
from pacer_hf.training.traces import load_traces
from pacer_hf.training.train import predict_probs, prepare

CATEGORIES = ("chat-humaneval", "chat-docstring", "chat-edit")


def answers(pair, per_category: int, skip: int, max_new_tokens: int, path: Path) -> list[dict]:
    """The target's greedy answers with their top-1 ids and log-probabilities (the loop's confidence feature; the
    draft recipe's agreement reads them too), cached."""
    if path.is_file():
        return json.loads(path.read_text())
    records = []
    for category in CATEGORIES:
        for prompt in chat_prompts(pair.tokenizer, category, "bench", n=skip + per_category)[skip:]:
            out = pair.target.generate(torch.tensor([list(prompt.ids)]), max_new_tokens=max_new_tokens,
                                       do_sample=False, output_logits=True, return_dict_in_generate=True)
            response = out.sequences[0, len(prompt.ids):].tolist()
            top = [torch.log_softmax(step[0].float(), -1).max(-1) for step in out.logits]
            records.append({"key": f"{category}:{prompt.id}", "prompt": list(prompt.ids), "response": response,
                            "top_logp": [[float(t.values)] for t in top], "top_ids": [[int(t.indices)] for t in top]})
            print(f"answered {category}:{prompt.id} ({len(response)} tokens)", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records))
    return records


def round_choices(lengths: np.ndarray, proposed: np.ndarray, accepted: np.ndarray, cap: int) -> dict:
    """How a rule's rounds compare with the stop-only oracle's (drafts up to and including the first miss)."""
    oracle = np.minimum(accepted + 1, cap)
    return {"drafted": dict(sorted(Counter(lengths.tolist()).items())),
            "proposed": dict(sorted(Counter(proposed.tolist()).items())),
            "vs_oracle": {"shorter": int((lengths < oracle).sum()), "equal": int((lengths == oracle).sum()),
                          "longer": int((lengths > oracle).sum())}}


def replay(acc: np.ndarray, probs: np.ndarray, costs: CostModel, cap: int) -> dict:
    """Simulated speedups (× the target alone, in target steps) and per-round choices under one curve."""
    hard = np.cumprod(acc, axis=1)
    accepted = hard.sum(1).astype(np.int64)
    speed = {"fixed": {g: round(simulate.speedup(acc, simulate.fixed_lengths(acc, g), costs), 4) for g in range(1, cap + 1)}}
    out = {"speedup": speed}  # × the target alone, in target steps
    oracle = np.minimum(accepted + 1, cap)
    speed["oracle"] = round(simulate.speedup(acc, oracle, costs), 4)
    speed["oracle_trim"] = round(simulate.speedup(acc, oracle, costs, proposed=np.minimum(accepted, cap)), 4)
    lengths = simulate.pacer_lengths(probs, 1, None, "expected_gain", cap, costs)
    speed["pacer"] = round(simulate.speedup(acc, lengths, costs, preverifier=True), 4)
    trimmed = simulate.trimmed_lengths(probs, lengths, costs)
    speed["pacer_trim"] = round(simulate.speedup(acc, lengths, costs, preverifier=True, proposed=trimmed), 4)
    drafted = simulate.pacer_lengths(probs, 1, None, "expected_gain", cap, costs, trim=True)
    proposed = simulate.trimmed_lengths(probs, drafted, costs)
    speed["pacer_trimming_rule"] = round(simulate.speedup(acc, drafted, costs, preverifier=True, proposed=proposed), 4)
    out["pacer_trimming_rule_choices"] = round_choices(drafted, proposed, accepted, cap)
    best = max(speed["fixed"], key=speed["fixed"].get)
    out["best_fixed"] = {"gamma": best, "speedup": speed["fixed"][best]}
    fixed, gamma = max((speed["fixed"][g], g) for g in (2, 4, 6, 8) if g <= cap)
    out["best_fixed_2468"] = {"gamma": gamma, "speedup": fixed}
    out["ratio_over_best_fixed_2468"] = {name: round(speed[name] / fixed, 4)
                                         for name in ("pacer", "pacer_trim", "pacer_trimming_rule", "oracle", "oracle_trim")}
    out["pacer_choices"] = round_choices(lengths, lengths, accepted, cap)
    out["pacer_trim_choices"] = round_choices(lengths, trimmed, accepted, cap)
    out["oracle_choices"] = round_choices(oracle, oracle, accepted, cap)
    # what the rule's rounds cost against the oracle's, split by the length the rule drafted
    time = costs.round_time(lengths) + lengths * costs.preverifier_cost
    tokens = simulate.expected_accepted(acc, lengths) + 1
    by_length = {}
    for n in sorted(set(lengths.tolist())):
        rows = lengths == n
        by_length[n] = {"rounds": int(rows.sum()), "tokens_per_step": round(float(tokens[rows].sum() / time[rows].sum()), 3),
                        "first_token_rejected": int((accepted[rows] == 0).sum())}
    out["pacer_by_length"] = by_length
    out["first_token_rejected_share"] = round(float((accepted == 0).mean()), 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=3, help="answers per code chat category")
    parser.add_argument("--skip", type=int, default=1, help="BENCH prompts per category left out (timed elsewhere)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--work", default="runs/curve_replay")
    parser.add_argument("--curves", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = load_pair("qwen2.5-coder")
    work = Path(args.work)
    records = answers(pair, args.answers, args.skip, args.max_new_tokens, work / "answers.json")
    cap = pair.preverifier.config.max_draft_tokens
    traces = work / "traces"
    if not (traces / "manifest.json").is_file():
        collect_along_answers(pair.draft, records, traces, max_draft_tokens=cap, teacher_forced=True, overwrite=True)
    probs, labels = predict_probs(pair.preverifier, prepare(load_traces(str(traces))))
    acc = simulate.acceptance_matrix(labels)
    result = {"command": " ".join(["OMP_NUM_THREADS=1", "python", *sys.argv]), "machine": cpu_name(),
              "answers": [r["key"] for r in records], "rounds": len(acc), "cap": cap, "curves": {}}
    for path in args.curves:
        calibration = recorded_calibration(path)
        if calibration is None:
            continue  # a verify curve without a draft step cannot price a round
        costs = CostModel.from_calibration(calibration)
        result["curves"][path] = replay(acc, probs, costs, cap)
        row = result["curves"][path]
        speed = row["speedup"]
        print(f"{path}: pacer {speed['pacer']}x, trim {speed['pacer_trim']}x, best fixed {row['best_fixed']}, "
              f"fixed 2/4/6/8 {[speed['fixed'][g] for g in (2, 4, 6, 8)]}, oracle {speed['oracle']}x, "
              f"oracle-trim {speed['oracle_trim']}x, trimming rule {speed['pacer_trimming_rule']}x", flush=True)
    result["mean_acceptance_first_token"] = round(float(acc[:, 0].mean()), 4) if len(acc) else math.nan
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
