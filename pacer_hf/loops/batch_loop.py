"""Batched speculative decoding: B left-padded prompts, each row with its own rounds.

transformers' assisted generation refuses batch > 1: after a round every row has accepted a different
number of tokens, so the rows' caches, positions and masks no longer line up. Here every cache slot
carries the position of the row token it holds, or -1 (`batch_cache.RowCache`): a row rolls back by
masking its rejected slots, positions are explicit per row. One target forward per round verifies every
row; rows that end (EOS, length limit, stopping criteria) leave both caches, so they stop costing work.
The draft runs the rows in lockstep; Pacer stops them together (`stop_rule.batch_continues`: a padded verify
slot is paid whether a row fills it or not) or, with `pacer_batch_stop="row"`, each by its own decision.

Every token is decided per row exactly as the batch-1 loop (`lean_loop.py`) decides it: logits
processors over the row's own ids (its left padding included, as in batched `generate`), greedy
acceptance against the target's argmax, transformers' speculative sampling per row. Greedy output
therefore equals the target's own batched `generate`, row for row; sampling keeps its distribution.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessorList,
    PreTrainedModel,
    StoppingCriteriaList,
)
from transformers.generation import GenerateDecoderOnlyOutput

from .._hf_compat import CACHE_KWARG, eos_ids, eos_tensor, pad_token_id
from ..costs import BatchClock, timed
from ..modeling_pacer import PacerPreVerifier
from ..stats import PacerStats
from .batch_cache import RowCache, draft_row_cache
from .lean_loop import accept_step, process_positions, unsupported_model_kwargs
from .padded_heads import fit_row_cache
from .stop_rule import BatchStopRule, next_round_loop

BATCH_CACHES = ("mask", "compact")  # pacer_batch_cache=: mask rejected slots, or also realign rows every round
BATCH_STOPS = ("batch", "row")  # pacer_batch_stop=: the rows stop together (measured faster), or each by its own


@dataclass
class BatchPlan:
    """What a strategy hands the batch loop: the draft, its stop rule and the call's stats."""

    draft: PreTrainedModel
    max_draft_tokens: int
    stats: PacerStats
    preverifier: PacerPreVerifier | None = None
    cache_mode: str = "mask"
    phrases: Any = None  # Ouroboros' BatchPhrases: extends each row's draft with pool tokens
    draft_forward: str = "auto"  # pacer_draft_forward=: "lean" when the draft qualifies, or its own forward
    stop_mode: str = "batch"  # pacer_batch_stop=: one batch-wide Pacer stop (batch_continues), or one per row


@dataclass
class _Row:
    """One prompt's state: its left-padded prompt ids plus the tokens generated so far."""

    index: int
    ids: list[int]  # padded prompt + generated
    pad: int  # left padding of the prompt
    stats: PacerStats
    generated: int = 0
    scores: list[torch.Tensor] = field(default_factory=list)
    raw: list[torch.Tensor] = field(default_factory=list)
    loop: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # `loop_features` after its last round

    @property
    def length(self) -> int:
        """Real tokens (no padding): also the position of the next token."""
        return len(self.ids) - self.pad


# Logits processors that decide from one row's ids alone; batched `generate` may give them per-row state
# (repetition penalty: each row's padding length), which `_row_processors` slices per row.
ROW_PROCESSORS = {
    "TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper", "TypicalLogitsWarper",
    "EpsilonLogitsWarper", "EtaLogitsWarper", "TopHLogitsWarper", "MinLengthLogitsProcessor",
    "MinNewTokensLengthLogitsProcessor", "RepetitionPenaltyLogitsProcessor", "NoRepeatNGramLogitsProcessor",
    "NoBadWordsLogitsProcessor", "SequenceBiasLogitsProcessor", "SuppressTokensLogitsProcessor",
    "SuppressTokensAtBeginLogitsProcessor", "ForcedBOSTokenLogitsProcessor", "ForcedEOSTokenLogitsProcessor",
    "InfNanRemoveLogitsProcessor", "ExponentialDecayLengthPenalty", "LogitNormalization",
}


