"""The timing primitives behind every cost measurement: calibration's c, verify and pre-verifier costs,
PEARL's γ, the demo pair's decode steps and the draft rounds' probe (`draft_costs`)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from ._hf_compat import CACHE_KWARG, crop_cache, new_cache
from .loops.lean_draft import LeanDraft
from .loops.round_costs import RoundCosts, cached_probe, forward_costs, model_key, resolve_costs
from .modeling_pacer import PacerPreVerifier


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously: a clock read right after a call that ends
    without a host read would stop before the work does); nothing to wait for on a CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def cached_forward_timer(
    model: PreTrainedModel, width: int, context: int = 32, logits_to_keep: int | None = None
) -> Callable[[], float]:
    """A callable returning the seconds of one forward of `width` new tokens after a cached
    `context`-token prefix (batch 1). The cache is cropped back after every call, so repeated calls
    time the same work and can be interleaved across models; CUDA is synchronized around the call."""
    vocab = model.get_output_embeddings().out_features
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=generator).to(model.device)
    tokens = torch.randint(0, vocab, (1, width), generator=generator).to(model.device)
    extra = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
    cache = new_cache(model.config)  # recording: a windowed layer rolls back past its window too
    model(input_ids=prefix, use_cache=True, **{CACHE_KWARG: cache})
    return _cropping_timer(lambda: model(input_ids=tokens, use_cache=True, **{CACHE_KWARG: cache}, **extra),
                           cache, context, model.device)


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
    return _cropping_timer(lambda: lean(prefix[:, context:], kv), kv, context, lean.device)


@torch.no_grad()
def preverifier_token_timer(preverifier: PacerPreVerifier, draft: PreTrainedModel,
                            scorer: bool = True) -> Callable[[], float]:
    """A callable returning the seconds per drafted token of what generation runs for Pacer
    (`PacerStoppingCriteria.add_token`: the draft-distribution features over the draft's full vocabulary, the
    scoring, the decision), over 8-token rounds at block size 1. `scorer=False` scores with the torch forward
    block by block (what runs off CPU) instead of the compiled round scorer.

    Scoring is per token whatever the block size (the CPU scorer adds one token at a time), so the cost model
    charges it per drafted token."""
    from .loops.candidate_generator import PacerStoppingCriteria
    from .stats import PacerStats

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

    timed = _cropping_timer(round_, None, 0, draft.device if draft.device.type == "cuda" else copy.device)
    return lambda: timed() / tokens


def draft_costs(model: PreTrainedModel, draft: PreTrainedModel, preverifier, max_tokens: int, mode,
                prior: list[float] | None) -> RoundCosts:
    """A draft round proposing k = 0..max_tokens tokens: k draft steps, k pre-verifier scorings, a target
    forward over k + 1 tokens."""
    def probe():
        key, describe, verify, wall = forward_costs(model, max_tokens + 1)
        draft_key = model_key(draft) + model_key(preverifier)

        def measure() -> list[float]:
            step, score = draft_step_timer(draft), preverifier_token_timer(preverifier, draft)
            step(), score()  # warm-up
            return [min(step() for _ in range(5)) + min(score() for _ in range(5))]

        (per_token,), draft_wall = cached_probe(draft_key, measure)
        seconds = [verify[k] + k * per_token for k in range(max_tokens + 1)]
        describe = {**describe, "draft_token_ms": round(1000 * per_token, 3)}
        return hashlib.sha1((key + draft_key).encode()).hexdigest()[:16], describe, seconds, wall + draft_wall

    return resolve_costs(mode, prior=prior, what="the pre-verifier", probe=probe)


def _cropping_timer(step: Callable[[], object], cache, context: int, device: torch.device) -> Callable[[], float]:
    """Seconds of `step()` (CUDA synchronized around it), with `cache` (if any) cropped back to `context` after each call."""
    cuda = device.type == "cuda"

    @torch.no_grad()
    def once() -> float:
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        if cache is not None:
            crop_cache(cache, context)
        return elapsed

    return once
