"""pacer_hf's strategies, one folder each: a serialisable config and a builder, registered by name.

Importing this package registers the built-in ones: `speculative` (`"sd-fixed-<γ>"`, `"pacer"`),
`ouroboros` (`"ouroboros"`, `"pacer+ouroboros"`), `pearl` (`"pearl"`, `"pacer+pearl"`, ...) and
`lookup` (`"lookup-<N>"`, `"pacer-lookup"`: prompt lookup, no draft model needed).
A new strategy subclasses `StrategyConfig` and calls `register_strategy`.
"""

from .lookup import DEFAULT_LOOKUP_TOKENS, LookupConfig  # registers
from .ouroboros import OuroborosConfig  # registers
from .pearl import PearlConfig  # registers
from .registry import (
    STRATEGIES,
    STRATEGY_TYPES,
    StrategyCall,
    StrategyConfig,
    StrategyContext,
    build_call,
    register_strategy,
    strategy_config,
    strategy_names,
    unknown_name_error,
)
from .speculative import SpeculativeConfig  # registers

__all__ = [
    "DEFAULT_LOOKUP_TOKENS",
    "STRATEGIES",
    "STRATEGY_TYPES",
    "LookupConfig",
    "OuroborosConfig",
    "PearlConfig",
    "SpeculativeConfig",
    "StrategyCall",
    "StrategyConfig",
    "StrategyContext",
    "build_call",
    "register_strategy",
    "strategy_config",
    "strategy_names",
    "unknown_name_error",
]
