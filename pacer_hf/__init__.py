"""pacer_hf: adaptive speculative decoding for Hugging Face transformers.

    target = pacer_hf.enable(target)
    out = target.generate(**inputs, assistant_model=draft, pacer=PacerPreVerifier.from_draft(draft))
    out = target.generate(**inputs, prompt_lookup_num_tokens=10, pacer=lookup_gate)  # no draft model
    print(pacer_hf.last_stats(target))

Importing registers `PacerConfig`/`PacerPreVerifier` and `PacerLookupGateConfig`/`PacerLookupGate` with
transformers' Auto classes and the built-in strategies (`pacer_hf.strategy_names()`) in the strategy
registry; nothing else.
"""

from transformers import AutoConfig, AutoModel

from .attached import attach, default_lookup_gate, default_preverifier
from .candidates import SuffixCache
from .configuration_lookup_gate import PacerLookupGateConfig
from .configuration_pacer import PacerConfig
from .generation import disable, enable, last_stats, load_preverifier
from .loops.draft_forwards import compile_draft
from .modeling_lookup_gate import PacerLookupGate
from .modeling_pacer import PacerPreVerifier, draft_features
from .stats import PacerStats
from .strategies import (
    STRATEGIES,
    LookupConfig,
    OuroborosConfig,
    PearlConfig,
    SpeculativeConfig,
    StrategyConfig,
    register_strategy,
    strategy_names,
)
from .strategies.lookup import LookupStats
from .strategies.ouroboros import OuroborosStats, PhrasePool, phrase_pool, reset_phrase_pool

AutoConfig.register(PacerConfig.model_type, PacerConfig, exist_ok=True)
AutoModel.register(PacerConfig, PacerPreVerifier, exist_ok=True)
AutoConfig.register(PacerLookupGateConfig.model_type, PacerLookupGateConfig, exist_ok=True)
AutoModel.register(PacerLookupGateConfig, PacerLookupGate, exist_ok=True)

__version__ = "0.1.0"


def __getattr__(name: str):
    # fit_preverifier needs the training stack (datasets, transformers.Trainer): imported on first use (PEP 562),
    # so `import pacer_hf` stays light.
    if name == "fit_preverifier":
        import importlib

        value = globals()[name] = importlib.import_module(f"{__name__}.training.fit").fit_preverifier
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "STRATEGIES",
    "LookupConfig",
    "LookupStats",
    "OuroborosConfig",
    "OuroborosStats",
    "PacerConfig",
    "PacerLookupGate",
    "PacerLookupGateConfig",
    "PacerPreVerifier",
    "PacerStats",
    "PearlConfig",
    "PhrasePool",
    "SpeculativeConfig",
    "StrategyConfig",
    "SuffixCache",
    "attach",
    "compile_draft",
    "default_lookup_gate",
    "default_preverifier",
    "disable",
    "draft_features",
    "enable",
    "fit_preverifier",
    "last_stats",
    "load_preverifier",
    "phrase_pool",
    "register_strategy",
    "reset_phrase_pool",
    "strategy_names",
]
