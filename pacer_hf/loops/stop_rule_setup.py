"""A call's stop rule set up: the costs its expected-gain decision reads and how they are measured.

`stop_rule_for` builds the `PacerStopRule` of one strategy call and picks its cost source (`generate`'s
`pacer_costs=`); `draft_costs` prices a draft round of each length from a target forward per verify width plus the
draft step and the rule's own work per drafted token, which `preverifier_token_timer` times through the path
generation runs. Kept apart from `stop_rule.py` because timing the rule needs the rule: this module sits above it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from ..costs import RoundCosts, cached_probe, fastest, forward_costs, model_key, resolve_costs, timer
from ..modeling_pacer import PacerPreVerifier, calibrated_round_time
from ..stats import PacerStats
from .block_scorer import BlockScorer
from .draft_forwards import draft_step_timer
from .recent_acceptance import recent_acceptance_for
from .stop_rule import PacerStopRule


@torch.no_grad()
def preverifier_token_timer(preverifier: PacerPreVerifier, draft: PreTrainedModel,
                            scorer: bool = True) -> Callable[[], float]:
    """A callable returning the seconds per drafted token of what generation runs for Pacer (`PacerStopRule.add_token`:
    the draft-distribution features over the draft's full vocabulary, the scoring, the decision), over 8-token rounds
    at block size 1 (scoring is per token whatever the block size, so the cost model charges it per drafted token).
    `scorer=False` scores with the eager torch forward block by block instead of the path generation takes."""
    config = preverifier.config.to_dict()
    config.update(block_size=1, decision_rule="block", threshold=0.0, trim_failed_block=False)
    copy = type(preverifier)(type(preverifier.config)(**config)).to(preverifier.device).eval()
    copy.load_state_dict(preverifier.state_dict())
    # the inputs live where the draft makes them, and the path is the one generation takes there
    stop = PacerStopRule(copy, PacerStats(strategy="timing"), draft_device=draft.device)
    if not scorer:
        stop.scorer, stop.blocks = None, BlockScorer(copy)
    vocab = draft.get_output_embeddings().out_features
    generator = torch.Generator().manual_seed(0)
    tokens = min(8, copy.config.max_draft_tokens)
    hidden = torch.randn(tokens, 1, copy.config.draft_hidden_size, generator=generator).to(draft.device)
    logits = (torch.randn(tokens, 1, vocab, generator=generator) * 3).to(draft.device)
    ids = logits.argmax(-1, keepdim=True)

    def round_() -> None:
        stop.start_round()
        for i in range(tokens):
            stop.add_token(hidden[i], logits[i], ids[i])

    round_()  # compiles (or captures) the scorer here: a compile inside the caller's warm-up pass slows what it times next
    timed = timer(round_, None, 0, draft.device if draft.device.type == "cuda" else copy.device)
    return lambda: timed() / tokens


def draft_costs(model: PreTrainedModel, draft: PreTrainedModel, preverifier, max_tokens: int, mode,
                prior: list[float] | None, prior_per_token: float | None = None) -> RoundCosts:
    """A draft round proposing k = 0..max_tokens tokens: k draft steps, k pre-verifier scorings, a target
    forward over k + 1 tokens."""
    def probe():
        key, describe, verify, wall = forward_costs(model, max_tokens + 1)
        draft_key = model_key(draft) + model_key(preverifier)

        def measure() -> list[float]:
            step, score = draft_step_timer(draft), preverifier_token_timer(preverifier, draft)
            return [fastest(step, 5) + fastest(score, 5)]

        (per_token,), draft_wall = cached_probe(draft_key, measure)
        seconds = [verify[k] + k * per_token for k in range(max_tokens + 1)]
        describe = {**describe, "draft_token_ms": round(1000 * per_token, 6)}
        return hashlib.sha1((key + draft_key).encode()).hexdigest()[:16], describe, seconds, wall + draft_wall, per_token

    return resolve_costs(mode, prior=prior, what="the pre-verifier", probe=probe, prior_per_token=prior_per_token)


def stop_rule_for(context, stats: PacerStats, max_tokens: int) -> PacerStopRule | None:
    """The stop rule of one strategy call (`context`: its `StrategyContext`), None without a pre-verifier. The cost
    source is chosen here: an expected-gain rule decides with the round costs measured on this machine
    (`generate`'s `pacer_costs=`: probe plus online refit by default), reported in `stats.costs` when the call
    ends; a threshold rule reads no costs."""
    preverifier = context.preverifier
    if preverifier is None:
        return None
    costs = None
    if preverifier.config.decision_rule == "expected_gain":
        calibration = preverifier.config.calibration
        prior = [calibrated_round_time(calibration)(k) for k in range(max_tokens + 1)] if calibration else None
        per_token = calibration["draft_cost"] + calibration.get("preverifier_cost", 0.0) if calibration else None
        costs = draft_costs(context.model, context.draft, preverifier, max_tokens, context.costs, prior, per_token)
        stats.use_costs(costs)
    draft_device = context.draft.device if context.draft is not None else None
    recent = recent_acceptance_for(context.model, context.draft, context.do_sample)
    return PacerStopRule(preverifier, stats, costs, draft_device=draft_device, recent=recent,
                         greedy=not context.do_sample)
