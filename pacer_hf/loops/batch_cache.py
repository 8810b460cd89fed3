"""The batched loop's caches (`batch_loop.py`): B rows of different lengths in one cache.

Every cache slot carries, per row, the position of the row token it holds, or -1 for a masked slot
(padding, a rejected token, a row's filler). The attention mask is `position >= 0` and positions are
explicit per row, so a row rolls back by masking its rejected slots: never by zeroing them, since a
zeroed key still receives attention. The target's cache is transformers' `DynamicCache`; the draft's
is the lean forward's preallocated buffers when the draft qualifies (`lean_draft.py`).
"""

from __future__ import annotations

import os

import torch
from transformers import PreTrainedModel

from .._hf_compat import CACHE_KWARG, batch_row_cache, gather_cache_slots
from ..model_state import ModelState
from ..stats import PacerStats
from .lean_draft import LeanDraft


class RowCache:
    """A transformers cache shared by rows of different lengths. `positions[b, s]` is the position of
    row b's token in slot s, or -1 for a masked slot (padding, a rejected token, a row's filler).

    Sliding-window models (`contiguous`): the model's mask measures its window in slots, as batched `generate`
    does over a left-padded batch, so each row's tokens stay contiguous: blocks are padded on the right and
    rows are realigned every round (`batch_row_cache` gives such models full layers, windowed by the mask).
    """

    def __init__(self, model: PreTrainedModel, cache, batch: int, device, contiguous: bool = False):
        self.model, self.cache, self.contiguous = model, cache, contiguous
        self.positions = torch.empty((batch, 0), dtype=torch.long, device=device)

    @classmethod
    def for_model(cls, model: PreTrainedModel, cache, batch: int, device) -> RowCache:
        """The RowCache for `model` over `cache` (None: a new one), laid out as its attention needs."""
        cache, windowed = batch_row_cache(model, cache)
        return cls(model, cache, batch, device, contiguous=windowed)

    def lay_out(self, blocks: list[list[int]], starts: list[int], device) -> tuple[torch.Tensor, torch.Tensor,
                                                                                  torch.Tensor | None]:
        """Tokens, positions and each row's last column (None: the last column for every row) for per-row
        blocks of different lengths, whose first tokens have positions `starts`."""
        if not self.contiguous:
            return (*right_aligned(blocks, starts, device), None)
        width = max(len(block) for block in blocks)
        tokens = torch.zeros((len(blocks), width), dtype=torch.long)
        positions = torch.full((len(blocks), width), -1, dtype=torch.long)
        for b, (block, start) in enumerate(zip(blocks, starts)):
            tokens[b, : len(block)] = torch.tensor(block, dtype=torch.long)
            positions[b, : len(block)] = torch.arange(start, start + len(block))
        last = torch.tensor([max(len(block) - 1, 0) for block in blocks])
        return tokens.to(device), positions.to(device), last.to(device)

    def held(self) -> list[int]:
        """Tokens each row has in the cache (always a prefix of the row)."""
        return (self.positions >= 0).sum(1).tolist()

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, logits_to_keep: int, hidden: bool = False,
                last: torch.Tensor | None = None):
        """Run the model on a block (`lay_out`); returns per row the `logits_to_keep` logits ending at its
        last column (`last`, None: the block's last column), and the `lm_head` input there when `hidden`."""
        self.positions = torch.cat((self.positions, positions), 1)
        mask = (self.positions >= 0).long()
        position_ids = positions.clamp_min(0).masked_fill(positions < 0, 1)  # batched generate's pad positions
        width = tokens.shape[1]
        kept = logits_to_keep if last is None else min(width, width - int((last - logits_to_keep + 1).min()))
        captured = []
        handle = None
        if hidden:
            handle = self.model.get_output_embeddings().register_forward_pre_hook(
                lambda module, args: captured.append(args[0]))
        try:
            out = self.model(input_ids=tokens, attention_mask=mask, position_ids=position_ids,
                             use_cache=True, logits_to_keep=kept, **{CACHE_KWARG: self.cache})
        finally:
            if handle is not None:
                handle.remove()
        logits, states = out.logits, (captured[-1] if hidden else None)
        if last is None:
            return (logits, states[:, -1]) if hidden else logits
        end = last - (width - logits.shape[1])  # each row's last column among the kept logits
        # a row whose block is shorter than `logits_to_keep` repeats its first column (the loop never reads those)
        index = (end[:, None] - torch.arange(logits_to_keep - 1, -1, -1, device=end.device)).clamp_min(0)
        logits = logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))
        if not hidden:
            return logits
        end = last - (width - states.shape[1])
        return logits, states.gather(1, end[:, None, None].expand(-1, 1, states.shape[-1]))[:, 0]

    def keep(self, lengths: list[int]) -> None:
        """Mask every slot at or past each row's `lengths[b]`."""
        limit = torch.tensor(lengths, device=self.positions.device)[:, None]
        self.positions = self.positions.masked_fill(self.positions >= limit, -1)

    def select(self, rows: list[int]) -> None:
        index = torch.tensor(rows, device=self.positions.device)
        self._select(index)
        self.positions = self.positions[index]

    def _select(self, index: torch.Tensor) -> None:
        self.cache.batch_select_indices(index)

    def _gather(self, order: torch.Tensor) -> None:
        gather_cache_slots(self.cache, order)

    def compact(self, always: bool) -> None:
        """Realign rows: each row's held slots move right, masked slots go (every round when `always` or the
        rows must stay contiguous, else once masked slots are over half the cache, which bounds its memory to
        about twice the text)."""
        valid = self.positions >= 0
        width = int(valid.sum(1).max())
        # stable sort puts masked slots first and keeps held slots in order; keep the last `width`
        flags, order = torch.sort(valid.long(), dim=1, stable=True)
        aligned = width == self.positions.shape[1] and (not self.contiguous or torch.equal(flags.bool(), valid))
        if aligned or (not always and not self.contiguous and 2 * width > self.positions.shape[1]):
            return
        order = order[:, -width:]
        self._gather(order)
        self.positions = self.positions.gather(1, order)


