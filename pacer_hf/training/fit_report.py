"""`fit_preverifier`'s checks and card: the speed check on held-out prompts and the model card that records the fit.

The speed check times, interleaved on the same held-out prompts, the target alone, fixed-length drafting (γ = 2, 4,
6, 8), transformers' own assisted generation with the draft's generation config as it ships (HF's default schedule)
and the fitted pre-verifier, greedy, and checks every output against the target alone. The card (README.md beside
the weights) carries the data, the training run, held-out AUC/ECE, the calibration and that check, with the
machine and the time each stage took.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import types
from pathlib import Path

import torch

from ..costs import processor_name
from ..hub.publish import METRICS_FILE, render_preverifier_card
from ..modeling_pacer import PacerPreVerifier
from .validate import compare_in_generate

FIXED_GAMMAS = (2, 4, 6, 8)
HF_DEFAULT = "hf-default"


@contextlib.contextmanager
def fresh_generation_config(draft):
    """Run one call with a copy of the draft's generation config and restore it after: transformers writes its
    schedule's state back into the draft's config (the heuristic window, the re-tuned confidence threshold), so
    without this every call after the first would start from the previous one's state."""
    saved = draft.generation_config
    draft.generation_config = copy.deepcopy(saved)
    try:
        yield
    finally:
        draft.generation_config = saved


def hf_schedule(draft) -> str:
    """What the draft's generation config sets for transformers' schedule (unset: transformers' defaults, 20 tokens
    and a 0.4 confidence threshold in transformers 5)."""
    config = draft.generation_config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    given = {name: getattr(config, name, None) for name in names}
    if all(value is None for value in given.values()):
        return "the draft's generation config as shipped: transformers' defaults"
    return ", ".join(f"{name}={value}" for name, value in given.items() if value is not None)


def speed_check(target, draft, preverifier: PacerPreVerifier, prompts: list[list[int]], max_new_tokens: int,
                runs: int = 1) -> dict:
    """Greedy tokens/s of the target alone, fixed γ, HF's default schedule and the pre-verifier on `prompts`
    (interleaved; every output checked against the target alone). Returns the rows and the conditions."""
    settings = {f"sd-fixed-{g}": f"sd-fixed-{g}" for g in FIXED_GAMMAS} | {HF_DEFAULT: False, "pacer": preverifier}
    measured = compare_in_generate(target, draft, prompts, settings, runs=runs, max_new_tokens=max_new_tokens,
                                   warmup=True, contexts={HF_DEFAULT: lambda: fresh_generation_config(draft)})
    names = {"ar": "target alone", HF_DEFAULT: f"transformers' assisted generation ({hf_schedule(draft)})",
             "pacer": "Pacer (this pre-verifier)"}
    rows = [{"method": names.get(name, name), "tokens/s": round(row["tokens_per_s"], 2),
             "vs target alone": round(row["vs_ar"], 3), "mean draft": None if name in ("ar", HF_DEFAULT)
             else round(row["mean_draft"], 2)} for name, row in measured.items()]
    best_fixed = max(measured[f"sd-fixed-{g}"]["vs_ar"] for g in FIXED_GAMMAS)
    pacer = measured["pacer"]["vs_ar"]
    summary = {"pacer_vs_target": round(pacer, 3), "pacer_vs_best_fixed": round(pacer / best_fixed, 3),
               "pacer_vs_hf_default": round(pacer / measured[HF_DEFAULT]["vs_ar"], 3),
               "outputs_identical": True}  # compare_in_generate raises on the first greedy output that differs
    conditions = (f"{len(prompts)} held-out prompts x {max_new_tokens} new tokens, greedy, {runs} interleaved "
                  f"run(s), batch 1, {torch.get_num_threads()} torch thread(s), {_device(target)}, "
                  f"{str(target.dtype).removeprefix('torch.')}; load average {_load()}")
    return {"rows": rows, "summary": summary, "conditions": conditions}


def _device(model) -> str:
    device = model.device
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({processor_name()}, {os.cpu_count()} cores)"


def _load() -> str:
    try:
        return ", ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def card_metrics(report: dict) -> dict:
    """`pacer_metrics.json` of a fitted pre-verifier (what its card shows) from the fit's report."""
    speed = report.get("speed_check") or {}
    evaluation = {"held-out AUC": report["auc"], "held-out ECE": report["ece"],
                  "held-out rounds": report["heldout_rounds"], **report.get("simulated", {})}
    return {
        "datasets": [report["data"]],
        "training": {**report["training"], "stage seconds": report["stage_seconds"],
                     "stage plan seconds": report.get("stage_plan_seconds") or None, "budget_s": report["budget_s"],
                     "total seconds": report["total_seconds"]},
        "evaluation": evaluation,
        "speedup": speed.get("rows"),
        "conditions": speed.get("conditions"),
        "hardware": report["hardware"],
        "command": report.get("command"),
    }


def write_card(folder: Path, metrics: dict) -> None:
    """`pacer_metrics.json` and README.md (the model card) beside the weights saved in `folder`."""
    (folder / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True, default=str) + "\n")
    (folder / "README.md").write_text(render_preverifier_card(folder, datasets=metrics.get("datasets")))


def save_pretrained(self: PacerPreVerifier, save_directory, *args, **kwargs):
    """`PacerPreVerifier.save_pretrained`, then the card and `pacer_metrics.json` beside the weights. Named like the
    method it stands in for: pickle finds a bound method by its name (an unpickled copy saves without the card)."""
    result = PacerPreVerifier.save_pretrained(self, save_directory, *args, **kwargs)
    write_card(Path(save_directory), self.fit_metrics)
    return result


def with_card(preverifier: PacerPreVerifier, metrics: dict) -> PacerPreVerifier:
    """Make this pre-verifier's `save_pretrained` also write its card (README.md) and `pacer_metrics.json` (bound
    on this object only: what loads it back is a plain PacerPreVerifier, and the card stays in the folder)."""
    preverifier.fit_metrics = metrics
    preverifier.save_pretrained = types.MethodType(save_pretrained, preverifier)
    return preverifier
