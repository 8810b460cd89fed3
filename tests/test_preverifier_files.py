"""A pre-verifier folder whose model.safetensors is corrupt fails with an OSError naming the file and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from transformers import LlamaConfig, LlamaForCausalLM

from pacer_hf import PacerPreVerifier


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    draft = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    folder = tmp_path_factory.mktemp("pv") / "saved"
    PacerPreVerifier.from_draft(draft, hidden_size=16, num_attention_heads=2, intermediate_size=32).save_pretrained(folder)
    return folder


def _damaged(saved: Path, tmp_path: Path, damage) -> Path:
    folder = tmp_path / "damaged"
    folder.mkdir()
    for path in saved.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    weights = folder / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    return folder


@pytest.mark.parametrize("damage", [
    pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
    pytest.param(lambda data: b"not a safetensors file", id="garbled"),
    pytest.param(lambda data: (10**12).to_bytes(8, "little") + data[8:], id="header-length"),
    pytest.param(lambda data: b"", id="empty"),
])
def test_corrupt_weights_name_the_file_and_the_fix(saved, tmp_path, damage):
    folder = _damaged(saved, tmp_path, damage)
    with pytest.raises(OSError) as info:
        PacerPreVerifier.from_pretrained(folder)
    message = str(info.value)
    assert str(folder / "model.safetensors") in message
    assert "force_download=True" in message and "save_pretrained" in message
    assert isinstance(info.value.__cause__, SafetensorError)  # safetensors' own error is kept as the cause


def test_intact_folder_still_loads(saved):
    assert PacerPreVerifier.from_pretrained(saved).config.model_type == "pacer_preverifier"
