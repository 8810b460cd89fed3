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

from dataclasses import dataclass
from typing import ClassVar

from ...loops.batch_loop import BatchPlan
from ...loops.stop_rule_setup import stop_rule_for
from ..registry import StrategyCall, StrategyConfig, StrategyContext, register_strategy
from .generator import BatchPhrases, OuroborosCandidateGenerator, OuroborosStats
from .pool import PhrasePool, phrase_pool, pool_for, reset_phrase_pool

__all__ = [
    "OuroborosCandidateGenerator",
    "OuroborosConfig",
    "OuroborosStats",
    "PhrasePool",
    "phrase_pool",
    "reset_phrase_pool",
]


@dataclass(frozen=True)
class OuroborosConfig(StrategyConfig):
    """Ouroboros' settings: `generate(..., pacer=OuroborosConfig(...))`; the presets are "ouroboros" and
    "pacer+ouroboros" (`use_preverifier=True`: the pre-verifier decides the draft length, the pool extends it).

    The pool shape (key_length, phrase_length, phrases_per_key, max_keys) is fixed per pool: a call
    with a different shape starts a fresh pool for that (target, draft) pair.
    """

    strategy_type: ClassVar[str] = "ouroboros"
    supports_batch: ClassVar[bool] = True
    use_preverifier: bool = False
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


def build(config: OuroborosConfig, context: StrategyContext) -> StrategyCall:
    name = "pacer+ouroboros" if config.use_preverifier else "ouroboros"
    pool = pool_for(context.model, context.draft, config.pool_shape)
    stats = OuroborosStats(strategy=name)
    preverifier = context.preverifier
    max_draft_tokens = preverifier.config.max_draft_tokens if preverifier is not None else config.draft_tokens

    def make(generation_config, logits_processor) -> OuroborosCandidateGenerator:
        return OuroborosCandidateGenerator(context.draft, generation_config, logits_processor,
                                           max_draft_tokens=max_draft_tokens, stats=stats,
                                           stop=stop_rule_for(context, stats, max_draft_tokens),
                                           draft_forward=context.draft_forward, pool=pool, config=config)

    def record_pool_size() -> None:
        stats.pool_phrases = len(pool)

    def batch(cache_mode: str) -> BatchPlan:
        if config.from_target_tail:
            raise ValueError("OuroborosConfig(from_target_tail=True) runs batch size 1 only; pass "
                             "from_target_tail=False for a batch, or call generate once per prompt.")
        return BatchPlan(context.draft, max_draft_tokens, stats, preverifier, cache_mode,
                         phrases=BatchPhrases(pool, config, stats), draft_forward=context.draft_forward)

    return StrategyCall(name=name, make=make, stats=stats, closers=[record_pool_size], batch=batch)


register_strategy(
    OuroborosConfig,
    build,
    presets={"ouroboros": OuroborosConfig(), "pacer+ouroboros": OuroborosConfig(use_preverifier=True)},
)
