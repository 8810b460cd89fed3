"""A trace collection on disk: what the run was (`CollectConfig`, manifest.json) and its shards.

Each finished shard is written atomically (`save_to_disk` to a temporary folder, then a rename), so an
interrupted run resumes where it stopped without losing or duplicating rows; the manifest records what
the run is, to refuse mixing runs. `collect` and `collect_answers` write collections; `load_traces` reads one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import datasets
import numpy as np

MANIFEST = "manifest.json"
FORMAT_VERSION = 1



@dataclass
class CollectConfig:
    """What a collection run does; two runs with different configs never share an output folder.

    `temperature=0` drafts greedily and stores hard greedy labels; `temperature>0` samples the draft at
    that temperature and stores soft labels min(1, p_target/p_draft) at the same temperature.
    `target_continuation=G`: before drafting, extend each text prefix by g in [0, G] tokens of the target's own
    greedy continuation (g fixed per work unit), so rounds also start inside model-generated text, as at serving.
    """

    max_draft_tokens: int = 8
    temperature: float = 0.0
    positions_per_text: int = 32
    min_prefix: int = 8
    context: int = 256
    shard_size: int = 256
    batch_size: int = 16
    seed: int = 0
    target_continuation: int = 0

    def __post_init__(self) -> None:
        for name in ("max_draft_tokens", "positions_per_text", "min_prefix", "context", "shard_size", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1.")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy).")
        if self.target_continuation < 0:
            raise ValueError(f"target_continuation={self.target_continuation} must be >= 0.")
        if self.context < self.min_prefix:
            raise ValueError(f"context={self.context} must be >= min_prefix={self.min_prefix}.")

    @property
    def label_kind(self) -> str:
        return "greedy" if self.temperature == 0 else "sampling"


def _features(steps: int, hidden_size: int) -> datasets.Features:
    return datasets.Features({
        "example_id": datasets.Value("string"),
        "text_id": datasets.Value("int32"),
        "position": datasets.Value("int32"),
        "draft_tokens": datasets.Sequence(datasets.Value("int32"), length=steps),
        "draft_hidden_states": datasets.Array2D((steps, hidden_size), "float16"),
        "draft_features": datasets.Array2D((steps, 3), "float32"),
        "labels": datasets.Sequence(datasets.Value("float32"), length=steps),
        "labels_unmasked": datasets.Sequence(datasets.Value("float32"), length=steps),
    })


def _digest(token_lists: list[list[int]]) -> str:
    sha = hashlib.sha256()
    for ids in token_lists:
        sha.update(np.asarray(ids, dtype=np.int64).tobytes())
        sha.update(b"|")
    return sha.hexdigest()


def read_manifest(path: str | Path) -> dict:
    """The manifest of a collection folder (raises a clear error when the folder holds none)."""
    file = Path(path) / MANIFEST
    if not file.is_file():
        raise ValueError(f"{str(path)!r} is not a trace collection (no {MANIFEST}); run `pacer-hf collect` first.")
    return json.loads(file.read_text())


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def _open_shards(out: Path, run: dict, overwrite: bool, num_shards: int, **counts) -> tuple[dict, Path, list[int]]:
    """(manifest, shard folder, shards done) of a resumable collection in `out`; half-written shards are redone."""
    _prepare_folder(out, run, overwrite)
    manifest = {**run, **counts, "num_shards": num_shards, "done_shards": [], "complete": False}
    shard_dir = out / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    for stale in shard_dir.glob(".tmp-*"):
        shutil.rmtree(stale)
    done = sorted(k for k in range(num_shards) if (shard_dir / f"shard-{k:05d}").is_dir())
    manifest["done_shards"] = done
    _write_json(out / MANIFEST, manifest)
    return manifest, shard_dir, done


def _shard_done(out: Path, manifest: dict, done: list[int], k: int) -> None:
    done.append(k)  # after `_save_shard`: a rerun resumes after shard k
    manifest["done_shards"] = sorted(done)
    manifest["complete"] = len(done) == manifest["num_shards"]
    _write_json(out / MANIFEST, manifest)


def _finish(out: Path, manifest: dict) -> None:
    manifest["complete"] = True  # also when there was nothing left to do
    manifest["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    _write_json(out / MANIFEST, manifest)


def _save_shard(rows: dict, features: datasets.Features, shard_dir: Path, index: int) -> None:
    tmp = shard_dir / f".tmp-shard-{index:05d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # our own bar counts positions; one per shard save is noise
    try:
        datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp))
    finally:
        if shown:
            datasets.enable_progress_bars()
    os.replace(tmp, shard_dir / f"shard-{index:05d}")


def _prepare_folder(out: Path, run: dict, overwrite: bool) -> None:
    if out.exists() and (out / MANIFEST).is_file():
        old = json.loads((out / MANIFEST).read_text())
        old["config"] = {**asdict(CollectConfig()), **old.get("config", {})}  # runs from before a new option
        differs = sorted(k for k in run if old.get(k) != run[k])
        if not differs:
            return
        if not overwrite:
            raise ValueError(
                f"--out {str(out)!r} holds a different collection run ({', '.join(differs)} differ); nothing was "
                "changed. Pass a new --out, or --overwrite to delete that run."
            )
        shutil.rmtree(out)
    elif out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {str(out)!r} is not empty and holds no trace collection; choose an empty or new "
                         "folder (nothing was changed).")
    out.mkdir(parents=True, exist_ok=True)


def load_traces(path: str | Path, require_complete: bool = True) -> datasets.Dataset:
    """All shards of a collection as one `datasets.Dataset` (in work-unit order)."""
    manifest = read_manifest(path)
    if require_complete and not manifest.get("complete"):
        raise ValueError(f"The collection in {str(path)!r} is incomplete ({len(manifest['done_shards'])}/"
                         f"{manifest['num_shards']} shards); rerun the same `pacer-hf collect` command to resume.")
    shard_dir = Path(path) / "shards"
    parts = [datasets.load_from_disk(str(shard_dir / f"shard-{k:05d}")) for k in sorted(manifest["done_shards"])]
    if not parts:
        raise ValueError(f"The collection in {str(path)!r} has no finished shards yet.")
    return datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
