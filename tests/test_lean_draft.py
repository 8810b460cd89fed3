"""The lean draft forward (lean_draft.py): same logits and hidden state as the draft's own forward,
chosen only where it is checked, recorded in stats, and exact end to end."""

from __future__ import annotations

import pytest
import torch
from conftest import build_model, make_preverifier, plain_greedy
from transformers import (
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import pacer_hf
from pacer_hf._hf_compat import CACHE_KWARG
from pacer_hf.loops.lean_draft import LeanDraft, unsupported_reason

SMALL = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "initializer_range": 0.3,
         "bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
VARIANTS = {
    "llama-gqa": lambda: LlamaForCausalLM(LlamaConfig(**SMALL)),
    "llama-bias-llama3-rope": lambda: LlamaForCausalLM(LlamaConfig(
        **SMALL, attention_bias=True, mlp_bias=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "llama-mha-head-dim": lambda: LlamaForCausalLM(LlamaConfig(**{**SMALL, "num_key_value_heads": 4}, head_dim=16)),
    "qwen2-bias": lambda: Qwen2ForCausalLM(Qwen2Config(**SMALL)),
    "qwen3-qk-norm": lambda: Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=8)),
    "mistral": lambda: MistralForCausalLM(MistralConfig(**SMALL, sliding_window=None)),
}


def _build(variant: str, dtype=torch.float32):
    torch.manual_seed(0)
    model = VARIANTS[variant]().eval().to(dtype)
    with torch.no_grad():  # random biases and norm weights, so a term left out would show
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.normal_(0.5 if "norm" in name else 0.0, 0.2)
    return model


def _reference(model, chunks):
    """Last-position logits and lm_head input of the draft's own forward, chunk after chunk."""
    captured = []
    hook = model.lm_head.register_forward_pre_hook(lambda _, args: captured.append(args[0][:, -1]))
    cache, out = DynamicCache(config=model.config), []
    try:
        with torch.no_grad():
            for chunk in chunks:
                out.append(model(input_ids=chunk, use_cache=True, **{CACHE_KWARG: cache}).logits[:, -1])
    finally:
        hook.remove()
    return out, captured


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_logits_and_hidden_as_the_model(variant, dtype):
    model = _build(variant, dtype)
    lean, reason = LeanDraft.for_model(model, max_length=64)
    assert reason is None and lean is not None
    ids = torch.randint(0, 96, (1, 20), generator=torch.Generator().manual_seed(3))
    # prefill, one token, two tokens after a cache (the masked path), then a crop and a re-draft
    chunks = [ids[:, :7], ids[:, 7:8], ids[:, 8:10], ids[:, 10:13]]
    logits, hidden = _reference(model, chunks)
    kv = lean.new_cache(capacity=4)  # smaller than the sequence: the buffers must grow and keep their content
    tol = {torch.float32: 1e-5, torch.bfloat16: 5e-2}[dtype]
    for chunk, want_logits, want_hidden in zip(chunks, logits, hidden):
        got_hidden, got_logits = lean(chunk, kv)
        torch.testing.assert_close(got_logits.float(), want_logits.float(), rtol=tol, atol=tol)
        torch.testing.assert_close(got_hidden.float(), want_hidden.float(), rtol=tol, atol=tol)
    assert kv.get_seq_length() == 13
    kv.crop(-4)  # roll back as the drafting loop does after a rejection, then continue from position 9
    got_hidden, got_logits = lean(ids[:, 9:11], kv)
    want, _ = _reference(model, [ids[:, :11]])
    torch.testing.assert_close(got_logits.float(), want[0].float(), rtol=tol, atol=tol)


def test_unsupported_drafts_say_why():
    gpt2 = build_model("gpt2")
    assert "gpt2" in unsupported_reason(gpt2, 64)
    windowed = MistralForCausalLM(MistralConfig(**SMALL, sliding_window=16)).eval()
    assert "sliding window (16)" in unsupported_reason(windowed, 64)
    assert unsupported_reason(windowed, 16) is None  # a window the sequence never exceeds changes nothing
    dynamic = LlamaForCausalLM(LlamaConfig(**SMALL, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4,
                                                                     "factor": 2.0})).eval()
    assert "dynamic" in unsupported_reason(dynamic, 64)

    class WrappedDraft(LlamaForCausalLM):
        pass

    assert "plain" in unsupported_reason(WrappedDraft(LlamaConfig(**SMALL)).eval(), 64)


def test_probe_rejects_a_model_whose_forward_differs():
    model = _build("llama-gqa")
    model.lm_head.register_forward_hook(lambda _, args, out: out + 1.0)  # something the lean forward cannot see
    lean, reason = LeanDraft.for_model(model, max_length=64)
    assert lean is None and "differ" in reason


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("strategy", ["sd-fixed-3", "pacer"])
def test_generate_lean_and_model_forwards_agree(pair, arch, strategy):
    target, draft = pair(arch, "noisy")
    prompt = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(5))
    pacer = make_preverifier(draft, threshold=0.5, block_size=2, max_draft_tokens=6) if strategy == "pacer" else strategy
    expected = plain_greedy(target, prompt, max_new_tokens=40)
    runs = {}
    for forward in ("auto", "model"):
        out = target.generate(prompt, assistant_model=draft, pacer=pacer, pacer_draft_forward=forward,
                              max_new_tokens=40, do_sample=False)
        stats = pacer_hf.last_stats(target)
        assert torch.equal(out, expected)
        runs[forward] = stats
    assert runs["auto"].draft_forward == "lean" and runs["model"].draft_forward == "model"
    # float64 drafts: the two forwards agree to ~1e-15, so every drafting and stopping decision is the same
    assert runs["auto"].draft_lengths == runs["model"].draft_lengths
    assert runs["auto"].accepted == runs["model"].accepted


def test_auto_uses_the_model_forward_where_lean_cannot_run(pair):
    target, draft = pair("gpt2", "noisy")
    prompt = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(5))
    out = target.generate(prompt, assistant_model=draft, pacer="sd-fixed-3", max_new_tokens=20, do_sample=False)
    assert pacer_hf.last_stats(target).draft_forward == "model"
    assert torch.equal(out, plain_greedy(target, prompt, max_new_tokens=20))


def test_errors(pair):
    target, draft = pair("gpt2", "noisy")
    prompt = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match="pacer_draft_forward='lean' cannot run this draft: model_type 'gpt2'"):
        target.generate(prompt, assistant_model=draft, pacer="sd-fixed-3", pacer_draft_forward="lean",
                        max_new_tokens=5, do_sample=False)
    with pytest.raises(ValueError, match=r"pacer_draft_forward='fast': choose one of \('auto', 'lean', 'model'\)"):
        target.generate(prompt, assistant_model=draft, pacer="sd-fixed-3", pacer_draft_forward="fast",
                        max_new_tokens=5, do_sample=False)
