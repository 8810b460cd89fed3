"""The strategy registry, in PEFT's shape: one serialisable config and one builder per method.

`generate(..., pacer=...)` resolves its value to a `StrategyConfig` (a preset name such as "pearl", a
parametrised name such as "sd-fixed-4", a config instance or its `to_dict()`), resolves the
pre-verifier once when the config asks for one, and calls the registered builder, which returns the
`StrategyCall` of that one `generate` call.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from transformers import PreTrainedModel

from ..modeling_lookup_gate import PacerLookupGate
from ..modeling_pacer import PacerPreVerifier
from ..stats import PacerStats


class StrategyConfig:
    """Base of every strategy's config: a dataclass with a registered `strategy_type`.

    `use_preverifier` is a field of every config that drafts with a model: True makes `generate` resolve a
    pre-verifier (the `pacer=` object itself, or the one attached with `pacer_hf.attach`) and hand it to the
    builder. Prompt lookup's `LookupConfig` has `use_gate` instead: its Pacer model is the target's lookup gate.
    """

    strategy_type: ClassVar[str] = ""
    supports_batch: ClassVar[bool] = False  # its builder's StrategyCall.batch runs batches of prompts

    def to_dict(self) -> dict[str, Any]:
        return {"strategy_type": self.strategy_type, **dataclasses.asdict(self)}

    @staticmethod
    def from_dict(values: dict[str, Any]) -> StrategyConfig:
        values = dict(values)
        kind = values.pop("strategy_type", None)
        if kind not in STRATEGY_TYPES:
            raise ValueError(f"strategy_type={kind!r} is not registered; known: {sorted(STRATEGY_TYPES)}.")
        return STRATEGY_TYPES[kind].config_class(**values)


@dataclass
class StrategyCall:
    """One `generate` call's strategy: `make(generation_config, logits_processor)` builds its
    candidate generator; `batch(cache_mode)`, for strategies that run batches of prompts, the
    `batch_loop.BatchPlan`; `close()` runs once the call ends (workers stopped, stats finalised)."""

    name: str
    make: Callable[..., Any]
    stats: PacerStats
    closers: list[Callable[[], None]] = field(default_factory=list)
    batch: Callable[[str], Any] | None = None

    def close(self) -> None:
        for close in self.closers:
            close()
        self.closers.clear()


@dataclass(frozen=True)
class StrategyContext:
    """What a builder may read: the pair, the resolved pre-verifier and lookup gate, the call's sampling mode
    and settings. `draft` is None only for strategies that need no draft model (prompt lookup)."""

    model: PreTrainedModel
    draft: PreTrainedModel | None
    preverifier: PacerPreVerifier | None
    do_sample: bool
    draft_forward: str = "auto"
    lookup_gate: PacerLookupGate | None = None
    costs: str | list[float] = "measure"  # generate's pacer_costs=: where expected-gain rules take their costs
    suffix_cache: Any = None  # generate's suffix_cache= (a ScopedSuffixCache): prompt lookup also searches it


@dataclass(frozen=True)
class RegisteredStrategy:
    config_class: type[StrategyConfig]
    build: Callable[[Any, StrategyContext], StrategyCall]


STRATEGY_TYPES: dict[str, RegisteredStrategy] = {}  # strategy_type -> config class and builder
STRATEGIES: dict[str, StrategyConfig] = {}  # preset name -> config ("pearl", "pacer+ouroboros", ...)
_PATTERNS: dict[str, tuple[re.Pattern, Callable[[re.Match], StrategyConfig]]] = {}  # shown name -> parser


def register_strategy(
    config_class: type[StrategyConfig],
    build: Callable[[Any, StrategyContext], StrategyCall],
    presets: dict[str, StrategyConfig] | None = None,
    patterns: dict[str, tuple[str, Callable[[re.Match], StrategyConfig]]] | None = None,
) -> None:
    """Register a strategy: its config class, its builder, preset names and parametrised name patterns.

    `patterns` maps a shown name ("sd-fixed-<γ>") to (regex, match -> config).
    """
    if not config_class.strategy_type:
        raise ValueError(f"{config_class.__name__} needs a non-empty strategy_type.")
    STRATEGY_TYPES[config_class.strategy_type] = RegisteredStrategy(config_class, build)
    for name, config in (presets or {}).items():
        if not isinstance(config, config_class):
            raise TypeError(f"preset {name!r} must be a {config_class.__name__}.")
        STRATEGIES[name] = config
    for shown, (regex, parse) in (patterns or {}).items():
        _PATTERNS[shown] = (re.compile(regex), parse)


def strategy_names() -> list[str]:
    """Every name `pacer=` accepts as a strategy (parametrised ones shown with their placeholder)."""
    return sorted(STRATEGIES) + sorted(_PATTERNS)


def strategy_config(name: str) -> StrategyConfig | None:
    """The config a strategy name stands for, or None when no preset or pattern matches."""
    if name in STRATEGIES:
        return STRATEGIES[name]
    for regex, parse in _PATTERNS.values():
        if match := regex.fullmatch(name):
            return parse(match)
    return None


def unknown_name_error(name: str, argument: str = "pacer") -> ValueError:
    """The error for a name that is neither a strategy nor a place holding a pre-verifier."""
    names = strategy_names()
    digits = "".join(c for c in name if c.isdigit()) or "4"  # a parametrised name is suggested with the user's γ
    candidates = {shown.split("<")[0] + digits if "<" in shown else shown: shown for shown in names}
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(
        f"{argument}={name!r} is neither a strategy nor a folder holding a pre-verifier.{hint} Strategies: "
        f"{', '.join(names)}; or pass a PacerPreVerifier, a pre-verifier folder or a Hub id ('org/name')."
    )


def build_call(config: StrategyConfig, context: StrategyContext) -> StrategyCall:
    return STRATEGY_TYPES[config.strategy_type].build(config, context)
