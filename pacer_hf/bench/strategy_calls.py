"""Benchmark strategies by name: what each one sets on the draft and how it calls `generate`.

Every strategy installs an explicit draft `generation_config` for the duration of one call and restores
the original afterwards: HF silently reads draft length, schedule and the 0.4 confidence threshold from
the draft's generation config, and its "heuristic" schedule writes its final window back there.
pacer_hf's own strategies come from the strategy registry (`pacer_hf.strategies`): their names, and
whether they need a pre-verifier, are the registry's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedModel
from transformers.generation.candidate_generator import AssistedCandidateGenerator
from transformers.utils import is_sklearn_available

from .._hf_compat import bind_candidate_factory, unbind_candidate_factory
from ..candidates import SuffixCache
from ..strategies import (
    DEFAULT_LOOKUP_TOKENS,
    STRATEGIES,
    LookupConfig,
    SpeculativeConfig,
    StrategyConfig,
    strategy_config,
    strategy_names,
)

HF_DEFAULT_ASSISTANT_TOKENS = 20  # transformers' GenerationConfig default for num_assistant_tokens
HF_DEFAULT_CONFIDENCE = 0.4  # transformers' default assistant_confidence_threshold
SWEEP = tuple(range(1, 9))  # gammas swept by the bare names "sd-fixed" / "hf-fixed"
LOOKUP_SWEEP = (3, 5, 10)  # prompt_lookup_num_tokens swept by the bare name "hf-lookup"
# Gated lookup from the request's suffix index (the target's gate, else the default one), alone or with a SuffixCache
# of the earlier prompts of the same run and temperature (`BenchSuffixCaches`)
SUFFIX_NAMES = ("pacer-suffix", "pacer-suffix-cache")
SUFFIX_CACHE_TOKENS = 262_144
QUICK_REGISTERED = ("pearl", "ouroboros", "pacer+ouroboros")  # registry presets a --quick run includes
# Names only the benchmark knows; every other name is looked up in the strategy registry.
BASE_NAMES = ("ar", "sd-fixed", "hf-fixed-<γ>", "hf-fixed", "hf-heuristic", "hf-confidence",
              "hf-confidence-static", "pacer", "pacer-b1", "pacer-default", "oracle", "hf-lookup-<N>", "hf-lookup",
              "lookup-oracle", "pacer-lookup-default", *SUFFIX_NAMES)


class StaticConfidenceCandidateGenerator(AssistedCandidateGenerator):
    """HF's candidate generator with the confidence threshold frozen.

    transformers re-tunes `assistant_confidence_threshold` from an ROC curve only when scikit-learn is
    installed *and* `type(self) is AssistedCandidateGenerator`; this subclass changes nothing else, so it
    is exactly HF's behaviour without scikit-learn.
    """


@dataclass(frozen=True)
class Strategy:
    """One benchmarked decoding strategy.

    `family`: "ar" (target alone), "sd-fixed" (pacer_hf's loop at fixed γ), "hf" (transformers' own
    AssistedCandidateGenerator, called with pacer=None), "hf-lookup" (transformers' own prompt lookup,
    pacer=None), "pacer" (pacer_hf + a pre-verifier), "registered" (another strategy of the registry, run
    by name), "default-gate" (prompt lookup gated by pacer_hf's default gate, whatever gate the target has
    attached), "oracle" or "lookup-oracle" (modelled from traces). `needs_preverifier` comes from the
    registry config; `lookup_tokens` is the call's prompt_lookup_num_tokens (lookup strategies use no draft).
    """

    name: str
    family: str
    gamma: int | None = None
    draft_config: dict[str, Any] = field(default_factory=dict)
    static_confidence: bool = False
    block_size: int | None = None
    needs_preverifier: bool = False
    lookup_tokens: int | None = None
    suffix_cache: bool = False  # family "suffix": generate(suffix_cache=) with this strategy's BenchSuffixCaches entry

    @property
    def uses_draft(self) -> bool:
        return self.family not in ("ar", "oracle", "lookup-oracle") and self.lookup_tokens is None

    @property
    def runs(self) -> bool:
        """False for strategies computed afterwards from other strategies' traces (the oracles)."""
        return self.family not in ("oracle", "lookup-oracle")


