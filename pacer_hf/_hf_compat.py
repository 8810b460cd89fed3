"""Every contact with transformers' private generation and cache API lives here, behind a version check.

transformers moves these internals between minor releases; pacer_hf is tested against the range
below (both ends in CI) and refuses other versions with a clear message instead of misbehaving.
Differences between releases are settled here by capability, never in the loops:
- 5.24 renamed the models' `past_key_values` argument and output to `cache` (`CACHE_KWARG`);
- cache layers differ by model family: full attention, sliding window or chunked attention, shared-KV
  dummies, linear attention. `new_cache`, `crop_cache` and `check_cache_support` are the only code that
  knows; docs/LEAN_LOOP.md ("When transformers moves") lists what to check on a new release.
"""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Callable

import torch
import transformers
from packaging.version import Version
from transformers import Cache, DynamicCache, GenerationConfig, GenerationMixin, PretrainedConfig
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.generation.candidate_generator import AssistedCandidateGenerator, CandidateGenerator
from transformers.generation.utils import _speculative_sampling

SUPPORTED_RANGE = (Version("5.21.0"), Version("5.25.0"))
# The method `_assisted_decoding` asks for its candidate generator: `enable` and the benchmark bind their own over it,
# on the instance (`bind_candidate_factory`); `disable` removes what was bound (`ModelState.ATTRIBUTES`).
CANDIDATE_HOOK = "_get_candidate_generator"
# The models' cache argument and output field: `cache` from 5.24 on (`past_key_values` still works there, with a
# deprecation warning on every call), `past_key_values` before.
CACHE_KWARG = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"
# A windowed layer keeps this many states past its window, so a rollback that reaches behind the last crop
# (Ouroboros dropping a trimmed block, a lookup round after a draft round) still finds them.
ROLLBACK_MARGIN = 64
# How each cache layer class rolls back, by exact class: a subclass (hybrid linear-attention layers, quantized
# layers, a model's own layer) may hold state these do not restore, so it is refused, not assumed.
_ROLLBACK = {
    "DynamicLayer": "full",
    "DynamicIndexedLayer": "full",  # DeepSeek's indexer keys: its own crop drops them too
    "DynamicSlidingWindowLayer": "windowed",  # sliding and chunked attention
    "DummyLayer": "none",  # shared-KV and attention-free layers hold nothing
}
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
    "CACHE_KWARG",
    "CANDIDATE_HOOK",
    "batch_row_cache",
    "bind_candidate_factory",
    "check_cache_support",
    "check_supported",
    "crop_cache",
    "default_candidate_generator",
    "eos_ids",
    "eos_tensor",
    "gather_cache_slots",
    "new_cache",
    "output_cache",
    "pad_token_id",
    "record_past",
    "speculative_sampling",
    "unbind_candidate_factory",
]


def check_supported() -> None:
    """Raise if the installed transformers is outside the tested range or its hook point moved."""
    version = Version(transformers.__version__)
    low, high = SUPPORTED_RANGE
    if not low <= Version(version.base_version) < high:
        raise RuntimeError(
            f"pacer_hf supports transformers >={low},<{high}, found {transformers.__version__}. "
            f'Install a supported version: pip install "transformers>={low},<{high}". (pacer_hf.vllm\'s proposer '
            "runs under vLLM's own transformers; generate(pacer=...) needs this range.)"
        )
    params = list(inspect.signature(GenerationMixin._get_candidate_generator).parameters)
    if params != _EXPECTED_FACTORY_PARAMS:
        raise RuntimeError(
            f"transformers {transformers.__version__}: GenerationMixin._get_candidate_generator has parameters "
            f"{params}, expected {_EXPECTED_FACTORY_PARAMS}; this build is not supported by pacer_hf."
        )
    missing = [name for owner, name in ((GenerationMixin, "_prepare_special_tokens"), (Cache, "activate_past_recording"))
               if not callable(getattr(owner, name, None))]
    if missing:
        raise RuntimeError(f"transformers {transformers.__version__} has no {', '.join(missing)}; this build is not "
                           "supported by pacer_hf.")
    params = list(inspect.signature(_speculative_sampling).parameters)
    if params != _EXPECTED_SAMPLING_PARAMS:
        raise RuntimeError(
            f"transformers {transformers.__version__}: _speculative_sampling has parameters {params}, expected "
            f"{_EXPECTED_SAMPLING_PARAMS}; this build is not supported by pacer_hf."
        )


