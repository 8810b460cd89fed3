"""The Ouroboros candidate generator: pacer_hf's draft, extended by a pool phrase after it stops."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..._hf_compat import crop_cache
from ...loops.draft_loop import PacerCandidateGenerator
from ...stats import PacerStats
from .pool import Phrase, PhrasePool


@dataclass
class OuroborosStats(PacerStats):
    """PacerStats plus the pool's share; `draft_lengths[i]` counts draft-model and pool tokens together.

    `pool_lengths[i]` of round i's proposed tokens came from the pool (they follow the draft-model
    tokens); `pool_accepted[i]` of those were accepted. `alpha` stays accepted / proposed.
    """

    pool_lengths: list[int] = field(default_factory=list)
    pool_accepted: list[int] = field(default_factory=list)
    pool_phrases: int = 0

    @property
    def pool_acceptance(self) -> float:
        """Accepted pool tokens / proposed pool tokens."""
        proposed = sum(self.pool_lengths)
        return sum(self.pool_accepted) / proposed if proposed else 0.0

    def to_dict(self) -> dict:
        return {**super().to_dict(), "pool_acceptance": self.pool_acceptance}


def pool_phrase(pool: PhrasePool, config, tail: list[int], drafted: int, room: int, eos: set[int]) -> Phrase:
    """The pool tokens that extend a candidate (at most `room` and `config.pool_tokens`, none after an EOS),
    and, with `config.from_draft`, the draft indexed. `tail`: the candidate's last committed tokens (up to
    the pool's key length) followed by its `drafted` draft tokens."""
    phrase: Phrase = ()
    room = min(config.pool_tokens, room)
    if room > 0 and not (drafted and tail[-1] in eos):
        phrase = pool.lookup(tail)[:room]
        for i, token in enumerate(phrase):
            if token in eos:  # nothing after EOS can be accepted
                phrase = phrase[: i + 1]
                break
    if config.from_draft and drafted:
        pool.add(tail, start=len(tail) - drafted - 1)
    return phrase


def index_committed(pool: PhrasePool, text: list[int] | torch.Tensor, fresh: int) -> int:
    """Index committed `text` (a list, or a 1-D tensor read from `fresh` on only) from `fresh`, the first key end
    whose phrase may still grow (the newest phrases win); returns the next such key end."""
    low = max(0, fresh - pool.key_length + 1)
    part = text[low:]
    pool.add(part.tolist() if isinstance(part, torch.Tensor) else part, start=fresh - low)
    return max(fresh, len(text) - pool.phrase_length)


