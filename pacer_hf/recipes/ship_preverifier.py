"""The last steps every shipped pre-verifier goes through: Trainer, costs measured where it will run, the stop rule
chosen on held-out rounds, the Hub folder with its card. The demo pair's and the Qwen pair's recipes call it."""

from __future__ import annotations

import platform
import time
from pathlib import Path

import torch

from ..configuration_pacer import DECISION_RULES


def train_calibrate_ship(target, draft, traces: dict, trained: Path, shipped: Path, dataset: str, *,
                         draft_name: str, target_name: str, epochs: float, seed: int, threads: int | None = None,
                         cost_repeats: int = 15, loop_costs: dict | None = None,
                         rules: tuple[str, ...] = DECISION_RULES) -> Path:
    """Trainer on traces["train"] (skipped when `trained` holds a model), costs measured here (`cost_repeats`
    interleaved repeats; `loop_costs`: keyword arguments of `measure_loop_costs`), the rule chosen on half of the
    held-out answers and reported on the other half; `shipped` gets the calibrated pre-verifier and its card.
    `threads`: torch threads while the costs are measured (as the pair will run; None: as set). `rules`: the decision
    rules the calibration may choose among."""
    from ..generation import load_preverifier
    from ..hub.publish import build_preverifier_repo
    from ..loops.probes import measure_costs
    from ..training.calibrate import calibrate_preverifier, format_table, measure_loop_costs
    from ..training.traces import load_traces
    from ..training.train import split_by_text, train_preverifier

    if not (trained / "model.safetensors").is_file():
        train_preverifier(str(traces["train"]), trained, eval_data=str(traces["heldout"]), epochs=epochs, seed=seed)
    preverifier = load_preverifier(str(trained)).eval()
    # choose on half of the held-out answers, report on the other half (a smoke build has too few: both on all)
    heldout = load_traces(traces["heldout"])
    halves = len(set(heldout["text_id"])) >= 4
    choose, report_on = split_by_text(heldout, 0.5, seed + 1) if halves else (heldout, None)
    if threads:
        torch.set_num_threads(threads)
    costs = measure_costs(target, draft, preverifier, max_k=max(16, preverifier.config.max_draft_tokens),
                          repeats=cost_repeats)
    measured = {"data": str(traces["heldout"]), "report_fraction": 0.5 if halves else None,
                "machine": platform.machine(), "torch_threads": torch.get_num_threads(),
                "bare_draft_cost": costs.draft_cost, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "costs": f"measured: context 128, {cost_repeats} interleaved repeats, medians; draft step and loop "
                         "overheads measured inside generate", "draft_model": draft_name, "target_model": target_name}
    costs = measure_loop_costs(target, draft, costs, **(loop_costs or {}))
    report = calibrate_preverifier(preverifier, choose, costs, rules=rules, measured=measured, report_traces=report_on)
    print(format_table(report), flush=True)
    preverifier.config.draft_model, preverifier.config.target_model = draft_name, target_name
    calibrated = trained.parent / f"{trained.name}-calibrated"
    preverifier.save_pretrained(calibrated)
    build_preverifier_repo(calibrated, shipped, datasets=[dataset])
    print(f"wrote {shipped}", flush=True)
    return shipped
