"""Making a pretrained draft cheaper per token without touching exactness.

The target verifies every drafted token, so a draft may be changed in any way that keeps it proposing tokens the
target accepts; what it must keep is a proper distribution (under sampling the verifier divides by the q a token
was drawn from). Two levers, each measured before it is used (docs/QWEN_CODER.md):

- `restrict_vocabulary`: an output head over a subset of the vocabulary (the tokens the target emits on the kind
  of text served, FR-Spec style). Tokens outside it get logit `OUTSIDE_LOGIT`, so they are never proposed and
  have q = 0 under sampling, which rejection sampling handles (the target's residual distribution covers them).
  A 151,936-token head is a fifth of a 0.5B draft's weights.
- `quantize_linears`: int8 weights with one scale per output channel for the decoder's linear layers (dynamic
  quantization: activations are quantized on the fly), the head left as it is unless asked.

Both return modules the model's own `forward` and the lean drafting loop (`loops/lean_draft.py`) call alike.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

OUTSIDE_LOGIT = -1e4  # finite: softmax gives 0, and entropy-style features stay finite (0 * log 0 is not NaN)


class SubsetHead(nn.Module):
    """An output head whose rows cover `token_ids` only; `forward` still returns full-vocabulary logits."""

    def __init__(self, head: nn.Linear, token_ids: Iterable[int] | torch.Tensor):
        super().__init__()
        ids = token_ids if torch.is_tensor(token_ids) else list(token_ids)
        token_ids = torch.as_tensor(ids, dtype=torch.long).unique()
        self.out_features, self.in_features = head.weight.shape  # out_features: the whole vocabulary, as nn.Linear's
        if token_ids.numel() == 0 or token_ids.min() < 0 or token_ids.max() >= self.out_features:
            raise ValueError(f"token_ids must be a non-empty set of ids in [0, {self.out_features}).")
        self.weight = nn.Parameter(head.weight.detach()[token_ids].clone(), requires_grad=False)
        self.bias = None if head.bias is None else nn.Parameter(head.bias.detach()[token_ids].clone(), requires_grad=False)
        self.register_buffer("token_ids", token_ids, persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = nn.functional.linear(hidden, self.weight, self.bias)
        full = logits.new_full((*logits.shape[:-1], self.out_features), OUTSIDE_LOGIT)
        return full.index_copy_(-1, self.token_ids, logits)


def restrict_vocabulary(draft: nn.Module, token_ids: Iterable[int] | torch.Tensor) -> nn.Module:
    """Replace `draft`'s output head by a `SubsetHead` over `token_ids` (in place; returns `draft`).

    The input embedding is left whole, so the draft still reads every token the target writes."""
    head = draft.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise TypeError(f"restrict_vocabulary needs an nn.Linear output head; {type(draft).__name__} has "
                        f"{type(head).__name__}.")
    if head.weight is draft.get_input_embeddings().weight:  # tied: the copy below unties it, on purpose
        draft.config.tie_word_embeddings = False
    draft.set_output_embeddings(SubsetHead(head, token_ids))
    return draft


def quantize_linears(draft: nn.Module, *, include_head: bool = False) -> nn.Module:
    """int8 weights, one scale per output channel, for every nn.Linear of `draft` (the head only with
    `include_head`), through torch's dynamic quantization; in place, CPU only. Returns `draft`. Not torchao's
    `quantize_`: on CPU its int8 draft step measured twelve times this one (docs/QWEN_CODER.md, the EPYC)."""
    if any(p.device.type != "cpu" for p in draft.parameters()):
        raise ValueError("quantize_linears works on CPU models only (torch's dynamic int8 kernels are CPU kernels).")
    head = draft.get_output_embeddings()
    names = {name for name, module in draft.named_modules()
             if type(module) is nn.Linear and (include_head or module is not head)}
    with warnings.catch_warnings():  # torch.ao.quantization announces its move to torchao; its CPU kernels stay
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*", category=UserWarning)
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        quantize_dynamic(draft, {name: per_channel_dynamic_qconfig for name in names}, dtype=torch.qint8,
                         inplace=True)
    return draft


def is_int8(module: nn.Module) -> bool:
    """Whether `module` is a linear layer `quantize_linears` made int8: its `weight` is a method returning the packed
    tensor, where a float layer's is a tensor."""
    weight = getattr(module, "weight", None)
    return callable(weight) and not isinstance(weight, torch.Tensor)


def cheapened(draft: nn.Module) -> str | None:
    """What `restrict_vocabulary` and `quantize_linears` changed in `draft`, in words (None: neither), so a record
    that names the draft by the folder it was loaded from does not pass an int8 copy off as that folder's model."""
    head = draft.get_output_embeddings() if hasattr(draft, "get_output_embeddings") else None
    int8 = sum(map(is_int8, draft.modules()))
    parts = [f"int8 weights in {int8} linear layers"] if int8 else []
    if isinstance(head, SubsetHead):
        parts.append(f"head over {head.token_ids.numel():,} of {head.out_features:,} tokens")
    return ", ".join(parts) or None


CHEAP_DRAFT_FILE = "cheap_draft.json"  # {"vocabulary": "<file of token ids>" | null, "int8": bool, "int8_head": bool}


def apply_cheap_draft(draft: nn.Module, folder: str | Path) -> nn.Module:
    """Make `draft` cheap as `folder/cheap_draft.json` says (a shipped recipe's choice, e.g.
    hub_cards/qwen-coder-draft): the vocabulary subset first (from the float head), then int8 linears."""
    folder = Path(folder)
    spec = json.loads((folder / CHEAP_DRAFT_FILE).read_text())
    unknown = set(spec) - {"vocabulary", "int8", "int8_head", "measured"}
    if unknown:
        raise ValueError(f"{folder / CHEAP_DRAFT_FILE} has unknown keys {sorted(unknown)}; this pacer_hf reads "
                         "'vocabulary', 'int8' and 'int8_head'.")
    if spec.get("vocabulary"):
        restrict_vocabulary(draft, json.loads((folder / spec["vocabulary"]).read_text()))
    if spec.get("int8") or spec.get("int8_head"):
        quantize_linears(draft, include_head=bool(spec.get("int8_head")))
    return draft
