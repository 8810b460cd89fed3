"""`fit_preverifier`'s calibration: the pair's costs measured on the device and in the dtype it runs in, each
candidate's expected-gain setting chosen on half of the held-out answers and the fastest candidate kept, AUC/ECE and
the table reported on the other half (as the shipped pre-verifiers were calibrated: `recipes/ship_preverifier.py`)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch

from ..costs import interleaved
from ..loops.probes import measure_costs
from ..loops.stop_rule_setup import preverifier_token_timer
from ..modeling_pacer import PacerPreVerifier
from .calibrate import calibrate_preverifier, measure_loop_costs, report_on
from .traces import load_traces
from .train import split_by_text

COST_REPEATS = 7
LOOP_TOKENS = 32  # new tokens of each timed generate call (fixed γ = 1..8, and plain decoding)


def calibrate_here(target, draft, candidates: dict[str, PacerPreVerifier], heldout: Path, plan, *, seed: int = 0,
                   progress: bool = True) -> tuple[str, PacerPreVerifier, dict]:
    """Measure the costs here (each candidate's own scoring cost beside them), calibrate every candidate on half of
    the held-out texts and keep the one whose rule the simulation runs fastest there; report on the other half (all
    of them, choosing and reporting, when fewer than 4 texts are held out). Returns (name, calibrated, report)."""
    traces = load_traces(heldout)
    halves = len(set(traces["text_id"])) >= 4
    choose, report_half = split_by_text(traces, 0.5, seed + 1) if halves else (traces, None)
    candidates = {name: pv.to(device=draft.device, dtype=draft.dtype).eval() for name, pv in candidates.items()}
    widest = max(pv.config.max_draft_tokens for pv in candidates.values())
    costs = measure_costs(target, draft, None, max_k=max(16, widest), repeats=COST_REPEATS, progress=progress)
    scoring = interleaved({name: preverifier_token_timer(pv, draft) for name, pv in candidates.items()}, COST_REPEATS,
                          progress=False)
    measured = {"data": f"held-out answers ({len(traces)} rounds)", "report_fraction": 0.5 if halves else None,
                "hardware": plan.hardware, "torch_threads": torch.get_num_threads(),
                "device": str(target.device), "dtype": str(target.dtype).removeprefix("torch."),
                "bare_draft_cost": costs.draft_cost, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "costs": f"measured where the fit ran: context 128, {COST_REPEATS} interleaved repeats, medians; draft "
                         "step and loop overheads measured inside generate"}
    costs = measure_loop_costs(target, draft, costs, new_tokens=LOOP_TOKENS, repeats=1)
    own = {name: replace(costs, preverifier_cost=scoring[name] / costs.step_seconds) for name in candidates}
    speeds = {name: calibrate_preverifier(pv, choose, own[name], rules=("expected_gain",), measured=measured,
                                          report_traces=None)["chosen"]["speedup"] for name, pv in candidates.items()}
    kept = max(speeds, key=speeds.get)  # ties: the first in `candidates`' order
    report = report_on(candidates[kept], report_half, own[kept]) if halves else candidates[kept].config.calibration
    report["candidates_simulated"] = {name: round(v, 4) for name, v in speeds.items()}
    report["candidate_kept"] = kept  # named, since rounded speeds can tie
    return kept, candidates[kept], report
