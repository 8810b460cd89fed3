"""A pair's cost model for calibration and the benchmark (`measure_costs`), from the drafting loop's own timers: a
draft step through the forward the loop uses (`draft_forwards.draft_step_timer`) and the stop rule's work per drafted
token (`stop_rule_setup.preverifier_token_timer`). The timing itself is `pacer_hf.costs` (one loop, one timer)."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..costs import CostModel, cached_forward_timer, interleaved
from ..modeling_pacer import PacerPreVerifier
from .draft_forwards import draft_step_timer
from .stop_rule_setup import preverifier_token_timer


@torch.inference_mode()
def measure_costs(target: PreTrainedModel, draft: PreTrainedModel | None, preverifier: PacerPreVerifier | None = None,
                  context: int = 128, max_k: int = 16, repeats: int = 15, progress: bool = True) -> CostModel:
    """Time one target step, target forwards over k+1 tokens (k = 0..max_k), one draft step on a cached
    `context`-token prefix and the pre-verifier's work per drafted token; all relative to one target step.
    Interleaved repeats, medians. The draft step goes through the forward the drafting loop uses (the lean
    one when the draft qualifies). Without a draft (prompt lookup) the draft cost is 0."""
    def forward(width: int, keep: int | None):
        return cached_forward_timer(target, width, context, logits_to_keep=keep)

    runs = {"target": forward(1, 1)}
    if draft is not None:
        runs["draft"] = draft_step_timer(draft, context)
    runs.update({f"verify-{k}": forward(k + 1, None) for k in range(1, max_k + 1)})
    if preverifier is not None:
        runs["preverifier"] = preverifier_token_timer(preverifier, draft or target)
    med = interleaved(runs, repeats, progress=progress)
    step = med["target"]
    verify = [1.0] + [med[f"verify-{k}"] / step for k in range(1, max_k + 1)]
    return CostModel(draft_cost=med.get("draft", 0.0) / step, verify_cost=verify,
                     preverifier_cost=med.get("preverifier", 0.0) / step, step_seconds=step)
