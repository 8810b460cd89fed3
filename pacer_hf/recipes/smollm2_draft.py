"""Build a draft for SmolLM2-135M-Instruct (`load_pair("smollm2")`) from the target's own greedy answers.

Reproducible and resumable: every stage writes under --work-dir and picks up where it stopped.

Stages (`--stage all` runs them in order):
  responses  the target's greedy answers to TRAIN-split chat prompts (all seven chat categories,
             round-robin), generated in batches of same-category prompts (left padding), with the
             target's top-k log-probabilities at every answer position; one jsonl record per prompt,
             appended as batches finish; prompts already in the file are skipped on restart.
             A sha1 bucket of the prompt key holds some prompts out of training for evaluation.
  train      a draft initialized from the target (its embedding/tied head, a subset of its layers,
             its final norm), distilled on the answers (top-k KL + cross-entropy on the target's
             greedy token) under a wall-clock budget; checkpoints every --checkpoint-every seconds
             (model, optimizer, data position) and resumes from the last one; greedy agreement on the
             held-out answers is measured at every checkpoint and the best draft is kept.
  ship       the best draft in bf16 + the target's tokenizer files + a model card in --out
             (default hub_cards/smollm2-draft), only after it loads as a draft of the target and
             greedy generation with it is identical to the target alone.

Modules: this one (prompts, the responses stage, the command) and `smollm2_draft_train` (the draft,
training, evaluation, shipping). Heavy work runs on one torch thread unless --threads says otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

from .._hf_compat import eos_ids as _eos_ids
from ..training.fit_data import answer_batch
from .smollm2_draft_train import read_records

RESPONSES = "responses.jsonl"
SAMPLED_RESPONSES = "responses_sampled.jsonl"  # T=1 answers (`stage_responses(..., do_sample=True)`)
CATEGORY_PLAN = {  # train-split prompts per category, in this order (round-robin batches)
    "chat-humaneval": 116, "chat-docstring": 300, "chat-rewrite": 72,
    "chat-summarize": 120, "chat-extract": 120, "chat-qa": 80, "chat-edit": 80,
}
HELDOUT_BUCKETS = 1  # of 10: sha1(key) % 10 < this -> held out of training (evaluation)


def is_heldout(key: str) -> bool:
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % 10 < HELDOUT_BUCKETS


def smollm2_prompts(tokenizer, plan: dict[str, int] = CATEGORY_PLAN, max_tokens: int = 700,
                    seed: int = 0) -> list[tuple[str, str, list[int]]]:
    """(key, category, prompt ids) of TRAIN-split chat prompts, `plan[category]` of each (fewer where a
    split runs out)."""
    from ..data.chat_prompts import chat_prompts

    out = []
    for category, n in plan.items():
        for prompt in chat_prompts(tokenizer, category, split="train", n=n, seed=seed, max_tokens=max_tokens):
            out.append((f"{category}/{prompt.id}", category, list(prompt.ids)))
    return out


def batches(prompts: list[tuple[str, str, list[int]]], batch_size: int) -> list[list[tuple[str, str, list[int]]]]:
    """Same-category batches of similar length, categories interleaved round-robin."""
    per_category: dict[str, list] = {}
    for prompt in prompts:
        per_category.setdefault(prompt[1], []).append(prompt)
    queues = []
    for items in per_category.values():
        # sort by length in blocks of 4 batches: similar lengths share a batch, order stays mixed
        block = 4 * batch_size
        chunks = []
        for i in range(0, len(items), block):
            part = sorted(items[i:i + block], key=lambda p: len(p[2]))
            chunks += [part[j:j + batch_size] for j in range(0, len(part), batch_size)]
        queues.append(chunks)
    out = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def stage_responses(target, tokenizer, prompts: list[tuple[str, str, list[int]]], work: Path, *,
                    max_new_tokens: int = 128, batch_size: int = 8, top_k: int = 16,
                    budget_s: float | None = None, progress: bool = True, do_sample: bool = False) -> Path:
    """Append the target's greedy answers for `prompts` to work/responses.jsonl (with `do_sample`: T=1
    samples to work/responses_sampled.jsonl, each batch seeded by its first key), skipping prompts already
    there; stops starting new batches after `budget_s` seconds (None: no limit). Returns the file."""
    from tqdm.auto import tqdm

    work.mkdir(parents=True, exist_ok=True)
    path = work / (SAMPLED_RESPONSES if do_sample else RESPONSES)
    records = read_records(path)
    if path.is_file():  # drop a torn last line so appends stay line-aligned
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = {r["key"] for r in records}
    todo = [b for b in batches([p for p in prompts if p[0] not in done], batch_size)]
    eos_ids = _eos_ids(target.generation_config.eos_token_id)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = pad_id if pad_id is not None else min(eos_ids or {0})
    tokens = sum(len(r["response"]) for r in records)
    bar = tqdm(total=len(prompts), initial=len(prompts) - sum(map(len, todo)), unit="prompt",
               desc="sampled responses" if do_sample else "responses",
               disable=not progress, dynamic_ncols=True)
    start = time.perf_counter()
    with path.open("a") as handle:
        for batch in todo:
            if budget_s is not None and time.perf_counter() - start > budget_s:
                break
            if do_sample:
                torch.manual_seed(int(hashlib.sha1(batch[0][0].encode()).hexdigest(), 16) % (1 << 31))
            for (key, category, ids), record in zip(batch, answer_batch(
                    target, [b[2] for b in batch], max_new_tokens, pad_id, eos_ids, do_sample, top_k)):
                handle.write(json.dumps({"key": key, "category": category, "heldout": is_heldout(key),
                                         "prompt": ids, **record}) + "\n")
                tokens += len(record["response"])
            handle.flush()
            os.fsync(handle.fileno())
            bar.update(len(batch))
            bar.set_postfix(tokens=tokens, tok_s=f"{tokens / max(time.perf_counter() - start, 1e-9):.0f}")
    bar.close()
    return path


# -- the command ---------------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    parser.add_argument("--work-dir", default="smollm2-draft-work", help="where stages keep their results")
    parser.add_argument("--stage", default="all", choices=("all", "responses", "train", "ship"))
    parser.add_argument("--cache-dir", default=None, help="load_pair('smollm2', cache_dir=...)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts generated together")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="answer length cap")
    parser.add_argument("--responses-minutes", type=float, default=None, help="stop generating after this")
    parser.add_argument("--layers", default="auto", help="target layers the draft starts from, e.g. 0,1,2; "
                        "'auto': a short trial of each candidate set, the best one continues")
    parser.add_argument("--trial-minutes", type=float, default=2.5, help="per candidate with --layers auto")
    parser.add_argument("--train-minutes", type=float, default=30.0, help="training budget (wall clock)")
    parser.add_argument("--checkpoint-every", type=float, default=240.0, help="seconds between checkpoints")
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--out", default=None, help="ship folder (default hub_cards/smollm2-draft)")
    parser.add_argument("--seed", type=int, default=0)


def run(args) -> int:
    from ..pairs import load_pair

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    work = Path(args.work_dir)
    pair = load_pair("smollm2", cache_dir=args.cache_dir, cards_dir=work / "no-cards")
    if args.stage in ("all", "responses"):
        budget = None if args.responses_minutes is None else 60 * args.responses_minutes
        stage_responses(pair.target, pair.tokenizer, smollm2_prompts(pair.tokenizer), work,
                        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, budget_s=budget)
    if args.stage in ("all", "train", "ship"):
        from . import smollm2_draft_train as train
    if args.stage in ("all", "train"):
        options = dict(lr=args.lr, seed=args.seed, schedule_s=60 * args.train_minutes)
        layers = None
        if args.layers == "auto":
            train.choose_layers(pair.target, work, trial_s=60 * args.trial_minutes, **options)
        else:
            layers = [int(x) for x in args.layers.split(",")]
        train.stage_train(pair.target, work, layers=layers, budget_s=60 * args.train_minutes,
                          checkpoint_every=args.checkpoint_every, **options)
    if args.stage in ("all", "ship"):
        from .._paths import hub_cards_dir

        out = Path(args.out) if args.out else hub_cards_dir() / "smollm2-draft"
        train.stage_ship(pair.target, pair.tokenizer, work, out, command=vars(args))
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m pacer_hf.recipes.smollm2_draft", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