def default_candidate_generator(model, *args, **kwargs) -> CandidateGenerator:
    """transformers' own choice of candidate generator (plain HF behaviour)."""
    return GenerationMixin._get_candidate_generator(model, *args, **kwargs)


def bind_candidate_factory(model, factory: Callable) -> Callable | None:
    """Bind `factory` (with `GenerationMixin._get_candidate_generator`'s parameters) on this instance, where
    `_assisted_decoding` looks for its candidate generator; returns what the instance had bound before (None: none)."""
    check_supported()
    previous = model.__dict__.get(CANDIDATE_HOOK)
    setattr(model, CANDIDATE_HOOK, types.MethodType(factory, model))
    return previous


def unbind_candidate_factory(model, previous: Callable | None = None) -> None:
    """Put back what `bind_candidate_factory` returned (None: the class's own factory again)."""
    if previous is None:
        model.__dict__.pop(CANDIDATE_HOOK, None)
    else:
        setattr(model, CANDIDATE_HOOK, previous)


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


def pad_token_id(generation_config: GenerationConfig, default: int = 0) -> int:
    """The pad id `generate` prepared (`_prepare_special_tokens`' `_pad_token_tensor`), else `default`."""
    pad = getattr(generation_config, "_pad_token_tensor", None)
    return int(pad) if pad is not None else default


def eos_ids(eos) -> set[int]:
    """The EOS ids as a set of ints, from what holds them: None, an id, a list of ids, or a tensor (`eos_tensor`).
    The one place every loop, generator and collector reads its EOS set from."""
    return set() if eos is None else {int(t) for t in torch.as_tensor(eos).flatten().tolist()}


def output_cache(output) -> Cache | None:
    """The cache a model forward returned (`.cache` from 5.24, `.past_key_values` before)."""
    return getattr(output, CACHE_KWARG)


def new_cache(config: PretrainedConfig) -> DynamicCache:
    """An empty cache for a draft that rolls back: its windowed layers record the states a rollback needs."""
    cache = DynamicCache(config=config)
    cache.activate_past_recording()
    return cache


def record_past(cache: Cache) -> None:
    """Make the cache's windowed and linear-attention layers keep the states a rollback needs (`crop_cache`)."""
    cache.activate_past_recording()


