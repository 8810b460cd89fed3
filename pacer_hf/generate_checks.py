"""The argument checks of `generate(pacer=...)`: what pacer_hf refuses, each with its fix, before any work.

`pacer_hf.generation` resolves `pacer=` and runs these (all names stay importable from there); they read the call's
args and kwargs the way transformers' `generate` takes them, falling back to the generation config.
"""

from __future__ import annotations

import weakref

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ._hf_compat import batch_row_cache, check_cache_support
from .loops.batch_cache import check_batch_memory
from .modeling_pacer import PacerPreVerifier
from .strategies import StrategyCall


def check_vocabularies(target: PreTrainedModel, draft: PreTrainedModel, fix: str, *,
                       tokenizer: PreTrainedTokenizerBase | None = None,
                       draft_tokenizer: PreTrainedTokenizerBase | None = None) -> None:
    """Refuse a draft whose token ids do not mean what the target's do.

    Heads of one width pass as before. A draft head narrower than the target's passes when the rows past it are
    padding: the tokenizers, when given, must map the same ids and fit in the draft's rows; without them the
    configs must not contradict that (their BOS/EOS ids agree and lie inside the draft's rows). Acceptance never
    touches exactness (the target verifies every token, `loops/padded_heads.py`), only whether drafting can pay.
    A draft head wider than the target's is refused: it could propose ids the target has no row for.
    """
    target_rows = target.get_output_embeddings().out_features
    draft_head = draft.get_output_embeddings()
    draft_rows = None if draft_head is None else draft_head.out_features
    differ = f"Draft and target vocabularies differ (draft lm_head has {draft_rows} rows, target {target_rows})"
    if draft_rows is None or draft_rows > target_rows:
        reason = ("the draft has no output head" if draft_rows is None else "a draft head wider than the target's "
                  "could propose ids the target has no row for (padding rows are accepted only on the target's side)")
        raise ValueError(f"{differ}: {reason}. {fix}")
    if tokenizer is not None or draft_tokenizer is not None:
        _check_tokenizer_ids(tokenizer, draft_tokenizer, draft_rows, differ, fix)
    elif draft_rows < target_rows:
        _check_special_ids(target, draft, draft_rows, differ, fix)


def _check_tokenizer_ids(tokenizer, draft_tokenizer, rows: int, differ: str, fix: str) -> None:
    """The tokenizers map the same ids, and every one of them has a row in both heads."""
    for name, given in (("tokenizer", tokenizer), ("assistant_tokenizer", draft_tokenizer)):
        if given is not None and len(given) > rows:
            raise ValueError(f"{differ}: {name} has {len(given)} tokens, more than the {rows} rows of the narrower "
                             f"head, so some of its ids have no row there. {fix}")
    if tokenizer is not None and draft_tokenizer is not None and tokenizer is not draft_tokenizer:
        if _vocabulary(tokenizer) != _vocabulary(draft_tokenizer):
            raise ValueError(f"{differ}: tokenizer and assistant_tokenizer map tokens to different ids. {fix}")


_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> its vocabulary, once a call


def _vocabulary(tokenizer) -> dict:
    """`tokenizer.get_vocab()`, cached per tokenizer (150k entries for Qwen: tens of ms, not to pay every call)."""
    try:
        cached = _VOCABULARIES.get(tokenizer)
    except TypeError:  # not weak-referenceable
        return tokenizer.get_vocab()
    if cached is None or cached[0] != len(tokenizer):  # added tokens change the length
        cached = _VOCABULARIES[tokenizer] = (len(tokenizer), tokenizer.get_vocab())
    return cached[1]


def _special_ids(model: PreTrainedModel, name: str) -> set[int]:
    """`name` ("bos_token_id", "eos_token_id") from the model's config and generation config, as a set."""
    ids: set[int] = set()
    for config in (model.config.get_text_config(), getattr(model, "generation_config", None)):
        value = getattr(config, name, None)
        for token in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(token, int):
                ids.add(token)
    return ids


