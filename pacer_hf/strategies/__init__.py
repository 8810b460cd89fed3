"""pacer_hf's strategies, one folder each: a serialisable config and a builder, registered by name.

Importing this package registers the built-in ones: `speculative` (`"sd-fixed-<γ>"`, `"pacer"`),
`ouroboros` (`"ouroboros"`, `"pacer+ouroboros"`) and `pearl` (`"pearl"`, `"pacer+pearl"`, ...).
A new strategy subclasses `StrategyConfig` and calls `register_strategy`.
"""

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
    "STRATEGIES",
    "STRATEGY_TYPES",
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
