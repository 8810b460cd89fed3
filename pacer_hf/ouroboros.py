"""Ouroboros (arXiv 2402.13720) for any HF model pair: a phrase pool lengthens every draft.

The draft model drafts as usual (a fixed number of tokens for `pacer="ouroboros"`, as long as the
Pacer pre-verifier allows for `pacer="pacer+ouroboros"`); then the newest pool phrase that follows
the candidate's last tokens is appended, and the target verifies draft + phrase in its one normal
forward. Pool tokens cost no draft forward and no extra target forward, only a longer verify batch.

Lossless by construction: greedy decoding compares every candidate token with the target's argmax.
Under sampling a pool token is a deterministic proposal, i.e. drawn from a one-hot q, and the round
stays speculative sampling (exact for any q the candidate was drawn from); with
`sampling_pool_q="none"` no draft logits are returned instead and transformers falls back to
target-only acceptance, also exact. The pool may be arbitrarily wrong; it only changes speed.

The pool (token n-gram -> recent phrases) lives on the target model instance, one per draft, and
survives across `generate` calls (warm start); `reset_phrase_pool(model)` empties it.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from ._hf_compat import crop_cache
from .candidate_generator import PacerCandidateGenerator, PacerStoppingCriteria
from .generation import STRATEGIES, StrategyCall, _check_preverifier, _generation_value
from .modeling_pacer import PacerPreVerifier
from .stats import PacerStats

__all__ = [
    "OuroborosCandidateGenerator",
    "OuroborosConfig",
    "OuroborosStats",
    "PhrasePool",
    "phrase_pool",
    "reset_phrase_pool",
]

_POOLS = "_pacer_phrase_pools"  # attribute on the target: WeakKeyDictionary[draft model -> PhrasePool]
Phrase = tuple[int, ...]


@dataclass
class OuroborosConfig:
    """Settings of the Ouroboros strategies; pass as `generate(..., ouroboros=OuroborosConfig(...))` or a dict.

    The pool shape (key_length, phrase_length, phrases_per_key, max_keys) is fixed per pool: a call
    with a different shape starts a fresh pool for that (target, draft) pair.
    """

    draft_tokens: int = 4
    """Draft-model tokens per round for pacer="ouroboros" (pacer+ouroboros uses the pre-verifier's cap)."""
    key_length: int = 2
    """Longest n-gram key; lookups try the longest key first and back off to single tokens."""
    phrase_length: int = 6
    """Tokens stored per phrase (Ouroboros' N-1)."""
    phrases_per_key: int = 8
    """Phrases kept per key (Ouroboros' G); the least recently used one is evicted first."""
    max_keys: int = 16384
    """Keys kept in the pool; the least recently used key is evicted first. Bounds memory."""
    max_pool_tokens: int | None = None
    """Pool tokens appended per round (default: phrase_length)."""
    from_prompt: bool = True
    """Index the prompt too (prompt-lookup style: boilerplate, code edits, quoted context)."""
    from_draft: bool = True
    """Index the draft model's own drafts (Ouroboros' draft-side phrases)."""
    from_target_tail: bool = False
    """Also index the target's argmax after rejected draft tokens (Ouroboros' add_extra_ngram).
    Costs an argmax over the verify logits every round, so it is off by default."""
    sampling_pool_q: str = "one-hot"
    """Sampling only. "one-hot": pool tokens get a one-hot q and the round stays speculative sampling
    (the draft tokens keep their min(p, q) acceptance; a pool token is accepted with probability p(x),
    as under target-only acceptance). "none": return no draft logits when pool tokens are present, so
    the whole round falls back to target-only acceptance (the draft tokens then match only with
    probability sum p*q). Both are lossless; "one-hot" accepts more."""

    def __post_init__(self) -> None:
        for name in ("draft_tokens", "key_length", "phrase_length", "phrases_per_key", "max_keys"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"OuroborosConfig.{name} must be an integer >= 1, got {value!r}.")
        if self.sampling_pool_q not in ("one-hot", "none"):
            raise ValueError(f"OuroborosConfig.sampling_pool_q must be 'one-hot' or 'none', got {self.sampling_pool_q!r}.")
        if self.max_pool_tokens is not None and (not isinstance(self.max_pool_tokens, int) or self.max_pool_tokens < 0):
            raise ValueError(f"OuroborosConfig.max_pool_tokens must be None or an integer >= 0, got "
                             f"{self.max_pool_tokens!r}.")

    @property
    def pool_shape(self) -> tuple[int, int, int, int]:
        return self.key_length, self.phrase_length, self.phrases_per_key, self.max_keys

    @property
    def pool_tokens(self) -> int:
        return self.phrase_length if self.max_pool_tokens is None else self.max_pool_tokens


class PhrasePool:
    """Token n-gram -> recent phrases (the tokens that followed it), bounded, LRU at both levels.

    Rules: inserting or looking up a key makes it the newest key; past `max_keys` keys the least
    recently used key goes. Under a key, inserting a phrase makes it the newest; a phrase that
    extends a stored phrase replaces it, a prefix of a stored phrase only refreshes that one (the
    newest such phrase, so a stale phrase that merely shares a prefix is not revived); past
    `phrases_per_key` the oldest phrase goes. So the pool never holds more than
    max_keys * phrases_per_key phrases of at most phrase_length tokens each.
    """

    def __init__(self, key_length: int = 2, phrase_length: int = 6, phrases_per_key: int = 8, max_keys: int = 16384):
        OuroborosConfig(key_length=key_length, phrase_length=phrase_length, phrases_per_key=phrases_per_key,
                        max_keys=max_keys)  # validates
        self.key_length = key_length
        self.phrase_length = phrase_length
        self.phrases_per_key = phrases_per_key
        self.max_keys = max_keys
        self._table: OrderedDict[Phrase, OrderedDict[Phrase, None]] = OrderedDict()
        self._phrases = 0
        self._tokens = 0
        self.lookups = self.hits = self.proposed_tokens = self.accepted_tokens = 0

    @classmethod
    def from_config(cls, config: OuroborosConfig) -> PhrasePool:
        return cls(*config.pool_shape)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.key_length, self.phrase_length, self.phrases_per_key, self.max_keys

    def __len__(self) -> int:
        """Number of phrases held."""
        return self._phrases

    @property
    def num_keys(self) -> int:
        return len(self._table)

    @property
    def num_tokens(self) -> int:
        """Tokens held in phrases (the pool's memory, up to a constant per entry)."""
        return self._tokens

    @property
    def capacity(self) -> int:
        """The most phrases the pool can hold."""
        return self.max_keys * self.phrases_per_key

    def phrases(self, key: Sequence[int]) -> list[Phrase]:
        """Phrases under `key`, oldest first (read-only view for inspection and tests)."""
        return list(self._table.get(tuple(key), ()))

    def clear(self) -> None:
        """Drop every phrase and zero the counters."""
        self._table.clear()
        self._phrases = self._tokens = 0
        self.lookups = self.hits = self.proposed_tokens = self.accepted_tokens = 0

    def insert(self, key: Sequence[int], phrase: Sequence[int]) -> None:
        """Record that `phrase` followed `key` (both token-id sequences)."""
        key, phrase = tuple(key), tuple(phrase[: self.phrase_length])
        if not key or not phrase:
            return
        phrases = self._table.get(key)
        if phrases is None:
            phrases = self._table[key] = OrderedDict()
            if len(self._table) > self.max_keys:
                _, evicted = self._table.popitem(last=False)
                self._phrases -= len(evicted)
                self._tokens -= sum(map(len, evicted))
        else:
            self._table.move_to_end(key)
            for old in reversed(phrases):  # newest first: refresh the freshest match, never a stale one
                if old[: len(phrase)] == phrase:  # already known, maybe longer: refresh it
                    phrases.move_to_end(old)
                    return
                if phrase[: len(old)] == old:  # the new phrase extends an old one: replace it
                    del phrases[old]
                    self._phrases -= 1
                    self._tokens -= len(old)
                    break
        phrases[phrase] = None
        self._phrases += 1
        self._tokens += len(phrase)
        if len(phrases) > self.phrases_per_key:
            old, _ = phrases.popitem(last=False)
            self._phrases -= 1
            self._tokens -= len(old)

    def add(self, tokens: Sequence[int], start: int = 0) -> None:
        """Index `tokens`: for every key ending at position >= `start`, the tokens after it are a phrase.

        Keys of every length 1..key_length are stored, so lookups can back off to shorter keys.
        """
        last = len(tokens) - 1
        for end in range(max(start, 0), last):
            phrase = tokens[end + 1 : end + 1 + self.phrase_length]
            for k in range(1, min(self.key_length, end + 1) + 1):
                self.insert(tokens[end - k + 1 : end + 1], phrase)

    def lookup(self, context: Sequence[int]) -> Phrase:
        """The newest phrase under the longest key that ends `context` (empty if none)."""
        self.lookups += 1
        for k in range(min(self.key_length, len(context)), 0, -1):
            key = tuple(context[len(context) - k :])
            phrases = self._table.get(key)
            if phrases:
                self._table.move_to_end(key)
                self.hits += 1
                return next(reversed(phrases))
        return ()

    def __repr__(self) -> str:
        return (f"PhrasePool(phrases={len(self)}/{self.capacity}, keys={self.num_keys}/{self.max_keys}, "
                f"key_length={self.key_length}, phrase_length={self.phrase_length}, hits={self.hits}/{self.lookups}, "
                f"accepted={self.accepted_tokens}/{self.proposed_tokens} pool tokens)")


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


class OuroborosCandidateGenerator(PacerCandidateGenerator):
    """PacerCandidateGenerator whose candidate is extended by a pool phrase after the draft stops.

    Draft KV cache: pool tokens are never fed to the draft. The base class keeps
    min(cache length, cur_len - 1) positions next round, and the cache only holds drafted positions
    whose tokens are all in this round's candidate, so a fully accepted phrase is simply re-fed as
    pending input. The one exception is a pre-verifier trim (trim_failed_block): the cache then holds
    trimmed draft tokens beyond the candidate's draft part, so it is cropped to the proposed drafts here.
    """

    def __init__(self, *args, pool: PhrasePool, config: OuroborosConfig, **kwargs):
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
        room = min(self.config.pool_tokens, self.main_model_max_length - cur_len - 1 - drafted)
        phrase: Phrase = ()
        context_start = max(0, cur_len - self.pool.key_length)
        tail = candidates[0, context_start:].tolist()
        if room > 0 and not (drafted and tail[-1] in self.eos):
            phrase = self.pool.lookup(tail)[:room]
            for i, token in enumerate(phrase):
                if token in self.eos:  # nothing after EOS can be accepted
                    phrase = phrase[: i + 1]
                    break
        if self.config.from_draft and drafted:
            self.pool.add(tail, start=cur_len - 1 - context_start)
        self._round = (cur_len, drafted, len(phrase))
        self.stats.pool_lengths.append(len(phrase))
        if not phrase:
            self._candidate = tail
            return candidates, logits
        if self.cache is not None:  # drop draft positions a pre-verifier trim left beyond the proposal
            crop_cache(self.cache, cur_len + drafted)
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
            vocab, dtype = self.lm_head.weight.shape[0], torch.float32
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
        """Index committed text from the first key whose phrase was still short; the newest phrases win."""
        length = input_ids.shape[1]
        low = max(0, self._fresh - self.pool.key_length + 1)
        self.pool.add(input_ids[0, low:].tolist(), start=self._fresh - low)
        self._fresh = max(self._fresh, length - self.pool.phrase_length)

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


def phrase_pool(model: PreTrainedModel, draft: PreTrainedModel) -> PhrasePool | None:
    """The phrase pool kept on `model` for `draft` (None before the first Ouroboros call)."""
    pools = model.__dict__.get(_POOLS)
    return None if pools is None else pools.get(draft)


def reset_phrase_pool(model: PreTrainedModel, draft: PreTrainedModel | None = None) -> None:
    """Empty the warm-start phrase pool(s) kept on `model`: the one for `draft`, or all of them."""
    pools = model.__dict__.get(_POOLS)
    if pools is None:
        return
    for key, pool in list(pools.items()):
        if draft is None or key is draft:
            pool.clear()


def _pool_for(model: PreTrainedModel, draft: PreTrainedModel, config: OuroborosConfig) -> PhrasePool:
    pools = model.__dict__.get(_POOLS)
    if pools is None:
        pools = model.__dict__[_POOLS] = weakref.WeakKeyDictionary()
    pool = pools.get(draft)
    if pool is None or pool.shape != config.pool_shape:
        pool = pools[draft] = PhrasePool.from_config(config)
    return pool


def _config_from(kwargs: dict) -> OuroborosConfig:
    """The `ouroboros=` generate kwarg (popped: transformers must not see it), or the defaults."""
    value = kwargs.pop("ouroboros", None)
    if value is None:
        return OuroborosConfig()
    if isinstance(value, OuroborosConfig):
        return value
    if isinstance(value, dict):
        return OuroborosConfig(**value)
    raise TypeError(f"ouroboros= takes an OuroborosConfig or a dict of its fields, got {type(value).__name__}.")


def _build(name: str, model: PreTrainedModel, draft: PreTrainedModel, config: OuroborosConfig,
           max_draft_tokens: int, preverifier: PacerPreVerifier | None) -> StrategyCall:
    pool = _pool_for(model, draft, config)
    stats = OuroborosStats(strategy=name)
    stop = PacerStoppingCriteria(preverifier.eval(), stats) if preverifier is not None else None

    def make(**generator_kwargs) -> OuroborosCandidateGenerator:
        return OuroborosCandidateGenerator(**generator_kwargs, max_draft_tokens=max_draft_tokens, stats=stats,
                                           stopping_criteria=stop, pool=pool, config=config)

    def record_pool_size() -> None:
        stats.pool_phrases = len(pool)

    return StrategyCall(name=name, make=make, stats=stats, closers=[record_pool_size])


def _ouroboros(model: PreTrainedModel, draft: PreTrainedModel, kwargs: dict) -> StrategyCall:
    """pacer="ouroboros": fixed-length drafts (OuroborosConfig.draft_tokens) extended by the pool."""
    config = _config_from(kwargs)
    return _build("ouroboros", model, draft, config, config.draft_tokens, None)


def _pacer_ouroboros(model: PreTrainedModel, draft: PreTrainedModel, kwargs: dict) -> StrategyCall:
    """pacer="pacer+ouroboros": the attached pre-verifier decides the draft length, the pool extends it."""
    config = _config_from(kwargs)
    preverifier = getattr(draft, "_pacer_preverifier", None)
    if preverifier is None:
        raise ValueError(
            "pacer='pacer+ouroboros' uses the pre-verifier attached to the draft, and this draft has none: call "
            "pacer_hf.attach(draft, preverifier) first, or use pacer='ouroboros' for fixed-length drafts."
        )
    _check_preverifier(preverifier, draft)
    if preverifier.config.trim_failed_block and _generation_value(model, kwargs, "do_sample"):
        raise ValueError(
            "The pre-verifier has trim_failed_block=True, which is exact only for greedy decoding; "
            "set do_sample=False or use a pre-verifier config with trim_failed_block=False."
        )
    return _build("pacer+ouroboros", model, draft, config, preverifier.config.max_draft_tokens, preverifier)


STRATEGIES["ouroboros"] = _ouroboros
STRATEGIES["pacer+ouroboros"] = _pacer_ouroboros
