"""A built wheel carries hub_cards/ (demo pair, demo pre-verifier, card templates) as pacer_hf/hub_cards,
and `pacer_hf._paths.hub_cards_dir()` finds it there as it finds the checkout's hub_cards/.

The wheel is built from a copy of the source tree (so the checkout gets no build/ or egg-info), with the
installed setuptools and no network (`--no-build-isolation`).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")
MAX_WHEEL_MB = 64  # the demo pair is ~31 MB of weights; more means something else slipped in


def _load_paths_module(path: Path):
    """pacer_hf/_paths.py from `path`, without importing pacer_hf (so no copy can shadow another)."""
    spec = importlib.util.spec_from_file_location(f"_paths_under_test_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    pytest.importorskip("setuptools")
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pacer_hf", "hub_cards"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    out = base / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
                    "-q", "-w", str(out), str(source)], check=True, cwd=base, capture_output=True, text=True)
    (built,) = out.glob("pacer_hf-*.whl")
    return built


def test_wheel_carries_the_demo_pair_and_card_templates(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"pacer_hf/hub_cards/demo-{role}/{name}" for role in ("target", "draft") for name in MODEL_FILES}
    expected |= {"pacer_hf/hub_cards/demo-target/corpus_splits.json",
                 "pacer_hf/hub_cards/demo-preverifier/config.json",
                 "pacer_hf/hub_cards/demo-preverifier/model.safetensors",
                 "pacer_hf/hub_cards/demo-preverifier-sampling/config.json",
                 "pacer_hf/hub_cards/demo-preverifier-sampling/model.safetensors",
                 "pacer_hf/loops/preverifier_kernel.py",
                 "pacer_hf/hub_cards/templates/preverifier_card.md",
                 "pacer_hf/hub_cards/templates/custom_generate_card.md",
                 "pacer_hf/hub_cards/custom-generate/custom_generate/requirements.txt",
                 "pacer_hf/bench/metrics/speculative_stats/speculative_stats.py",  # evaluate loads it by path
                 "pacer_hf/hub_cards/qwen-coder-draft/cheap_draft.json",
                 "pacer_hf/hub_cards/qwen-coder-preverifier/model.safetensors",
                 "pacer_hf/hub_cards/qwen-coder-preverifier-sampling/model.safetensors",
                 "pacer_hf/hub_cards/default-preverifier/model.safetensors",  # pacer=True for any draft
                 "pacer_hf/hub_cards/default-preverifier/sampling/model.safetensors",
                 "pacer_hf/_paths.py", "pacer_hf/recipes/demo_pair.py"}
    assert expected <= names, sorted(expected - names)
    assert not any(name.startswith(("hub_cards/", "tests/", "docs/")) for name in names)
    assert wheel.stat().st_size < MAX_WHEEL_MB * 2**20, f"wheel is {wheel.stat().st_size / 2**20:.1f} MB"


def test_hub_cards_dir_resolves_in_both_layouts(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    installed = _load_paths_module(site / "pacer_hf" / "_paths.py").hub_cards_dir()
    assert installed == (site / "pacer_hf" / "hub_cards").resolve()
    assert (installed / "templates" / "preverifier_card.md").is_file()
    assert (installed / "demo-target" / "model.safetensors").is_file()
    checkout = _load_paths_module(ROOT / "pacer_hf" / "_paths.py").hub_cards_dir()
    assert checkout == ROOT / "hub_cards"
