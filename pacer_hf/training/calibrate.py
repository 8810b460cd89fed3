"""Calibrate a pre-verifier for this hardware: measure the pair's costs, pick block size and threshold.

Measures c = t(draft step)/t(target step) and verify_cost(k) = t(target forward over k+1 tokens) /
t(one target step) (medians, runs interleaved), then searches decision rule x block size x threshold
for the highest simulated speedup on held-out traces and writes the choice, `cost_ratio` and a
`calibration` dict (costs, table, data) into the pre-verifier's config.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from ..modeling_pacer import PacerPreVerifier
from ..timing import cached_forward_timer
from .collect import load_traces
from .common import cli_errors
from .simulate import CostModel, acceptance_matrix, best_setting, speedup_table
from .train import auc_ece, predict_probs, prepare, split_by_text


@torch.inference_mode()
def measure_costs(target: PreTrainedModel, draft: PreTrainedModel, preverifier: PacerPreVerifier | None = None,
                  context: int = 128, max_k: int = 16, repeats: int = 15, progress: bool = True) -> CostModel:
    """Time one target step, target forwards over k+1 tokens (k = 0..max_k) and one draft step on a cached
    `context`-token prefix; all relative to one target step. Interleaved repeats, medians."""
    def timer(model: PreTrainedModel, width: int, keep: int | None):
        return cached_forward_timer(model, width, context, logits_to_keep=keep)

    runs = {"draft": timer(draft, 1, 1), "target": timer(target, 1, 1)}
    runs.update({f"verify-{k}": timer(target, k + 1, None) for k in range(1, max_k + 1)})
    if preverifier is not None:
        hidden = torch.zeros(1, preverifier.config.max_draft_tokens, preverifier.config.draft_hidden_size)
        feats = torch.zeros(1, preverifier.config.max_draft_tokens, 3)
        size = preverifier.config.max_draft_tokens // 2 or 1
        runs["preverifier"] = lambda: _time(lambda: preverifier(hidden[:, :size], feats[:, :size]))
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for name in runs:  # warm-up
        runs[name]()
    for _ in tqdm(range(repeats), desc="timing", disable=not progress):
        for name, once in runs.items():
            samples[name].append(once())
    med = {name: statistics.median(values) for name, values in samples.items()}
    step = med["target"]
    verify = [1.0] + [med[f"verify-{k}"] / step for k in range(1, max_k + 1)]
    return CostModel(draft_cost=med["draft"] / step, verify_cost=verify,
                     preverifier_cost=med.get("preverifier", 0.0) / step)


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@torch.no_grad()
def fold_platt_scaling(preverifier: PacerPreVerifier, traces, steps: int = 200) -> tuple[float, float]:
    """Fit p = sigmoid(a * logit + b) on `traces` (Platt scaling) and fold a, b into the output head.

    Fixes the calibration that class weighting or over-training leaves, without changing the
    architecture (the head is linear), so generation and the saved model need nothing new.
    """
    probs, labels = predict_probs(preverifier, prepare(traces))
    valid = labels >= 0
    logit = torch.logit(torch.as_tensor(probs[valid], dtype=torch.float64).clamp(1e-7, 1 - 1e-7))
    target = torch.as_tensor(labels[valid], dtype=torch.float64)
    a = torch.ones((), dtype=torch.float64, requires_grad=True)
    b = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([a, b], lr=0.5, max_iter=steps)

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(a * logit + b, target)
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    scale, shift = float(a), float(b)
    head = preverifier.head
    head.weight.mul_(scale)
    head.bias.mul_(scale).add_(shift)
    return scale, shift


def calibrate_preverifier(preverifier: PacerPreVerifier, traces, costs: CostModel, block_sizes=(1, 2, 3, 4, 6, 8),
                          rules=("block", "cumulative"), measured: dict | None = None, report_traces=None,
                          platt: bool = True) -> dict:
    """Choose (rule, block size, threshold) maximising simulated speedup on `traces`; write them to the config.

    With `platt`, first rescale the predicted probabilities on `traces` (Platt scaling folded into the head).
    Returns the report: chosen setting, the speedup table (fixed gamma 1..8, oracle, Pacer), AUC and ECE,
    computed on `report_traces` when given (so the reported speedup is not the one the choice was tuned on).
    """
    scaling = fold_platt_scaling(preverifier, traces) if platt else None
    probs, labels = predict_probs(preverifier, prepare(traces))
    search = best_setting(acceptance_matrix(labels), probs, costs, block_sizes=block_sizes, rules=rules)
    best = search["best"]
    if report_traces is not None:
        probs, labels = predict_probs(preverifier, prepare(report_traces))
    acc = acceptance_matrix(labels)
    table = speedup_table(acc, probs, costs, best["block_size"], best["threshold"], best["rule"],
                          max_gamma=min(8, acc.shape[1]))
    auc, ece = auc_ece(probs, labels)
    config = preverifier.config
    config.block_size, config.threshold, config.decision_rule = best["block_size"], best["threshold"], best["rule"]
    config.cost_ratio = round(costs.draft_cost, 5)
    report = {
        "draft_cost": costs.draft_cost, "verify_cost": [round(v, 4) for v in costs.verify_cost],
        "preverifier_cost": costs.preverifier_cost, "chosen": best, "table": table, "auc": auc, "ece": ece,
        "platt_scaling": scaling, "rounds": len(acc), "reported_on": "report split" if report_traces is not None else "calibration data",
        **(measured or {}),
    }
    config.calibration = report
    return report


def format_table(report: dict) -> str:
    table, best = report["table"], report["chosen"]
    lines = [f"c = t(draft)/t(target) = {report['draft_cost']:.3f}; verify_cost(k) = "
             + ", ".join(f"{v:.2f}" for v in report["verify_cost"][:9]) + " (k=0..8)",
             f"{report['reported_on']}: {report['rounds']} rounds   AUC {report['auc']:.3f}   ECE {report['ece']:.3f}",
             f"{'stop rule':<34}{'simulated speedup':>18}"]
    for key, value in table.items():
        if key.startswith("fixed-"):
            lines.append(f"{'fixed gamma=' + key[6:]:<34}{value:>17.3f}x")
    lines.append(f"{'oracle (stop before 1st rejection)':<34}{table['oracle']:>17.3f}x")
    name = f"pacer {best['rule']} b={best['block_size']} tau={best['threshold']:.2f}"
    lines.append(f"{name:<34}{table['pacer']:>17.3f}x   (mean draft {table['pacer_mean_draft']:.2f})")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preverifier", required=True, help="trained pre-verifier folder")
    parser.add_argument("--data", required=True, help="held-out traces (a `pacer-hf collect` folder)")
    parser.add_argument("--eval-fraction", type=float,
                        help="use only the held-out texts of `train --eval-fraction` (same --seed) from --data")
    parser.add_argument("--report-data", help="report the table on these traces (e.g. test files) instead")
    parser.add_argument("--report-fraction", type=float,
                        help="choose the setting on part of the texts, report the table on this fraction of them")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", help="target model folder (to measure costs on this hardware)")
    parser.add_argument("--draft", help="draft model folder (to measure costs)")
    parser.add_argument("--draft-adapter")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--cost-ratio", type=float, help="skip timing: use this c with --verify-slope")
    parser.add_argument("--verify-slope", type=float, default=0.05, help="with --cost-ratio: verify_cost(k)=1+slope*k")
    parser.add_argument("--context", type=int, default=128, help="prefix length for timing")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, help="torch.set_num_threads while timing (match your deployment)")
    parser.add_argument("--block-sizes", default="1,2,3,4,6,8")
    parser.add_argument("--rules", default="block,cumulative")
    parser.add_argument("--no-platt", action="store_true", help="do not rescale probabilities (Platt scaling)")
    parser.add_argument("--out", help="where to save the calibrated pre-verifier (default: in place)")


@cli_errors("calibrate")
def run(args: argparse.Namespace) -> int:
    from ..generation import load_preverifier
    from .common import load_causal_lm

    if args.threads:
        torch.set_num_threads(args.threads)
    preverifier = load_preverifier(args.preverifier).eval()
    traces = load_traces(args.data)
    if args.eval_fraction:
        traces = split_by_text(traces, args.eval_fraction, args.seed)[1]
    report_traces = load_traces(args.report_data) if args.report_data else None
    if args.report_fraction and report_traces is None:
        traces, report_traces = split_by_text(traces, args.report_fraction, args.seed + 1)
    measured = {"data": args.data, "eval_fraction": args.eval_fraction, "report_fraction": args.report_fraction,
                "report_data": args.report_data, "machine": platform.machine(),
                "processor": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads(),
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.cost_ratio is not None:
        costs = CostModel(args.cost_ratio, [1.0 + args.verify_slope * k for k in range(33)])
        measured["costs"] = "given on the command line (--cost-ratio/--verify-slope), not measured"
    else:
        if not (args.target and args.draft):
            raise ValueError("Pass --target and --draft to measure costs on this hardware, or --cost-ratio to skip it.")
        target = load_causal_lm(args.target, args.dtype)
        draft = load_causal_lm(args.draft, args.dtype, args.draft_adapter)
        costs = measure_costs(target, draft, preverifier, context=args.context,
                              max_k=max(16, preverifier.config.max_draft_tokens), repeats=args.repeats)
        measured["costs"] = f"measured: context {args.context}, {args.repeats} interleaved repeats, medians"
        measured["draft_model"], measured["target_model"] = args.draft, args.target
    block_sizes = tuple(int(b) for b in args.block_sizes.split(","))
    rules = tuple(r.strip() for r in args.rules.split(","))
    report = calibrate_preverifier(preverifier, traces, costs, block_sizes, rules, measured, report_traces,
                                   platt=not args.no_platt)
    out = Path(args.out or args.preverifier)
    preverifier.save_pretrained(str(out))
    print(format_table(report))
    print(f"chosen: {json.dumps(report['chosen'])}; saved to {out}")
    return 0
