"""The demo-pair build's data: the stdlib corpus, its file split, the tokenizer, token blocks, the work dir.

Stages `tokenizer` and `data` of `pacer-hf build-demo-pair` (pacer_hf.recipes.demo_pair), plus the
helpers every stage shares: the report file and loading a finished stage's model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sysconfig
import time
from pathlib import Path

import torch

from .._paths import hub_cards_dir
from ..data.prompts import SPLITS_FILE, pair_held_out_files

CORPUS_EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "encodings", "pydoc_data", "__pycache__"}
"""Test suites are dropped (repetitive fixtures, a third of the stdlib's bytes) and so are data-like
modules (codec tables, pydoc topic strings): the models should learn ordinary library code."""
CORPUS_MAX_FILE_BYTES = 400_000
SPLIT_PERCENT = {"test": 5, "validation": 5}  # the rest is "train"
EOS = "<|endoftext|>"


# ---------------------------------------------------------------------------------------------- corpus


def stdlib_root() -> Path:
    """The running interpreter's standard library: a corpus every user already has, byte for byte."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path) -> list[str]:
    """Relative paths (posix, sorted) of the corpus files under `root`."""
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in CORPUS_EXCLUDED_DIRS for part in rel.parts[:-1]) or rel.name.startswith("_sysconfigdata"):
            continue
        if path.stat().st_size > CORPUS_MAX_FILE_BYTES or not path.is_file():
            continue
        files.append(rel.as_posix())
    return sorted(files)


def split_of(relative_path: str) -> str:
    """Deterministic split of one file from the SHA-256 of its relative path (stable across machines)."""
    bucket = int(hashlib.sha256(relative_path.encode()).hexdigest()[:8], 16) % 100
    if bucket < SPLIT_PERCENT["test"]:
        return "test"
    if bucket < SPLIT_PERCENT["test"] + SPLIT_PERCENT["validation"]:
        return "validation"
    return "train"


def split_files(files: list[str]) -> dict[str, list[str]]:
    """{"train": [...], "validation": [...], "test": [...]}: each file in exactly one split."""
    splits: dict[str, list[str]] = {"train": [], "validation": [], "test": []}
    for rel in files:
        splits[split_of(rel)].append(rel)
    return splits


def held_out_files(folder: str | Path | None = None) -> list[str]:
    """Stdlib files (relative paths) never trained on (the "test" split of the pair's corpus_splits.json,
    default: the shipped demo-target): benchmark code prompts must come from these."""
    return pair_held_out_files(hub_cards_dir() / "demo-target" if folder is None else folder)


def _read(root: Path, rel: str) -> str:
    return (root / rel).read_text(encoding="utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(root: Path, files: list[str], vocab_size: int):
    """Byte-level BPE (no unknown tokens, any text round-trips) with one special token, EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((_read(root, rel) for rel in files), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS,
                                   unk_token=None, model_max_length=1024, clean_up_tokenization_spaces=False)


def bytes_per_token(tokenizer, root: Path, files: list[str]) -> float:
    text = [_read(root, rel) for rel in files]
    n_tokens = sum(len(e.ids) for e in tokenizer.backend_tokenizer.encode_batch(text, add_special_tokens=False))
    return sum(len(t.encode()) for t in text) / max(n_tokens, 1)


def stage_tokenizer(args: argparse.Namespace, work: Path) -> None:
    out = work / "tokenizer"
    if (out / "tokenizer.json").exists():
        print(f"[tokenizer] exists: {out}")
        return
    root = Path(args.corpus_root)
    splits = split_files(corpus_files(root))
    (work / SPLITS_FILE).write_text(json.dumps({"root": str(root), **splits}, indent=1))
    print(f"[tokenizer] corpus {root}: " + ", ".join(f"{k} {len(v)} files" for k, v in splits.items()))
    measured = {}
    for size in sorted({args.vocab_size, *args.measure_vocab}):
        start = time.perf_counter()
        tok = train_tokenizer(root, splits["train"], size)
        bpt = bytes_per_token(tok, root, splits["validation"])
        measured[size] = {"bytes_per_token_validation": round(bpt, 3), "train_seconds": round(time.perf_counter() - start, 1)}
        print(f"[tokenizer] vocab {size}: {bpt:.3f} bytes/token on validation files")
        if size == args.vocab_size:
            tok.save_pretrained(out)
    update_report(work, {"tokenizer": measured})


# ---------------------------------------------------------------------------------------------- data


def stage_data(args: argparse.Namespace, work: Path) -> None:
    out = work / "data"
    if (out / "train.pt").exists():
        print(f"[data] exists: {out}")
        return
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(work / "tokenizer")
    meta = json.loads((work / SPLITS_FILE).read_text())
    root = Path(meta["root"])
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split in ("train", "validation", "test"):
        ids: list[int] = []
        texts = [_read(root, rel) for rel in meta[split]]
        for enc in tok.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(tok.eos_token_id)
        n_blocks = len(ids) // args.seq_len
        blocks = torch.tensor(ids[: n_blocks * args.seq_len], dtype=torch.int16 if len(tok) < 32768 else torch.int32)
        torch.save(blocks.view(n_blocks, args.seq_len), out / f"{split}.pt")
        counts[split] = {"files": len(meta[split]), "tokens": len(ids), "blocks": n_blocks}
        print(f"[data] {split}: {len(meta[split])} files, {len(ids)} tokens, {n_blocks} blocks of {args.seq_len}")
    update_report(work, {"data": counts, "seq_len": args.seq_len})


class Blocks(torch.utils.data.Dataset):
    """Fixed-length token blocks; labels are the inputs (the model shifts them)."""

    def __init__(self, path: Path, limit_tokens: int | None = None):
        self.blocks = torch.load(path).long()
        if limit_tokens:
            self.blocks = self.blocks[: max(1, limit_tokens // self.blocks.shape[1])]

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


# ---------------------------------------------------------------------------------------------- work dir


def update_report(work: Path, entries: dict) -> dict:
    """Merge `entries` into `<work>/report.json` (the numbers the model cards quote) and return it."""
    path = work / "report.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report.update(entries)
    path.write_text(json.dumps(report, indent=1))
    return report


def load_stage_model(path: Path):
    """A stage's saved model in float32, with the KV cache on (Trainer saves use_cache=False)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.config.use_cache = model.generation_config.use_cache = True
    return model


def require_stage(work: Path, name: str) -> None:
    if not (work / name / "final" / "stage.json").exists():
        raise SystemExit(f"stage {name!r} has not run yet (run it first, or use --stage all)")
