"""pacer_hf: adaptive speculative decoding for Hugging Face transformers.

    target = pacer_hf.enable(target)
    out = target.generate(**inputs, assistant_model=draft, pacer=PacerPreVerifier.from_draft(draft))
    print(pacer_hf.last_stats(target))

Importing registers `PacerConfig`/`PacerPreVerifier` with transformers' Auto classes and the extra
strategies (`pacer="ouroboros"`, `pacer="pacer+ouroboros"`, `pacer="pearl"`, `pacer="pearl-sequential"`,
`pacer="pacer+pearl"`, `pacer="pearl-resync"`) in `STRATEGIES`; nothing else.
"""

from transformers import AutoConfig, AutoModel

from .candidate_generator import compile_draft
from .configuration_pacer import PacerConfig
from .generation import STRATEGIES, attach, disable, enable, last_stats, load_preverifier
from .modeling_pacer import PacerPreVerifier, draft_features
from .ouroboros import OuroborosConfig, OuroborosStats, PhrasePool, phrase_pool, reset_phrase_pool
from .pearl import PearlConfig  # registers pacer="pearl" and its variants
from .stats import PacerStats

AutoConfig.register(PacerConfig.model_type, PacerConfig, exist_ok=True)
AutoModel.register(PacerConfig, PacerPreVerifier, exist_ok=True)

__version__ = "0.1.0"
__all__ = [
    "STRATEGIES",
    "OuroborosConfig",
    "OuroborosStats",
    "PacerConfig",
    "PacerPreVerifier",
    "PacerStats",
    "PhrasePool",
    "PearlConfig",
    "attach",
    "compile_draft",
    "disable",
    "draft_features",
    "enable",
    "last_stats",
    "load_preverifier",
    "phrase_pool",
    "reset_phrase_pool",
]