def _constant(gamma: int, threshold: float = 0.0) -> dict[str, Any]:
    return {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": threshold}


def available_strategy_names() -> list[str]:
    """Every name `resolve_strategies` accepts right now (registered strategies included)."""
    return [*BASE_NAMES, *(name for name in strategy_names() if name not in BASE_NAMES)]


def default_strategy_names(quick: bool, has_preverifier: bool, has_draft: bool = True,
                           has_lookup_gate: bool = False) -> list[str]:
    """Full mode sweeps γ = 1..8 for both loops and runs every registered strategy; quick mode keeps a few γ
    and only `QUICK_REGISTERED` of those. Strategies that need a pre-verifier go without one. Without a
    draft: prompt lookup only (HF's N swept, pacer_hf's lookup-10, Pacer-gated lookup with the target's own gate
    and with the default gate, the oracle)."""
    if not has_draft:
        names = ["ar", "hf-lookup-3", "hf-lookup-10"] if quick else ["ar", "hf-lookup", "lookup-10"]
        return names + (["pacer-lookup"] if has_lookup_gate else []) + ["pacer-lookup-default", "lookup-oracle"]
    names = ["ar"]
    names += ["sd-fixed-2", "sd-fixed-4", "sd-fixed-8", "hf-fixed-4"] if quick else ["sd-fixed", "hf-fixed"]
    names += ["hf-heuristic", "hf-confidence", "hf-confidence-static"]
    if has_preverifier:
        names += ["pacer", "pacer-b1"]
    names.append("pacer-default")  # what `pacer=True` gives a draft with no pre-verifier of its own
    registered = QUICK_REGISTERED if quick else sorted(STRATEGIES)
    names += [name for name in registered if name not in names and (has_preverifier or not _needs_preverifier(name))
              and not isinstance(strategy_config(name), LookupConfig)]
    names.append("oracle")
    return names


def _needs_preverifier(name: str) -> bool:
    config = strategy_config(name)
    return config is not None and not isinstance(config, LookupConfig) and config.use_preverifier


def resolve_strategies(names: list[str], has_preverifier: bool, oracle_gamma: int = 8,
                       has_draft: bool = True) -> list[Strategy]:
    """Names -> strategies, in order, without duplicates; raises ValueError naming what is wrong.

    With `oracle`, an `sd-fixed-<oracle_gamma>` run is added when no fixed-γ run is that long: the oracle
    replays it, so its γ caps the oracle's draft length (pass the pre-verifier's max_draft_tokens).
    With `lookup-oracle`, a `lookup-10` run is added when there is no pacer_hf lookup-<N> run to replay.
    """
    out: list[Strategy] = []
    for raw in names:
        name = raw.strip()
        for strategy in _resolve_one(name, has_preverifier):
            if strategy.uses_draft and not has_draft:
                raise ValueError(f"Strategy {name!r} needs a draft model and this run has none; run the "
                                 "prompt-lookup strategies (hf-lookup, lookup-<N>, pacer-lookup) or pass a draft.")
            if all(s.name != strategy.name for s in out):
                out.append(strategy)
    if any(s.family == "lookup-oracle" for s in out) and not any(is_lookup_fixed(s) for s in out):
        out.insert(1, _resolve_one(f"lookup-{DEFAULT_LOOKUP_TOKENS}", has_preverifier)[0])
    if not any(s.name == "ar" for s in out):
        out.insert(0, Strategy("ar", "ar"))  # every speedup and the greedy check are relative to ar
    if any(s.family == "oracle" for s in out) and not any(s.family == "sd-fixed" and s.gamma >= oracle_gamma
                                                          for s in out):
        out.insert(1, _sd_fixed(oracle_gamma))  # the oracle is computed from a long fixed-γ trace
    return out


def is_lookup_fixed(strategy: Strategy) -> bool:
    """pacer_hf's ungated lookup-<N>: every lookup token proposed, a trace the lookup oracle can replay."""
    config = strategy_config(strategy.name) if strategy.family == "registered" else None
    return isinstance(config, LookupConfig) and not config.use_gate


def _sd_fixed(gamma: int) -> Strategy:
    return Strategy(f"sd-fixed-{gamma}", "sd-fixed", gamma, _constant(gamma))


def _resolve_one(name: str, has_preverifier: bool) -> list[Strategy]:
    if name == "ar":
        return [Strategy("ar", "ar")]
    if name in ("sd-fixed", "hf-fixed"):
        return [s for gamma in SWEEP for s in _resolve_one(f"{name}-{gamma}", has_preverifier)]
    if name.startswith("hf-fixed-"):
        config = strategy_config("sd" + name[2:])  # the same γ rule as pacer="sd-fixed-<γ>"
        if config is None:
            raise ValueError(f"Strategy {name!r}: write hf-fixed-<γ> with an integer γ >= 1.")
        return [Strategy(name, "hf", config.gamma, _constant(config.gamma))]
    if name == "hf-heuristic":
        # threshold 0.0 isolates the schedule (otherwise HF's 0.4 confidence stop also runs)
        config = {**_constant(HF_DEFAULT_ASSISTANT_TOKENS), "num_assistant_tokens_schedule": "heuristic"}
        return [Strategy(name, "hf", None, config)]
    if name in ("hf-confidence", "hf-confidence-static"):
        config = _constant(HF_DEFAULT_ASSISTANT_TOKENS, HF_DEFAULT_CONFIDENCE)
        return [Strategy(name, "hf", None, config, static_confidence=name.endswith("-static"))]
    if name in ("pacer", "pacer-b1"):
        if not has_preverifier:
            raise ValueError(f"Strategy {name!r} needs a trained pre-verifier: pass --preverifier PATH (or "
                             "preverifier= in Python); with the demo pair it defaults to hub_cards/demo-preverifier.")
        return [Strategy(name, "pacer", None, {}, block_size=1 if name == "pacer-b1" else None, needs_preverifier=True)]
    if name == "pacer-default":
        return [Strategy(name, "pacer", None, {})]
    if name == "oracle":
        return [Strategy("oracle", "oracle")]
    if name == "lookup-oracle":
        return [Strategy("lookup-oracle", "lookup-oracle")]
    if name in SUFFIX_NAMES:
        return [Strategy(name, "suffix", lookup_tokens=DEFAULT_LOOKUP_TOKENS, suffix_cache=name.endswith("-cache"))]
    if name == "pacer-lookup-default":
        return [Strategy(name, "default-gate", lookup_tokens=DEFAULT_LOOKUP_TOKENS)]
    if name == "hf-lookup":
        return [s for n in LOOKUP_SWEEP for s in _resolve_one(f"hf-lookup-{n}", has_preverifier)]
    if name.startswith("hf-lookup-"):
        config = strategy_config(name[3:])  # the same N rule as pacer="lookup-<N>"
        if config is None:
            raise ValueError(f"Strategy {name!r}: write hf-lookup-<N> with an integer N >= 1.")
        return [Strategy(name, "hf-lookup", lookup_tokens=config.num_tokens)]
    config: StrategyConfig | None = strategy_config(name)
    if isinstance(config, SpeculativeConfig) and not config.use_preverifier:
        return [_sd_fixed(config.gamma)]
    if isinstance(config, LookupConfig):  # the gate is the target's (pacer_hf.attach), not a draft pre-verifier
        return [Strategy(name, "registered", lookup_tokens=config.num_tokens or DEFAULT_LOOKUP_TOKENS)]
    if config is not None:
        if config.use_preverifier and not has_preverifier:
            raise ValueError(f"Strategy {name!r} needs a pre-verifier: pass --preverifier PATH.")
        return [Strategy(name, "registered", None, _constant(HF_DEFAULT_ASSISTANT_TOKENS),
                         needs_preverifier=config.use_preverifier)]
    raise ValueError(f"Unknown strategy {name!r}; known: {', '.join(available_strategy_names())}.")


class BenchSuffixCaches:
    """One SuffixCache per strategy and temperature, emptied at the start of every run (and after the warm-up):
    a run takes its prompts in a fixed order, each once, so a cache holds only earlier prompts' prompts and
    answers, never the answer of the prompt being timed."""

    def __init__(self, max_tokens: int = SUFFIX_CACHE_TOKENS):
        self.max_tokens = max_tokens
        self.caches: dict[tuple[str, float], SuffixCache] = {}

    def reset(self) -> None:
        self.caches.clear()

    def get(self, strategy: Strategy, temperature: float) -> SuffixCache | None:
        if not strategy.suffix_cache:
            return None
        key = (strategy.name, temperature)
        if key not in self.caches:
            self.caches[key] = SuffixCache(max_tokens=self.max_tokens)
        return self.caches[key]


def sklearn_retuning(strategy: Strategy) -> bool:
    """True when transformers will re-tune this strategy's confidence threshold during generation."""
    return (strategy.family == "hf" and not strategy.static_confidence and is_sklearn_available()
            and bool(strategy.draft_config.get("assistant_confidence_threshold")))


@contextmanager
def draft_generation_config(draft: PreTrainedModel | None, settings: dict[str, Any]) -> Iterator[None]:
    """Give `draft` a fresh copy of its generation config with `settings` for one call, then restore it.

    A fresh copy per call also undoes HF's write-back of the "heuristic" window, so every call starts at
    the configured `num_assistant_tokens`.
    """
    if draft is None:
        yield
        return
    saved = draft.generation_config
    config = copy.deepcopy(saved)
    for key, value in settings.items():
        setattr(config, key, value)
    draft.generation_config = config
    try:
        yield
    finally:
        draft.generation_config = saved


@contextmanager
def static_confidence(target: PreTrainedModel) -> Iterator[None]:
    """Bind (on this instance, for one call) a candidate-generator factory returning the frozen-threshold
    subclass; whatever was bound before (pacer_hf.enable's factory or nothing) is put back."""
    def factory(self, generation_config, input_ids, inputs_tensor, logits_processor, model_kwargs,
                assistant_model=None, target_tokenizer=None, assistant_tokenizer=None):
        return StaticConfidenceCandidateGenerator(
            input_ids=input_ids, assistant_model=assistant_model, generation_config=generation_config,
            model_kwargs=model_kwargs, inputs_tensor=inputs_tensor, logits_processor=logits_processor,
        )

    previous = bind_candidate_factory(target, factory)
    try:
        yield
    finally:
        unbind_candidate_factory(target, previous)


def call_context(strategy: Strategy, target: PreTrainedModel, draft: PreTrainedModel | None):
    """The context one `generate` call of `strategy` runs in (draft config, and the static-threshold factory)."""
    config = draft_generation_config(draft if strategy.uses_draft else None, strategy.draft_config)
    if not strategy.static_confidence:
        return config
    return _both(config, static_confidence(target))


@contextmanager
def _both(first, second) -> Iterator[None]:
    with first, second:
        yield


__all__ = [
    "BenchSuffixCaches",
    "Strategy",
    "StaticConfidenceCandidateGenerator",
    "available_strategy_names",
    "call_context",
    "default_strategy_names",
    "draft_generation_config",
    "is_lookup_fixed",
    "resolve_strategies",
    "sklearn_retuning",
]
