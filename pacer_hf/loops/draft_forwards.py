"""The draft's decode step, chosen once per `generate` call: `forward(pending, cache) -> (hidden, logits)`.

`hidden` is the input of the draft's `lm_head` at the last position (what the pre-verifier reads) and
`logits` the raw logits there; `cache` is updated in place. Three kinds, recorded in `stats.draft_forward`:
- "lean": Llama-family drafts as plain tensor ops over a preallocated KV buffer (`lean_draft.py`);
- "compiled": a `compile_draft`ed decoder for one-token steps, the eager forward for longer inputs;
- "model": the draft's own `forward`, with a pre-hook on `lm_head` capturing its input.
Draft numerics never decide a token (the target verifies every one), so the choice is speed only.
`draft_step_timer` times a step through the forward the loop would choose.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from .._hf_compat import CACHE_KWARG, new_cache, output_cache
from ..costs import cached_forward_timer, timer
from ..model_state import ModelState
from ..stats import PacerStats
from .lean_draft import LeanDraft

DraftForward = Callable[[torch.Tensor, object], tuple[torch.Tensor, torch.Tensor]]
DRAFT_FORWARDS = ("auto", "lean", "model")


def choose_draft_forward(draft, draft_forward: str, max_length: int, stats: PacerStats) -> tuple[DraftForward, object]:
    """The decode step and an empty cache for it; `draft_forward` was validated by `generate`.

    Under "auto" a `compile_draft`ed draft runs compiled, any other draft lean when it qualifies."""
    decode_step = ModelState(draft).decode_step  # set by compile_draft
    if draft_forward == "lean" or (draft_forward == "auto" and decode_step is None):
        lean, reason = LeanDraft.for_model(draft, max_length)
        if lean is not None:
            stats.draft_forward = "lean"
            return lean, lean.new_cache(min(max_length, 512))
        if draft_forward == "lean":
            raise ValueError(f"pacer_draft_forward='lean' cannot run this draft: {reason}. "
                             "Pass pacer_draft_forward='model' (or 'auto') to use the draft's own forward.")
    cache = new_cache(draft.config)
    if decode_step is not None:
        stats.draft_forward = "compiled"
        return _compiled_forward(draft, decode_step), cache
    stats.draft_forward = "model"
    return _model_forward(draft), cache


def _model_forward(draft) -> DraftForward:
    lm_head = draft.get_output_embeddings()
    kwargs = {"use_cache": True}
    if "logits_to_keep" in inspect.signature(getattr(draft, "get_base_model", lambda: draft)().forward).parameters:
        kwargs["logits_to_keep"] = 1
    captured: list[torch.Tensor] = []

    def capture(module: torch.nn.Module, args: tuple) -> None:
        captured.append(args[0][:, -1])

    def forward(pending: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        captured.clear()
        handle = lm_head.register_forward_pre_hook(capture)
        try:
            logits = draft(input_ids=pending, **{CACHE_KWARG: cache}, **kwargs).logits[:, -1, :]
        finally:
            handle.remove()
        return captured[-1], logits

    return forward


def _compiled_forward(draft, decode_step) -> DraftForward:
    eager = _model_forward(draft)
    lm_head = draft.get_output_embeddings()

    def forward(pending: torch.Tensor, cache) -> tuple[torch.Tensor, torch.Tensor]:
        if pending.shape[1] != 1 or cache.get_seq_length() == 0:  # prefill and multi-token steps stay eager
            return eager(pending, cache)
        hidden = decode_step(input_ids=pending, use_cache=True, **{CACHE_KWARG: cache}).last_hidden_state[:, -1]
        return hidden, lm_head(hidden)

    return forward


def compile_draft(draft_model, warmup: bool = True):
    """Opt-in: compile the draft's one-token decode step with `torch.compile` (returns the draft).

    The draft's decoder is compiled (dynamic shapes, its own DynamicCache) and `lm_head` stays eager.
    Multi-token inputs (prefill, the two tokens after a fully accepted round) keep the eager forward,
    so only one shape is compiled. Compiling takes tens of seconds on a CPU; `warmup` pays it here
    rather than in the first call. Refused for drafts whose logits are not `lm_head(decoder(...))`.
    """
    decoder, lm_head = draft_model.get_decoder(), draft_model.get_output_embeddings()
    if decoder is None or decoder is draft_model or lm_head is None:
        raise ValueError(f"compile_draft needs a causal LM with a decoder and an lm_head; got {type(draft_model).__name__}.")
    probe = torch.zeros((1, 4), dtype=torch.long, device=draft_model.device)
    with torch.no_grad():
        expected = draft_model(probe).logits
        split = lm_head(decoder(input_ids=probe).last_hidden_state)
    if not torch.allclose(expected, split, atol=1e-4, rtol=1e-4):
        raise ValueError(
            f"compile_draft: {type(draft_model).__name__}'s logits are not lm_head(decoder(x)); use the eager draft."
        )
    # Kept out of the module tree (not a submodule): the draft's state_dict and save_pretrained stay unchanged.
    ModelState(draft_model).decode_step = torch.compile(decoder, dynamic=True)
    if warmup:
        with torch.no_grad():
            cache = output_cache(decoder(input_ids=probe, use_cache=True))
            for token in range(2):  # two lengths, so the dynamic-shape graph is the one compiled
                ModelState(draft_model).decode_step(input_ids=probe[:, :1] + token, use_cache=True, **{CACHE_KWARG: cache})
    return draft_model


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
