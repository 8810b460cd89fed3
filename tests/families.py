"""Tiny causal LMs of any transformers family, built from its config (no downloads), for the family sweep.

`tiny_model(model_type)` takes the family's default config and shrinks what sets its size (width, depth,
heads, experts, vocabulary) to a model of a few ten thousand parameters; a family that can window its
attention (sliding or chunked) gets a window of `WINDOW` tokens, so that a short test text runs far past
it, and keeps each kind of layer its default declares. Families it cannot shrink raise `TinyModelError`
(the sweep reports them).
"""

from __future__ import annotations

import copy
import re
import traceback

import torch
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 96
WINDOW = 8
MAX_PARAMETERS = 3_000_000

# Size fields under the names different families use; only the ones a family's config has are set.
_SIZES = {
    "vocab_size": VOCAB,
    "hidden_size": 32, "n_embd": 32, "d_model": 32, "dim": 32, "embed_dim": 32,
    "intermediate_size": 64, "n_inner": 64, "ffn_dim": 64, "ffn_hidden_size": 64,
    "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16, "expert_intermediate_size": 16,
    "shared_experts_intermediate_size": 16,
    "vocab_size_per_layer_input": VOCAB, "hidden_size_per_layer_input": 8, "unpadded_vocab_size": VOCAB,
    "index_n_heads": 2, "index_head_dim": 8, "mamba_n_heads": 4, "mamba_d_head": 16,
    "num_hidden_layers": 2, "n_layer": 2, "num_layers": 2, "n_layers": 2,
    "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_heads": 4,
    "num_key_value_heads": 2, "num_kv_heads": 2, "n_kv_heads": 2,
    "head_dim": 8, "kv_channels": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
    "kv_lora_rank": 16, "q_lora_rank": 16, "rotary_dim": 4, "partial_rotary_factor": 0.5,
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "moe_num_experts": 4,
    "num_experts_per_tok": 2, "num_experts_per_token": 2, "moe_topk": 2, "top_k": 2,
    "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
    "max_position_embeddings": 512, "n_positions": 512, "n_ctx": 512, "max_seq_len": 512,
    "initializer_range": 0.3, "use_cache": True,
    "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
}
_WINDOWS = ("sliding_window", "attention_chunk_size", "window_size")


class TinyModelError(Exception):
    """The family's config could not be shrunk to a tiny model."""


def tiny_config(model_type: str, **overrides):
    try:
        default = AutoConfig.for_model(model_type)
    except Exception as error:
        raise TinyModelError(f"no default config: {error}") from error
    if getattr(default, "is_encoder_decoder", False):
        raise TinyModelError("encoder-decoder")
    kwargs = _shrunk(default)
    for name in getattr(default, "sub_configs", {}):  # a composite model (vision or audio towers): each part too
        part = getattr(default, name, None)
        if part is not None and hasattr(part, "to_dict"):
            sizes = {key: value for key, value in _shrunk(part).items() if not key.endswith("_token_id")}
            for key, value in part.to_dict().items():  # its special tokens (a part may need them) inside the vocabulary
                if key.endswith("_token_id") and isinstance(value, int) and value >= VOCAB:
                    sizes[key] = VOCAB - 1
            kwargs[name] = {"model_type": part.model_type, **sizes}  # the rest: its defaults
    kwargs.update(overrides)
    for _ in range(5):
        try:
            return AutoConfig.for_model(model_type, **kwargs)
        except Exception as error:
            needed = re.search(r"Field '(\w+_token_id)' expected int", str(error))
            if needed is not None and kwargs.get(needed.group(1), 0) is None:
                kwargs[needed.group(1)] = VOCAB - 1  # a family that needs this special token: the last id
                continue
            derived = re.search(r"property '(\w+)' of '\w+' object has no setter", str(error))
            field = None if derived is None else next((k for k in (derived.group(1), "layer_types") if k in kwargs), None)
            if field is None:
                raise TinyModelError(f"config refused the tiny sizes: {str(error)[:200]}") from error
            del kwargs[field]  # a field the config derives (Mamba's layer kinds): let it
    raise TinyModelError("config refused the tiny sizes")


