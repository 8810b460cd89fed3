"""pacer_hf: adaptive speculative decoding for Hugging Face transformers.

    target = pacer_hf.enable(target)
    out = target.generate(**inputs, assistant_model=draft, pacer=PacerPreVerifier.from_draft(draft))
    print(pacer_hf.last_stats(target))

Importing registers `PacerConfig`/`PacerPreVerifier` with transformers' Auto classes; nothing else.
"""

from transformers import AutoConfig, AutoModel

from .candidate_generator import compile_draft
from .configuration_pacer import PacerConfig
from .generation import STRATEGIES, attach, disable, enable, last_stats, load_preverifier
from .modeling_pacer import PacerPreVerifier, draft_features
from .stats import PacerStats

AutoConfig.register(PacerConfig.model_type, PacerConfig, exist_ok=True)
AutoModel.register(PacerConfig, PacerPreVerifier, exist_ok=True)

__version__ = "0.1.0"
__all__ = [
    "STRATEGIES",
    "PacerConfig",
    "PacerPreVerifier",
    "PacerStats",
    "attach",
    "compile_draft",
    "disable",
    "draft_features",
    "enable",
    "last_stats",
    "load_preverifier",
]
