"""Every decoder-only family transformers ships: exact with every strategy, or refused before generating.

Tiny random models of each family are built from its config (`families.tiny_model`), with attention windows
of 8 tokens where the family can window, and texts that run far past them. The battery (`families.BATTERY`:
fixed-length speculation, Pacer, Ouroboros, Pacer + Ouroboros, PEARL, Pacer + PEARL, prompt lookup, gated
lookup, transformers' own loop) must return the target's own greedy output, or refuse the call while
resolving it with an error that names the family. `scripts/family_sweep.py` runs the same battery over every
causal-LM family of the installed transformers (docs/FAMILIES.md).
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_lookup_gate, make_preverifier
from families import BATTERY, LOOKUP_PROMPT, Refused, noisy_copy, run_case, tiny_model, window_of
from helpers import PROMPT, exact_distributions, goodness_of_fit, sample_counts

import pacer_hf
from pacer_hf.loops.batch_cache import left_padded

# (family, what it brings) for the documentation and the test ids: windows, hybrids, ALiBi, parallel
# attention, soft-capping, MoE, MQA/GQA, latent attention, chunked attention.
SUPPORTED = {
    "llama": "full attention, GQA",
    "gpt2": "learned positions, fused QKV",
    "mistral": "sliding window on every layer",
    "mixtral": "sliding window + MoE",
    "qwen2": "sliding window from layer 1 on (use_sliding_window)",
    "qwen2_moe": "MoE, sliding and full layers",
    "qwen3": "QK norm, sliding window from layer 1 on",
    "qwen3_moe": "MoE with QK norm",
    "gemma": "GeGLU, scaled embeddings",
    "gemma2": "alternating sliding/full layers, logit soft-capping",
    "gemma3_text": "alternating sliding/full layers, local RoPE",
    "gemma3": "a multimodal model on a text prompt (transformers passes it empty image encodings)",
    "gemma4": "a multimodal model on a text prompt, per-layer input embeddings",
    "gemma4_text": "per-layer input embeddings, sliding/full layers",
    "gpt_neo": "alternating global/local attention layers",
    "llama4": "the text model under a multimodal config: chunked attention, MoE",
    "fuyu": "a multimodal model on a text prompt, partial rotary",
    "cohere2": "alternating sliding/full layers, parallel block",
    "phi3": "sliding window, fused QKV",
    "starcoder2": "sliding window, biases",
    "ministral": "sliding window",
    "olmo3": "alternating sliding/full layers",
    "smollm3": "NoPE layers, sliding window",
    "gpt_oss": "alternating sliding/full layers, attention sinks, MoE",
    "llama4_text": "chunked attention, MoE",
    "exaone4": "sliding/full layers",
    "gpt_neox": "parallel attention, partial rotary",
    "gptj": "parallel attention, interleaved rotary",
    "phi": "parallel attention, partial rotary",
    "codegen": "parallel attention, fused QKV",
    "falcon": "parallel attention, MQA",
    "bloom": "ALiBi",
    "mpt": "ALiBi",
    "gpt_bigcode": "MQA",
    "opt": "learned positions with offset",
    "olmo2": "post-norm, QK norm",
    "olmoe": "MoE",
    "cohere": "parallel block, logit scale",
    "granite": "scaled residuals and logits",
    "stablelm": "partial rotary",
    "deepseek_v3": "latent attention (MLA), MoE",
    "jetmoe": "mixture of attention heads",
}
# Families pacer_hf refuses, with the words the refusal must contain.
REFUSED = {
    "rwkv": "takes no cache",
    "qwen3_next": "recurrent state",
    "inkling_text": "cannot roll back",
    "olmo_hybrid": "recurrent state",
    "bert": "is_decoder",
    "electra": "is_decoder",
    "openai-gpt": "takes no cache",
    "moshi": "differ from a forward over the whole text",
}
NEW_TOKENS = 30  # past every window: prompts of 12 tokens, windows of 8


@pytest.fixture(scope="module")
def family():
    """(target, draft) per family, built once: an enabled target with a lookup gate, a noisy draft with a
    pre-verifier whose blocks both pass and fail."""
    made = {}

    def make(name: str):
        if name not in made:
            target = tiny_model(name)
            draft = noisy_copy(target)
            pacer_hf.enable(target)
            pacer_hf.attach(target, make_lookup_gate(target))
            pacer_hf.attach(draft, make_preverifier(draft, block_size=2, threshold=0.5, max_draft_tokens=6))
            made[name] = target, draft
        return made[name]

    return make


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_family_battery_is_exact(family, name):
    target, draft = family(name)
    expected = target.generate(LOOKUP_PROMPT, max_new_tokens=NEW_TOKENS, do_sample=False, pacer=None)
    window = window_of(target)
    assert window is None or window < LOOKUP_PROMPT.shape[1] + NEW_TOKENS
    proposed = 0
    for label, pacer, kwargs in BATTERY:
        out = run_case(target, draft, pacer, LOOKUP_PROMPT, NEW_TOKENS, **kwargs)
        assert torch.equal(out, expected), f"{name}: {label} differs from the target alone"
        proposed += sum(pacer_hf.last_stats(target).draft_lengths or [0])
    assert proposed > 0, "the strategies must have proposed tokens for the check to mean much"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_family_is_refused_before_generating(family, name):
    target, draft = family(name)
    for label, pacer, kwargs in BATTERY:
        with pytest.raises(Refused, match=REFUSED[name]) as refusal:
            run_case(target, draft, pacer, LOOKUP_PROMPT, NEW_TOKENS, **kwargs)
        assert name in str(refusal.value), f"{label}: the refusal must name the family"


# Batches: the windowed families whose own left-padded batched generate equals their single-prompt output
# (gemma2 in float64 is not one: transformers' eager soft-capped attention turns fully masked padding rows into
# NaN there, so it is checked in float32).
BATCH_FAMILIES = {"mistral": None, "qwen2": None, "gemma3_text": None, "phi3": None, "starcoder2": None,
                  "cohere2": None, "gemma2": torch.float32, "llama": None}


@pytest.mark.parametrize("name", sorted(BATCH_FAMILIES))
def test_left_padded_batch_equals_batched_generate(name):
    target = tiny_model(name, dtype=BATCH_FAMILIES[name])
    draft = noisy_copy(target)
    pacer_hf.enable(target)
    pacer_hf.attach(draft, make_preverifier(draft, block_size=2, threshold=0.5, max_draft_tokens=6))
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 96, (n,), generator=generator).tolist() for n in (5, 11, 3)]
    ids, mask = left_padded(prompts, 0, "cpu")
    kwargs = {"attention_mask": mask, "max_new_tokens": NEW_TOKENS, "do_sample": False, "pad_token_id": 0}
    expected = target.generate(ids, pacer=None, **kwargs)
    for strategy in ("sd-fixed-3", "pacer", "pacer+ouroboros"):
        for cache_mode in ("mask", "compact"):
            out = target.generate(ids, assistant_model=draft, pacer=strategy, pacer_batch_cache=cache_mode, **kwargs)
            assert torch.equal(out, expected), f"{name}: {strategy} ({cache_mode}) differs from batched generate"


def test_chunked_attention_batch_is_refused_before_generating():
    target = tiny_model("llama4_text")
    draft = noisy_copy(target)
    pacer_hf.enable(target)
    ids, mask = left_padded([[1, 2, 3], [4, 5, 6, 7]], 0, "cpu")
    with pytest.raises(ValueError, match="chunked attention"):
        target.generate(ids, attention_mask=mask, max_new_tokens=4, assistant_model=draft, pacer="sd-fixed-3")


# One chi-square per family class: the pair's sampled first two tokens follow the target's own distribution,
# with windows of 4 tokens so that the 9-token texts pass them.
SAMPLING = {"mistral": "sliding window", "gemma3_text": "sliding/full hybrid", "qwen2_moe": "MoE",
            "bloom": "ALiBi", "gpt_neox": "parallel attention"}


@pytest.mark.parametrize("name", sorted(SAMPLING))
def test_family_sampling_distribution(name):
    target = tiny_model(name, vocab_size=10, sliding_window=4) if window_of(tiny_model(name)) else tiny_model(
        name, vocab_size=10)
    draft = noisy_copy(target, noise=0.3)
    pacer_hf.enable(target)
    pacer_hf.attach(draft, make_preverifier(draft, block_size=2, threshold=0.3, max_draft_tokens=4))
    p1, p12 = (p.double() / p.double().sum() for p in exact_distributions(target))
    first, joint, accepted = sample_counts(target, draft, "pacer", seed=0, samples=1200)
    assert 0 < sum(accepted), "drafts must be partly accepted for the test to mean much"
    assert goodness_of_fit(first, p1) > 1e-3
    assert goodness_of_fit(joint, p12) > 1e-3
    assert PROMPT.shape[1] + 4 > (window_of(target) or 0)


def test_windowed_cache_rolls_back_behind_its_last_crop():
    """A sliding-window layer rolled back past its last crop (Ouroboros dropping a trimmed block, then the
    next round dropping rejected tokens) gives the states a fresh forward over the kept text gives."""
    from pacer_hf._hf_compat import CACHE_KWARG, crop_cache, new_cache, output_cache

    model = tiny_model("mistral")
    text = torch.randint(0, 96, (1, 40), generator=torch.Generator().manual_seed(0))
    cache = new_cache(model.config)
    with torch.no_grad():
        model(input_ids=text[:, :30], use_cache=True, **{CACHE_KWARG: cache})
        crop_cache(cache, 27)  # past the window of 8: the layer keeps its window plus a margin
        model(input_ids=text[:, 27:29], use_cache=True, **{CACHE_KWARG: cache})
        crop_cache(cache, 28)
        crop_cache(cache, 25)  # behind the last crop
        got = model(input_ids=text[:, 25:26], use_cache=True, **{CACHE_KWARG: cache}).logits[0, -1]
        fresh = output_cache(model(input_ids=text[:, :25], use_cache=True))
        want = model(input_ids=text[:, 25:26], use_cache=True, **{CACHE_KWARG: fresh}).logits[0, -1]
    torch.testing.assert_close(got, want)
    long_text = torch.randint(0, 96, (1, 120), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(input_ids=long_text, use_cache=True, **{CACHE_KWARG: cache})
    crop_cache(cache, 144)
    layer = cache.layers[0]
    assert layer.keys.shape[-2] == layer.sliding_window - 1 + 64  # memory stays bounded
    with pytest.raises(RuntimeError, match="cannot roll back"):
        crop_cache(cache, 10)  # further back than any state it kept
