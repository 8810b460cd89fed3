"""Speculative decoding through pacer_hf's drafting loop: a fixed draft length, or Pacer's adaptive one.

`pacer="sd-fixed-4"` is `SpeculativeConfig(gamma=4)`; `pacer="pacer"`, `pacer=True` or a pre-verifier
is `SpeculativeConfig(use_preverifier=True)`, which drafts until the pre-verifier stops the round
(at most `gamma`, default the pre-verifier's `max_draft_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...loops.batch_loop import BatchPlan
from ...loops.draft_loop import PacerCandidateGenerator
from ...loops.stop_rule_setup import stop_rule_for
from ...stats import PacerStats
from ..registry import StrategyCall, StrategyConfig, StrategyContext, register_strategy


@dataclass(frozen=True)
class SpeculativeConfig(StrategyConfig):
    """`gamma`: tokens drafted per round (a cap under Pacer; None = the pre-verifier's max_draft_tokens)."""

    strategy_type: ClassVar[str] = "speculative"
    supports_batch: ClassVar[bool] = True
    gamma: int | None = None
    use_preverifier: bool = False

    def __post_init__(self) -> None:
        if self.gamma is None and not self.use_preverifier:
            raise ValueError("SpeculativeConfig needs gamma (tokens per round) unless use_preverifier=True.")
        if self.gamma is not None and self.gamma < 1:
            raise ValueError(f"SpeculativeConfig: the draft length must be >= 1 tokens per round; got gamma={self.gamma}.")

    @property
    def name(self) -> str:
        return "pacer" if self.use_preverifier else f"sd-fixed-{self.gamma}"


def build(config: SpeculativeConfig, context: StrategyContext) -> StrategyCall:
    stats = PacerStats(strategy=config.name)
    preverifier = context.preverifier
    gamma = config.gamma or preverifier.config.max_draft_tokens

    def make(generation_config, logits_processor) -> PacerCandidateGenerator:
        return PacerCandidateGenerator(context.draft, generation_config, logits_processor, max_draft_tokens=gamma,
                                       stats=stats, stop=stop_rule_for(context, stats, gamma),
                                       draft_forward=context.draft_forward)

    def batch(cache_mode: str) -> BatchPlan:
        return BatchPlan(context.draft, gamma, stats, preverifier, cache_mode,
                         draft_forward=context.draft_forward)

    return StrategyCall(name=config.name, make=make, stats=stats, batch=batch)


register_strategy(
    SpeculativeConfig,
    build,
    presets={"pacer": SpeculativeConfig(use_preverifier=True)},
    patterns={"sd-fixed-<γ>": (r"sd-fixed-(\d+)", lambda match: SpeculativeConfig(gamma=int(match.group(1))))},
)
