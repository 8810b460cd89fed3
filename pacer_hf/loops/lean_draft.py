"""A lean forward for Llama-family drafts: the draft's own weights as plain tensor ops.

A small draft's `forward` spends most of its time in transformers' per-call machinery (mask and
position setup, output capture, config lookups, module calls), not in arithmetic: 1.4 ms for the
demo's 1-layer draft, of which 0.6 ms is the layer and the `lm_head`. Speculation pays only when
drafting is cheap, so for Llama-family drafts (llama, mistral, qwen2, qwen3) the drafting loop runs
the same layers as tensor ops over a preallocated KV buffer.

Draft numerics never decide a token: the target verifies every token, and under sampling the q
handed to the verifier is the one the token was sampled from. So this is a speed path, not an
exactness risk; it is still checked against the draft's own `forward` once per model, dtype and
device (`LeanDraft.for_model`), and the drafting loop records which forward ran in
`stats.draft_forward`.
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.nn.functional as F

from .._hf_compat import CACHE_KWARG, new_cache
from ..cheap_draft import is_int8

# pacer_draft_forward=: "auto" (lean when the draft qualifies), "lean" (or raise), "model" (its forward).
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}  # relative to the largest logit; 16-bit: 3e-2
# int8 linears (cheap_draft.quantize_linears) quantize activations per call, so the last-bit differences between
# two float paths flip rounding steps that 24 layers amplify (0.08 of the largest logit on Qwen2.5-Coder-0.5B);
# a structural mistake (rope, masking, a missing bias) is O(1)
_QUANTIZED_TOLERANCE = 0.15
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(dtype, device): reason}


def unsupported_reason(draft: torch.nn.Module, max_length: int) -> str | None:
    """Why `draft` cannot use the lean forward for sequences up to `max_length` (None: it can)."""
    model_type = getattr(getattr(draft, "config", None), "model_type", None)
    if model_type not in SUPPORTED:
        return f"model_type {model_type!r} is not one of {SUPPORTED}"
    base = getattr(draft, "model", None)
    if type(draft).__name__ != f"{type(base).__name__[: -len('Model')]}ForCausalLM":
        return f"{type(draft).__name__} is not a plain <Model>ForCausalLM (e.g. a PEFT or wrapped model)"
    rope_type = getattr(base.rotary_emb, "rope_type", "default")
    if "dynamic" in rope_type or "longrope" in rope_type:
        return f"rope_type {rope_type!r} depends on the sequence length"
    for layer in base.layers[: draft.config.num_hidden_layers]:  # qwen2/qwen3 per layer, mistral per model
        window = getattr(layer.self_attn, "sliding_window", getattr(draft.config, "sliding_window", None))
        if window is not None and window < max_length:
            return f"a sliding window ({window}) shorter than the sequence ({max_length})"
    return None


class DraftKV:
    """The lean forward's KV cache: one preallocated buffer per layer, grown by doubling.

    It answers `get_seq_length()` and `crop(-n)` like a transformers `Cache`, so the drafting loop's
    roll-back (`_hf_compat.crop_cache`) treats both alike; cropping just moves `length`.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int, dtype, device, batch: int = 1):
        self.keys = [torch.empty(batch, kv_heads, capacity, head_dim, dtype=dtype, device=device)
                     for _ in range(layers)]
        self.values = [torch.empty_like(k) for k in self.keys]
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        self.length -= abs(tokens_to_remove)

    def reserve(self, length: int) -> None:
        capacity = self.keys[0].shape[2]
        if length <= capacity:
            return
        grown = max(length, 2 * capacity)
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                new = old.new_empty(*old.shape[:2], grown, old.shape[3])
                new[:, :, : self.length] = old[:, :, : self.length]
                buffers[i] = new