def _check_special_ids(target: PreTrainedModel, draft: PreTrainedModel, rows: int, differ: str, fix: str) -> None:
    """Without tokenizers: the configs' BOS and EOS ids must not say the vocabularies differ."""
    hint = ("If they do share one tokenizer, pass it to generate as tokenizer= and assistant_tokenizer= so pacer_hf "
            "can compare them.")
    for name in ("bos_token_id", "eos_token_id"):
        target_ids, draft_ids = _special_ids(target, name), _special_ids(draft, name)
        if target_ids and draft_ids and not target_ids & draft_ids:
            raise ValueError(f"{differ}, and their configs name different special tokens ({name} {sorted(draft_ids)} "
                             f"in the draft, {sorted(target_ids)} in the target). {fix} {hint}")
        outside = sorted(t for t in target_ids | draft_ids if t >= rows)
        if outside:
            raise ValueError(f"{differ}, and {name} {outside} has no row in the draft's head: the rows past "
                             f"{rows} are not padding. {fix} {hint}")


def _check_trim(preverifier: PacerPreVerifier, do_sample: bool) -> None:
    if preverifier.config.trim_failed_block and do_sample:
        raise ValueError(
            "The pre-verifier has trim_failed_block=True, which is exact only for greedy decoding; "
            "set do_sample=False or use a pre-verifier config with trim_failed_block=False."
        )


def _check_tokenizers(kwargs: dict) -> None:
    """tokenizer= and assistant_tokenizer= are read to compare the pair's vocabularies (`_check_pair`)."""
    for name in ("tokenizer", "assistant_tokenizer"):
        given = kwargs.get(name)
        if given is not None and not (hasattr(given, "get_vocab") and hasattr(given, "__len__")):
            raise TypeError(f"{name}= must be a transformers tokenizer (with get_vocab() and len()); got "
                            f"{type(given).__name__}.")


def _check_pair(model: PreTrainedModel, draft: PreTrainedModel, kwargs: dict | None = None) -> None:
    """The pair fits together (`check_vocabularies`, with the call's tokenizers when it has them).

    transformers' own assisted mode (pacer_loop="transformers") refuses an assistant_tokenizer for models of one
    config.vocab_size, so once compared here it is not passed on for such a pair."""
    kwargs = {} if kwargs is None else kwargs
    check_vocabularies(model, draft, "assistant_model must share the target's tokenizer and vocabulary for pacer=.",
                       tokenizer=kwargs.get("tokenizer"), draft_tokenizer=kwargs.get("assistant_tokenizer"))
    if _config_vocab(model) == _config_vocab(draft):
        kwargs.pop("assistant_tokenizer", None)
    if model.config.is_encoder_decoder or draft.config.is_encoder_decoder:
        raise ValueError("pacer= supports decoder-only models; use plain assisted generation for encoder-decoders.")
    check_cache_support(draft, "draft (assistant_model)")


def _config_vocab(model: PreTrainedModel) -> int | None:
    return getattr(model.config.get_text_config(), "vocab_size", None)


def _check_transformers_loop(model: PreTrainedModel, kwargs: dict) -> None:
    """pacer_loop="transformers" hands the draft to transformers' generate, which refuses a draft of another
    config.vocab_size (a padded head, `check_vocabularies`) unless it also gets both tokenizers: say so first."""
    draft = kwargs.get("assistant_model")
    if draft is None or _config_vocab(model) == _config_vocab(draft):
        return
    if kwargs.get("tokenizer") is None or kwargs.get("assistant_tokenizer") is None:
        raise ValueError(
            f"pacer_loop='transformers' hands assistant_model to transformers' generate, which refuses a draft whose "
            f"config.vocab_size ({_config_vocab(draft)}) differs from the target's ({_config_vocab(model)}) unless "
            "it also gets tokenizer= and assistant_tokenizer=: pass both (the same tokenizer twice when the pair "
            "shares one), or leave pacer_loop at 'lean' (the default), which needs neither."
        )


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