def _row_processors(processors: LogitsProcessorList, batch: int) -> list[LogitsProcessorList]:
    """One processor list per row; refuses, before any forward, processors not known to work row by row."""
    rows = [LogitsProcessorList() for _ in range(batch)]
    for processor in processors:
        name = type(processor).__name__
        if name not in ROW_PROCESSORS:
            raise ValueError(
                f"pacer_hf's batched loop applies logits processors one row at a time and does not know {name}; "
                "call generate once per prompt with it, or leave it out."
            )
        for b, row in enumerate(rows):
            state = getattr(processor, "prompt_ignore_length", None)
            if isinstance(state, torch.Tensor):  # repetition penalty's per-row padding lengths
                processor_b = copy.copy(processor)
                processor_b.prompt_ignore_length = state[b : b + 1]
                row.append(processor_b)
            else:
                row.append(processor)
    return rows


def _draft_round(plan: BatchPlan, draft_cache: RowCache, rows: list[_Row], budgets: list[int],
                 processors: list[LogitsProcessorList], config: GenerationConfig, eos_ids: set[int],
                 stopper: BatchStopRule | None, clock: BatchClock):
    """Every row drafts up to its budget in lockstep; a row that stops feeds masked filler until all stop.

    Returns per row the drafted tokens and, under sampling, their processed logits (the q of each token)."""
    device = plan.draft.device
    drafted: list[list[int]] = [[] for _ in rows]
    qs: list[list[torch.Tensor]] = [[] for _ in rows]
    drafting = [budget > 0 for budget in budgets]
    if not any(drafting):  # the draft catches up next round
        return drafted, qs
    held = draft_cache.held()
    tokens, positions, last = draft_cache.lay_out([row.ids[row.pad + h:] for row, h in zip(rows, held)], held, device)
    logits, hidden = draft_cache.forward(tokens, positions, 1, hidden=True, last=last)
    if stopper is not None:
        stopper.start([row.loop for row in rows])
    forwards = 1
    while any(drafting):
        raw = logits[:, -1].float() if config.do_sample else logits[:, -1]
        chosen = torch.zeros(len(rows), dtype=torch.long)
        for b, row in enumerate(rows):
            if not drafting[b]:
                continue
            scores = raw[b : b + 1]
            if len(processors[row.index]) > 0:
                ids = torch.tensor([row.ids + drafted[b]], device=device)
                scores = process_positions(processors[row.index], ids, scores.clone())
            if config.do_sample:
                chosen[b] = torch.multinomial(torch.softmax(scores, dim=-1), 1)[0, 0]
                qs[b].append(scores)
            else:
                chosen[b] = scores.argmax(dim=-1)[0]
            drafted[b].append(int(chosen[b]))
        decisions = stopper.add(hidden, raw, chosen.to(raw.device), drafted, drafting) if stopper is not None else None
        for b in range(len(rows)):
            if not drafting[b]:
                continue
            if decisions is not None and decisions[b][0]:
                drafting[b] = False
                del drafted[b][len(drafted[b]) - decisions[b][1]:]  # a trim (greedy only: qs is empty)
            elif len(drafted[b]) >= budgets[b] or drafted[b][-1] in eos_ids:
                drafting[b] = False
        if not any(drafting):
            break
        step_positions = [rows[b].length + len(drafted[b]) - 1 if drafting[b] else -1 for b in range(len(rows))]
        positions = torch.tensor(step_positions, device=device)[:, None]
        seconds, (logits, hidden) = timed(partial(draft_cache.forward, chosen[:, None].to(device), positions, 1,
                                                  hidden=True), device)
        clock.draft_step = clock.average(clock.draft_step, seconds)
        forwards += 1
    plan.stats.draft_forwards += forwards
    # a trimmed block was fed to the draft but is not proposed: drop it (pool tokens may take its positions)
    draft_cache.keep([row.length + len(tokens) for row, tokens in zip(rows, drafted)])
    return drafted, qs


