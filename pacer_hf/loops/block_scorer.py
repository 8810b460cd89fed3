"""The pre-verifier's torch path, shared by the single-row stop criterion and the batched loop's stopper.

Drafted tokens are collected until a block is full; then one forward of the pre-verifier scores the block over the
round's cached keys and values. Used where the compiled CPU scorer (`preverifier_kernel`) cannot run: a draft on
an accelerator, and batches, where a block of every row costs one call.
"""

from __future__ import annotations

import torch

from ..modeling_pacer import PacerPreVerifier, draft_features


class BlockScorer:
    """`start(loops)` opens a round; `add(hidden, raw_logits, tokens)` records one drafted token per row and, when a
    block is full, returns the acceptance logits of every token drafted this round, shape (rows, tokens so far)."""

    def __init__(self, preverifier: PacerPreVerifier):
        self.preverifier = preverifier
        self.block_size = preverifier.config.block_size
        self.reads_loop = bool(getattr(preverifier.config, "loop_features", False))
        self.start(None)

    def start(self, loops: list[list[float]] | None) -> None:
        """A new round; `loops`: each row's `loop_features(...)` (read when the config says `loop_features`)."""
        self.hidden: list[torch.Tensor] = []
        self.features: list[torch.Tensor] = []
        self.past = None
        self.logits: torch.Tensor | None = None
        device = self.preverifier.device
        self.loop = torch.tensor(loops, device=device) if self.reads_loop and loops is not None else None

    @torch.no_grad()
    def add(self, hidden: torch.Tensor, raw_logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor | None:
        self.hidden.append(hidden)
        self.features.append(draft_features(raw_logits, tokens))  # 3 numbers a token: no logits are kept
        if len(self.hidden) < self.block_size:
            return None
        device = self.preverifier.device
        out = self.preverifier(torch.stack(self.hidden, 1).to(device), torch.stack(self.features, 1).to(device),
                               cache=self.past, loop_features=self.loop)
        self.hidden, self.features, self.past = [], [], out.cache
        self.logits = out.logits if self.logits is None else torch.cat((self.logits, out.logits), 1)
        return self.logits
