"""The argument checks of `generate(pacer=...)`: what pacer_hf refuses, each with its fix, before any work.

`pacer_hf.generation` resolves `pacer=` and runs these (all names stay importable from there); they read the call's
args and kwargs the way transformers' `generate` takes them, falling back to the generation config.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ._hf_compat import batch_row_cache, check_cache_support
from .loops.batch_cache import check_batch_memory
from .modeling_pacer import PacerPreVerifier
from .strategies import StrategyCall


def check_vocabularies(target: PreTrainedModel, draft: PreTrainedModel, fix: str) -> None:
    """Refuse a draft whose output rows differ from the target's: token ids must mean the same thing."""
    target_rows = target.get_output_embeddings().out_features
    draft_head = draft.get_output_embeddings()
    draft_rows = None if draft_head is None else draft_head.out_features
    if draft_rows != target_rows:
        raise ValueError(
            f"Draft and target vocabularies differ (draft lm_head has {draft_rows} rows, target {target_rows}): {fix}"
        )


def _check_trim(preverifier: PacerPreVerifier, do_sample: bool) -> None:
    if preverifier.config.trim_failed_block and do_sample:
        raise ValueError(
            "The pre-verifier has trim_failed_block=True, which is exact only for greedy decoding; "
            "set do_sample=False or use a pre-verifier config with trim_failed_block=False."
        )


def _check_tokenizers(kwargs: dict) -> None:
    if kwargs.get("tokenizer") is not None or kwargs.get("assistant_tokenizer") is not None:
        raise ValueError(
            "pacer= does not support drafts with a different tokenizer (tokenizer=/assistant_tokenizer=); "
            "use a draft that shares the target's vocabulary."
        )


def _check_pair(model: PreTrainedModel, draft: PreTrainedModel) -> None:
    check_vocabularies(model, draft, "assistant_model must share the target's tokenizer and vocabulary for pacer=.")
    if model.config.is_encoder_decoder or draft.config.is_encoder_decoder:
        raise ValueError("pacer= supports decoder-only models; use plain assisted generation for encoder-decoders.")
    check_cache_support(draft, "draft (assistant_model)")


def _check_inputs(model: PreTrainedModel, args: tuple, kwargs: dict) -> None:
    if _generation_value(model, kwargs, "use_cache") is False:
        raise ValueError("pacer= verifies drafts against the target's cache: pass use_cache=True (this call or the "
                         "model's generation_config has use_cache=False).")
    check_cache_support(model, "target")
    input_ids = _input_ids(args, kwargs)
    beams = _generation_value(model, kwargs, "num_beams") or 1
    if beams > 1:
        raise ValueError(f"pacer= supports greedy decoding and sampling, not beam search (num_beams={beams}); "
                         "pass num_beams=1, or pacer=None for beam search.")
    if input_ids is not None and input_ids.shape[-1] == 0:
        raise ValueError("pacer= needs a prompt of at least one token (input_ids is empty); start it with the "
                         "tokenizer's BOS token or any text.")
    mask = kwargs.get("attention_mask")
    if input_ids is not None and input_ids.shape[0] > 1:
        _check_padding(input_ids, mask)
    elif mask is not None and not bool(mask.all()):
        raise ValueError("pacer= with one prompt takes it unpadded (attention_mask has zeros); pass the prompt "
                         "without padding.")


def _check_padding(input_ids: torch.Tensor, mask: torch.Tensor | None) -> None:
    """A batch must come left-padded with its attention mask, as a tokenizer with padding_side='left' gives it."""
    if mask is None:
        raise ValueError(
            f"pacer= with a batch of {input_ids.shape[0]} prompts needs their attention_mask: pass the tokenizer's "
            "output whole (tokenizer(prompts, padding=True, return_tensors='pt') with padding_side='left')."
        )
    if mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)} but input_ids {tuple(input_ids.shape)}: "
                         "pass the mask the tokenizer returned with these ids.")
    if not bool(((mask == 0) | (mask == 1)).all()) or bool((mask[:, 1:] < mask[:, :-1]).any()):
        raise ValueError(
            "pacer= takes left-padded batches (each attention_mask row zeros, then ones); this mask has padding on "
            "the right or in the middle. Set tokenizer.padding_side = 'left' and tokenize again."
        )
    if not bool(mask[:, -1].all()):
        raise ValueError("A row of the batch is all padding (its attention_mask has no ones); drop that prompt.")


def _check_batch(model: PreTrainedModel, call: StrategyCall, loop: str, kwargs: dict, input_ids: torch.Tensor) -> None:
    """What batch > 1 refuses, before any work: strategies and settings the batched loop does not run."""
    size = input_ids.shape[0]
    if call.batch is None:
        raise TypeError(f"{call.name}: its config says supports_batch, but its builder gave no StrategyCall.batch.")
    if loop != "lean":
        raise ValueError(f"pacer_loop={loop!r} (transformers' assisted generation) supports batch size 1; got {size} "
                         "prompts. Leave pacer_loop at 'lean' for batches.")
    for member in (model, kwargs.get("assistant_model")):  # layers that cannot mask per-row slots
        if member is not None:
            batch_row_cache(member, None)
    for name in ("streamer", "synced_gpus", "output_attentions", "output_hidden_states"):
        if _generation_value(model, kwargs, name):
            raise ValueError(f"pacer_hf's batched loop does not support {name}; call generate once per prompt "
                             "for it.")
    config = kwargs.get("generation_config") or model.generation_config
    max_new = kwargs.get("max_new_tokens", config.max_new_tokens)
    max_length = input_ids.shape[1] + max_new if max_new is not None else kwargs.get("max_length", config.max_length)
    check_batch_memory(model, kwargs.get("assistant_model"), size, max_length)


def _input_ids(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The prompt ids of a `generate` call, however they were passed."""
    return args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))


def _batch_size(args: tuple, kwargs: dict) -> int:
    inputs = _input_ids(args, kwargs)
    return 1 if inputs is None else inputs.shape[0]


def _generation_value(model: PreTrainedModel, kwargs: dict, name: str):
    if name in kwargs:
        return kwargs[name]
    return getattr(kwargs.get("generation_config") or model.generation_config, name, None)


def _prompt_length(model: PreTrainedModel, args: tuple, kwargs: dict) -> int:
    inputs = _input_ids(args, kwargs)
    return 0 if inputs is None else inputs.shape[1]
