"""`fit_preverifier`'s data: the prompts (the default mixed set or the user's), and the target's own answers to them.

The answers are generated in batches of similar length (left padding), in the dtype that is fastest for batched
forwards on the device (timed, not assumed), and appended to a jsonl file as each batch finishes, so an interrupted
fit keeps every finished batch and a rerun answers only the prompts still missing. Each record carries what
`collect_along_answers` reads: `prompt`, `response` and the target's top log-probabilities at every answer step.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .._hf_compat import eos_ids as _eos_ids
from ..costs import timed
from ..data.fit_prompts import default_requests, is_heldout, render
from ..loops.batch_cache import left_padded

HELDOUT_FRACTION = 0.15
TOP_K = 32  # top log-probabilities kept per answer step (the sampling labels read p from them)


def user_requests(prompts: str | Path | Iterable, column: str = "text", split: str = "train") -> list[tuple[str, str, str]]:
    """(key, "user", request) from `prompts`: a list of strings, a .jsonl/.json file (`column`), a folder or text
    file, or a `datasets` name (`split`, `column`). ValueError naming `prompts=` when nothing usable is found."""
    if isinstance(prompts, (str, Path)):
        from .sources import load_texts

        path = Path(prompts)
        if (isinstance(prompts, Path) or path.suffix in (".jsonl", ".json", ".txt")) and not path.exists():
            raise ValueError(f"prompts={str(prompts)!r} does not exist; pass a list of strings, a .jsonl file with a "
                             f"{column!r} field per line, or a datasets name.")
        try:
            texts = load_texts(str(prompts), column=column, split=split)
        except ValueError as error:
            raise ValueError(f"prompts={str(prompts)!r}: {error}") from None
    else:
        texts = list(prompts)
        bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
        if bad:
            raise ValueError(f"prompts= must hold strings (one user request each); found a {bad[0]}.")
        texts = [t for t in texts if t.strip()]
        if not texts:
            raise ValueError("prompts= is empty: pass user requests (strings), a .jsonl file or a datasets name, or "
                             "leave prompts=None for the default mixed set.")
    return [(f"user/{i}", "user", text) for i, text in enumerate(texts)]


def build_prompts(tokenizer, prompts=None, *, chat_template: bool | None = None, max_prompt_tokens: int = 768,
                  per_category: int = 80, seed: int = 0, column: str = "text", split: str = "train") -> list[dict]:
    """Prompt records {key, category, heldout, prompt (ids)}, the held-out ones first, categories interleaved. Prompts longer than
    `max_prompt_tokens` are left out (the target's answers are what counts, not long contexts)."""
    has_template = getattr(tokenizer, "chat_template", None) is not None
    if chat_template and not has_template:
        raise ValueError("chat_template=True, but the tokenizer has no chat template (tokenizer.chat_template is "
                         "None); pass chat_template=None to render plain text, or a tokenizer with one.")
    use_template = has_template if chat_template is None else chat_template
    requests = default_requests(per_category, seed) if prompts is None else user_requests(prompts, column, split)
    records = []
    for key, category, request in requests:
        ids = render(tokenizer, request, use_template)
        if 0 < len(ids) <= max_prompt_tokens:
            records.append({"key": key, "category": category, "prompt": ids})
    if len(records) < 4:
        raise ValueError(f"prompts= gave {len(records)} usable prompts (at most {max_prompt_tokens} tokens each); "
                         "fit_preverifier needs at least 4 (some are held out to evaluate the pre-verifier).")
    held = {r["key"] for r in records if is_heldout(r["key"], HELDOUT_FRACTION)}
    floor = max(2, round(HELDOUT_FRACTION * len(records)) // 2)
    if len(held) < floor:  # a small set: hold out the lowest hashes so there is something to evaluate on
        held = set(sorted((r["key"] for r in records), key=_digest)[:floor])
    for record in records:
        record["heldout"] = record["key"] in held
    return [r for r in records if r["heldout"]] + [r for r in records if not r["heldout"]]


def _digest(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()


def read_answers(path: Path) -> list[dict]:
    """The answers written so far (a torn last line, from an interruption, is dropped)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


@torch.no_grad()
def fastest_dtype(model, prompts: list[list[int]], pad_id: int, candidates: tuple[torch.dtype, ...],
                  new_tokens: int = 8) -> torch.dtype:
    """The dtype of `candidates` in which batched generation over `prompts` (the prompt's forward and `new_tokens`
    steps, as the answers run) is fastest here; the model is left as it was (`cast_for_a_while`). On CPUs without
    bfloat16 units float32 wins; on a GPU or a CPU with bfloat16 matrix instructions bfloat16 usually does.
    A dtype whose matrix products run at under half the best one's rate (`matmul_rates`) is not timed in generate:
    on a CPU that emulates bfloat16 that run alone took minutes of a fit's budget."""
    rates = matmul_rates(candidates, model.device)
    candidates = tuple(dtype for dtype in candidates if rates[dtype] >= 0.5 * max(rates.values()))
    if len(candidates) == 1:
        return candidates[0]
    ids, mask = left_padded(prompts, pad_id, model.device)

    def run():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id)

    seconds = {}
    for dtype in candidates:
        with cast_for_a_while(model, dtype):
            run()  # warm-up
            seconds[dtype] = timed(run, model.device)[0]
    return min(seconds, key=seconds.get)


def matmul_rates(dtypes: tuple[torch.dtype, ...], device: torch.device | str, size: int = 512,
                 repeats: int = 2) -> dict[torch.dtype, float]:
    """Products of two `size` x `size` matrices per second in each dtype on `device` (the best of `repeats`, after
    one untimed): a cheap first look at which dtypes the hardware runs natively."""
    rates = {}
    for dtype in dtypes:
        a = torch.randn(size, size, generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
        torch.mm(a, a)
        rates[dtype] = 1.0 / min(timed(lambda a=a: torch.mm(a, a), device)[0] for _ in range(repeats))
    return rates


@contextlib.contextmanager
def cast_for_a_while(model: torch.nn.Module, dtype: torch.dtype):
    """`model` in `dtype` inside the block, and its own tensors back afterwards. A `.to()` there and back would
    round float32 weights through bfloat16: the user's model changed, and the target the fit calibrates and the
    draft it compares with no longer the ones served."""
    kept = [(module, name, tensor, tensor.data) for module in model.modules()
            for name, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]]
    model.to(dtype)
    try:
        yield model
    finally:
        for module, name, tensor, data in kept:
            tensor.data = data
            setattr(module, name, tensor)


@torch.no_grad()
def answer_batch(target, prompts: list[list[int]], max_new_tokens: int, pad_id: int, eos: set[int],
                 do_sample: bool, top_k: int = TOP_K) -> list[dict]:
    """The target's greedy answers (or T = 1 samples) to a left-padded batch, with the top-k log-probabilities of
    every step (of the raw logits: the T = 1 distribution)."""
    ids, mask = left_padded(prompts, pad_id, target.device)
    sampling = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} if do_sample else {"do_sample": False}
    out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=pad_id, **sampling)
    values, indices = torch.stack(out.logits, 1).float().log_softmax(-1).topk(top_k, -1)
    records = []
    for row in range(len(prompts)):
        response = out.sequences[row, ids.shape[1]:].tolist()
        end = next((i + 1 for i, t in enumerate(response) if t in eos), len(response))
        records.append({"response": response[:end], "top_ids": indices[row, :end].tolist(),
                        "top_logp": [[round(v, 3) for v in vs] for vs in values[row, :end].tolist()]})
    return records


