"""Tiny models built from configs (no downloads) for the peer suite.

Exactness tests run in float64: batched verification and one-token decoding then agree to ~1e-15,
so a mismatch with plain greedy decoding is a logic bug, never a numerical near-tie.
"""

from __future__ import annotations

import copy
import functools
import os

# No test may need the network (CI has none): offline, a test that reached for the Hub fails at once instead of
# waiting out huggingface_hub's retries. Set before transformers is imported, which reads it then. The Hub tests
# run their clients against a local server, each with its own environment (test_hub.py).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import pacer_hf
from pacer_hf import PacerPreVerifier

# Tiny models are fastest on one intra-op thread, and OpenMP spin-waiting makes 2 threads up to
# 40x slower when the cores are shared (measured on the 2-core dev machine).
torch.set_num_threads(1)

ARCHITECTURES = ("llama", "gpt2", "qwen2")
DRAFT_KINDS = ("copy", "noisy", "random")
NO_SPECIAL_TOKENS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def build_model(arch: str, vocab_size: int = 96, hidden: int = 32, layers: int = 2, seed: int = 0):
    """A small random causal LM; initializer_range is large so greedy choices are decisive."""
    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             initializer_range=0.3, **NO_SPECIAL_TOKENS)
        model = LlamaForCausalLM(config)
    elif arch == "gpt2":
        config = GPT2Config(vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=4, n_positions=256,
                            initializer_range=0.3, **NO_SPECIAL_TOKENS)
        model = GPT2LMHeadModel(config)
    elif arch == "qwen2":
        config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             initializer_range=0.3, **NO_SPECIAL_TOKENS)
        model = Qwen2ForCausalLM(config)
    else:
        raise ValueError(arch)
    return model.eval()


def build_draft(target, kind: str, seed: int = 1, noise: float = 0.03):
    """`copy`: identical weights (everything accepted); `noisy`: perturbed copy (partly accepted);
    `random`: an unrelated, narrower model of the same architecture and vocabulary (rarely accepted)."""
    if kind == "random":
        arch = {"llama": "llama", "gpt2": "gpt2", "qwen2": "qwen2"}[target.config.model_type]
        return build_model(arch, vocab_size=target.config.vocab_size, hidden=16, layers=1, seed=seed).to(target.dtype)
    draft = copy.deepcopy(target)
    if kind == "noisy":
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in draft.parameters():
                param.add_(noise * param.std() * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return draft.eval()


@functools.cache
def _pair(arch: str, kind: str, dtype: torch.dtype):
    target = build_model(arch).to(dtype)
    return target, build_draft(target, kind)


@pytest.fixture
def pair():
    """pair(arch, kind, dtype) -> (enabled target, draft); cached across tests (models are read-only)."""

    def make(arch: str = "llama", kind: str = "noisy", dtype: torch.dtype = torch.float64):
        target, draft = _pair(arch, kind, dtype)
        pacer_hf.enable(target)
        return target, draft

    return make


@pytest.fixture(scope="module")
def sampling_pair():
    """A float64 pair over a 10-token vocabulary whose noisy draft is partly accepted under sampling."""
    from helpers import VOCAB

    target = build_model("llama", vocab_size=VOCAB, hidden=32, seed=3).double()
    draft = build_draft(target, "noisy", noise=0.3)
    pacer_hf.enable(target)
    return target, draft


def make_preverifier(draft, seed: int = 0, **overrides) -> PacerPreVerifier:
    """An untrained pre-verifier whose random logits vary a lot, so blocks both pass and fail."""
    torch.manual_seed(seed)
    overrides.setdefault("initializer_range", 0.5)
    return PacerPreVerifier.from_draft(draft, **overrides).eval()


def make_lookup_gate(target, seed: int = 0, **overrides) -> pacer_hf.PacerLookupGate:
    """An untrained lookup gate whose random scores vary a lot, so it proposes all, some or none of a match."""
    torch.manual_seed(seed)
    overrides.setdefault("initializer_range", 1.0)
    overrides.setdefault("max_lookup_tokens", 6)
    if overrides.get("decision_rule") == "expected_gain":
        overrides.setdefault("round_cost", [1.0 + 0.1 * k for k in range(overrides["max_lookup_tokens"] + 1)])
    config = pacer_hf.PacerLookupGateConfig(vocab_size=target.get_output_embeddings().weight.shape[0], **overrides)
    return pacer_hf.PacerLookupGate(config).to(target.dtype).eval()


def plain_greedy(target, prompt, **kwargs):
    """The reference: the target alone, through transformers' plain generate."""
    return target.generate(prompt, do_sample=False, pacer=None, **kwargs)


def logits_processor_case(target, prompt_ids) -> tuple[dict, torch.Tensor]:
    """generate kwargs with repetition penalty and min_new_tokens, the EOS being a token the target
    would otherwise emit early; returns them with the target's own output under those settings."""
    free = plain_greedy(target, prompt_ids, max_new_tokens=10, repetition_penalty=1.5)
    eos = int(free[0, prompt_ids.shape[1] + 1])
    kwargs = {"max_new_tokens": 20, "repetition_penalty": 1.5, "min_new_tokens": 6, "eos_token_id": eos,
              "pad_token_id": eos}
    expected = plain_greedy(target, prompt_ids, **kwargs)
    assert expected.shape[1] >= prompt_ids.shape[1] + 6, "min_new_tokens must be what keeps generation going"
    return kwargs, expected
