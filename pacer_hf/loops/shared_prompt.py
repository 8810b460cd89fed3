"""A draft that is a copy of its target (int8, bfloat16) starts from the target's keys and values for the prompt.

Such a draft is the target's size, so its own pass over the prompt costs a good share of the target's, paid by
every call before its first drafted token: on a short answer to a long prompt it is most of what speculation loses.
Its layers read keys and values shaped and positioned as the target's, so the target's prompt states stand in for
the draft's own (nearer the target's, if anything). The lean loop has the target read the prompt but its last token
before the first round; the round then drafts from the last token and verifies it with the drafted ones, so the
target reads the prompt once, as before. Draft states never decide a token (the target verifies every one).
"""

from __future__ import annotations

import weakref

import torch
from transformers import DynamicCache

from .._hf_compat import full_attention_kv, output_cache
from .lean_draft import DraftKV

_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # draft -> WeakKeyDictionary(target -> bool)
_LAYOUT = ("model_type", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
           "head_dim", "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")


def is_copy_of(draft: torch.nn.Module, target: torch.nn.Module) -> bool:
    """Whether `draft` is `target` in another precision: the same attention layout and the same input
    embeddings (compared in the draft's dtype). Checked once per pair."""
    known = _COPIES.setdefault(draft, weakref.WeakKeyDictionary())
    if target not in known:
        known[target] = _same_layout(draft.config, target.config) and _same_embeddings(draft, target)
    return known[target]


def load_prompt_kv(kv: DraftKV, target_cache, length: int) -> bool:
    """Copy the target's keys and values for the first `length` positions into the empty lean cache `kv`; False
    (nothing copied) when a target layer is not plain full attention."""
    layers = full_attention_kv(target_cache, length)
    if layers is None or len(layers) != len(kv.keys):
        return False
    kv.reserve(length)
    for i, (keys, values) in enumerate(layers):
        kv.keys[i][:, :, :length] = keys
        kv.values[i][:, :, :length] = values
    kv.length = length
    return True


def _same_layout(draft_config, target_config) -> bool:
    draft_text = getattr(draft_config, "get_text_config", lambda: draft_config)()
    target_text = getattr(target_config, "get_text_config", lambda: target_config)()
    return all(getattr(draft_text, name, None) == getattr(target_text, name, None) for name in _LAYOUT)


def _same_embeddings(draft: torch.nn.Module, target: torch.nn.Module) -> bool:
    ours, theirs = draft.get_input_embeddings().weight, target.get_input_embeddings().weight
    if ours.shape != theirs.shape:
        return False
    return bool(torch.equal(ours, theirs.to(device=ours.device, dtype=ours.dtype)))


@torch.no_grad()
def target_prompt_cache(target: torch.nn.Module, draft: torch.nn.Module, prompt: torch.Tensor):
    """The target's keys and values over `prompt` (1 x n ids) as a `DynamicCache` in the draft's dtype, for a
    draft forward to continue from, as the lean loop serves a copy; None where they cannot stand in (the draft is
    not a copy of the target, or a target layer is not plain full attention)."""
    if not is_copy_of(draft, target) or prompt.shape[-1] == 0:
        return None
    cache = output_cache(target(input_ids=prompt.to(target.device), use_cache=True))
    layers = full_attention_kv(cache, prompt.shape[-1])
    if layers is None:
        return None
    dtype = draft.get_input_embeddings().weight.dtype
    shared = DynamicCache()
    for i, (keys, values) in enumerate(layers):
        shared.update(keys.to(draft.device, dtype), values.to(draft.device, dtype), i)
    return shared