def _shrunk(default) -> dict:
    """The tiny sizes for one config (a whole model's, or one part of a composite model's)."""
    fields = set(default.to_dict()) | set(getattr(default, "attribute_map", {}))
    kwargs = {key: value for key, value in _SIZES.items() if key in fields}
    layer_types = getattr(default, "layer_types", None)
    if isinstance(layer_types, (list, tuple)) and layer_types:
        kinds = list(dict.fromkeys(layer_types))  # the family's kinds of layer, in order of first use
        kwargs["layer_types"] = [kinds[i % len(kinds)] for i in range(max(2, len(kinds)))]
        kwargs["num_hidden_layers"] = len(kwargs["layer_types"])
    if "attention_types" in fields:  # GPT-Neo: one global and one local layer
        kwargs["attention_types"] = [[["global", "local"], 1]]
    if "kv_lora_rank" in fields:  # multi-head latent attention: as many key/value heads as query heads
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    for key in _WINDOWS:  # a family that can window its attention does, over WINDOW tokens
        if key in fields:
            kwargs[key] = WINDOW
    if "use_sliding_window" in fields:  # Qwen2-style: windows are opt-in, from layer `max_window_layers` on
        kwargs.update(use_sliding_window=True, max_window_layers=1, num_hidden_layers=2)
        kwargs.pop("layer_types", None)  # the config derives them: layer 0 full, layer 1 windowed
    return kwargs


def tiny_model(model_type: str, seed: int = 0, dtype: torch.dtype | None = None, **overrides):
    """A random tiny causal LM of `model_type` in eval mode: float64, so exactness tests see logic and not
    rounding, unless the family's kernels need float32 (grouped expert matmuls) or `dtype` says otherwise."""
    config = tiny_config(model_type, **overrides)
    with torch.device("meta"):
        try:
            probe = AutoModelForCausalLM.from_config(config)
        except Exception as error:
            raise TinyModelError(f"cannot build: {str(error)[:200]}") from error
    size = sum(p.numel() for p in probe.parameters())
    if size > MAX_PARAMETERS:
        raise TinyModelError(f"{size} parameters with the tiny config")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    if dtype is not None:
        return model.to(dtype)
    try:
        with torch.no_grad():
            model.double()(torch.zeros((1, 2), dtype=torch.long))
    except RuntimeError:
        model.float()
    return model


def noisy_copy(model, seed: int = 1, noise: float = 0.03):
    """A draft that agrees with `model` often but not always: its weights, perturbed."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype) * noise)
    return draft


def window_of(model) -> int | None:
    config = model.config.get_text_config(decoder=True)
    for key in _WINDOWS:
        if getattr(config, key, None) is not None:
            return getattr(config, key)
    return None


# The strategy battery: (name, pacer=, extra generate kwargs). Lookup strategies need no draft.
BATTERY = (
    ("sd-fixed-3", "sd-fixed-3", {}),
    ("pacer", "pacer", {}),
    ("ouroboros", "ouroboros", {}),
    ("pacer+ouroboros", "pacer+ouroboros", {}),
    ("pearl", "pearl", {}),
    ("pacer+pearl", "pacer+pearl", {}),
    ("lookup-4", "lookup-4", {"prompt_lookup_num_tokens": 4}),
    ("pacer-lookup", True, {"prompt_lookup_num_tokens": 4}),
    ("sd-fixed-3 in transformers' loop", "sd-fixed-3", {"pacer_loop": "transformers"}),
)
LOOKUP_PROMPT = torch.tensor([[5, 17, 33, 60, 5, 17, 33, 60, 5, 17, 2, 71]])  # repeats: lookup proposes


class Refused(Exception):
    """pacer_hf refused the call while resolving its arguments, before generating."""


def run_case(target, draft, pacer, prompt: torch.Tensor, max_new_tokens: int, **kwargs):
    """One greedy generate call; `Refused` when pacer_hf refused it before generating, the error otherwise."""
    lookup = "prompt_lookup_num_tokens" in kwargs
    try:
        return target.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, pacer=pacer,
                               assistant_model=None if lookup else draft, **kwargs)
    except ValueError as error:
        frames = [frame.f_code.co_name for frame, _ in traceback.walk_tb(error.__traceback__)]
        if "_resolve" in frames:  # pacer_hf.generation resolves and checks everything before generating
            raise Refused(str(error)) from error
        raise