class LeanDraft:
    """`lean(input_ids, kv) -> (hidden, logits)` of the last position, as the draft's forward computes them.

    `hidden` is the input of the draft's `lm_head` (what the pre-verifier reads). Weights are read from
    the draft's modules at construction, so build one per `generate` call (`for_model`).
    """

    def __init__(self, draft: torch.nn.Module):
        base = draft.model
        self.embed = base.embed_tokens.weight
        self.norm = (base.norm.weight, base.norm.variance_epsilon)
        self.lm_head = _projection(draft.lm_head)
        self.rotary = base.rotary_emb
        self.layers = []
        for layer in base.layers[: draft.config.num_hidden_layers]:
            attn, mlp = layer.self_attn, layer.mlp
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)  # qwen3
            self.layers.append((
                (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                [_projection(p) for p in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)],
                None if q_norm is None else ((q_norm.weight, q_norm.variance_epsilon),
                                             (k_norm.weight, k_norm.variance_epsilon)),
                attn.scaling,
                (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                [_projection(p) for p in (mlp.gate_proj, mlp.up_proj, mlp.down_proj)],
                mlp.act_fn,
            ))
        attn = base.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.kv_heads = attn.k_proj.out_features // self.head_dim
        self.dtype, self.device = self.embed.dtype, self.embed.device
        quantized = any(map(is_int8, (attn.q_proj, attn.o_proj, base.layers[0].mlp.down_proj, draft.lm_head)))
        self.tolerance = _QUANTIZED_TOLERANCE if quantized else _TOLERANCE.get(self.dtype, 3e-2)
        self.cos = self.sin = self.embed.new_empty(0, self.head_dim)

    @classmethod
    def for_model(cls, draft: torch.nn.Module, max_length: int) -> tuple[LeanDraft | None, str | None]:
        """A LeanDraft for `draft`, or (None, why not). The first use per model/dtype/device is checked."""
        reason = unsupported_reason(draft, max_length)
        if reason is not None:
            return None, reason
        lean = cls(draft)
        checked = _CHECKED.setdefault(draft, {})
        key = (lean.dtype, lean.device)
        if key not in checked:
            checked[key] = lean._mismatch(draft)
        return (None, checked[key]) if checked[key] else (lean, None)

    def new_cache(self, capacity: int, batch: int = 1) -> DraftKV:
        return DraftKV(len(self.layers), self.kv_heads, self.head_dim, capacity, self.dtype, self.device, batch)

    def _rope(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        if end > self.cos.shape[0]:  # the draft's own rotary module, evaluated once for all positions
            positions = torch.arange(max(end, 2 * self.cos.shape[0]), device=self.device)[None]
            cos, sin = self.rotary(self.embed[:1][None], position_ids=positions)
            self.cos, self.sin = cos[0], sin[0]
        return self.cos, self.sin

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, kv: DraftKV) -> tuple[torch.Tensor, torch.Tensor]:
        start, length = kv.length, input_ids.shape[1]
        end = start + length
        cos, sin = self._rope(end)
        if length == 1:
            mask, causal = None, False
        elif start == 0:
            mask, causal = None, True
        else:  # new positions attend to the cache and causally among themselves
            mask = torch.arange(end, device=self.device) <= torch.arange(start, end, device=self.device)[:, None]
            causal = False
        return self._forward(input_ids, kv, cos[start:end], sin[start:end], mask, causal)

    @torch.no_grad()
    def rows(self, input_ids: torch.Tensor, positions: torch.Tensor, kv: DraftKV,
             visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch whose rows have their own positions (`batch_cache.LeanRowCache`): `positions` (batch, new)
        are the new tokens' positions, `visible` (batch, new, slots) which cache slots each may attend to."""
        cos, sin = self._rope(int(positions.max()) + 1)
        positions = positions.clamp_min(0)
        return self._forward(input_ids, kv, cos[positions][:, None], sin[positions][:, None], visible[:, None], False)

    def _forward(self, input_ids: torch.Tensor, kv: DraftKV, cos: torch.Tensor, sin: torch.Tensor,
                 mask: torch.Tensor | None, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length = input_ids.shape
        start = kv.length
        end = start + length
        kv.reserve(end)
        hidden = F.embedding(input_ids, self.embed)
        for i, (norm1, qkvo, qk_norm, scaling, norm2, mlp, act) in enumerate(self.layers):
            x = _rms_norm(hidden, *norm1)
            q, k, v = (project(x).view(batch, length, -1, self.head_dim) for project in qkvo[:3])
            if qk_norm is not None:
                q, k = _rms_norm(q, *qk_norm[0]), _rms_norm(k, *qk_norm[1])
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            keys, values = kv.keys[i], kv.values[i]
            keys[:, :, start:end] = k
            values[:, :, start:end] = v
            out = F.scaled_dot_product_attention(q, keys[:, :, :end], values[:, :, :end], attn_mask=mask,
                                                 is_causal=causal, scale=scaling, enable_gqa=True)
            hidden = hidden + qkvo[3](out.transpose(1, 2).reshape(batch, length, -1))
            x = _rms_norm(hidden, *norm2)
            gate, up, down = mlp
            hidden = hidden + down(act(gate(x)) * up(x))
        kv.length = end
        last = _rms_norm(hidden[:, -1], *self.norm)
        return last, self.lm_head(last)

    def _mismatch(self, draft: torch.nn.Module) -> str | None:
        """Compare with the draft's forward on a probe (prefill, one token, two tokens after a cache)."""
        vocab = self.embed.shape[0]
        probe = (torch.arange(11, device=self.device) * 7919 + 13) % vocab
        kv, cache = self.new_cache(4), new_cache(draft.config)
        with torch.no_grad():
            for chunk in (probe[:6], probe[6:7], probe[7:9], probe[9:11]):
                _, mine = self(chunk[None], kv)
                theirs = draft(input_ids=chunk[None], use_cache=True, **{CACHE_KWARG: cache}).logits[:, -1]
                tolerance = self.tolerance * (1 + theirs.abs().max().item())
                if not torch.allclose(mine.float(), theirs.float(), rtol=0, atol=tolerance):
                    error = (mine.float() - theirs.float()).abs().max().item()
                    return f"its logits differ from the draft's forward by {error:.3g} on a probe"
        return None


def _projection(module: torch.nn.Module):
    """`x -> module(x)`: a plain nn.Linear as F.linear over its weights (no module-call overhead), anything
    else (an int8 or vocabulary-subset head from `pacer_hf.cheap_draft`) as the module itself."""
    if type(module) is torch.nn.Linear:
        return functools.partial(F.linear, weight=module.weight, bias=module.bias)
    return module


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm, in its order of operations (float32 statistics, then back to the input dtype)."""
    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
