"""The one timing primitive behind every cost measurement: calibration's c and verify costs,
PEARL's γ and the demo pair's decode steps."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from ._hf_compat import crop_cache
from .lean_draft import LeanDraft


@torch.no_grad()
def cached_forward_timer(
    model: PreTrainedModel, width: int, context: int = 32, logits_to_keep: int | None = None
) -> Callable[[], float]:
    """A callable returning the seconds of one forward of `width` new tokens after a cached
    `context`-token prefix (batch 1). The cache is cropped back after every call, so repeated calls
    time the same work and can be interleaved across models; CUDA is synchronized around the call."""
    vocab = model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=generator).to(model.device)
    tokens = torch.randint(0, vocab, (1, width), generator=generator).to(model.device)
    extra = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
    cache = model(input_ids=prefix, use_cache=True).past_key_values
    return _cropping_timer(lambda: model(input_ids=tokens, past_key_values=cache, use_cache=True, **extra),
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


def _cropping_timer(step: Callable[[], object], cache, context: int, device: torch.device) -> Callable[[], float]:
    """Seconds of `step()` (CUDA synchronized around it), with `cache` cropped back to `context` after each call."""
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
        crop_cache(cache, context)
        return elapsed

    return once
