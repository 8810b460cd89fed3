"""Every contact with transformers' private generation API lives here, behind a version check.

transformers moves these internals between minor releases; pacer_hf is tested against the range
below and refuses other versions with a clear message instead of misbehaving.
"""

from __future__ import annotations

import inspect

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache, GenerationConfig, GenerationMixin
from transformers.generation.candidate_generator import AssistedCandidateGenerator, CandidateGenerator
from transformers.generation.utils import _speculative_sampling

SUPPORTED_RANGE = (Version("5.23.0"), Version("5.24.0"))
_EXPECTED_SAMPLING_PARAMS = [
    "candidate_input_ids",
    "candidate_logits",
    "candidate_length",
    "new_logits",
    "assistant_ensemble_weight",
]
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
    "check_batch_cache",
    "check_supported",
    "crop_cache",
    "default_candidate_generator",
    "eos_tensor",
    "gather_cache_slots",
    "speculative_sampling",
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
    params = list(inspect.signature(_speculative_sampling).parameters)
    if params != _EXPECTED_SAMPLING_PARAMS:
        raise RuntimeError(
            f"transformers {transformers.__version__}: _speculative_sampling has parameters {params}, expected "
            f"{_EXPECTED_SAMPLING_PARAMS}; this build is not supported by pacer_hf."
        )


def default_candidate_generator(model, *args, **kwargs) -> CandidateGenerator:
    """transformers' own choice of candidate generator (plain HF behaviour)."""
    return GenerationMixin._get_candidate_generator(model, *args, **kwargs)


def speculative_sampling(
    candidate_input_ids: torch.LongTensor,
    candidate_logits: torch.Tensor,
    candidate_length: int,
    new_logits: torch.Tensor,
    assistant_ensemble_weight: float | None = None,
) -> tuple[torch.LongTensor, torch.Tensor]:
    """transformers' speculative sampling (Algorithm 1 of arXiv 2211.17192): (valid tokens, matches).

    The lean loop uses transformers' own function, so its accept/reject draws are those of
    `_assisted_decoding`, draw for draw.
    """
    return _speculative_sampling(
        candidate_input_ids,
        candidate_logits,
        candidate_length,
        new_logits,
        assistant_ensemble_weight=assistant_ensemble_weight,
    )


def eos_tensor(generation_config: GenerationConfig) -> torch.Tensor | None:
    """The EOS ids `generate` prepared (`_prepare_special_tokens`), the tensor its stopping criteria use."""
    return getattr(generation_config, "_eos_token_tensor", None)


def crop_cache(cache: DynamicCache, length: int, shrink: bool = False) -> None:
    """Keep the first `length` positions of `cache` (5.23's `crop` takes the count to remove, negated).

    `shrink` calls `crop` even when nothing is removed, as `_assisted_decoding` does for the target:
    sliding-window and linear-attention layers that record their past then drop back to their working size.
    """
    excess = cache.get_seq_length() - length
    if excess > 0 or shrink:
        cache.crop(-max(excess, 0))


def check_batch_cache(cache: DynamicCache) -> None:
    """Batched verification masks and realigns cache slots: only full-attention dynamic layers allow it."""
    from transformers.cache_utils import DynamicLayer

    kinds = {type(layer).__name__ for layer in getattr(cache, "layers", [])}
    if not isinstance(cache, DynamicCache) or any(type(layer) is not DynamicLayer for layer in cache.layers):
        raise ValueError(
            f"pacer_hf's batched loop needs a DynamicCache of full-attention layers; this model's cache has {kinds} "
            "(sliding-window or linear-attention layers cannot mask per-row slots). Call generate once per prompt."
        )


def gather_cache_slots(cache: DynamicCache, index: torch.Tensor) -> None:
    """Keep, per row, the cache slots `index[b]` (batch, slots), in that order: realigns rows of different lengths."""
    for layer in cache.layers:
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        batch, heads, _, dim = layer.keys.shape
        expanded = index.to(layer.keys.device)[:, None, :, None].expand(batch, heads, index.shape[1], dim)
        layer.keys = layer.keys.gather(2, expanded)
        layer.values = layer.values.gather(2, expanded)
