"""Pairs whose output heads differ only by padding rows past the shared vocabulary, kept exact.

Qwen2.5-7B's head has 152,064 rows, Qwen2.5-0.5B's 151,936, over one 151,665-token tokenizer: the rows past the
tokenizer are padding. `generate_checks.check_vocabularies` accepts such a pair when the draft's head is the
narrower one; this module is what the loops do with it. The draft keeps its own width wherever it decides (it
proposes only ids it has, its pre-verifier reads its own logits, it samples from its own softmax); where it meets
the target:

- its q is widened to the target's width with probability 0 on the rows it lacks. That is exactly the
  distribution its tokens were drawn from, so speculative sampling stays exact;
- it reads the committed text through its own rows: an id past them (a target that emits one of its padding
  rows; never a token of the tokenizer) reaches the draft as `rows - 1`, its own last row, and the target's
  scores it reads back (the loop features' confidence, Ouroboros' target tails) are its own rows of them. That
  changes what the draft proposes next, never what is accepted: the target verifies every token.

A pair whose heads have one width gets none of this (no wrapper, no cost per round).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .._hf_compat import CandidateGenerator

_FLOAT32_MIN = torch.finfo(torch.float32).min


def own_rows(draft: PreTrainedModel) -> int:
    """The ids the draft can read and propose: its head's rows, or its input embedding's when fewer."""
    rows = draft.get_output_embeddings().out_features
    return min(rows, getattr(draft.get_input_embeddings(), "num_embeddings", rows))


def draft_rows(target: PreTrainedModel, draft: PreTrainedModel | None) -> int | None:
    """`own_rows(draft)` when the target's head is wider; None when the heads have one width (nothing to adapt)."""
    if draft is None or draft.get_output_embeddings() is None:
        return None
    rows = own_rows(draft)
    return rows if rows < target.get_output_embeddings().out_features else None


def draft_view(ids: torch.Tensor, rows: int) -> torch.Tensor:
    """`ids` as the draft reads them: an id past its `rows` as `rows - 1`; `ids` itself when none is."""
    beyond = ids >= rows
    return ids.masked_fill(beyond, rows - 1) if bool(beyond.any()) else ids


def widen(logits: torch.Tensor, width: int, fill: float = float("-inf")) -> torch.Tensor:
    """`logits` (..., rows) with columns of `fill` up to `width`: probability 0 on the rows the draft lacks."""
    missing = width - logits.shape[-1]
    if missing <= 0:
        return logits
    return torch.cat([logits, logits.new_full((*logits.shape[:-1], missing), fill)], dim=-1)


class PaddedHeadCandidates(CandidateGenerator):
    """A strategy's candidate generator for a draft whose head is narrower than the target's: the inner generator
    sees the text and the target's scores through the draft's rows, and hands out q at the target's width."""

    def __init__(self, inner: CandidateGenerator, rows: int, width: int):
        self.inner, self.rows, self.width = inner, rows, width
        self.requires_model_outputs = getattr(inner, "requires_model_outputs", False)

    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        view = draft_view(input_ids, self.rows)
        candidates, q = self.inner.get_candidates(view, **kwargs)
        if view is not input_ids:  # the committed text as it is; the proposals after it are the draft's own ids
            candidates = torch.cat([input_ids, candidates[:, input_ids.shape[1]:].to(input_ids.device)], dim=1)
        return candidates, None if q is None else widen(q, self.width)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches) -> None:
        self.inner.update_candidate_strategy(draft_view(input_ids, self.rows), scores[..., : self.rows], num_matches)

    def __getattr__(self, name: str):
        if name == "inner":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def fit_generator(generator: CandidateGenerator, target: PreTrainedModel,
                  draft: PreTrainedModel | None) -> CandidateGenerator:
    """`generator`, wrapped (`PaddedHeadCandidates`) when the draft's head is narrower than the target's."""
    rows = draft_rows(target, draft)
    if rows is None:
        return generator
    return PaddedHeadCandidates(generator, rows, target.get_output_embeddings().out_features)


class PaddedRowCache:
    """The batched loop's draft cache (`batch_cache.RowCache`) for a draft whose head is narrower than the
    target's: tokens past its rows go in as `rows - 1`, logits come out at the target's width.

    The added columns hold the dtype's lowest finite value rather than -inf: the pre-verifier's features read these
    logits too, and a finite floor keeps them what they are over the draft's own rows (probability exactly 0, and
    0 * log p stays 0 where -inf would make it NaN); softmax, argmax and the logits processors never pick them. The
    floor is float32's (the features read logits in float32), or the dtype's own where that is higher (16-bit)."""

    def __init__(self, cache, rows: int, width: int):
        self.cache, self.rows, self.width = cache, rows, width

    def forward(self, tokens: torch.Tensor, *args, **kwargs):
        out = self.cache.forward(draft_view(tokens, self.rows), *args, **kwargs)
        logits, hidden = out if isinstance(out, tuple) else (out, None)
        logits = widen(logits, self.width, max(torch.finfo(logits.dtype).min, _FLOAT32_MIN))
        return (logits, hidden) if isinstance(out, tuple) else logits

    def __getattr__(self, name: str):
        if name == "cache":
            raise AttributeError(name)
        return getattr(self.cache, name)


def fit_row_cache(cache, target: PreTrainedModel, draft: PreTrainedModel):
    """The batched loop's draft cache, wrapped (`PaddedRowCache`) when the draft's head is narrower."""
    rows = draft_rows(target, draft)
    if rows is None:
        return cache
    return PaddedRowCache(cache, rows, target.get_output_embeddings().out_features)
