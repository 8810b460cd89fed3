"""Collect pre-verifier training traces: the draft proposes, the target labels every drafted token.

At many positions of a text corpus the draft proposes `max_draft_tokens` tokens (greedy, or sampled
at a temperature); one batched target forward per group of proposals labels each drafted token:
greedy, 1 if it equals the target's argmax given the prefix and the drafted tokens before it (labels
after the first rejection are -100: "accepted given tokens < i accepted"; the unmasked matches are
kept in `labels_unmasked` for the ablation); sampling, the soft label min(1, p_target/p_draft).
Draft hidden states are the `lm_head` input at the last position, captured with a forward pre-hook: the
same quantity generation's draft forward hands the pre-verifier.

Work is split into deterministic shards of positions; each finished shard is written atomically
(`save_to_disk` to a temporary folder, then a rename), so an interrupted run resumes where it stopped
without losing or duplicating rows. `manifest.json` records what the run is, to refuse mixing runs.
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from .._hf_compat import CACHE_KWARG, output_cache
from .._hf_compat import eos_ids as _eos_ids
from ..loading import check_pair, load_causal_lm, load_tokenizer, model_name
from ..loops.padded_heads import draft_view, own_rows
from ..modeling_pacer import draft_features, draft_signature
from .common import cli_errors
from .sources import load_texts
from .traces import (
    FORMAT_VERSION,
    CollectConfig,
    _digest,
    _features,
    _finish,
    _open_shards,
    _save_shard,
    _shard_done,
    read_manifest,
)


def plan_units(token_lists: list[list[int]], config: CollectConfig) -> list[tuple[int, int]]:
    """Deterministic work units (text index, prefix length): the same corpus and config give the same list."""
    units: list[tuple[int, int]] = []
    for index, ids in enumerate(token_lists):
        low, high = config.min_prefix, len(ids)
        if high <= low:
            continue
        rng = np.random.default_rng([config.seed, index])
        count = min(config.positions_per_text, high - low)
        positions = np.sort(rng.choice(np.arange(low, high), size=count, replace=False))
        units.extend((index, int(p)) for p in positions)
    return units


def _accepts(model: PreTrainedModel, name: str) -> bool:
    forward = getattr(model, "get_base_model", lambda: model)().forward
    return name in inspect.signature(forward).parameters


def _left_pad(prefixes: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(p) for p in prefixes)
    ids = torch.zeros((len(prefixes), length), dtype=torch.long)
    mask = torch.zeros((len(prefixes), length), dtype=torch.long)
    for row, prefix in enumerate(prefixes):
        ids[row, length - len(prefix):] = torch.as_tensor(prefix, dtype=torch.long)
        mask[row, length - len(prefix):] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def greedy_continuations(model: PreTrainedModel, prefixes: list[list[int]], steps: int) -> list[list[int]]:
    """`steps` greedy tokens of `model` after each prefix (one padded batch, KV cache)."""
    if steps <= 0:
        return [[] for _ in prefixes]
    ids, mask = _left_pad(prefixes, model.device)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    keep = {"logits_to_keep": 1} if _accepts(model, "logits_to_keep") else {}
    cache, step_ids, step_pos, step_mask, out_tokens = None, ids, positions, mask, []
    for step in range(steps):
        out = model(input_ids=step_ids, attention_mask=step_mask, position_ids=step_pos, use_cache=True,
                    **{CACHE_KWARG: cache}, **keep)
        cache = output_cache(out)
        token = out.logits[:, -1, :].argmax(-1, keepdim=True)
        out_tokens.append(token[:, 0])
        step_ids, step_pos = token, positions[:, -1:] + step + 1
        step_mask = torch.cat([mask, torch.ones((len(prefixes), step + 1), dtype=mask.dtype, device=mask.device)], 1)
    return torch.stack(out_tokens, 1).cpu().tolist()


def _draft_ids(draft: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    """`ids` as the draft reads them (`padded_heads.draft_view`): with a head narrower than the target's, an id past
    its rows (a target's padding row, never a token) goes in as its last row; labels still compare the real ids."""
    return draft_view(ids, own_rows(draft))


@torch.no_grad()
def draft_rollout(draft: PreTrainedModel, prefixes: list[list[int]], steps: int, temperature: float = 0.0,
                  generator: torch.Generator | None = None):
    """`steps` draft tokens after each prefix (one left-padded batch, KV cache): (ids, mask, tokens (B,L),
    hidden states (B,L,H) at the `lm_head` input, raw logits (B,L,V))."""
    device = draft.device
    batch = len(prefixes)
    ids, mask = _left_pad(prefixes, device)
    drafted_from = _draft_ids(draft, ids)  # a target's padding rows past the draft's head (`loops/padded_heads.py`)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    hidden: list[torch.Tensor] = []
    # The lm_head input at the last position: what generation's draft forward hands the pre-verifier.
    hook = draft.get_output_embeddings().register_forward_pre_hook(lambda m, args: hidden.append(args[0][:, -1]))
    keep = {"logits_to_keep": 1} if _accepts(draft, "logits_to_keep") else {}
    raw, drafted = [], []
    cache, step_ids, step_pos, step_mask = None, drafted_from, positions, mask
    try:
        for step in range(steps):
            out = draft(input_ids=step_ids, attention_mask=step_mask, position_ids=step_pos,
                        use_cache=True, **{CACHE_KWARG: cache}, **keep)
            cache = output_cache(out)
            logits = out.logits[:, -1, :].float()
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                token = torch.multinomial(probs.cpu(), 1, generator=generator).to(device)
            else:
                token = logits.argmax(-1, keepdim=True)
            raw.append(logits)
            drafted.append(token[:, 0])
            step_ids, step_pos = token, positions[:, -1:] + step + 1
            step_mask = torch.cat([mask, torch.ones((batch, step + 1), dtype=mask.dtype, device=device)], dim=1)
    finally:
        hook.remove()
    return ids, mask, torch.stack(drafted, 1), torch.stack(hidden, 1), torch.stack(raw, 1)


@torch.no_grad()
def propose_and_label(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    prefixes: list[list[int]],
    max_draft_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    eos_token_ids: set[int] | None = None,
) -> dict[str, np.ndarray]:
    """Draft `max_draft_tokens` after each prefix (one padded batch) and label them with one target forward.

    Returns arrays `draft_tokens (B,L)`, `draft_hidden_states (B,L,H)` float16, `draft_features (B,L,3)`,
    `labels (B,L)` and `labels_unmasked (B,L)` (-100 where undefined: after an EOS, or greedy after the
    first rejection).
    """
    device = draft.device
    steps = max_draft_tokens
    ids, mask, tokens, hidden, draft_logits = draft_rollout(draft, prefixes, steps, temperature, generator)
    full_ids = torch.cat([ids, tokens], 1).to(target.device)
    full_mask = torch.cat([mask, torch.ones_like(tokens)], 1).to(target.device)
    target_keep = {"logits_to_keep": steps + 1} if _accepts(target, "logits_to_keep") else {}
    target_logits = target(input_ids=full_ids, attention_mask=full_mask,
                           position_ids=(full_mask.cumsum(-1) - 1).clamp_min(0), use_cache=False,
                           **target_keep).logits[:, -(steps + 1):-1].float().to(device)
    if temperature > 0:
        p_target = torch.softmax(target_logits / temperature, -1).gather(-1, tokens[..., None])[..., 0]
        p_draft = torch.softmax(draft_logits / temperature, -1).gather(-1, tokens[..., None])[..., 0]
        labels = (p_target / p_draft.clamp_min(1e-12)).clamp(max=1.0)
        unmasked = labels.clone()
    else:
        unmasked = (target_logits.argmax(-1) == tokens).float()
        accepted_before = torch.cat([torch.ones_like(unmasked[:, :1]), unmasked[:, :-1].cumprod(1)], 1)
        labels = torch.where(accepted_before > 0, unmasked, torch.full_like(unmasked, -100.0))
    if eos_token_ids:
        is_eos = torch.isin(tokens, torch.as_tensor(sorted(eos_token_ids), device=device))
        after_eos = torch.cat([torch.zeros_like(is_eos[:, :1]), is_eos[:, :-1]], 1).cummax(1).values
        labels = labels.masked_fill(after_eos, -100.0)
        unmasked = unmasked.masked_fill(after_eos, -100.0)
    return {
        "draft_tokens": tokens.cpu().numpy().astype(np.int32),
        "draft_hidden_states": hidden.to(torch.float16).cpu().numpy(),
        "draft_features": draft_features(draft_logits, tokens).cpu().numpy().astype(np.float32),
        "labels": labels.cpu().numpy().astype(np.float32),
        "labels_unmasked": unmasked.cpu().numpy().astype(np.float32),
    }


def collect(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    output_dir: str | Path,
    *,
    texts: list[str] | None = None,
    tokenizer=None,
    token_ids: list[list[int]] | None = None,
    config: CollectConfig | None = None,
    source: str = "in-memory",
    draft_name: str | None = None,
    target_name: str | None = None,
    overwrite: bool = False,
    progress: bool = True,
    _stop_after_shards: int | None = None,
) -> Path:
    """Collect traces into `output_dir` (resumable). Returns the folder; load it with `traces.load_traces`.

    Pass `texts` with `tokenizer`, or pre-tokenized `token_ids`. Rerunning with the same arguments
    resumes an interrupted run; a folder holding a different run is refused (or deleted with
    `overwrite=True`). `_stop_after_shards` simulates an interruption (tests).
    """
    config = config or CollectConfig()
    check_pair(target, draft, tokenizer)
    if token_ids is None:
        if texts is None or tokenizer is None:
            raise ValueError("collect() needs texts= with tokenizer=, or token_ids=.")
        token_ids = [tokenizer(t)["input_ids"] for t in texts]
    units = plan_units(token_ids, config)
    if not units:
        raise ValueError(f"No text is longer than min_prefix={config.min_prefix} tokens; lower --min-prefix or "
                         "use longer texts.")
    out = Path(output_dir)
    hidden_size = int(draft.get_output_embeddings().in_features)
    run = {
        "format_version": FORMAT_VERSION,
        "config": asdict(config),
        "source": source,
        "tokens_sha256": _digest(token_ids),
        "draft_model": model_name(draft, draft_name),
        "target_model": model_name(target, target_name),
        "draft_signature": draft_signature(draft.config),
        "target_signature": draft_signature(target.config),
        "draft_hidden_size": hidden_size,
    }
    shards = [units[i:i + config.shard_size] for i in range(0, len(units), config.shard_size)]
    manifest, shard_dir, done = _open_shards(out, run, overwrite, len(shards), label_kind=config.label_kind,
                                             num_texts=len(token_ids), num_units=len(units))
    eos_ids = _eos_ids(draft.generation_config.eos_token_id if getattr(draft, "generation_config", None) else None)
    features = _features(config.max_draft_tokens, hidden_size)
    bar = tqdm(total=len(units), initial=sum(len(shards[k]) for k in done), unit="pos", desc="collect",
               disable=not progress, dynamic_ncols=True)
    written = 0
    try:
        for k, shard_units in enumerate(shards):
            if k in done:
                continue
            if _stop_after_shards is not None and written >= _stop_after_shards:
                raise KeyboardInterrupt(f"simulated interruption after {written} shards")
            rows = _collect_shard(target, draft, token_ids, shard_units, config, k, list(features), eos_ids, bar)
            _save_shard(rows, features, shard_dir, k)
            written += 1
            _shard_done(out, manifest, done, k)
    finally:
        bar.close()
    _finish(out, manifest)
    return out


def _collect_shard(target, draft, token_ids: list[list[int]], shard_units: list[tuple[int, int]], config: CollectConfig,
                   k: int, names: list[str], eos_ids: set[int], bar) -> dict[str, list]:
    """The rows of shard `k`: proposals and labels at its work units, `config.batch_size` at a time."""
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + k)
    rows: dict[str, list] = {name: [] for name in names}
    for start in range(0, len(shard_units), config.batch_size):
        chunk = shard_units[start:start + config.batch_size]
        prefixes = [token_ids[t][max(0, p - config.context):p] for t, p in chunk]
        if config.target_continuation:
            grown = greedy_continuations(target, prefixes, config.target_continuation)
            cuts = [int(np.random.default_rng([config.seed, t, p]).integers(0, config.target_continuation + 1))
                    for t, p in chunk]
            prefixes = [(pre + more[:cut])[-config.context:] for pre, more, cut in zip(prefixes, grown, cuts)]
        arrays = propose_and_label(target, draft, prefixes, config.max_draft_tokens, config.temperature,
                                   generator, eos_ids)
        rows["example_id"] += [f"t{t}:p{p}" for t, p in chunk]
        rows["text_id"] += [t for t, _ in chunk]
        rows["position"] += [p for _, p in chunk]
        for name, array in arrays.items():
            rows[name] += list(array)
        bar.update(len(chunk))
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model folder or Hub id")
    parser.add_argument("--draft", required=True, help="draft model folder or Hub id")
    parser.add_argument("--draft-adapter", help="PEFT adapter folder applied on top of --draft")
    parser.add_argument("--tokenizer", help="tokenizer folder (default: --target)")
    parser.add_argument("--source", help="datasets name/path (with --column), .jsonl/.json file, folder of text files")
    parser.add_argument("--file-list", help="text file with one path per line (instead of --source)")
    parser.add_argument("--column", default="text")
    parser.add_argument("--split", default="train")
    parser.add_argument("--limit", type=int, help="use only the first N texts")
    parser.add_argument("--out", required=True, help="output folder (resumed when it holds the same run)")
    parser.add_argument("--overwrite", action="store_true", help="delete a different run found in --out")
    parser.add_argument("--max-draft-tokens", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy labels; >0: sampled, soft labels")
    parser.add_argument("--positions-per-text", type=int, default=32)
    parser.add_argument("--min-prefix", type=int, default=8)
    parser.add_argument("--context", type=int, default=256, help="at most this many prefix tokens per proposal")
    parser.add_argument("--shard-size", type=int, default=256, help="positions per shard (unit of resumption)")
    parser.add_argument("--batch-size", type=int, default=16, help="proposals per draft/target forward")
    parser.add_argument("--target-continuation", type=int, default=0,
                        help="extend each prefix by 0..N tokens of the target's greedy continuation before drafting")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads")


@cli_errors("collect", "Finished shards are kept: rerun the same command to resume.")
def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    config = CollectConfig(max_draft_tokens=args.max_draft_tokens, temperature=args.temperature,
                           positions_per_text=args.positions_per_text, min_prefix=args.min_prefix,
                           context=args.context, shard_size=args.shard_size, batch_size=args.batch_size,
                           seed=args.seed, target_continuation=args.target_continuation)
    texts = load_texts(args.source, column=args.column, split=args.split, file_list=args.file_list, limit=args.limit)
    tokenizer = load_tokenizer(args.tokenizer or args.target)
    target = load_causal_lm(args.target, args.dtype)
    draft = load_causal_lm(args.draft, args.dtype, args.draft_adapter)
    source = f"{args.source or 'file_list:' + str(args.file_list)}[{args.column}]"
    draft_name = args.draft + (f"+{args.draft_adapter}" if args.draft_adapter else "")
    out = collect(target, draft, args.out, texts=texts, tokenizer=tokenizer, config=config, source=source,
                  draft_name=draft_name, target_name=args.target, overwrite=args.overwrite)
    manifest = read_manifest(out)
    print(f"{manifest['num_units']} positions in {manifest['num_shards']} shards written to {out}")
    return 0
