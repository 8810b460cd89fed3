"""Every contact with transformers' private generation API lives here, behind a version check.

transformers moves these internals between minor releases; pacer_hf is tested against the range
below and refuses other versions with a clear message instead of misbehaving.
"""

from __future__ import annotations

import inspect

import transformers
from packaging.version import Version
from transformers import DynamicCache, GenerationMixin
from transformers.generation.candidate_generator import AssistedCandidateGenerator, CandidateGenerator

SUPPORTED_RANGE = (Version("5.23.0"), Version("5.24.0"))
_EXPECTED_FACTORY_PARAMS = [
    "self",
    "generation_config",
    "input_ids",
    "inputs_tensor",
    "logits_processor",
    "model_kwargs",
    "assistant_model",
    "target_tokenizer",
    "assistant_tokenizer",
]

__all__ = [
    "AssistedCandidateGenerator",
    "CandidateGenerator",
    "DynamicCache",
    "check_supported",
    "crop_cache",
    "default_candidate_generator",
]


def check_supported() -> None:
    """Raise if the installed transformers is outside the tested range or its hook point moved."""
    version = Version(transformers.__version__)
    low, high = SUPPORTED_RANGE
    if not low <= Version(version.base_version) < high:
        raise RuntimeError(
            f"pacer_hf supports transformers >={low},<{high}, found {transformers.__version__}. "
            f'Install a supported version: pip install "transformers>={low},<{high}".'
        )
    params = list(inspect.signature(GenerationMixin._get_candidate_generator).parameters)
    if params != _EXPECTED_FACTORY_PARAMS:
        raise RuntimeError(
            f"transformers {transformers.__version__}: GenerationMixin._get_candidate_generator has parameters "
            f"{params}, expected {_EXPECTED_FACTORY_PARAMS}; this build is not supported by pacer_hf."
        )


def default_candidate_generator(model, *args, **kwargs) -> CandidateGenerator:
    """transformers' own choice of candidate generator (plain HF behaviour)."""
    return GenerationMixin._get_candidate_generator(model, *args, **kwargs)


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` positions of `cache` (5.23's `crop` takes the count to remove, negated)."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)
