"""PacerPreVerifier as a transformers model: sizes, save/load, Auto classes, decision rule, loss."""

from __future__ import annotations

import pytest
import torch
from conftest import make_preverifier, plain_greedy
from transformers import AutoConfig, AutoModel

import pacer_hf
from pacer_hf import PacerConfig, PacerPreVerifier, draft_features


def inputs(pv: PacerPreVerifier, length: int = 5, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(1, length, pv.config.draft_hidden_size, generator=generator)
    logits = torch.randn(1, length, 50, generator=generator)
    return hidden, draft_features(logits, logits.argmax(-1))


def test_from_draft_is_sized_for_the_draft(pair):
    _, draft = pair("gpt2", "random")
    pv = PacerPreVerifier.from_draft(draft, block_size=3, threshold=0.7)
    assert pv.config.draft_hidden_size == draft.config.n_embd == 16
    assert pv.config.draft_signature == {"model_type": "gpt2", "hidden_size": 16, "num_hidden_layers": 1,
                                         "vocab_size": 96}
    assert (pv.config.block_size, pv.config.threshold) == (3, 0.7)
    assert sum(p.numel() for p in pv.parameters()) < 200_000


def test_save_load_round_trip_and_auto_classes(pair, tmp_path):
    target, draft = pair()
    pv = make_preverifier(draft, block_size=2, threshold=0.3)
    pv.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / "pytorch_model.bin").exists()
    for loaded in (PacerPreVerifier.from_pretrained(tmp_path), AutoModel.from_pretrained(tmp_path),
                   pacer_hf.load_preverifier(str(tmp_path))):
        assert isinstance(loaded, PacerPreVerifier)
        ignored = {"_name_or_path", "transformers_version"}
        assert {k: v for k, v in loaded.config.to_dict().items() if k not in ignored} == {
            k: v for k, v in pv.config.to_dict().items() if k not in ignored}
        torch.testing.assert_close(loaded(*inputs(pv)).logits, pv(*inputs(pv)).logits)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), PacerConfig)
    ids = torch.tensor([[5, 6, 7]])
    out = target.generate(ids, max_new_tokens=9, do_sample=False, assistant_model=draft, pacer=str(tmp_path))
    assert torch.equal(out, plain_greedy(target, ids, max_new_tokens=9))


def test_decide_survival_threshold_and_trim():
    """decide() is the whole rule: block or cumulative survival vs threshold, then the trim of a failed block."""
    def decide(logits, **config):
        config.setdefault("block_size", 2)
        return PacerPreVerifier(PacerConfig(draft_hidden_size=8, **config)).decide(torch.tensor(logits))

    sure, unsure = 10.0, -10.0
    assert decide([sure, sure, unsure, sure], threshold=0.5) == (True, 0), "block survival ~ 0 fails"
    assert decide([unsure, unsure, sure, sure], threshold=0.5) == (False, 0), "only the last block counts"
    assert decide([unsure, sure, sure], threshold=0.5, decision_rule="cumulative") == (True, 0)
    half = 0.0  # sigmoid(0) = 0.5: survival of a one-token block is exactly 0.5
    assert decide([half], threshold=0.5, block_size=1) == (False, 0), "survival == threshold passes"
    assert decide([half - 1e-3], threshold=0.5, block_size=1) == (True, 0)
    assert decide([unsure], threshold=0.0, block_size=1) == (False, 0), "threshold 0 never stops"
    assert decide([sure], threshold=1.0, block_size=1) == (True, 0), "threshold 1 stops after the first block"
    # trimming keeps the failed block's tokens up to the first one predicted below trim_cutoff
    assert decide([sure, sure, unsure, sure], threshold=0.9, block_size=4, trim_failed_block=True) == (True, 2)
    assert decide([sure, 0.5, sure, sure], threshold=0.99, block_size=4, trim_failed_block=True,
                  trim_cutoff=0.7) == (True, 3)
    assert decide([unsure, sure], threshold=0.5, block_size=2, trim_failed_block=True) == (True, 2)


def test_causal_layer_lets_a_block_see_only_earlier_blocks():
    pv = make_preverifier_from_config()
    hidden, features = inputs(pv, length=6)
    changed = hidden.clone()
    changed[:, 4:] += 5.0
    before, after = pv(hidden, features).logits, pv(changed, features).logits
    torch.testing.assert_close(before[:, :4], after[:, :4])
    assert not torch.allclose(before[:, 4:], after[:, 4:])


def make_preverifier_from_config() -> PacerPreVerifier:
    torch.manual_seed(0)
    return PacerPreVerifier(PacerConfig(draft_hidden_size=12, initializer_range=0.5)).eval()


def test_loss_masks_padding_and_weights_rejects():
    pv = make_preverifier_from_config()
    hidden, features = inputs(pv, length=4)
    labels = torch.tensor([[1.0, 0.0, -100.0, -100.0]])
    loss = pv(hidden, features, labels=labels).loss
    padded_changed = hidden.clone()
    padded_changed[:, 2:] = 0
    torch.testing.assert_close(pv(padded_changed, features, labels=labels).loss, loss)
    pv.config.reject_weight = 5.0
    logits = pv(hidden, features).logits[0, :2]
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.tensor([1.0, 0.0]), reduction="none")
    torch.testing.assert_close(pv(hidden, features, labels=labels).loss, (bce[0] + 5 * bce[1]) / 6)


@pytest.mark.parametrize("mode", ["hidden", "features"])
def test_input_modes(mode):
    pv = PacerPreVerifier(PacerConfig(draft_hidden_size=12, input_mode=mode))
    assert (pv.hidden_proj is None) == (mode == "features") and (pv.feature_proj is None) == (mode == "hidden")
    assert pv(*inputs(pv)).logits.shape == (1, 5)


def test_draft_features():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    features = draft_features(logits, torch.tensor([0]))
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(features[0, 0], probs[0, 0].log())
    torch.testing.assert_close(features[0, 1], -(probs * probs.log()).sum())
    torch.testing.assert_close(features[0, 2], probs[0, 0] - probs[0, 1])