def full_attention_kv(cache, length: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Each layer's keys and values for the first `length` positions, or None unless every layer of `cache` is a
    plain full-attention layer holding them."""
    if not isinstance(cache, DynamicCache) or any(_ROLLBACK.get(type(layer).__name__) != "full" for layer in cache.layers):
        return None
    if cache.get_seq_length() < length:
        return None
    return [(layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in cache.layers]


def crop_cache(cache, length: int) -> None:
    """Keep the first `length` positions of `cache`: the rollback of every loop, for every kind of layer.

    Full-attention layers drop what follows. A windowed layer (sliding or chunked attention), recording since
    `activate_past_recording`, drops what follows and then keeps its window plus `ROLLBACK_MARGIN` states, so
    memory stays bounded and the next rollback still finds the states it uncovers. Other caches (the lean
    draft's `DraftKV`) take `crop(-n)`. Layers that cannot roll back were refused by `check_cache_support`.
    """
    if not isinstance(cache, Cache):
        excess = cache.get_seq_length() - length
        if excess > 0:
            cache.crop(-excess)
        return
    for layer in cache.layers:
        kind = _ROLLBACK.get(type(layer).__name__)
        if kind == "windowed":
            _crop_windowed(layer, length)
        elif kind == "full":
            excess = layer.get_seq_length() - length
            if excess > 0:
                layer.crop(-excess)
        elif kind is None:
            raise RuntimeError(f"pacer_hf cannot roll back a {type(layer).__name__} cache layer; check_cache_support "
                               "refuses such models before generating.")


def _crop_windowed(layer: DynamicSlidingWindowLayer, length: int) -> None:
    if layer.keys is None or not layer.is_initialized:
        return
    excess = layer.cumulative_length - length
    held = layer.keys.shape[-2]
    if excess > 0:
        if not layer.record_past or held - excess < min(length, layer.sliding_window - 1):
            raise RuntimeError(
                f"A sliding-window cache layer cannot roll back {excess} tokens: it holds {held} states of "
                f"{layer.cumulative_length} (window {layer.sliding_window}, recording {layer.record_past})."
            )
        layer.keys, layer.values = layer.keys[..., : held - excess, :], layer.values[..., : held - excess, :]
        layer.cumulative_length = length
    keep = layer.sliding_window - 1 + ROLLBACK_MARGIN
    if layer.keys.shape[-2] > keep:
        layer.keys, layer.values = layer.keys[..., -keep:, :], layer.values[..., -keep:, :]


def check_cache_support(model, role: str) -> None:
    """Refuse, before generating, a model pacer_hf cannot verify drafts for exactly.

    Static checks first: a forward without a cache, a recurrent state (refused by transformers' assisted
    generation too), cache layers with no exact rollback. Then, for a target, a probe: logits of a text fed in
    chunks through the cache must equal one forward over the whole text (`_chunked_forward_mismatch`), the
    property every verification relies on; it refuses encoder families left bidirectional and any family whose
    cached forward is not its plain one. Drafts get the static checks only: their numerics never decide a
    token. The verdict is worked out once per model, role, dtype and device, not on every call.
    """
    checked = _CHECKED.setdefault(model, {})
    key = (role == "target", next(model.parameters()).dtype, model.device)
    if key not in checked:
        checked[key] = _unsupported_reason(model, probe=key[0])
    if checked[key]:
        family = getattr(model.config, "model_type", type(model).__name__)
        raise ValueError(f"pacer= cannot use this {role} ({type(model).__name__}, model_type {family!r}): "
                         f"{checked[key]}")


def _unsupported_reason(model, probe: bool) -> str | None:
    """Why pacer_hf cannot use `model` (the rest of `check_cache_support`'s message), or None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model's own model
    forwards = [inspect.signature(vars(klass)["forward"]).parameters for klass in type(base).__mro__
                if "forward" in vars(klass)]
    explicit = any(p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in list(forwards[0].values())[1:])
    if explicit and not any({CACHE_KWARG, "past_key_values"} & set(params) for params in forwards):
        return "its forward takes no cache, so verifying a draft would cost a forward over the whole text. " \
               "Generate without pacer=."
    if getattr(model, "_is_stateful", False):
        return ("it keeps a recurrent state that cannot be rolled back after a rejected draft token (transformers' "
                "assisted generation refuses it too). Generate without pacer= for this model.")
    try:
        layers = DynamicCache(config=model.config.get_text_config(decoder=True)).layers
    except Exception as error:  # a config transformers' DynamicCache cannot lay out
        return f"pacer_hf cannot lay out a cache for it: {error}"
    unknown = sorted({type(layer).__name__ for layer in layers if type(layer).__name__ not in _ROLLBACK})
    if unknown:
        return (f"its cache has {unknown} layers, which pacer_hf cannot roll back exactly after a rejected draft "
                "token. Generate without pacer= for this model.")
    mismatch = _chunked_forward_mismatch(model) if probe else None
    if mismatch is None:
        return None
    hint = (" (config.is_decoder is False: an encoder family attends both ways unless loaded with "
            "is_decoder=True)" if getattr(model.config, "is_decoder", None) is False else "")
    return (f"{mismatch}{hint}, so a draft verified in one forward would not get the logits plain decoding gives. "
            "Generate without pacer= for this model.")


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(probed, dtype, device): reason}
_PROBE_TOLERANCE = {torch.float64: 1e-4, torch.float32: 1e-4}  # relative to the largest logit; 16-bit: 3e-2
# (not 1e-9 in float64: some families keep rotary or ALiBi tables in float32; a structural mismatch is O(1))


@torch.no_grad()
def _chunked_forward_mismatch(model) -> str | None:
    """Why logits differ between one forward over a probe text and the same text fed through a cache in
    chunks (8 tokens, then 1, then 3), or None when they agree at every chunk's last position."""
    vocab = model.get_output_embeddings().out_features
    probe = ((torch.arange(12) * 7919 + 13) % vocab)[None].to(model.device)
    try:
        whole = model(input_ids=probe, use_cache=False).logits[0].float()
        cache = None  # the model's own cache, as its first forward makes it
        for start, end in ((0, 8), (8, 9), (9, 12)):
            out = model(input_ids=probe[:, start:end], use_cache=True, **({CACHE_KWARG: cache} if cache else {}))
            cache, chunk = output_cache(out), out.logits[0, -1].float()
            tolerance = _PROBE_TOLERANCE.get(next(model.parameters()).dtype, 3e-2) * (1 + whole.abs().max().item())
            if not torch.allclose(chunk, whole[end - 1], rtol=0, atol=tolerance):
                error = (chunk - whole[end - 1]).abs().max().item()
                return f"its logits through the cache differ from a forward over the whole text by {error:.3g}"
    except Exception as error:  # noqa: BLE001  (any failure of the probe is a reason to refuse, named)
        return f"a forward through the cache failed ({type(error).__name__}: {str(error)[:200]})"
    return None


def batch_row_cache(model, cache: Cache | None) -> tuple[DynamicCache, bool]:
    """The cache the batched loop runs `model` on, and whether each row's tokens must stay contiguous in it.

    The loop masks and realigns per-row slots, so every layer must hold every slot: full-attention layers as
    they are; sliding-window layers become full layers whose window the model's mask applies (in slot space,
    as batched `generate` does, hence contiguous rows). Other layers cannot mask per-row slots.
    """
    config = model.config.get_text_config(decoder=True)
    if cache is None:
        cache = DynamicCache(config=config)
    kinds = sorted({type(layer).__name__ for layer in getattr(cache, "layers", [])})
    chunked = "chunked_attention" in (getattr(config, "layer_types", None) or ()) or getattr(
        config, "attention_chunk_size", None) is not None
    if type(cache) is not DynamicCache or chunked or set(kinds) - {"DynamicLayer", "DynamicSlidingWindowLayer"}:
        what = "chunked attention" if chunked else f"{kinds} cache layers"
        raise ValueError(
            f"pacer_hf's batched loop cannot run this model ({type(model).__name__}): its {what} cannot mask "
            "per-row cache slots. Call generate once per prompt."
        )
    windowed = "DynamicSlidingWindowLayer" in kinds
    if windowed:
        cache.layers = [DynamicLayer() if isinstance(layer, DynamicSlidingWindowLayer) else layer
                        for layer in cache.layers]
    return cache, windowed


def gather_cache_slots(cache: DynamicCache, index: torch.Tensor) -> None:
    """Keep, per row, the cache slots `index[b]` (batch, slots), in that order: realigns rows of different lengths."""
    for layer in cache.layers:
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        batch, heads, _, dim = layer.keys.shape
        expanded = index.to(layer.keys.device)[:, None, :, None].expand(batch, heads, index.shape[1], dim)
        layer.keys = layer.keys.gather(2, expanded)
        layer.values = layer.values.gather(2, expanded)