class LeanRowCache(RowCache):
    """RowCache over the lean draft forward (`lean_draft.py`): the draft's layers as tensor ops on
    preallocated per-row buffers, with the same slot bookkeeping."""

    def __init__(self, lean: LeanDraft, batch: int, capacity: int):
        self.lean, self.kv, self.contiguous = lean, lean.new_cache(capacity, batch), False
        self.positions = torch.empty((batch, 0), dtype=torch.long, device=lean.device)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, logits_to_keep: int, hidden: bool = False,
                last: None = None):
        start, end = self.kv.length, self.kv.length + tokens.shape[1]
        self.positions = torch.cat((self.positions, positions), 1)
        slots, new = torch.arange(end, device=tokens.device), torch.arange(start, end, device=tokens.device)
        # held slots up to its own; a masked query also sees itself (its output is never read)
        visible = ((self.positions >= 0)[:, None, :] & (slots <= new[:, None])) | (slots == new[:, None])
        last, logits = self.lean.rows(tokens, positions, self.kv, visible)
        return (logits[:, None], last) if hidden else logits[:, None]

    def _select(self, index: torch.Tensor) -> None:
        for buffers in (self.kv.keys, self.kv.values):
            for i, buffer in enumerate(buffers):
                buffers[i] = buffer[index]

    def _gather(self, order: torch.Tensor) -> None:
        width = order.shape[1]
        for buffers in (self.kv.keys, self.kv.values):
            for buffer in buffers:
                index = order[:, None, :, None].expand(buffer.shape[0], buffer.shape[1], width, buffer.shape[3])
                buffer[:, :, :width] = buffer[:, :, : self.kv.length].gather(2, index)
        self.kv.length = width


def left_padded(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and attention mask of a left-padded batch, as a tokenizer with padding_side='left' returns them."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, prompt in enumerate(prompts):
        ids[b, width - len(prompt):] = torch.tensor(prompt)
        mask[b, width - len(prompt):] = 1
    return ids.to(device), mask.to(device)


def right_aligned(blocks: list[list[int]], starts: list[int], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token and position tensors for per-row blocks of different lengths, padded on the left."""
    width = max(len(block) for block in blocks)
    tokens = torch.zeros((len(blocks), width), dtype=torch.long)
    positions = torch.full((len(blocks), width), -1, dtype=torch.long)
    for b, (block, start) in enumerate(zip(blocks, starts)):
        if block:
            tokens[b, width - len(block):] = torch.tensor(block)
            positions[b, width - len(block):] = torch.arange(start, start + len(block))
    return tokens.to(device), positions.to(device)


def draft_row_cache(draft: PreTrainedModel, draft_forward: str, stats: PacerStats, batch: int,
                    max_length: int) -> RowCache:
    """The draft's RowCache: the lean forward when the draft qualifies (as in the batch-1 drafting loop)."""
    if draft_forward != "model" and ModelState(draft).decode_step is None:
        lean, reason = LeanDraft.for_model(draft, max_length)
        if lean is not None:
            stats.draft_forward = "lean"
            return LeanRowCache(lean, batch, min(2 * max_length, 1024))
        if draft_forward == "lean":
            raise ValueError(f"pacer_draft_forward='lean' cannot run this draft: {reason}. "
                             "Pass pacer_draft_forward='model' (or 'auto') to use the draft's own forward.")
    stats.draft_forward = "model"
    return RowCache.for_model(draft, None, batch, draft.device)


def kv_bytes(model: PreTrainedModel, batch: int, slots: int) -> int:
    """Bytes of a full-attention KV cache of `slots` positions for `batch` rows."""
    config = model.config.get_text_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    itemsize = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * batch * kv_heads * head_dim * slots * itemsize


def available_memory(device: torch.device) -> int:
    """Free bytes where the caches will live: the accelerator's free memory, else the host's available RAM."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_batch_memory(model: PreTrainedModel, draft: PreTrainedModel | None, batch: int, max_length: int) -> None:
    """Refuse, before any work, a batch whose caches cannot fit: masked slots keep the cache at most about
    twice the text (`RowCache.compact`), and the prompt's logits are never all kept."""
    slots = 2 * max_length + 64
    needed = kv_bytes(model, batch, slots) + (kv_bytes(draft, batch, slots) if draft is not None else 0)
    free = available_memory(model.device)
    if needed > free:
        raise ValueError(
            f"A batch of {batch} prompts up to {max_length} tokens needs about {needed / 2**30:.1f} GiB of KV cache "
            f"for the target and the draft, and {free / 2**30:.1f} GiB is free on {model.device}: pass fewer prompts "
            "per generate call (or a smaller max_new_tokens)."
        )
