"""How well a pre-verifier's predictions match acceptance on a set of traces: mean predicted vs accepted per drafted
position and per predicted-probability bin (docs/DEMO_PAIR.md, "Its pre-verifier for sampling").

    python examples/decoding_mode_check.py hub_cards/demo-preverifier \\
        runs/demo_pair/onpolicy/traces-sampled-heldout --loop-from runs/demo_pair/onpolicy/traces-heldout
    python examples/decoding_mode_check.py hub_cards/demo-preverifier-sampling \\
        runs/demo_pair/onpolicy/traces-sampled-heldout

Labels are the traces' own: 0/1 for greedy rounds, min(1, p/q) for sampled ones (means are acceptance rates
either way). A pre-verifier that reads the loop's state (`config.loop_features`) gets, on traces without it,
the mean loop state of `--loop-from` traces (rounds along the target's answers), else zeros.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from pacer_hf.generation import load_preverifier
from pacer_hf.training.calibrate import prepare
from pacer_hf.training.traces import load_traces
from pacer_hf.training.train import auc_ece, predict_probs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preverifier")
    parser.add_argument("traces")
    parser.add_argument("--loop-from", help="traces with loop features: their mean stands in for missing ones")
    args = parser.parse_args()
    preverifier = load_preverifier(args.preverifier).eval()
    data = prepare(load_traces(args.traces))
    if preverifier.loop_proj is not None and "loop_features" not in data.columns:
        loop = torch.zeros(3)
        if args.loop_from:
            loop = torch.as_tensor(np.stack(load_traces(args.loop_from)["loop_features"])).float().mean(0)
        print(f"loop features (the traces have none): {[round(float(v), 3) for v in loop]}")
        data.columns["loop_features"] = loop.expand(len(data), 3).clone()
    with torch.no_grad():
        probs, labels = predict_probs(preverifier, data)
    valid = labels >= 0
    auc, ece = auc_ece(probs, labels)
    print(f"{len(labels)} rounds: accepted {labels[valid].mean():.3f}, predicted {probs[valid].mean():.3f} "
          f"(AUC {auc:.3f}, ECE {ece:.3f})")
    for i in range(min(6, labels.shape[1])):
        seen = labels[:, i] >= 0
        print(f"  drafted token {i + 1}: accepted {labels[seen, i].mean():.3f}, predicted {probs[seen, i].mean():.3f}")
    p, y = probs[valid], labels[valid]
    for low in np.arange(0.0, 1.0, 0.2):
        chosen = (p >= low) & (p < low + 0.2 if low < 0.8 else p <= 1.0)
        if chosen.any():
            print(f"  predicted in [{low:.1f}, {low + 0.2:.1f}): {chosen.sum():5d} tokens, predicted {p[chosen].mean():.3f}, "
                  f"accepted {y[chosen].mean():.3f}")


if __name__ == "__main__":
    main()