@torch.no_grad()
def batched_assisted_decoding(
    model: PreTrainedModel,
    input_ids: torch.LongTensor,
    logits_processor: LogitsProcessorList,
    stopping_criteria: StoppingCriteriaList,
    generation_config: GenerationConfig,
    synced_gpus: bool = False,
    streamer=None,
    inputs_tensor: torch.Tensor | None = None,
    plan: BatchPlan | None = None,
    **model_kwargs,
) -> GenerateDecoderOnlyOutput | torch.LongTensor:
    """A `custom_generate` decoding method for B left-padded prompts (`pacer_hf.enable` binds `plan`)."""
    if unknown := unsupported_model_kwargs(model_kwargs):
        raise ValueError(f"pacer_hf's batched loop does not support model kwargs {unknown}; call generate once per "
                         "prompt with pacer_loop='transformers' for them.")
    config = generation_config
    device = input_ids.device
    stats = plan.stats
    mask = model_kwargs.get("attention_mask")  # generate drops a mask of all ones
    pads = [0] * input_ids.shape[0] if mask is None else (mask == 0).sum(1).tolist()
    target_cache = RowCache.for_model(model, model_kwargs[CACHE_KWARG], len(pads), device)
    eos_set = eos_ids(eos_tensor(config))
    pad_id = pad_token_id(config)
    max_new = config.max_length - input_ids.shape[1]
    rows = [_Row(b, input_ids[b].tolist(), pads[b], type(stats)(strategy=stats.strategy)) for b in range(len(pads))]
    keep_scores = config.return_dict_in_generate and config.output_scores
    keep_logits = config.return_dict_in_generate and config.output_logits
    clock = BatchClock()
    stopper = (BatchStopRule(plan.preverifier, stats, plan.stop_mode, clock, plan.draft.device)
               if plan.preverifier is not None else None)
    processors = _row_processors(logits_processor, len(rows))
    # after every refusal above: choosing the lean draft forward runs the draft once to check it
    draft_cache = draft_row_cache(plan.draft, plan.draft_forward, stats, len(pads), config.max_length)
    draft_cache = fit_row_cache(draft_cache, model, plan.draft)  # a draft head narrower than the target's
    settle = _Settle(plan, config, stats, max_new, eos_set, stopping_criteria, keep_scores, keep_logits)
    active = list(rows)
    while active:
        budgets = [min(plan.max_draft_tokens, max_new - row.generated - 1) for row in active]
        drafted, qs = _draft_round(plan, draft_cache, active, budgets, processors, config, eos_set, stopper, clock)
        from_draft = [len(tokens) for tokens in drafted]
        if plan.phrases is not None:
            _extend(plan.phrases, active, drafted, qs, max_new, eos_set, config, model)
        held = target_cache.held()
        # right-aligned (but for windowed models), so the first round's block is the left-padded prompt plus drafts
        blocks = [row.ids[row.pad + h:] + d for row, h, d in zip(active, held, drafted)]
        tokens, positions, last = target_cache.lay_out(blocks, held, device)
        width = max(len(d) for d in drafted) + 1
        seconds, logits = timed(partial(target_cache.forward, tokens, positions, width, last=last), device)
        logits = logits.to(torch.float32)
        if stats.target_forwards > 0:  # the first round also reads the prompts
            clock.verify(len(active) * width, seconds)
        stats.target_forwards += 1
        finished = [b for b, row in enumerate(active)
                    if _settle(row, drafted[b], from_draft[b], qs[b], logits[b, width - len(drafted[b]) - 1:],
                               processors[row.index], settle)]
        kept = [b for b in range(len(active)) if b not in finished]
        active = [active[b] for b in kept]
        for cache in (target_cache, draft_cache) if active else ():
            if finished:  # ended rows leave: they stop costing target and draft work
                cache.select(kept)
            cache.keep([row.length - 1 for row in active])  # the bonus token is fed with the next round
            cache.compact(always=plan.cache_mode == "compact")
    return _output(rows, config, pad_id, stats, keep_scores, keep_logits, device, target_cache.cache)


@dataclass(frozen=True)
class _Settle:
    """What settling a row's round reads that is the same for every row and round of one `generate` call."""

    plan: BatchPlan
    config: GenerationConfig
    stats: PacerStats  # the call's stats (each row also keeps its own)
    max_new: int
    eos_ids: set[int]
    stopping_criteria: StoppingCriteriaList
    keep_scores: bool  # return_dict_in_generate with output_scores
    keep_logits: bool  # return_dict_in_generate with output_logits


