"""pacer_hf's drafting loop: direct draft forwards on the draft's own KV cache, stopped by Pacer.

Verification runs in the lean loop (lean_loop.py) or transformers' `_assisted_decoding`; this module
is the drafting side. Drafting runs the draft
on its own KV cache instead of re-entering `generate()` every round (the per-round setup that makes
stock assisted generation lose on small models): through `lean_draft.LeanDraft` for Llama-family
drafts, else the draft's `forward`. The pre-verifier runs as a `StoppingCriteria` at block
boundaries, reading the draft's last hidden state (the lean forward returns it; with `forward`, a
pre-hook on the draft's `lm_head` captures it).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

import torch
from transformers import LogitsProcessorList, StoppingCriteria

from ._hf_compat import AssistedCandidateGenerator, crop_cache
from .lean_draft import LeanDraft
from .modeling_pacer import PacerPreVerifier, draft_features
from .stats import PacerStats


class PacerStoppingCriteria(StoppingCriteria):
    """Runs the pre-verifier after every `block_size` drafted tokens; True means "stop drafting".

    Stop-only: a failed block has been drafted and is still verified, which keeps sampling exact.
    With `trim_failed_block` (greedy only) `trim` says how many trailing tokens to drop instead.
    """

    def __init__(self, preverifier: PacerPreVerifier, stats: PacerStats):
        self.preverifier = preverifier
        self.block_size = preverifier.config.block_size
        self.trim_failed_block = preverifier.config.trim_failed_block
        self.stats = stats
        self.hidden: list[torch.Tensor] = []
        self.logits: list[torch.Tensor] = []
        self.features: list[torch.Tensor] = []
        self.trim = 0
        self._answers = (torch.zeros(1, dtype=torch.bool), torch.ones(1, dtype=torch.bool))  # no per-token allocation

    def start_round(self) -> None:
        self.hidden.clear()
        self.logits.clear()
        self.features.clear()
        self.trim = 0

    def capture_hidden(self, module: torch.nn.Module, args: tuple) -> None:
        """Forward pre-hook on the draft's lm_head: its input is the last hidden state, for free."""
        self.hidden.append(args[0][:, -1])

    @torch.no_grad()
    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        self.logits.append(scores)
        stop = False
        if len(self.logits) % self.block_size == 0:
            start = time.perf_counter()
            block = len(self.features) * self.block_size
            tokens = input_ids[:, -self.block_size :]
            self.features.append(draft_features(torch.stack(self.logits[block:], 1), tokens))
            pv = self.preverifier
            device = pv.device
            token_logits = pv(
                torch.stack(self.hidden, 1).to(device), torch.cat(self.features, 1).to(device)
            ).logits[0]
            stop = not pv.passes(pv.survival(token_logits, self.block_size))
            if stop and self.trim_failed_block:
                kept = (torch.sigmoid(token_logits[-self.block_size :]) >= 0.5).long().cumprod(0).sum()
                self.trim = self.block_size - int(kept)
            self.stats.preverifier_seconds += time.perf_counter() - start
        return self._answers[stop].to(input_ids.device)


