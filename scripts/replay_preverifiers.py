"""Two or more pre-verifiers replayed on the same held-out rounds under the same costs, each with its own rule.

Answers "does the pre-verifier trained for this mode beat the one a call would otherwise fall back on?" without a
timed run: every pre-verifier is scored on the report half of the held-out traces (the half `train_calibrate_ship`
reports on), with the costs recorded by the first one's calibration, and its shipped rule (block size, rule,
threshold) simulated (`training.simulate.speedup_table`, fixed γ up to the traces' round length). Prints and saves
AUC, ECE, the simulated speedup over the target alone, the mean draft and the best fixed γ; for an expected-gain
rule also the same rule with `trim_failed_block` (greedy only: it trims a stopped round and stops where a trim, none
proposed included, beats drafting on). A pre-verifier whose
`max_draft_tokens` is below the traces' round length is scored on the rounds' first tokens, where its rounds end.
`--costs` replays under another measured cost model instead (a bench record's `run.json`, whose "costs" it reads,
or a calibration-style JSON dict).

    python scripts/replay_preverifiers.py --traces runs/qwen_coder/work/traces-sampled-heldout \
        hub_cards/qwen-coder-preverifier-sampling hub_cards/qwen-coder-preverifier --out replay.json
"""

from __future__ import annotations

import argparse
import copy
import json

from pacer_hf.costs import CostModel
from pacer_hf.generation import load_preverifier
from pacer_hf.training.simulate import acceptance_matrix, speedup_table
from pacer_hf.training.traces import load_traces
from pacer_hf.training.train import auc_ece, predict_probs, prepare, split_by_text


def scored(module, data) -> tuple:
    """(predicted acceptance, labels): a pre-verifier with a shorter horizon than the traces' rounds scores their
    first `max_draft_tokens` tokens, where its rounds end (the simulated rule stops there); labels stay whole for the
    fixed lengths and the oracle."""
    width = module.config.max_draft_tokens
    labels = data.columns["labels"]
    if width >= labels.shape[1]:
        return predict_probs(module, data)
    short = copy.copy(data)
    short.columns = {name: column[:, :width] if column.dim() > 2 else column  # per-token columns; loop state whole
                     for name, column in data.columns.items() if name != "labels"}
    short.columns["labels"] = labels[:, :width]
    return predict_probs(module, short)[0], labels.numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preverifiers", nargs="+", help="folders; the first one's calibration gives the costs")
    parser.add_argument("--traces", required=True, help="held-out traces (collect / collect_along_answers)")
    parser.add_argument("--seed", type=int, default=0, help="the recipe's seed: the report half is split_by_text(seed + 1)")
    parser.add_argument("--costs", default=None, help="a JSON file with the costs to replay under (default: the first "
                        "pre-verifier's calibration)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    _, report_on = split_by_text(load_traces(args.traces), 0.5, args.seed + 1)
    modules = [load_preverifier(path).eval() for path in args.preverifiers]
    calibration = modules[0].config.calibration
    if args.costs:
        with open(args.costs) as handle:
            loaded = json.load(handle)
        calibration = {**calibration, "round_cost": None, **loaded.get("costs", loaded)}
    costs = CostModel.from_calibration(calibration)
    data = prepare(report_on)
    results = {"traces": args.traces, "rounds": len(report_on), "costs_from": args.costs or args.preverifiers[0],
               "costs": costs.as_calibration(), "preverifiers": {}}
    for path, module in zip(args.preverifiers, modules):
        config = module.config
        probs, labels = scored(module, data)
        table = speedup_table(acceptance_matrix(labels), probs, costs, config.block_size, config.threshold or 0.0,
                              config.decision_rule, max_gamma=labels.shape[1], trim=True)
        auc, ece = auc_ece(probs, labels[:, : probs.shape[1]])
        fixed = {k: v for k, v in table.items() if k.startswith("fixed-")}
        best = max(fixed, key=fixed.get)
        row = {"rule": f"{config.decision_rule} b={config.block_size}", "auc": round(auc, 4), "ece": round(ece, 4),
               "speedup": round(table["pacer"], 4), "mean_draft": round(table["pacer_mean_draft"], 2),
               "best_fixed": best, "best_fixed_speedup": round(fixed[best], 4), "oracle": round(table["oracle"], 4)}
        if "pacer_trim" in table:
            row.update(speedup_trim=round(table["pacer_trim"], 4),
                       mean_proposed_trim=round(table["pacer_trim_mean_proposed"], 2))
        results["preverifiers"][path] = row
        print(f"{path}: {row}")
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
