"""Traces along the target's own answers, round by round, with the loop's state (`collect_along_answers`).

Used by `pacer-hf build-demo-pair --stage preverifier`; the rows have the layout `collect.py` writes plus a
`loop_features` column, so `pacer-hf train` and `calibrate` read them as any traces folder.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import datasets
import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from .._hf_compat import CACHE_KWARG
from ..loading import model_name
from ..loops.shared_prompt import is_copy_of, target_prompt_cache
from ..modeling_pacer import draft_features, draft_signature, loop_features
from .collect import _draft_ids, draft_rollout
from .traces import (
    FORMAT_VERSION,
    CollectConfig,
    _digest,
    _features,
    _finish,
    _open_shards,
    _save_shard,
    _shard_done,
)


def collect_along_answers(
    draft: PreTrainedModel,
    records: list[dict],
    output_dir: str | Path,
    *,
    max_draft_tokens: int = 12,
    context: int = 256,
    batch_size: int = 32,
    records_per_shard: int = 64,
    source: str = "in-memory",
    draft_name: str | None = None,
    target_name: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    teacher_forced: bool = False,
    temperature: float = 0.0,
    seed: int = 0,
    target: PreTrainedModel | None = None,
) -> Path:
    """Greedy traces along the target's own greedy answers, round by round, with the loop's state (resumable).

    `records`: the target's answers as `pacer-hf build-draft` / `build-demo-pair` write them (`prompt`, `response` token
    ids, `top_logp`: the target's sorted top log-probabilities at every answer step). Each answer is decoded the way
    fixed-length speculative decoding would run it: a round at position p drafts `max_draft_tokens` tokens, accepts the
    leading ones that equal the answer's (on the target's greedy path that is exactly greedy verification, so no target
    forward is needed), and the next round starts after the target's own token. Every round is one row with
    `loop_features`: the previous round's accepted count and whether that was all `max_draft_tokens`, and the target's
    probability of the token before p (`modeling_pacer.loop_features`). Positions past an answer's end are unknown
    (-100). The manifest records `loop_features: true`, so `pacer-hf train` builds a pre-verifier that reads them.

    `teacher_forced=True` reads every round from one draft forward over each answer (about 100x less draft work):
    along the target's greedy path the draft's tokens up to and including its first miss are its argmax given the
    answer, so rows agree with the rollout wherever a label is defined; after the first miss they hold the
    teacher-forced tokens (masked in the labels) and `labels_unmasked` is -100 there.

    `temperature=1.0` (teacher-forced only): sampling traces along the target's T = 1 answers (`_sampled_rows`).
    `target` (teacher-forced): a copy of it (`is_copy_of`) reads answers from the target's prompt states, as served.
    """
    records = [r for r in records if r["response"]]
    if not records:
        raise ValueError("collect_along_answers() got no answers with tokens.")
    if temperature not in (0.0, 1.0) or (temperature and not teacher_forced):
        raise ValueError(f"temperature={temperature}: sampling traces along answers need temperature=1.0 (the "
                         "answers record the target's T = 1 log-probabilities) and teacher_forced=True.")
    reader = _prompt_reader(draft, target, teacher_forced)
    config = CollectConfig(max_draft_tokens=max_draft_tokens, context=context, batch_size=batch_size,
                           shard_size=records_per_shard, positions_per_text=1, min_prefix=1, temperature=temperature,
                           seed=seed)
    out = Path(output_dir)
    hidden_size = int(draft.get_output_embeddings().in_features)
    run = {
        "format_version": FORMAT_VERSION, "config": asdict(config), "source": source, "loop_features": True,
        "tokens_sha256": _digest([r["prompt"] + r["response"] for r in records]),
        "draft_model": model_name(draft, draft_name), "target_model": target_name or "the answers' target",
        "draft_signature": draft_signature(draft.config), "draft_hidden_size": hidden_size,
        "prompt_states": "draft" if reader is None else "target",
    }
    shards = [list(range(i, min(i + records_per_shard, len(records)))) for i in range(0, len(records), records_per_shard)]
    manifest, shard_dir, done = _open_shards(out, run, overwrite, len(shards), label_kind=config.label_kind,
                                             num_texts=len(records), num_units=len(records))
    features = _features(max_draft_tokens, hidden_size)
    features["loop_features"] = datasets.Sequence(datasets.Value("float32"), length=3)
    bar = tqdm(total=len(records), initial=sum(len(shards[k]) for k in done), unit="answer", desc="collect answers",
               disable=not progress, dynamic_ncols=True)
    try:
        for k, members in enumerate(shards):
            if k in done:
                continue
            if temperature:
                rows = _sampled_rows(draft, records, members, features, max_draft_tokens, context, bar, seed, reader)
            elif teacher_forced:
                rows = _teacher_forced_rows(draft, records, members, features, max_draft_tokens, context, bar, reader)
            else:
                rows = _shard_rows(draft, records, members, features, max_draft_tokens, context, batch_size, bar)
            _save_shard(rows, features, shard_dir, k)
            _shard_done(out, manifest, done, k)
    finally:
        bar.close()
    _finish(out, manifest)
    return out


def _prompt_reader(draft: PreTrainedModel, target: PreTrainedModel | None, teacher_forced: bool
                   ) -> PreTrainedModel | None:
    """The model whose prompt states the draft reads answers from: the target for a copy of it, else None (its own)."""
    if target is not None and not teacher_forced:
        raise ValueError("collect_along_answers(target=...) reads the prompt from the target's states in one forward "
                         "per answer: pass teacher_forced=True, or leave target=None.")
    return target if target is not None and is_copy_of(draft, target) else None


def _shard_rows(draft: PreTrainedModel, records: list[dict], members: list[int], features, max_draft_tokens: int,
                context: int, batch_size: int, bar) -> dict[str, list]:
    """The rows of one shard: every round along each of its answers, drafted `batch_size` rounds at a time."""
    rows: dict[str, list] = {name: [] for name in features}
    # one chain per answer: (record index, next round's position in prompt + response, loop state)
    chains = [(i, len(records[i]["prompt"]), [0.0, 0.0, 0.0]) for i in members]
    while chains:
        batch, chains = chains[:batch_size], chains[batch_size:]
        fulls = [records[i]["prompt"] + records[i]["response"] for i, _, _ in batch]
        prefixes = [full[max(0, p - context):p] for full, (_, p, _) in zip(fulls, batch)]
        _, _, tokens, hidden, logits = draft_rollout(draft, prefixes, max_draft_tokens)
        feats = draft_features(logits, tokens).cpu().numpy().astype(np.float32)
        hidden = hidden.to(torch.float16).cpu().numpy()
        tokens = tokens.cpu().numpy()
        for b, ((i, p, loop), full) in enumerate(zip(batch, fulls)):
            record = records[i]
            labels, unmasked, accepted = _round_labels(tokens[b], full, p, max_draft_tokens)
            _add_round(rows, record, i, p, tokens[b], hidden[b], feats[b], labels, unmasked, loop)
            following = _next_loop(record, p + accepted + 1, accepted, max_draft_tokens)
            if following is not None:
                chains.append((i, p + accepted + 1, following))
            else:
                bar.update(1)
    return rows


def _answer_forward(draft: PreTrainedModel, record: dict, context: int, target: PreTrainedModel | None = None
                    ) -> tuple[list[int], int, int, torch.Tensor, torch.Tensor]:
    """(prompt + response, response start, first position kept, hidden, logits) of one draft forward over the
    answer and at most `context` prompt tokens before it, or over the answer from the target's states for the
    prompt but its last token when `target` is given: row t is the lm_head input predicting full[cut + t + 1]."""
    full, start = record["prompt"] + record["response"], len(record["prompt"])
    shared = None if target is None else target_prompt_cache(target, draft, torch.tensor([full[: start - 1]]))
    cut = start - 1 if shared is not None else max(0, start - context)
    ids = _draft_ids(draft, torch.tensor([full[cut:-1]], device=draft.device))  # padding rows past the draft's head
    reads = {CACHE_KWARG: shared, "use_cache": True} if shared is not None else {}
    hidden = draft.model(input_ids=ids, **reads).last_hidden_state[0]
    return full, start, cut, hidden, draft.get_output_embeddings()(hidden)


@torch.no_grad()
def _teacher_forced_rows(draft: PreTrainedModel, records: list[dict], members: list[int], features,
                         max_draft_tokens: int, context: int, bar, target=None) -> dict[str, list]:
    """`_shard_rows` from one forward per answer (see `collect_along_answers(teacher_forced=True)`)."""
    rows: dict[str, list] = {name: [] for name in features}
    steps = max_draft_tokens
    for i in members:
        record = records[i]
        full, start, cut, hidden, logits = _answer_forward(draft, record, context, target)
        argmax = logits.argmax(-1)
        feats = draft_features(logits, argmax).float().cpu().numpy()
        hidden, argmax = hidden.to(torch.float16).cpu().numpy(), argmax.cpu().numpy()
        p, loop = start, [0.0, 0.0, 0.0]
        while p < len(full):
            span = np.arange(p - 1 - cut, min(p - 1 - cut + steps, len(full) - 1 - cut))  # rows predicting p, p + 1, ...
            tokens = np.zeros(steps, dtype=np.int64)
            tokens[: len(span)] = argmax[span]
            labels, _, accepted = _round_labels(tokens, full, p, steps)
            unmasked = labels.copy()  # after the first miss the rollout's own tokens are unknown here
            _add_round(rows, record, i, p, tokens, _padded(hidden[span], steps), _padded(feats[span], steps), labels,
                       unmasked, loop)
            p, loop = p + accepted + 1, _next_loop(record, p + accepted + 1, accepted, steps)
        bar.update(1)
    return rows


@torch.no_grad()
def _sampled_rows(draft: PreTrainedModel, records: list[dict], members: list[int], features, steps: int,
                  context: int, bar, seed: int, target=None) -> dict[str, list]:
    """The T = 1 rows of `collect_along_answers(temperature=1.0)`: at every drafted position the draft samples its
    token from its own distribution given the answer so far and the label is that token's acceptance probability
    min(1, p/q), p read from the answer's recorded top log-probabilities (a token outside them counts as
    rejected). The answer is a sample of the target, which is what an accepted prefix is, so the contexts are the
    ones sampled rounds meet; the round's accepted count, which sets where the next one starts, is drawn from those
    probabilities (`seed`). The drafted tokens before position j are the answer's own, where a rollout would
    condition on its earlier samples: an approximation wherever those differ."""
    rows: dict[str, list] = {name: [] for name in features}
    for i in members:
        record = records[i]
        _, start, cut, hidden, logits = _answer_forward(draft, record, context, target)
        generator = torch.Generator().manual_seed(seed * 1_000_003 + i)
        answer_logits = logits.float().cpu()[start - 1 - cut:]  # row t predicts response[t]
        q = torch.softmax(answer_logits, -1)
        drafted = torch.multinomial(q, 1, generator=generator)[:, 0]
        p = torch.zeros(len(drafted))
        for t, (ids, logp) in enumerate(zip(record["top_ids"], record["top_logp"])):
            recorded = dict(zip(ids, logp))
            p[t] = math.exp(recorded[int(drafted[t])]) if int(drafted[t]) in recorded else 0.0
        accept = (p / q.gather(-1, drafted[:, None])[:, 0].clamp_min(1e-12)).clamp(max=1.0).numpy()
        feats = draft_features(answer_logits, drafted).float().numpy()
        hidden = hidden[start - 1 - cut:].to(torch.float16).cpu().numpy()
        draws = torch.rand(len(drafted), generator=generator).numpy()
        t, loop = 0, [0.0, 0.0, 0.0]
        while t < len(drafted):
            span = np.arange(t, min(t + steps, len(drafted)))
            labels = np.full(steps, -100.0, dtype=np.float32)
            labels[: len(span)] = accept[span]
            tokens = np.zeros(steps, dtype=np.int64)
            tokens[: len(span)] = drafted[span].numpy()
            accepted = next((j for j, k in enumerate(span) if draws[k] >= accept[k]), len(span))
            _add_round(rows, record, i, start + t, tokens, _padded(hidden[span], steps), _padded(feats[span], steps),
                       labels, labels.copy(), loop)
            t, loop = t + accepted + 1, _next_loop(record, start + t + accepted + 1, accepted, steps)
        bar.update(1)
    return rows


def _add_round(rows: dict[str, list], record: dict, i: int, p: int, tokens, hidden, feats, labels, unmasked,
               loop: list[float]) -> None:
    for name, value in (("example_id", f"{record.get('key', i)}@{p}"), ("text_id", i), ("position", p),
                        ("draft_tokens", tokens), ("draft_hidden_states", hidden), ("draft_features", feats),
                        ("labels", labels), ("labels_unmasked", unmasked), ("loop_features", loop)):
        rows[name].append(value)


def _next_loop(record: dict, nxt: int, accepted: int, max_draft_tokens: int) -> list[float] | None:
    """The loop state of the round at `nxt` after one that accepted `accepted` tokens (the target's token at
    nxt - 1 is the one it chose), or None when the answer ends before it."""
    start = len(record["prompt"])
    if nxt >= start + len(record["response"]):
        return None
    confidence = math.exp(record["top_logp"][nxt - 1 - start][0])
    return loop_features(accepted, max_draft_tokens, confidence, max_draft_tokens)


def _padded(values: np.ndarray, steps: int) -> np.ndarray:
    out = np.zeros((steps, *values.shape[1:]), dtype=values.dtype)
    out[: len(values)] = values
    return out


def _round_labels(drafted, full: list[int], p: int, max_draft_tokens: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(labels, unmasked labels, accepted count) of a round at position p: greedy verification against the answer
    (`full`), masked after the first miss; positions past the answer's end stay -100."""
    labels = np.full(max_draft_tokens, -100.0, dtype=np.float32)
    unmasked = labels.copy()
    accepted, open_ = 0, True
    for j in range(min(max_draft_tokens, len(full) - p)):
        unmasked[j] = float(drafted[j] == full[p + j])
        if open_:
            labels[j] = unmasked[j]
            accepted += int(unmasked[j])
            open_ = bool(unmasked[j])
    return labels, unmasked, accepted