def compile_draft(draft_model, warmup: bool = True):
    """Opt-in: compile the draft's one-token decode step with `torch.compile` (returns the draft).

    The draft's decoder is compiled (dynamic shapes, its own DynamicCache) and `lm_head` stays eager,
    so the pre-verifier's hook still sees the hidden state. Multi-token inputs (prefill, the two
    tokens after a fully accepted round) keep the eager forward, so only one shape is compiled.
    Compiling takes tens of seconds on a CPU; `warmup` pays it here rather than in the first call.
    Refused for drafts whose logits are not `lm_head(decoder(...))` (e.g. soft-capped logits).
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
    draft_model.__dict__["_pacer_decode_step"] = torch.compile(decoder, dynamic=True)
    if warmup:
        with torch.no_grad():
            cache = decoder(input_ids=probe, use_cache=True).past_key_values
            for token in range(2):  # two lengths, so the dynamic-shape graph is the one compiled
                draft_model._pacer_decode_step(input_ids=probe[:, :1] + token, past_key_values=cache, use_cache=True)
    return draft_model


class PacerCandidateGenerator(AssistedCandidateGenerator):
    """Drafts up to `max_draft_tokens` per round; with `stopping_criteria`, Pacer decides when to stop.

    Without a stopping criterion it is fixed-length speculative decoding (`sd-fixed-<γ>`).
    """

    def __init__(
        self,
        input_ids: torch.LongTensor,
        assistant_model,
        generation_config,
        model_kwargs: dict,
        inputs_tensor: torch.Tensor | None = None,
        logits_processor: LogitsProcessorList | None = None,
        *,
        max_draft_tokens: int,
        stats: PacerStats,
        stopping_criteria: PacerStoppingCriteria | None = None,
        draft_forward: str = "auto",
    ):
        super().__init__(input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor, logits_processor)
        self.draft = assistant_model
        self.max_draft_tokens = max_draft_tokens
        self.stop = stopping_criteria
        self.stats = stats
        self.processors = LogitsProcessorList(self.logits_processor)
        self.do_sample = bool(generation_config.do_sample)
        eos = generation_config.eos_token_id
        self.eos = set() if eos is None else {int(t) for t in torch.as_tensor(eos).flatten().tolist()}
        self.cache = None
        self.ids = torch.empty((1, self.main_model_max_length), dtype=torch.long, device=self.draft.device)
        forward = getattr(self.draft, "get_base_model", lambda: self.draft)().forward
        self.forward_kwargs = {"use_cache": True}
        if "logits_to_keep" in inspect.signature(forward).parameters:
            self.forward_kwargs["logits_to_keep"] = 1
        self.lm_head = self.draft.get_output_embeddings()
        self.decode_step = getattr(self.draft, "_pacer_decode_step", None)  # set by compile_draft
        self.lean = self._choose_forward(draft_forward)

    def _choose_forward(self, draft_forward: str) -> LeanDraft | None:
        """The lean forward, or None for the draft's own (`stats.draft_forward` records which).

        `draft_forward` was validated by `generate`; under "auto" a `compile_draft`ed draft runs compiled."""
        lean = None
        if draft_forward == "lean" or (draft_forward == "auto" and self.decode_step is None):
            lean, reason = LeanDraft.for_model(self.draft, self.main_model_max_length)
            if draft_forward == "lean" and lean is None:
                raise ValueError(f"pacer_draft_forward='lean' cannot run this draft: {reason}. "
                                 "Pass pacer_draft_forward='model' (or 'auto') to use the draft's own forward.")
        self.stats.draft_forward = "lean" if lean is not None else "compiled" if self.decode_step else "model"
        return lean

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        cur_len = input_ids.shape[1]
        self.stats.target_forwards += 1
        budget = min(self.max_draft_tokens, self.main_model_max_length - cur_len - 1)
        if budget <= 0:
            self.stats.draft_lengths.append(0)
            return input_ids, None
        n, processed = self._draft(input_ids, budget)
        self.stats.draft_lengths.append(n)
        if n == 0:
            return input_ids, None
        candidates = self.ids[:, : cur_len + n].clone()
        return candidates, torch.stack(processed[:n], dim=1) if self.do_sample else None

    def _draft(
        self,
        sequence: torch.LongTensor,
        budget: int,
        generator: torch.Generator | None = None,
        interrupt: Callable[[int, int], bool] | None = None,
    ) -> tuple[int, list[torch.Tensor]]:
        """Draft up to `budget` tokens after `sequence` into `self.ids`: the one drafting loop.

        Returns how many drafted tokens to propose (a trimmed failed block excluded) and the processed
        logits of every drafted token. `interrupt(n, token)`, called after each token, ends drafting
        early (PEARL's cancellation); `generator` is the RNG for sampled drafts (default: torch's).
        """
        cur_len = sequence.shape[1]
        keep = 0
        if self.cache is not None:  # roll the draft cache back to the accepted prefix
            keep = min(self.cache.get_seq_length(), cur_len - 1)
            crop_cache(self.cache, keep)
        elif self.lean is not None:
            self.cache = self.lean.new_cache(min(self.main_model_max_length, cur_len + 256))
        ids = self.ids
        ids[:, :cur_len] = sequence
        pending = ids[:, keep:cur_len]
        processed = []
        hook = self.lm_head.register_forward_pre_hook(self.stop.capture_hidden) if self.stop and self.lean is None else None
        if self.stop:
            self.stop.start_round()
        n = 0
        try:
            for n in range(1, budget + 1):
                if self.lean is not None:
                    hidden, raw = self.lean(pending, self.cache)
                    if self.stop is not None:
                        self.stop.hidden.append(hidden)
                elif self.decode_step is not None and pending.shape[1] == 1 and self.cache is not None:
                    hidden = self.decode_step(input_ids=pending, past_key_values=self.cache, use_cache=True)
                    raw = self.lm_head(hidden.last_hidden_state[:, -1:])[:, -1]
                else:
                    out = self.draft(input_ids=pending, past_key_values=self.cache, **self.forward_kwargs)
                    self.cache = out.past_key_values
                    raw = out.logits[:, -1, :]
                scores = self.processors(ids[:, : cur_len + n - 1], raw) if self.processors else raw
                if self.do_sample:  # float32, so the q the verifier recomputes is the one sampled from
                    scores = scores.float()
                    token = torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator)
                else:
                    token = scores.argmax(dim=-1, keepdim=True)
                ids[:, cur_len + n - 1] = token[:, 0]
                processed.append(scores)
                pending = token
                value = int(token)
                if interrupt is not None and interrupt(n, value):
                    break
                if self.stop is not None and bool(self.stop(ids[:, : cur_len + n], raw)[0]):
                    n -= self.stop.trim
                    break
                if value in self.eos:
                    break
        finally:
            if hook is not None:
                hook.remove()
            self.stats.draft_forwards += len(processed)
        return n, processed

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches) -> None:
        """No schedule to update (the draft length is decided while drafting); record the outcome."""
        self.stats.accepted.append(int(num_matches))