class OuroborosCandidateGenerator(PacerCandidateGenerator):
    """PacerCandidateGenerator whose candidate is extended by a pool phrase after the draft stops.

    Draft KV cache: pool tokens are never fed to the draft. The base class keeps
    min(cache length, cur_len - 1) positions next round, and the cache only holds drafted positions
    whose tokens are all in this round's candidate, so a fully accepted phrase is simply re-fed as
    pending input. The one exception is a pre-verifier trim (trim_failed_block): the cache then holds
    trimmed draft tokens beyond the candidate's draft part, so it is cropped to the proposed drafts here.
    """

    def __init__(self, *args, pool: PhrasePool, config, **kwargs):
        super().__init__(*args, **kwargs)
        self.pool = pool
        self.config = config
        self._fresh: int | None = None  # first committed key end whose phrase may still grow
        self._round: tuple[int, int, int] = (0, 0, 0)  # cur_len, draft-model tokens, pool tokens
        self._candidate: list[int] = []  # key context + this round's candidate tokens

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, **kwargs) -> tuple[torch.LongTensor, torch.Tensor | None]:
        cur_len = input_ids.shape[1]
        if self._fresh is None:  # first round: the prompt
            self._fresh = 0 if self.config.from_prompt else cur_len - 1
            self._index_committed(input_ids)
        candidates, logits = super().get_candidates(input_ids, **kwargs)
        drafted = candidates.shape[1] - cur_len
        tail = candidates[0, max(0, cur_len - self.pool.key_length) :].tolist()
        phrase = pool_phrase(self.pool, self.config, tail, drafted, self.max_length - cur_len - 1 - drafted, self.eos)
        self._round = (cur_len, drafted, len(phrase))
        self.stats.pool_lengths.append(len(phrase))
        if not phrase:
            self._candidate = tail
            return candidates, logits
        crop_cache(self.cache, cur_len + drafted)  # drop draft positions a pre-verifier trim left behind
        self.stats.draft_lengths[-1] += len(phrase)
        self.pool.proposed_tokens += len(phrase)
        self._candidate = tail + list(phrase)
        extension = torch.tensor([phrase], dtype=candidates.dtype, device=candidates.device)
        return torch.cat([candidates, extension], dim=1), self._pool_logits(logits, extension)

    def _pool_logits(self, draft_logits: torch.Tensor | None, extension: torch.LongTensor) -> torch.Tensor | None:
        """q for the whole candidate, or None (greedy; or sampling_pool_q="none": target-only acceptance).

        A pool token is a deterministic proposal, i.e. drawn from a one-hot q; speculative sampling is
        exact for any q the candidate was really drawn from, and accepts it with probability p(x).
        """
        if not self.do_sample or self.config.sampling_pool_q == "none":
            return None
        if draft_logits is None:  # the draft proposed nothing this round
            vocab, dtype = self.draft.get_output_embeddings().out_features, torch.float32
        else:
            vocab, dtype = draft_logits.shape[-1], draft_logits.dtype
        one_hot = torch.full((1, extension.shape[1], vocab), float("-inf"), dtype=dtype, device=extension.device)
        one_hot.scatter_(2, extension[..., None], 0.0)
        return one_hot if draft_logits is None else torch.cat([draft_logits, one_hot.to(draft_logits.device)], dim=1)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, num_matches) -> None:
        """Record the round, then index the verified text (accepted tokens + the target's correction)."""
        super().update_candidate_strategy(input_ids, scores, num_matches)
        cur_len, drafted, pooled = self._round
        accepted = int(num_matches)
        pool_accepted = min(pooled, max(0, accepted - drafted))
        self.stats.pool_accepted.append(pool_accepted)
        self.pool.accepted_tokens += pool_accepted
        if self.config.from_target_tail and scores is not None:
            self._index_rejected_tail(cur_len, scores, accepted)
        self._index_committed(input_ids)

    def _index_committed(self, input_ids: torch.LongTensor) -> None:
        self._fresh = index_committed(self.pool, input_ids[0], self._fresh)

    def _index_rejected_tail(self, cur_len: int, scores: torch.FloatTensor, accepted: int) -> None:
        """After each rejected candidate token, store the target's argmax chain (Ouroboros' add_extra_ngram).

        The chain continues while later candidate tokens agree with the target, since only then was
        the target's next prediction made on the phrase's own prefix.
        """
        offset = cur_len - max(0, cur_len - self.pool.key_length)
        proposed = self._candidate[offset:]
        if accepted >= len(proposed) or accepted + 1 >= scores.shape[1]:
            return
        target = scores[0, accepted:].argmax(dim=-1).tolist()  # target[i - accepted] follows proposed[:i]
        if target[0] == proposed[accepted]:
            return  # cut by EOS or max length, not a rejection
        for j in range(accepted, len(proposed)):
            phrase = [target[j + 1 - accepted]]
            i = j + 1
            while i < len(proposed) and proposed[i] == target[i - accepted] and len(phrase) < self.pool.phrase_length:
                i += 1
                phrase.append(target[i - accepted])
            end = offset + j
            for k in range(1, min(self.pool.key_length, end + 1) + 1):
                self.pool.insert(self._candidate[end - k + 1 : end + 1], phrase)


class BatchPhrases:
    """The phrase pool in the batched loop (`batch_loop.py`): every row looks up and feeds the one pool.

    Per row it does what `OuroborosCandidateGenerator` does for one sequence, over the row's real tokens
    (its padding excluded): index the prompt, extend each draft with the newest phrase that follows it,
    index drafts and verified text.
    """

    def __init__(self, pool: PhrasePool, config, stats: OuroborosStats):
        self.pool, self.config, self.stats = pool, config, stats
        self.fresh: dict[int, int] = {}  # row -> first committed key end whose phrase may still grow

    def extend(self, row: int, text: list[int], drafted: list[int], room: int, eos: set[int],
               row_stats: OuroborosStats) -> list[int]:
        """The pool tokens to append to `drafted` (at most `room`), after the row's `text`."""
        if row not in self.fresh:  # first round: the prompt
            self.fresh[row] = 0 if self.config.from_prompt else len(text) - 1
            self._index(row, text)
        tail = text[max(0, len(text) - self.pool.key_length) :] + drafted
        phrase = list(pool_phrase(self.pool, self.config, tail, len(drafted), room, eos))
        self.pool.proposed_tokens += len(phrase)
        for stats in (self.stats, row_stats):
            stats.pool_lengths.append(len(phrase))
        return phrase

    def commit(self, row: int, text: list[int], drafted: int, pooled: int, accepted: int,
               row_stats: OuroborosStats) -> None:
        """After verification: count the accepted pool tokens, index the row's verified text."""
        pool_accepted = min(pooled, max(0, accepted - drafted))
        self.pool.accepted_tokens += pool_accepted
        for stats in (self.stats, row_stats):
            stats.pool_accepted.append(pool_accepted)
        self._index(row, text)

    def _index(self, row: int, text: list[int]) -> None:
        self.fresh[row] = index_committed(self.pool, text, self.fresh[row])
