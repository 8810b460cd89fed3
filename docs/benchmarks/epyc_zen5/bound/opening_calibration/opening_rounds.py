"""The shipped Qwen pre-verifier on the opening rounds `collect.py` traced: calibration by position (opening rounds
against the later rounds of the same answers), a Platt or shift-only rescaling of the opening rounds fitted on one
half of the requests and scored on the other (2-fold), and how well estimators of the not-yet-drafted tokens'
acceptance predict it (the rule extrapolates the last block's mean; log loss over the next 8 tokens).

    python docs/benchmarks/epyc_zen5/bound/opening_calibration/opening_rounds.py WORK/traces > opening_rounds.json
"""
import json
import sys

import numpy as np
import torch

from pacer_hf._paths import hub_cards_dir
from pacer_hf.generation import load_preverifier
from pacer_hf.training.traces import load_traces
from pacer_hf.training.train import predict_probs, prepare

preverifier = load_preverifier(hub_cards_dir() / "qwen-coder-preverifier")
data = load_traces(sys.argv[1])
probs, labels = predict_probs(preverifier, prepare(data))
opening = ~np.stack(data["loop_features"]).any(1)
texts = np.asarray(data["text_id"])


def by_position(mask, positions=12):
    out = {}
    for j in range(positions):
        alive = mask & (labels[:, :j] == 1).all(1) & (labels[:, j] >= 0)
        out[j + 1] = {"rounds": int(alive.sum()), "mean_predicted": round(float(probs[alive, j].mean()), 3),
                      "accepted_share": round(float(labels[alive, j].mean()), 3)}
    return out


def logits_labels(mask):
    valid = labels[mask] >= 0
    p = torch.as_tensor(probs[mask][valid], dtype=torch.float64).clamp(1e-7, 1 - 1e-7)
    return torch.logit(p), torch.as_tensor(labels[mask][valid], dtype=torch.float64)


def fit(x, y, shift_only):
    a = torch.ones((), dtype=torch.float64, requires_grad=not shift_only)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([b] if shift_only else [a, b], lr=0.5, max_iter=200)

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(a * x + b, y)
        loss.backward()
        return loss

    optimizer.step(closure)
    return float(a.detach()), float(b.detach())


def nll(x, y, a=1.0, b=0.0):
    return round(float(torch.nn.functional.binary_cross_entropy_with_logits(a * x + b, y)), 4)


held = np.random.default_rng(0).permutation(np.unique(texts[opening]))
folds = [np.isin(texts, held[: len(held) // 2]), np.isin(texts, held[len(held) // 2:])]
rescaled = {}
for shift_only in (False, True):
    rows = []
    for k in range(2):
        a, b = fit(*logits_labels(opening & folds[k]), shift_only)
        x, y = logits_labels(opening & folds[1 - k])
        rows.append({"a": round(a, 3), "b": round(b, 3), "other_half_log_loss": nll(x, y),
                     "rescaled": nll(x, y, a, b)})
    rescaled["shift" if shift_only else "platt"] = rows

ESTIMATORS = {"last token (shipped)": lambda p, k: p[k - 1], "mean of the last 3": lambda p, k: p[max(0, k - 3):k].mean(),
              "mean of the round": lambda p, k: p[:k].mean()}
future = {}
for name, estimate in ESTIMATORS.items():
    for which, mask in (("opening", opening), ("later", ~opening)):
        loss, count = 0.0, 0
        for p, lab in zip(probs[mask], labels[mask]):
            for k in range(1, len(p)):
                if lab[k - 1] != 1:
                    break
                q = float(np.clip(estimate(p, k), 1e-4, 1 - 1e-4))
                for j in range(k, min(k + 8, len(p))):
                    if lab[j] < 0:
                        break
                    loss -= lab[j] * np.log(q) + (1 - lab[j]) * np.log(1 - q)
                    count += 1
                    if lab[j] != 1:
                        break
        future.setdefault(name, {})[which] = {"tokens": count, "log_loss": round(loss / max(count, 1), 4)}

print(json.dumps({"rounds": len(probs), "opening_rounds": int(opening.sum()),
                  "by_position": {"opening": by_position(opening), "later": by_position(~opening)},
                  "opening_rescaled_2fold": rescaled, "future_estimators_next8": future}, indent=1))
