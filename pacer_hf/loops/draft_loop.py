"""pacer_hf's drafting loop: the draft runs on its own KV cache, and Pacer decides when it stops.

Verification runs in the lean loop (lean_loop.py) or transformers' `_assisted_decoding`; this module
is the drafting side. The draft never re-enters `generate()` (the per-round setup that makes stock
assisted generation lose on small models): one `forward(pending, cache) -> (hidden, logits)` is
chosen per call (`draft_forwards.py`) and `_draft` is a plain decode loop over it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers import GenerationConfig, LogitsProcessorList

from .._hf_compat import CandidateGenerator, crop_cache, eos_ids
from ..stats import PacerStats
from .draft_forwards import choose_draft_forward
from .lean_draft import DraftKV
from .shared_prompt import is_copy_of, load_prompt_kv
from .stop_rule import PacerStopRule, RoundRecord


class PacerCandidateGenerator(CandidateGenerator):
    """Drafts up to `max_draft_tokens` per round; with `stop`, Pacer decides when to stop.

    Without a stop criterion it is fixed-length speculative decoding (`sd-fixed-<γ>`).
    """

    read_each_token: bool | None = None  # None: a CPU draft reads each token back (free there), others per block

    def __init__(
        self,
        draft,
        generation_config: GenerationConfig,
        logits_processor: LogitsProcessorList | None = None,
        *,
        max_draft_tokens: int,
        stats: PacerStats,
        stop: PacerStopRule | None = None,
        draft_forward: str = "auto",
    ):
        self.draft = draft
        self.max_draft_tokens = max_draft_tokens
        self.max_length = generation_config.max_length
        self.stop = stop
        self.stats = stats
        self.processors = LogitsProcessorList(logits_processor or [])
        self.do_sample = bool(generation_config.do_sample)
        self.eos = eos_ids(generation_config.eos_token_id)
        self.ids = torch.empty((1, self.max_length), dtype=torch.long, device=draft.device)
        self.forward, self.cache = choose_draft_forward(draft, draft_forward, self.max_length, stats)
        self.record = RoundRecord(stats, stop, stop.costs if stop is not None else None)
        self.synced = 0  # leading positions of `ids` found equal to a verified sequence (they stay so)
        self.proposal = 0  # drafted tokens the last `get_candidates` proposed
        self.target_cache = None  # set by `share_prompt_kv` until the draft has taken the prompt's states

    def share_prompt_kv(self, target, target_cache) -> bool:
        """Whether this draft takes the prompt's keys and values from the target's cache (`shared_prompt.py`): a lean
        draft that is a copy of the target. If so, the verification loop has the target read the prompt but its last
        token before the first round, and the draft starts from those states instead of reading the prompt."""
        if isinstance(self.cache, DraftKV) and self.cache.length == 0 and is_copy_of(self.draft, target):
            self.target_cache = target_cache
        return self.target_cache is not None

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        start = time.perf_counter()
        cur_len = input_ids.shape[1]
        if self.target_cache is not None:
            self._take_prompt_kv(input_ids)
        budget = min(self.max_draft_tokens, self.max_length - cur_len - 1)
        # else a plain step; the stop rule prices the tokens the draft would read first
        self.synced = self._kept(input_ids)  # `input_ids` is verified
        unread, left = cur_len - self.synced, self.max_length - cur_len
        drafts = budget > 0 and (self.stop is None or self.stop.drafts_this_round(unread, left))
        n, processed = self._draft(input_ids, budget, kept=self.synced) if drafts else (0, [])
        self.proposal = n
        # untimed: the first round (it also reads the prompt) and a trimmed one (it drafted more than it proposes)
        self.record.proposed(n, start if self.record.rounds > 0 and len(processed) == n else None, len(processed))
        if n == 0:
            return input_ids, None
        # A view: the verification loop reads the candidates before the next round writes `ids` again.
        return self.ids[:, : cur_len + n], torch.stack(processed[:n], dim=1) if self.do_sample else None

    def _take_prompt_kv(self, input_ids: torch.LongTensor) -> None:
        """The draft's cache takes the prompt's states the target's cache holds (once; if they cannot be copied, the
        draft reads the prompt itself)."""
        held = min(self.target_cache.get_seq_length(), input_ids.shape[1] - 1)
        if held > 0 and load_prompt_kv(self.cache, self.target_cache, held):
            self.ids[:, :held] = input_ids[:, :held]
            self.stats.prompt_kv_from_target = held
        self.target_cache = None

    def _draft(
        self,
        sequence: torch.LongTensor,
        budget: int,
        generator: torch.Generator | None = None,
        interrupt: Callable[[int, int], bool] | None = None,
        kept: int | None = None,
    ) -> tuple[int, list[torch.Tensor]]:
        """Draft up to `budget` tokens after `sequence` into `self.ids`: the one drafting loop.

        Returns how many drafted tokens to propose (a trimmed failed block excluded) and the processed
        logits of every drafted token. `interrupt(n, token)`, called after each token, ends drafting
        early (PEARL's cancellation); `generator` is the RNG for sampled drafts (default: torch's); `kept`: what
        `_kept(sequence)` returns, when the caller has just found it.
        A CPU draft reads each token back for the EOS check (free there); elsewhere the tokens are read once per
        block and at the round's end, and drafting ends at the first EOS among them: the same proposal, without
        a device round trip per token.
        """
        cur_len = sequence.shape[1]
        keep = self._kept(sequence) if kept is None else kept
        crop_cache(self.cache, keep)
        ids = self.ids
        ids[:, keep:cur_len] = sequence[:, keep:]
        pending, processed, n = ids[:, keep:cur_len], [], 0
        each = self.read_each_token
        per_token = interrupt is not None or (ids.device.type == "cpu" if each is None else each)
        block = self.stop.block_size if self.stop is not None else budget
        checked = 0  # drafted tokens already read back for the EOS check
        if self.stop is not None:
            self.stop.start_round()
        for n in range(1, budget + 1):
            read_start = time.perf_counter()
            hidden, raw = self.forward(pending, self.cache)
            if n == 1 and self.stop is not None and ids.device.type == "cpu":  # on CPU the forward has finished here
                self.stop.read(pending.shape[1], time.perf_counter() - read_start)
            scores = self.processors(ids[:, : cur_len + n - 1], raw) if self.processors else raw
            if self.do_sample:  # float32, so the q the verifier recomputes is the one sampled from
                scores = scores.float()
                token = torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=generator)
            else:
                token = scores.argmax(dim=-1, keepdim=True)
            ids[:, cur_len + n - 1] = token[:, 0]
            processed.append(scores)
            pending = token
            if per_token:
                value = token.item()
                if interrupt is not None and interrupt(n, value):
                    break
            elif self.eos and (n % block == 0 or n == budget):
                eos = _first_eos(ids[0, cur_len + checked : cur_len + n].tolist(), self.eos)
                if eos is not None:
                    n = checked + eos
                    break
                checked = n
            if self.stop is not None and self.stop.add_token(hidden, raw, token):
                n -= self.stop.trim
                break
            if per_token and value in self.eos:
                break
        self.stats.draft_forwards += len(processed)
        return n, processed

    def _kept(self, sequence: torch.LongTensor) -> int:
        """How much of `sequence` the draft cache holds: the leading positions where the tokens it read (`ids`) are the
        sequence's, at most all but the last token, whose forward yields the first drafted token. After a round the
        cache still holds the draft's rejected proposals; rounds that draft nothing (plain steps, lookup or pool
        tokens) then append tokens past them, so the cache's length alone would keep a context the target never
        wrote. Positions before `synced` were compared already."""
        limit = min(self.cache.get_seq_length(), sequence.shape[1] - 1)
        start = min(self.synced, limit)
        differ = torch.ne(self.ids[0, start:limit], sequence[0, start:limit].to(self.ids.device)).nonzero()
        return start + int(differ[0, 0]) if differ.numel() else limit

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches) -> None:
        """No schedule to update (the draft length is decided while drafting); record the outcome and, for a
        stop rule deciding by cost, what the round cost."""
        if self.stop is not None:
            self.stop.observe(self.proposal, int(num_matches))
        self.proposal = 0
        self.record.verified(int(num_matches), scores)


def _first_eos(tokens: list[int], eos: set[int]) -> int | None:
    """How many of `tokens` to keep: up to and including the first EOS, or None without one."""
    return next((i + 1 for i, token in enumerate(tokens) if token in eos), None)