def _settle(row: _Row, drafted: list[int], from_draft: int, qs: list | None, logits: torch.Tensor,
            processors: LogitsProcessorList, call: _Settle) -> bool:
    """Verify one row's block against its target logits (`logits`: the last k + 1 positions), append what it
    accepts, record the round; True when the row has ended (EOS, max_new_tokens, a stopping criterion)."""
    k = len(drafted)
    new_logits = logits.clone()
    raw = new_logits.clone() if call.keep_logits else None
    device = new_logits.device
    ids = torch.tensor([row.ids + drafted], device=device)
    process_positions(processors, ids, new_logits)
    q = torch.cat([q.to(device) for q in qs])[None] if qs else None  # None: greedy, or target-only acceptance
    valid = accept_step(call.config, ids[:, len(row.ids):], q, new_logits[None], call.max_new - row.generated,
                        call.eos_ids)
    n = len(valid) - 1
    row.ids += valid
    row.generated += len(valid)
    for record in (row.stats, call.stats):
        record.draft_lengths.append(k)
        record.accepted.append(n)
    plan = call.plan
    if plan.preverifier is not None and getattr(plan.preverifier.config, "loop_features", False):
        row.loop = next_round_loop(plan.preverifier, n, k, new_logits[n])
    if plan.phrases is not None:
        plan.phrases.commit(row.index, row.ids[row.pad:], from_draft, k - from_draft, n, row.stats)
    if call.keep_scores:
        row.scores += [new_logits[i] for i in range(n + 1)]
    if call.keep_logits:
        row.raw += [raw[i] for i in range(n + 1)]
    ids = torch.tensor([row.ids], device=device)
    return valid[-1] in call.eos_ids or row.generated >= call.max_new or bool(call.stopping_criteria(ids, None).any())


def _extend(phrases, rows: list[_Row], drafted: list[list[int]], qs: list, max_new: int, eos_ids: set[int],
            config: GenerationConfig, model: PreTrainedModel) -> None:
    """Append each row's pool phrase to its draft. Under sampling a pool token is a deterministic proposal,
    a one-hot q (or, with sampling_pool_q="none", the row falls back to target-only acceptance: q None)."""
    for b, row in enumerate(rows):
        room = max_new - row.generated - 1 - len(drafted[b])
        phrase = phrases.extend(row.index, row.ids[row.pad:], drafted[b], room, eos_ids, row.stats)
        if not phrase:
            continue
        drafted[b] += phrase
        if not config.do_sample:
            continue
        if phrases.config.sampling_pool_q == "none":
            qs[b] = None
        elif qs[b] is not None:
            vocab = model.get_output_embeddings().out_features
            for token in phrase:
                one_hot = torch.full((1, vocab), float("-inf"))
                one_hot[0, token] = 0.0
                qs[b].append(one_hot)


def _output(rows: list[_Row], config: GenerationConfig, pad_id: int, stats: PacerStats, keep_scores: bool,
            keep_logits: bool, device, cache):
    """Rows padded with `pad_token_id` after they end, as batched `generate` returns them."""
    steps = max(row.generated for row in rows)
    sequences = torch.full((len(rows), len(rows[0].ids) - rows[0].generated + steps), pad_id, dtype=torch.long)
    for row in rows:
        sequences[row.index, : len(row.ids)] = torch.tensor(row.ids)
        row.stats.new_tokens = row.generated
        row.stats.target_forwards = len(row.stats.accepted)
    stats.rows = [row.stats for row in rows]
    stats.new_tokens = sum(row.generated for row in rows)
    sequences = sequences.to(device)
    if not config.return_dict_in_generate:
        return sequences
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=_per_step(rows, steps, pad_id, "scores") if keep_scores else None,
        logits=_per_step(rows, steps, pad_id, "raw") if keep_logits else None,
        **{CACHE_KWARG: cache},
    )


def _per_step(rows: list[_Row], steps: int, pad_id: int, name: str) -> tuple[torch.Tensor, ...]:
    """(B, vocab) per step; a row that has ended puts all its mass on `pad_token_id` (what it emits)."""
    vocab = getattr(rows[0], name)[0].shape[-1]
    ended = torch.full((vocab,), float("-inf"))
    ended[pad_id] = 0.0
    out = []
    for step in range(steps):
        out.append(torch.stack([getattr(row, name)[step] if step < row.generated else ended.to(getattr(row, name)[0])
                                for row in rows]))
    return tuple(out)
