"""Calibrate a pre-verifier for this hardware: measure the pair's costs, pick block size and threshold.

Measures c = t(draft step)/t(target step) and verify_cost(k) = t(target forward over k+1 tokens) /
t(one target step) and the pre-verifier's work per drafted token (medians, runs interleaved), then the
costs inside `generate` (the loop's per-round overhead, the draft step as the loop runs it, plain
decoding's per-token overhead) from real generations, then searches decision rule x block size x threshold
for the highest simulated speedup on held-out traces and writes the choice, `cost_ratio` and a
`calibration` dict (costs, table, data) into the pre-verifier's config.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel

from ..configuration_pacer import DECISION_RULES
from ..costs import CostModel, timed
from ..generation import EnabledState, disable, enable, last_stats
from ..loops.probes import measure_costs
from ..modeling_pacer import PacerPreVerifier
from .common import cli_errors
from .simulate import acceptance_matrix, best_setting, speedup_table
from .traces import load_traces
from .train import auc_ece, predict_probs, prepare, split_by_text
from .validate import compare_in_generate


@torch.inference_mode()
def measure_loop_costs(target: PreTrainedModel, draft: PreTrainedModel, costs: CostModel, context: int = 128,
                       new_tokens: int = 64,
                       gammas: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8), repeats: int = 2) -> CostModel:
    """Refine `costs` with what the forwards alone miss, measured in real `generate` calls.

    sd-fixed-γ runs give, per call, seconds = setup + draft_forwards*d + sum_r verify(k_r)*step + rounds*o
    (setup: the call's fixed cost and the prompt's forward, timed with one-token calls; the first round
    is that forward); a least-squares fit over several γ gives the in-loop draft step d and the
    per-round overhead o. The same runs give `round_cost[γ]`, the measured time of a whole round drafting
    γ tokens, which the simulator and `decision_rule="expected_gain"` use instead of the fitted sum
    (round_cost[0] is plain decoding's time per token). Plain decoding gives ar_overhead. The pre-verifier's
    cost per drafted token stays measure_costs' (it times the code generation runs). All in units of
    `costs.step_seconds` (one bare target step, from measure_costs). Every γ and plain decoding run once untimed first.
    """
    step_seconds = costs.step_seconds
    if step_seconds <= 0:
        raise ValueError("measure_loop_costs needs costs.step_seconds: pass the CostModel that measure_costs returned.")
    enabled_here = EnabledState(target).plain_generate is None
    enable(target)
    vocab = target.get_output_embeddings().out_features
    prompt = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(0)).to(target.device)

    def run(tokens: int = new_tokens, **kwargs) -> tuple[float, object]:  # one timed generate: (seconds, its stats)
        seconds, _ = timed(partial(target.generate, prompt, max_new_tokens=tokens, min_new_tokens=tokens,
                                   do_sample=False, **kwargs), target.device)
        return seconds, last_stats(target)

    def per_call(**kwargs) -> float:  # call setup + prefill: a one-token call drafts nothing
        return min(run(1, **kwargs)[0] for _ in range(repeats + 1))

    def after_setup_and_verify(seconds: float, stats) -> float:  # the first round's verify is in the setup
        return seconds - setup - costs.verify(np.asarray(stats.draft_lengths[1:])).sum() * step_seconds

    try:
        # warm-up: every verify width and the plain path once, untimed (on a GPU a shape's first call pays one-time
        # kernel selection and allocations that would otherwise land in that γ's only timed call)
        run(2)
        for gamma in gammas:
            run(2 * (gamma + 1), assistant_model=draft, pacer=f"sd-fixed-{gamma}")
        setup = per_call(assistant_model=draft, pacer="sd-fixed-1")
        rows, rest, per_round = [], [], {gamma: [] for gamma in gammas}
        for _ in range(repeats):
            for gamma in gammas:
                seconds, stats = run(assistant_model=draft, pacer=f"sd-fixed-{gamma}")
                rows.append([stats.draft_forwards, stats.target_forwards - 1])
                rest.append(after_setup_and_verify(seconds, stats))
                per_round[gamma].append((seconds - setup) / max(stats.target_forwards - 1, 1))
        (draft_s, round_s), *_ = np.linalg.lstsq(np.asarray(rows, float), np.asarray(rest), rcond=None)
        ar_setup = per_call()
        ar = (min(run()[0] for _ in range(repeats)) - ar_setup) / (new_tokens - 1)
        refined = CostModel(draft_cost=max(draft_s, 0.0) / step_seconds, verify_cost=costs.verify_cost,
                            preverifier_cost=costs.preverifier_cost, round_overhead=max(round_s, 0.0) / step_seconds,
                            ar_overhead=max(ar - step_seconds, 0.0) / step_seconds, step_seconds=step_seconds)
        if list(gammas) == list(range(1, len(gammas) + 1)):  # a table needs every length from 1 on
            refined.round_cost = [ar / step_seconds] + [min(per_round[g]) / step_seconds for g in gammas]
        return refined
    finally:
        if enabled_here:
            disable(target)


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
                          rules=DECISION_RULES, measured: dict | None = None, report_traces=None,
                          platt: bool = True) -> dict:
    """Choose (rule, block size, threshold) maximising simulated speedup on `traces`; write them to the config.

    With `platt`, first rescale the predicted probabilities on `traces` (Platt scaling folded into the head).
    Returns the report: chosen setting, the speedup table (fixed gamma 1..8, oracle, Pacer), AUC and ECE,
    computed on `report_traces` when given (so the reported speedup is not the one the choice was tuned on).
    """
    scaling = fold_platt_scaling(preverifier, traces) if platt else None
    probs, labels = predict_probs(preverifier, prepare(traces))
    best = best_setting(acceptance_matrix(labels), probs, costs, block_sizes=block_sizes, rules=rules)["best"]
    config = preverifier.config
    config.block_size, config.decision_rule = best["block_size"], best["rule"]
    if best["threshold"] is not None:  # expected_gain has none: the cost model decides
        config.threshold = best["threshold"]
    config.cost_ratio = round(costs.draft_cost, 5)
    report = {
        "draft_cost": costs.draft_cost, "verify_cost": [round(v, 4) for v in costs.verify_cost],
        "preverifier_cost": costs.preverifier_cost, "round_overhead": costs.round_overhead,
        "ar_overhead": costs.ar_overhead, "round_cost": costs.round_cost and [round(v, 4) for v in costs.round_cost],
        "chosen": best, "platt_scaling": scaling, **(measured or {}),
    }
    config.calibration = report
    if report_traces is not None:
        return report_on(preverifier, report_traces, costs)
    return _reported(preverifier, probs, labels, costs, "calibration data")


def report_on(preverifier: PacerPreVerifier, traces, costs: CostModel) -> dict:
    """The calibrated pre-verifier's report (`config.calibration`) completed on `traces`, texts its setting was not
    chosen on: the speedup table under its chosen setting, AUC and ECE. `fit` calls it only for the candidate it keeps."""
    probs, labels = predict_probs(preverifier, prepare(traces))
    return _reported(preverifier, probs, labels, costs, "report split")


def _reported(preverifier: PacerPreVerifier, probs, labels, costs: CostModel, where: str) -> dict:
    report, acc = preverifier.config.calibration, acceptance_matrix(labels)
    best = report["chosen"]
    table = speedup_table(acc, probs, costs, best["block_size"], best["threshold"] or 0.0, best["rule"],
                          max_gamma=min(8, acc.shape[1]))
    auc, ece = auc_ece(probs, labels)
    report.update(table=table, auc=auc, ece=ece, rounds=len(acc), reported_on=where)
    return report


def validate(target, draft, preverifier: PacerPreVerifier, report: dict, args: argparse.Namespace) -> dict:
    """Time the chosen setting next to fixed γ in real generate calls on held-out prompts; print both views."""
    from ..loading import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer or args.target)
    with open(args.validate_prompts, encoding="utf-8") as handle:
        texts = [json.loads(line)["text"] for line in handle if line.strip()]
    step = max(1, len(texts) // args.validate_n)
    prompts = [tokenizer(text).input_ids[-256:] for text in texts[::step][: args.validate_n]]
    table = report["table"]
    fixed = sorted((k for k in table if k.startswith("fixed-")), key=table.get, reverse=True)[:3]
    settings = {f"sd-{name}": f"sd-{name}" for name in fixed} | {"pacer (chosen)": preverifier}
    measured = compare_in_generate(target, draft, prompts, settings)
    print(f"real generate on {len(prompts)} held-out prompts x 64 greedy tokens, 2 interleaved runs:")
    print(f"{'setting':<20}{'simulated':>11}{'measured':>11}{'tokens/s':>10}{'mean draft':>12}")
    for name, row in measured.items():
        simulated = 1.0 if name == "ar" else table["pacer" if name.startswith("pacer") else name[3:]]
        print(f"{name:<20}{simulated:>10.3f}x{row['vs_ar']:>10.3f}x{row['tokens_per_s']:>10.1f}{row['mean_draft']:>12.2f}")
    return {name: {key: round(value, 4) for key, value in row.items()} for name, row in measured.items()}


def format_table(report: dict) -> str:
    table, best = report["table"], report["chosen"]
    lines = [f"c = t(draft)/t(target) = {report['draft_cost']:.3f}; verify_cost(k) = "
             + ", ".join(f"{v:.2f}" for v in report["verify_cost"][:9]) + " (k=0..8)",
             f"loop overhead {report.get('round_overhead', 0.0):.3f} per round; pre-verifier "
             f"{report.get('preverifier_cost', 0.0):.3f} per drafted token; plain decoding's loop "
             f"{report.get('ar_overhead', 0.0):.3f} per token (all in target steps)",
             *(["a round drafting k tokens, measured in generate: " + ", ".join(f"{v:.2f}" for v in report["round_cost"][:9])
                + " target steps (k=0..8; k=0: plain decoding per token)"] if report.get("round_cost") else []),
             f"{report['reported_on']}: {report['rounds']} rounds   AUC {report['auc']:.3f}   ECE {report['ece']:.3f}",
             f"{'stop rule':<34}{'simulated speedup':>18}"]
    for key, value in table.items():
        if key.startswith("fixed-"):
            lines.append(f"{'fixed gamma=' + key[6:]:<34}{value:>17.3f}x")
    lines.append(f"{'oracle (stop before 1st rejection)':<34}{table['oracle']:>17.3f}x")
    tau = "" if best["threshold"] is None else f" tau={best['threshold']:.2f}"
    name = f"pacer {best['rule']} b={best['block_size']}{tau}"
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
    parser.add_argument("--no-loop-costs", action="store_true",
                        help="cost model from bare forwards only (skip the in-`generate` loop measurement)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads while timing (match your deployment)")
    parser.add_argument("--block-sizes", default="1,2,3,4,6,8")
    parser.add_argument("--rules", default="block,cumulative,expected_gain")
    parser.add_argument("--no-platt", action="store_true", help="do not rescale probabilities (Platt scaling)")
    parser.add_argument("--validate-prompts", help="a .jsonl of held-out prompts ({'text': ...}): time the chosen "
                        "setting, the best simulated fixed γ and its neighbours in real generate calls and print them")
    parser.add_argument("--validate-n", type=int, default=6, help="prompts used from --validate-prompts")
    parser.add_argument("--tokenizer", help="tokenizer for --validate-prompts (default: --target)")
    parser.add_argument("--out", help="where to save the calibrated pre-verifier (default: in place)")


@cli_errors("calibrate")
def run(args: argparse.Namespace) -> int:
    from ..generation import load_preverifier
    from ..loading import load_causal_lm

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
    if args.validate_prompts and args.cost_ratio is not None:
        raise ValueError("--validate-prompts times real generate calls: pass --target and --draft instead of --cost-ratio.")
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
        if not args.no_loop_costs:
            measured["bare_draft_cost"] = costs.draft_cost
            costs = measure_loop_costs(target, draft, costs, context=args.context)
            measured["costs"] += "; draft step and loop overheads measured inside generate"
        measured["draft_model"], measured["target_model"] = args.draft, args.target
    block_sizes = tuple(int(b) for b in args.block_sizes.split(","))
    rules = tuple(r.strip() for r in args.rules.split(","))
    report = calibrate_preverifier(preverifier, traces, costs, block_sizes, rules, measured, report_traces,
                                   platt=not args.no_platt)
    if args.validate_prompts:
        report["validated"] = validate(target, draft, preverifier, report, args)
    out = Path(args.out or args.preverifier)
    preverifier.save_pretrained(str(out))
    print(format_table(report))
    print(f"chosen: {json.dumps(report['chosen'])}; saved to {out}")
    return 0
