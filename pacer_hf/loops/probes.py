"""What the drafting loop's own pieces cost: the timers of a draft step (through the forward the loop uses) and of
the pre-verifier's work per drafted token, the probe of a draft round (`draft_costs`) and a pair's cost model for
calibration and the benchmark (`measure_costs`). The timing itself is `pacer_hf.costs` (one loop, one timer);
this module only says what to time, because only the loop knows it."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from ..costs import (
    CostModel,
    RoundCosts,
    cached_forward_timer,
    cached_probe,
    fastest,
    forward_costs,
    interleaved,
    model_key,
    resolve_costs,
    timer,
)
from ..modeling_pacer import PacerPreVerifier
from ..stats import PacerStats
from .candidate_generator import PacerStoppingCriteria
from .lean_draft import LeanDraft


@torch.no_grad()
def draft_step_timer(draft: PreTrainedModel, context: int = 32) -> Callable[[], float]:
    """Like `cached_forward_timer(draft, 1, context, 1)`, through the draft forward pacer_hf's drafting loop
    uses (`pacer_draft_forward="auto"`): the lean forward when the draft qualifies, else its `forward`."""
    lean, _ = LeanDraft.for_model(draft, context + 1)
    if lean is None:
        return cached_forward_timer(draft, 1, context, logits_to_keep=1)
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, lean.embed.shape[0], (1, context + 1), generator=generator).to(lean.device)
    kv = lean.new_cache(context + 1)
    lean(prefix[:, :context], kv)
    return timer(lambda: lean(prefix[:, context:], kv), kv, context, lean.device)


@torch.no_grad()
def preverifier_token_timer(preverifier: PacerPreVerifier, draft: PreTrainedModel,
                            scorer: bool = True) -> Callable[[], float]:
    """A callable returning the seconds per drafted token of what generation runs for Pacer
    (`PacerStoppingCriteria.add_token`: the draft-distribution features over the draft's full vocabulary, the
    scoring, the decision), over 8-token rounds at block size 1. `scorer=False` scores with the torch forward
    block by block (what runs off CPU) instead of the compiled round scorer.

    Scoring is per token whatever the block size (the CPU scorer adds one token at a time), so the cost model
    charges it per drafted token."""
    config = preverifier.config.to_dict()
    config.update(block_size=1, decision_rule="block", threshold=0.0, trim_failed_block=False)
    copy = type(preverifier)(type(preverifier.config)(**config)).to(preverifier.device).eval()
    copy.load_state_dict(preverifier.state_dict())
    # the inputs live where the draft makes them, and the path (compiled or torch) is the one generation takes there
    stop = PacerStoppingCriteria(copy, PacerStats(strategy="timing"), draft_device=draft.device)
    if not scorer:
        stop.scorer = None
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

    round_()  # compiles (or loads) the scorer here: a compile inside the caller's warm-up pass slows what it times next
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
