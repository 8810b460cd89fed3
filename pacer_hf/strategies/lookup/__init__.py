"""Prompt lookup with Pacer's stop rule: `generate(..., prompt_lookup_num_tokens=N, pacer=True)`.

HF's prompt lookup proposes the up to N tokens that followed an earlier occurrence of the text's last
n-gram, every round there is a match. Here a lookup gate (`PacerLookupGate`, trained on the target's
own answers) scores those tokens and proposes only as many as it expects to pay, zero included;
`pacer="lookup-<N>"` proposes them all (HF's rule, in pacer_hf's verification loop). With an
`assistant_model` the draft proposes in the rounds where lookup proposes nothing (for as long as the
pre-verifier attached to the draft allows, else `draft_tokens`).

Exact: lookup tokens are a deterministic proposal with no draft logits, so the target accepts them
while they equal its greedy choice, or, under sampling, its own sample at that position; the gate only
shortens the proposal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar
from weakref import WeakKeyDictionary

from ...candidates.suffix import SuffixSource
from ...costs import lookup_costs
from ...loops.draft_loop import PacerCandidateGenerator
from ...loops.online_calibration import OnlineCalibration
from ...loops.stop_rule_setup import stop_rule_for
from ...model_state import ModelState
from ..registry import StrategyCall, StrategyConfig, StrategyContext, register_strategy
from .generator import LookupCandidateGenerator, LookupStats

__all__ = ["LookupCandidateGenerator", "LookupConfig", "LookupStats"]

DEFAULT_LOOKUP_TOKENS = 10  # HF's default prompt_lookup_num_tokens in its docs and blog post
DEFAULT_NGRAM = 3


@dataclass(frozen=True)
class LookupConfig(StrategyConfig):
    """`use_gate=True`: the lookup gate decides how many lookup tokens to propose ("pacer-lookup").

    `num_tokens` and `max_ngram_size` default to `prompt_lookup_num_tokens` / `max_matching_ngram_size`
    of the `generate` call, else the gate's `max_lookup_tokens` / `max_ngram_size`, else 10 / 3. A gate
    scores at most its `max_lookup_tokens`, so a gated round proposes at most that many.
    """

    strategy_type: ClassVar[str] = "lookup"
    num_tokens: int | None = None
    max_ngram_size: int | None = None
    use_gate: bool = False
    draft_tokens: int = 4
    """With an assistant_model and no pre-verifier attached to it: draft tokens in rounds without lookup tokens."""

    def __post_init__(self) -> None:
        for name in ("num_tokens", "max_ngram_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"LookupConfig: {name} must be >= 1; got {value}.")
        if self.draft_tokens < 1:
            raise ValueError(f"LookupConfig: draft_tokens must be >= 1; got {self.draft_tokens}.")

    @property
    def name(self) -> str:
        return "pacer-lookup" if self.use_gate else f"lookup-{self.num_tokens or DEFAULT_LOOKUP_TOKENS}"


def gate_calibration(model, gate, sampling: bool) -> OnlineCalibration:
    """`gate`'s map to `model`'s acceptances in this mode (greedy or sampling), kept on the model across calls
    (per gate: a map fitted to one gate's log-odds says nothing of another's): each call starts where the last
    one left it, and every lookup round refines it."""
    state = ModelState(model)
    maps = state.lookup_calibration
    if maps is None:
        maps = state.lookup_calibration = WeakKeyDictionary()
    return maps.setdefault(gate, {}).setdefault(sampling, OnlineCalibration())


def build(config: LookupConfig, context: StrategyContext) -> StrategyCall:
    stats = LookupStats(strategy=config.name)
    gate = context.lookup_gate if config.use_gate else None
    num_tokens = config.num_tokens or (gate.config.max_lookup_tokens if gate is not None else DEFAULT_LOOKUP_TOKENS)
    if gate is not None:
        num_tokens = min(num_tokens, gate.config.max_lookup_tokens)
    max_ngram = config.max_ngram_size or (gate.config.max_ngram_size if gate is not None else DEFAULT_NGRAM)
    preverifier = context.preverifier

    def make(generation_config, logits_processor) -> LookupCandidateGenerator:
        drafting = None
        if context.draft is not None:
            gamma = preverifier.config.max_draft_tokens if preverifier is not None else config.draft_tokens
            drafting = PacerCandidateGenerator(context.draft, generation_config, logits_processor,
                                               max_draft_tokens=gamma, stats=stats,
                                               stop=stop_rule_for(context, stats, gamma),
                                               draft_forward=context.draft_forward)
        costs = None
        if gate is not None and gate.config.decision_rule == "expected_gain":
            costs = lookup_costs(context.model, num_tokens, context.costs, gate.config.round_cost)
            stats.use_costs(costs)
        source = SuffixSource(generation_config.max_length, max_ngram, context.suffix_cache)
        calibration = gate_calibration(context.model, gate, bool(generation_config.do_sample)) if gate is not None else None
        return LookupCandidateGenerator(generation_config, num_tokens=num_tokens, max_ngram=max_ngram, gate=gate,
                                        stats=stats, drafting=drafting, costs=costs, source=source,
                                        calibration=calibration)

    return StrategyCall(name=config.name, make=make, stats=stats)


register_strategy(
    LookupConfig,
    build,
    presets={"pacer-lookup": LookupConfig(use_gate=True)},
    patterns={"lookup-<N>": (r"lookup-(\d+)", lambda match: LookupConfig(num_tokens=int(match.group(1))))},
)
