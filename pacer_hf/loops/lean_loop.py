"""pacer_hf's verification loop: per round, the candidates, one target forward, the accept step. Nothing else.

transformers' `_assisted_decoding` serves every model and input (encoder-decoders, multimodal and
padded inputs, attentions, synced GPUs) and pays for that every round: a model_kwargs copy, an
attention-mask concatenation, `prepare_inputs_for_generation`, per-round kwargs updates. pacer_hf
only runs batch-1, unpadded, decoder-only generation, where none of it changes a token: the target's
own cache length gives the positions, and only the tokens not yet in that cache need a forward.
Everything that decides tokens is done as transformers does it (logits processors per position,
the acceptance rule, EOS and length truncation, stopping criteria), so the output equals
`pacer_loop="transformers"` token for token and, under sampling, random draw for random draw.
`pacer_hf.enable` passes this function to `generate(custom_generate=...)`; transformers (5.21-5.24)
gives such a callable neither the draft nor the streamer, so they come bound with functools.partial,
together with the strategy's candidate-generator factory.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import Cache, PreTrainedModel, StaticCache
from transformers.generation import (
    BaseStreamer,
    GenerateDecoderOnlyOutput,
    GenerationConfig,
    LogitsProcessorList,
    StoppingCriteriaList,
)

from .._hf_compat import (
    CACHE_KWARG,
    CandidateGenerator,
    crop_cache,
    default_candidate_generator,
    eos_ids,
    eos_tensor,
    record_past,
    speculative_sampling,
)
from .padded_heads import fit_generator, widen

FALLBACK = "pass pacer_loop='transformers' to verify in transformers' own loop"
_KNOWN_KWARGS = {CACHE_KWARG, "use_cache", "logits_to_keep", "attention_mask", "position_ids"}
# what transformers passes empty when a call has nothing for it: a multimodal model's encoded images on a text prompt
_EMPTY_WHEN_UNUSED = {"mm_encoder_outputs"}
_STATIC_CACHES = ("static", "hybrid", "sliding_window")  # refused by _assisted_decoding too


def lean_assisted_decoding(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer: BaseStreamer | None = None,
    inputs_tensor: torch.Tensor | None = None,
    assistant_model: PreTrainedModel | None = None,
    candidate_generator: Callable[[GenerationConfig, LogitsProcessorList], CandidateGenerator] | None = None,
    **model_kwargs,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """A `custom_generate` decoding method: speculative decoding with `model` verifying `assistant_model`.

    `candidate_generator(generation_config, logits_processor)` builds this call's candidate generator
    (pacer_hf binds its strategy's factory here); without it, transformers' own choice for the model.
    """
    config = generation_config
    cache = _check(model, input_ids, config, synced_gpus, assistant_model or candidate_generator, model_kwargs)
    if candidate_generator is not None:
        generator = candidate_generator(config, logits_processor)
    else:
        generator = default_candidate_generator(
            model, config, input_ids, inputs_tensor, logits_processor, model_kwargs, assistant_model, None, None
        )
    generator = fit_generator(generator, model, assistant_model)  # a draft head narrower than the target's
    if generator.requires_model_outputs:
        raise ValueError(f"{type(generator).__name__} needs the target's hidden states; {FALLBACK}.")
    keep_scores = config.return_dict_in_generate and config.output_scores
    keep_logits = config.return_dict_in_generate and config.output_logits
    scores, raw_logits = (() if keep_scores else None), (() if keep_logits else None)
    eos_set = eos_ids(eos_tensor(config))
    forward_kwargs = {CACHE_KWARG: cache, "use_cache": True}
    record_past(cache)  # windowed / linear-attention layers must be able to roll back
    share = getattr(generator, "share_prompt_kv", None)  # a draft that is a copy of the target (shared_prompt.py)
    if share is not None and cache.get_seq_length() < input_ids.shape[1] - 1 and share(model, cache):
        prefill = {"logits_to_keep": 1} if "logits_to_keep" in model_kwargs else {}
        model(input_ids=input_ids[:, cache.get_seq_length() : -1], **forward_kwargs, **prefill)  # all but the last
    while True:
        cur_len = input_ids.shape[1]
        candidates, candidate_logits = generator.get_candidates(input_ids)
        candidates = candidates.to(model.device)
        if candidate_logits is not None:
            candidate_logits = candidate_logits.to(model.device)
        k = candidates.shape[1] - cur_len
        if "logits_to_keep" in model_kwargs:
            forward_kwargs["logits_to_keep"] = k + 1
        # The first round reads the prompt too (the cache is empty); later ones the last accepted token + k.
        logits = model(input_ids=candidates[:, cache.get_seq_length() :], **forward_kwargs).logits
        new_logits = logits[:, -k - 1 :].to(dtype=torch.float32, device=input_ids.device)  # as transformers
        raw = new_logits.clone() if keep_logits else None
        process_positions(logits_processor, candidates, new_logits[0])
        tokens = accept_step(config, candidates[:, cur_len:], candidate_logits, new_logits,
                             config.max_length - cur_len, eos_set)
        valid = torch.tensor([tokens], dtype=input_ids.dtype, device=input_ids.device)
        n = valid.shape[1] - 1
        input_ids = torch.cat((input_ids, valid), dim=-1)
        if streamer is not None:
            streamer.put(valid.cpu())
        # The cache keeps the accepted tokens; the bonus token is fed with the next round's candidates.
        crop_cache(cache, input_ids.shape[1] - 1)
        generator.update_candidate_strategy(input_ids, new_logits, n)
        if keep_scores:
            scores += tuple(new_logits[:, i, :] for i in range(n + 1))
        if keep_logits:
            raw_logits += tuple(raw[:, i, :] for i in range(n + 1))
        if stopping_criteria(input_ids, scores).any():
            break
    if streamer is not None:
        streamer.end()
    if config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(
            sequences=input_ids, scores=scores, logits=raw_logits, **{CACHE_KWARG: cache}
        )
    return input_ids


def process_positions(processors: LogitsProcessorList, ids: torch.LongTensor, logits: torch.Tensor) -> torch.Tensor:
    """Logits processors at each of the last `len(logits)` positions of `ids` (1, length), in place: the
    scores after `ids[:, :length - len(logits) + 1 + i]`, as transformers applies them one position at a time."""
    if len(processors) == 0:
        return logits
    for i in range(logits.shape[0]):
        logits[i : i + 1] = processors(ids[:, : ids.shape[1] - logits.shape[0] + 1 + i], logits[i : i + 1])
    return logits


def accept_step(config: GenerationConfig, drafted: torch.LongTensor, candidate_logits: torch.Tensor | None,
                new_logits: torch.Tensor, limit: int, eos_ids: set[int]) -> list[int]:
    """One sequence's verified tokens: the accepted drafted tokens plus the target's own next one, decided as
    `_assisted_decoding` decides them, at most `limit` of them and nothing past the first EOS.

    `drafted` (1, k) are the proposed tokens, `candidate_logits` (1, k, vocab) the q they were drawn from
    (None: greedy, or sampling without draft logits), `new_logits` (1, k + 1, vocab) the processed target logits.
    """
    k = drafted.shape[1]
    if config.do_sample and candidate_logits is not None and k > 0:
        # a draft head narrower than the target's (`padded_heads.py`): q = 0 on the rows it lacks, as it sampled
        candidate_logits = widen(candidate_logits, new_logits.shape[-1])
        valid, _ = speculative_sampling(drafted, candidate_logits, k, new_logits,
                                        assistant_ensemble_weight=config.assistant_ensemble_weight)
        tokens = valid[0].tolist()
    else:  # greedy, or sampling without draft logits: keep candidates while they equal the target's choice
        if config.do_sample:
            selected = torch.multinomial(new_logits.softmax(dim=-1)[0], num_samples=1).squeeze(1).tolist()
        else:
            selected = new_logits[0].argmax(dim=-1).tolist()
        n = 0
        for proposed, chosen in zip(drafted[0].tolist(), selected):
            if proposed != chosen:
                break
            n += 1
        tokens = selected[: n + 1]
    tokens = tokens[:limit]  # as transformers: never past max_length ...
    for i, token in enumerate(tokens):  # ... nor past the first EOS
        if token in eos_ids:
            return tokens[: i + 1]
    return tokens


def unsupported_model_kwargs(model_kwargs: dict) -> list[str]:
    """The model kwargs pacer_hf's loops do not feed the target (e.g. `token_type_ids`, encoded images): a loop that
    went on would drop them and decode another text, so both loops refuse them."""
    return sorted(key for key, value in model_kwargs.items()
                  if key not in _KNOWN_KWARGS and not (key in _EMPTY_WHEN_UNUSED and not value))


def _check(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    config: GenerationConfig,
    synced_gpus: bool,
    proposer: object | None,
    model_kwargs: dict,
) -> Cache:
    """Refuse, before any forward, what this loop does not implement; returns the target's cache."""
    if proposer is None:
        raise ValueError(
            "lean_assisted_decoding needs the draft or a candidate generator: bind one with "
            "functools.partial(lean_assisted_decoding, assistant_model=draft)."
        )
    unknown = unsupported_model_kwargs(model_kwargs)
    for name, unsupported in (
        ("synced_gpus", synced_gpus),
        ("output_attentions", config.output_attentions),
        ("output_hidden_states", config.output_hidden_states),
        ("an encoder-decoder model", model.config.is_encoder_decoder),
        (
            "assistant_ensemble_weight with greedy decoding",
            config.assistant_ensemble_weight is not None and not config.do_sample,
        ),
        (f"model kwargs {unknown}", unknown),
    ):
        if unsupported:
            raise ValueError(f"pacer_hf's lean verification loop does not support {name}; {FALLBACK}.")
    # Batch size 1 and unpadded prompts are refused for every loop before generate runs
    # (generate_checks._check_inputs), so the loop needs no mask and checks only what it alone assumes.
    positions = model_kwargs.get("position_ids")
    default_positions = positions is None or torch.equal(
        positions[0], torch.arange(positions.shape[-1]).to(positions)
    )
    if not default_positions:  # the loop lets the model count positions from its cache
        raise ValueError(
            f"pacer_hf's lean verification loop does not support custom position_ids; {FALLBACK}."
        )
    cache = model_kwargs.get(CACHE_KWARG)
    if not model_kwargs.get("use_cache") or cache is None:
        raise ValueError("assisted generate requires `use_cache=True`")
    if isinstance(cache, StaticCache) or config.cache_implementation in _STATIC_CACHES:
        raise ValueError("assisted generate is not supported with Static cache classes")
    if cache.get_seq_length() >= input_ids.shape[1]:
        raise ValueError(
            f"{CACHE_KWARG} already holds the whole prompt; pass a cache of at most the prompt minus "
            "its last token."
        )
    return cache
