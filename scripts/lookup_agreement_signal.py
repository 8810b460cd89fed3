"""Is there acceptance signal the pre-verifier does not read? Whether each drafted token agrees with prompt lookup.

For every held-out round along the target's greedy answers (`collect_along_answers` traces) and every drafted token
before the first rejection, the longest suffix (n <= 3 tokens) of the context so far (the answer up to the round,
then the tokens drafted before this one) that occurred earlier, and whether the drafted token equals what followed
its newest occurrence. Prints acceptance and the pre-verifier's prediction split by that, and the AUC of a logistic
regression on the pre-verifier's log-odds alone and with the lookup features (fitted on even rounds, scored on odd
ones), and the `expected_gain` rule simulated on the odd rounds with each under the pre-verifier's calibrated costs.
Needs scikit-learn (the `bench` extra).

    python scripts/lookup_agreement_signal.py --preverifier hub_cards/demo-preverifier \\
        --traces runs/demo_pair/onpolicy/traces-heldout --answers runs/demo_pair/onpolicy/responses.jsonl
    python scripts/lookup_agreement_signal.py --preverifier hub_cards/qwen-coder-preverifier \\
        --traces runs/curve_replay/traces --answers runs/curve_replay/answers.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from pacer_hf.costs import CostModel
from pacer_hf.generation import load_preverifier
from pacer_hf.recipes.smollm2_draft_train import read_records
from pacer_hf.training.simulate import acceptance_matrix, speedup_table
from pacer_hf.training.traces import load_traces
from pacer_hf.training.train import auc_ece, predict_probs, prepare


def lookup(context: list[int], max_ngram: int = 3) -> tuple[int, int]:
    """(n, token after the newest earlier occurrence of the context's last n tokens), longest n first; (0, -1)."""
    length = len(context)
    for n in range(min(max_ngram, length - 1), 0, -1):
        suffix = context[length - n:]
        for i in range(length - n - 1, -1, -1):
            if context[i:i + n] == suffix:
                return n, context[i + n]
    return 0, -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preverifier", required=True)
    parser.add_argument("--traces", required=True, help="held-out traces of collect_along_answers")
    parser.add_argument("--answers", required=True, help="the responses.jsonl those traces were collected from (its "
                                                         "held-out records), or scripts/curve_replay.py's answers.json")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--preverifier-cost", type=float, default=0.005,
                        help="the stop rule's cost per drafted token in target steps (the compiled scorer's: 0.005)")
    args = parser.parse_args()
    path = Path(args.answers)
    if path.suffix == ".json":  # curve_replay's answers: every one held out, traced in this order
        records = [r for r in json.loads(path.read_text()) if r["response"]]
    else:
        records = [r for r in read_records(path) if r["heldout"] and r["response"]]
    traces = load_traces(args.traces)
    preverifier = load_preverifier(args.preverifier).eval()
    with torch.no_grad():
        probs, labels = predict_probs(preverifier, prepare(traces))
    tokens, texts, positions = (np.asarray(traces[name]) for name in ("draft_tokens", "text_id", "position"))
    rows = []  # every drafted token, also past the first rejection: a stop rule sees those too
    for r in range(len(tokens)):
        full = records[texts[r]]["prompt"] + records[texts[r]]["response"]
        context = list(full[max(0, positions[r] - args.context):positions[r]])
        for j in range(tokens.shape[1]):
            n, following = lookup(context)
            rows.append((r, j, probs[r, j], labels[r, j], n, float(n > 0 and following == tokens[r, j])))
            context.append(int(tokens[r, j]))
    everything = np.asarray(rows)
    table = everything[everything[:, 3] >= 0]
    p, y, n, agree = table[:, 2], table[:, 3], table[:, 4], table[:, 5]
    print(f"{len(table)} drafted tokens; pre-verifier AUC {auc_ece(p[:, None], y[:, None])[0]:.3f}")
    for k in range(4):
        for name, chosen in (("agrees with", (n == k) & (agree == 1)), ("differs from", (n == k) & (agree == 0))):
            if chosen.any():
                what = f"longest match {k}, the draft {name} lookup" if k else "no earlier match"
                print(f"  {what:45s} {chosen.sum():6d} tokens, accepted {y[chosen].mean():.3f}, "
                      f"predicted {p[chosen].mean():.3f}")
    def inputs(rows: np.ndarray, lookup_features: bool) -> np.ndarray:
        prob, ngram, agrees = rows[:, 2], rows[:, 4], rows[:, 5]
        logit = np.log(np.clip(prob, 1e-6, 1 - 1e-6) / np.clip(1 - prob, 1e-6, 1 - 1e-6))
        if not lookup_features:
            return logit[:, None]
        return np.stack([logit, agrees, (ngram > 0) * (1 - agrees), ngram, agrees * ngram, rows[:, 1]], 1)

    even = table[:, 0] % 2 == 0
    odd_rounds = np.unique(everything[everything[:, 0] % 2 == 1, 0]).astype(int)
    costs = CostModel.from_calibration({**preverifier.config.calibration, "preverifier_cost": args.preverifier_cost})
    acc = acceptance_matrix(labels[odd_rounds])
    for name, with_lookup in (("pre-verifier log-odds", False), ("+ lookup agreement", True)):
        model = LogisticRegression(max_iter=1000).fit(inputs(table[even], with_lookup), y[even])
        scored = model.predict_proba(inputs(table[~even], with_lookup))[:, 1]
        auc = auc_ece(scored[:, None], y[~even][:, None])[0]
        adjusted = model.predict_proba(inputs(everything, with_lookup))[:, 1].reshape(probs.shape)[odd_rounds]
        sim = speedup_table(acc, adjusted, costs, 1, 0.0, "expected_gain", max_gamma=min(8, acc.shape[1]))
        best = max(v for k, v in sim.items() if k.startswith("fixed-"))
        print(f"logistic regression on {name}: AUC {auc:.3f} (odd rounds); simulated expected_gain {sim['pacer']:.3f}x "
              f"the target alone, {sim['pacer'] / best:.3f}x the best fixed gamma, oracle {sim['oracle']:.3f}x")


if __name__ == "__main__":
    main()
