"""Ablations of the pre-verifier recipe on one pair: inputs, loss, label masking, block size, decision rule.

    python -m pacer_hf.recipes.ablate --train TRACES --heldout HELDOUT --costs PV/config.json --out DIR

Every variant trains with the same budget and seed; the held-out texts are split in two halves by
text: the decision setting (rule, block size, threshold) is chosen on half A and the speedup is
reported on half B. Prints a markdown table (and writes DIR/ablations.json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from ..loops.probes import measure_costs
from ..training.simulate import (
    CostModel,
    acceptance_matrix,
    best_setting,
    pacer_lengths,
    speedup,
    speedup_table,
)
from ..training.traces import load_traces
from ..training.train import auc_ece, predict_probs, prepare, split_by_text, train_preverifier

VARIANTS = {
    "both (default)": {},
    "hidden only": {"input_mode": "hidden"},
    "features only": {"input_mode": "features"},
    "reject_weight=3": {"reject_weight": 3.0},
    "focal gamma=2": {"loss_type": "focal"},
    "unmasked labels": {"label_column": "labels_unmasked"},
}


def evaluate(model, calib, report, costs: CostModel, block_sizes=(1, 2, 3, 4, 6, 8), rules=("block", "cumulative")):
    """Choose the setting on `calib`, report AUC/ECE/speedup on `report`; plus the best per (rule, b)."""
    p_cal, y_cal = predict_probs(model, prepare(calib))
    p_rep, y_rep = predict_probs(model, prepare(report))
    search = best_setting(acceptance_matrix(y_cal), p_cal, costs, block_sizes, rules=rules)
    best = search["best"]
    acc = acceptance_matrix(y_rep)
    lengths = pacer_lengths(p_rep, best["block_size"], best["threshold"], best["rule"])
    auc, ece = auc_ece(p_rep, y_rep)
    per_setting = {}
    for rule in rules:
        for b in block_sizes:
            rows = [r for r in search["grid"] if r["rule"] == rule and r["block_size"] == b]
            if rows:
                pick = max(rows, key=lambda r: r["speedup"])
                chosen = pacer_lengths(p_rep, b, pick["threshold"], rule)
                per_setting[f"{rule} b={b}"] = speedup(acc, chosen, costs, preverifier=True)
    return {"auc": auc, "ece": ece, "speedup": speedup(acc, lengths, costs, preverifier=True), "setting": best,
            "mean_draft": float(lengths.mean()), "per_setting": per_setting}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", required=True)
    parser.add_argument("--heldout", required=True)
    parser.add_argument("--costs", help="a calibrated pre-verifier's config.json (uses its `calibration`)")
    parser.add_argument("--cost-ratio", type=float, help="assumed c (instead of --costs); with --verify-slope")
    parser.add_argument("--verify-slope", type=float, default=0.1, help="assumed verify_cost(k) = 1 + slope*k")
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--variants", help="comma-separated subset of: " + ", ".join(VARIANTS))
    parser.add_argument("--sampling-train", help="sampling-label traces: adds 'greedy vs sampling labels' rows")
    parser.add_argument("--sampling-heldout")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.cost_ratio is not None:
        costs = CostModel(args.cost_ratio, [1.0 + args.verify_slope * k for k in range(33)])
    elif args.costs:
        cal = json.loads(Path(args.costs).read_text())["calibration"]
        costs = CostModel.from_calibration(cal)
    else:
        from ..loading import load_causal_lm

        costs = measure_costs(load_causal_lm(args.target), load_causal_lm(args.draft))
    calib, report = split_by_text(load_traces(args.heldout), 0.5, seed=1)
    acc = acceptance_matrix(np.asarray(report["labels"]))
    baseline = speedup_table(acc, None, costs)
    results = {"costs": costs.__dict__, "baseline": baseline, "variants": {}}
    names = [n.strip() for n in args.variants.split(",")] if args.variants else list(VARIANTS)
    for name in names:
        options = dict(VARIANTS[name])
        train_args = {k: options.pop(k) for k in ("loss_type", "label_column") if k in options}
        model, _ = train_preverifier(args.train, out / name.replace(" ", "_"), eval_data=args.heldout,
                                     epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
                                     progress=False, **train_args, **options)
        results["variants"][name] = evaluate(model, calib, report, costs)
        print(name, json.dumps({k: v for k, v in results["variants"][name].items() if k != "per_setting"}), flush=True)
    if args.sampling_train and args.sampling_heldout:
        s_calib, s_report = split_by_text(load_traces(args.sampling_heldout), 0.5, seed=1)
        results["sampling_baseline"] = speedup_table(acceptance_matrix(np.asarray(s_report["labels"])), None, costs)
        for name, data in (("greedy labels -> sampling eval", args.train), ("soft labels -> sampling eval",
                                                                             args.sampling_train)):
            model, _ = train_preverifier(data, out / name.split()[0], eval_data=args.sampling_heldout,
                                         epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr,
                                         progress=False)
            results["variants"][name] = evaluate(model, s_calib, s_report, costs)
            print(name, json.dumps(results["variants"][name]["setting"]), flush=True)
    (out / "ablations.json").write_text(json.dumps(results, indent=2))
    print(markdown(results))
    return 0


def markdown(results: dict) -> str:
    base = results["baseline"]
    fixed = max(v for k, v in base.items() if k.startswith("fixed-"))
    lines = [f"best fixed gamma: {fixed:.3f}x, oracle: {base['oracle']:.3f}x (greedy held-out half B)", "",
             "| variant | AUC | ECE | chosen setting | mean draft | simulated speedup |", "|---|---|---|---|---|---|"]
    for name, row in results["variants"].items():
        s = row["setting"]
        lines.append(f"| {name} | {row['auc']:.3f} | {row['ece']:.3f} | {s['rule']} b={s['block_size']} "
                     f"tau={s['threshold']:.2f} | {row['mean_draft']:.2f} | {row['speedup']:.3f}x |")
    default = results["variants"].get("both (default)")
    if default:
        lines += ["", "| decision rule, block size (default model, best tau on A) | simulated speedup on B |",
                  "|---|---|"]
        lines += [f"| {k} | {v:.3f}x |" for k, v in default["per_setting"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
