"""The expected-gain rule with the pre-verifier recalibrated online, replayed on recorded rounds.

    OMP_NUM_THREADS=1 python scripts/online_offset_replay.py runs/default_pv/traces/qwen-int8-greedy \
        hub_cards/qwen-coder-preverifier docs/benchmarks/qwen_coder/cost_curves/amd_epyc.json \
        docs/benchmarks/qwen_coder/cost_curves/intel_xeon.json --out docs/benchmarks/online_offset/qwen_shipped.json

The question: a pre-verifier that over- or under-predicts on a kind of text (a category its training data lacked, a
pair it never saw) would draft better if a logit offset learned from the call's own verdicts corrected it. Each round
is decided with the offset so far (`simulate.pacer_lengths`, block size from the pre-verifier's config), then the
offset takes one gradient step of the log-loss per token the round observed (the accepted ones and the first
rejected: what a stop-only round learns), learning rate `lr`. At each new text the offset is multiplied by `keep`
(0: every call starts from the pre-verifier as trained; 1: the pair's offset carries over). Speeds are simulated
(`training.simulate`, target steps) under each cost file given (`scripts/record_cost_curve.py`, or a pre-verifier
folder as `cal:FOLDER` for its stored calibration); per category with `keep` = 0.
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from pacer_hf.costs import CostModel
from pacer_hf.modeling_pacer import PacerPreVerifier
from pacer_hf.training import simulate
from pacer_hf.training.fit_train import fine_tune_start
from pacer_hf.training.traces import load_traces, read_manifest
from pacer_hf.training.train import predict_probs, prepare

RATES = (0.03, 0.1, 0.3)
KEEPS = (1.0, 0.5, 0.0)


def online_lengths(probs: np.ndarray, acc: np.ndarray, texts: np.ndarray, costs: CostModel, block_size: int,
                   lr: float, keep: float) -> np.ndarray:
    logits = np.log(np.clip(probs, 1e-6, 1 - 1e-6)) - np.log(np.clip(1 - probs, 1e-6, 1))
    lengths, offset, text = np.zeros(len(probs), dtype=np.int64), 0.0, None
    for r in range(len(probs)):
        if texts[r] != text:
            offset, text = offset * keep, texts[r]
        row = 1 / (1 + np.exp(-(logits[r:r + 1] + offset)))
        n = int(simulate.pacer_lengths(row, block_size, 0.0, "expected_gain", costs=costs)[0])
        lengths[r] = n
        accepted = int(np.cumprod(acc[r, :n]).sum())
        for i in range(min(n, accepted + 1)):  # what a stop-only round observes
            offset += lr * ((1.0 if i < accepted else 0.0) - row[0, i])
    return lengths


def cost_model(source: str, preverifier: PacerPreVerifier) -> CostModel:
    if source == "own":
        calibration = preverifier.config.calibration
    elif source.startswith("cal:"):
        calibration = PacerPreVerifier.from_pretrained(source[4:]).config.calibration
    else:
        calibration = json.loads(open(source).read())["costs"]
    return CostModel.from_calibration({**calibration, "preverifier_cost": calibration.get("preverifier_cost") or 0.0})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces")
    parser.add_argument("preverifier")
    parser.add_argument("costs", nargs="+", help="cost curve JSON files, `own` or `cal:FOLDER`")
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    preverifier = PacerPreVerifier.from_pretrained(args.preverifier).eval()
    manifest, data = read_manifest(args.traces), load_traces(args.traces)
    if manifest["config"]["max_draft_tokens"] > preverifier.config.max_draft_tokens:  # positions past its last
        preverifier = fine_tune_start(preverifier, manifest, manifest["config"]["max_draft_tokens"]).eval()
    categories = np.array([e.split("@")[0].split("/")[0] for e in data["example_id"]])
    texts = np.array(data["text_id"])
    probs, labels = predict_probs(preverifier, prepare(data))
    acc = simulate.acceptance_matrix(labels)
    block = preverifier.config.block_size
    out = {"traces": args.traces, "preverifier": args.preverifier, "rounds": len(acc), "costs": {}}
    for source in args.costs:
        costs = cost_model(source, preverifier)
        base = simulate.pacer_lengths(probs, block, 0.0, "expected_gain", costs=costs)
        hard_lengths, hard = simulate.oracle_lengths(acc)
        row = {"oracle": simulate.speedup(hard, hard_lengths, costs),
               "pacer": simulate.speedup(acc, base, costs, preverifier=True)}
        for lr in RATES:
            for keep in KEEPS:
                lengths = online_lengths(probs, acc, texts, costs, block, lr, keep)
                row[f"online lr={lr} keep={keep}"] = simulate.speedup(acc, lengths, costs, preverifier=True)
        by_category = {}
        for category in sorted(set(categories)):
            m = categories == category
            cat = {"pacer": simulate.speedup(acc[m], base[m], costs, preverifier=True)}
            for lr in (0.1, 0.3):
                lengths = online_lengths(probs[m], acc[m], texts[m], costs, block, lr, 0.0)
                cat[f"online lr={lr} keep=0.0"] = simulate.speedup(acc[m], lengths, costs, preverifier=True)
            by_category[category] = {k: round(v, 4) for k, v in cat.items()}
        out["costs"][source] = {"speedup": {k: round(v, 4) for k, v in row.items()}, "speedup_by_category": by_category}
        print(source, json.dumps(out["costs"][source]["speedup"]))
        for category, cat in by_category.items():
            print(f"  {category}: {cat}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(out, handle, indent=1)


if __name__ == "__main__":
    main()
