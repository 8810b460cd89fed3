"""`fit_preverifier`'s calibration: the pair's costs measured on the device and in the dtype it runs in, and the
expected-gain rule's block size chosen on half of the held-out answers, AUC/ECE and the table reported on the other
half (as the shipped pre-verifiers were calibrated: `recipes/ship_preverifier.py`)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ..loops.probes import measure_costs
from ..modeling_pacer import PacerPreVerifier
from .calibrate import calibrate_preverifier, measure_loop_costs
from .traces import load_traces
from .train import split_by_text

COST_REPEATS = 7
LOOP_TOKENS = 32  # new tokens of each timed generate call (fixed γ = 1..8, and plain decoding)


def calibrate_here(target, draft, preverifier: PacerPreVerifier, heldout: Path, plan, *, seed: int = 0,
                   progress: bool = True) -> dict:
    """Measure the costs here, choose the expected-gain rule's setting on half of the held-out texts and report on
    the other half (all of them, choosing and reporting, when fewer than 4 texts are held out)."""
    traces = load_traces(heldout)
    halves = len(set(traces["text_id"])) >= 4
    choose, report_on = split_by_text(traces, 0.5, seed + 1) if halves else (traces, None)
    costs = measure_costs(target, draft, preverifier, max_k=max(16, preverifier.config.max_draft_tokens),
                          repeats=COST_REPEATS, progress=progress)
    measured = {"data": f"held-out answers ({len(traces)} rounds)", "report_fraction": 0.5 if halves else None,
                "hardware": plan.hardware, "torch_threads": torch.get_num_threads(),
                "device": str(target.device), "dtype": str(target.dtype).removeprefix("torch."),
                "bare_draft_cost": costs.draft_cost, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "costs": f"measured where the fit ran: context 128, {COST_REPEATS} interleaved repeats, medians; draft "
                         "step and loop overheads measured inside generate"}
    costs = measure_loop_costs(target, draft, costs, new_tokens=LOOP_TOKENS, repeats=1)
    return calibrate_preverifier(preverifier, choose, costs, rules=("expected_gain",), measured=measured,
                                 report_traces=report_on)