def generate_answers(target, tokenizer, prompts: list[dict], path: Path, *, max_new_tokens: int, batch_size: int,
                     budget_s: float | None, do_sample: bool, progress: bool = True,
                     later: Callable[[list[int], list[int]], float] | None = None) -> list[dict]:
    """Append the target's answers to `prompts` to `path` (resumable: prompts already there are skipped); start no
    batch that would end more than half its cost past `budget_s` (the last batch's cost; one held-out and one training
    batch are always answered), counting for each answer written what `later(prompt, response)` says the stages after
    it will spend on it. Returns every answer in the file."""
    written = read_answers(path)
    done = {r["key"] for r in written}
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():  # drop a torn last line so appends stay line-aligned
        path.write_text("".join(json.dumps(r) + "\n" for r in written))
    todo = [p for p in prompts if p["key"] not in done]
    eos = _eos_ids(target.generation_config.eos_token_id)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos or {0})
    batches = _batches(todo, batch_size)
    bar = tqdm(total=len(prompts), initial=len(prompts) - len(todo), unit="prompt",
               desc="answers (sampled)" if do_sample else "answers", disable=not progress, dynamic_ncols=True)
    start, tokens, last = time.perf_counter(), 0, 0.0
    owed = sum(later(r["prompt"], r["response"]) for r in written) if later is not None else 0.0
    answered = {flag: sum(r["heldout"] is flag for r in written) for flag in (True, False)}
    with path.open("a") as handle:
        for batch in batches:
            over = budget_s is not None and time.perf_counter() - start + owed + last / 2 > budget_s
            if over and all(answered.values()):  # a held-out and a training batch at least, whatever the budget
                break
            for p in batch:
                answered[p["heldout"]] += 1
            began, owed_before = time.perf_counter(), owed
            if do_sample:
                torch.manual_seed(int(_digest(batch[0]["key"]), 16) % (1 << 31))
            for prompt, answer in zip(batch, answer_batch(target, [p["prompt"] for p in batch], max_new_tokens,
                                                          pad_id, eos, do_sample)):
                handle.write(json.dumps({**prompt, **answer}) + "\n")
                tokens += len(answer["response"])
                owed += later(prompt["prompt"], answer["response"]) if later is not None else 0.0
            handle.flush()
            os.fsync(handle.fileno())
            last = time.perf_counter() - began + owed - owed_before
            bar.update(len(batch))
            bar.set_postfix(tokens=tokens, tok_s=f"{tokens / max(time.perf_counter() - start, 1e-9):.0f}")
    bar.close()
    return read_answers(path)


def _batches(prompts: list[dict], batch_size: int) -> list[list[dict]]:
    """Batches of held-out or of training prompts (blocks of 4 batches sorted by length: similar lengths share a
    batch, the order stays mixed), merged so that wherever a budget cuts the list, held-out and training answers
    stand in the proportion they have in the prompts, held-out first."""
    parts = []
    for part in ([p for p in prompts if p["heldout"]], [p for p in prompts if not p["heldout"]]):
        out = []
        for i in range(0, len(part), 4 * batch_size):
            block = sorted(part[i:i + 4 * batch_size], key=lambda p: len(p["prompt"]))
            out += [block[j:j + batch_size] for j in range(0, len(block), batch_size)]
        parts.append(out)
    held, train = parts
    share = len(held) / max(len(held) + len(train), 1)
    merged = []
    while held or train:
        done = sum(len(b) for b in merged if b[0]["heldout"]) / max(sum(map(len, merged)), 1)
        merged.append(held.pop(0) if held and (not train or not merged or done < share) else train.pop(0))
    return merged
