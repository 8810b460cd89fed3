"""Run a short side-by-side generation demo (plain decoding, fixed-length SD, Pacer) and check outputs match.

Until the trained demo pair ships, the pair is built from configs: a target and a draft that is a
perturbed copy of it, so that part of each draft is accepted.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import pacer_hf
from pacer_hf import PacerPreVerifier


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=3, help="number of random prompts")
    parser.add_argument("--seed", type=int, default=0)


def build_config_pair(seed: int = 0) -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """A 4-layer target and a 1-layer draft that copies the target's embeddings and first layer."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(config).eval()
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(0.02 * torch.randn_like(param))
    return target, draft


def run(args: argparse.Namespace) -> int:
    target, draft = build_config_pair(args.seed)
    pacer_hf.enable(target)
    preverifier = PacerPreVerifier.from_draft(draft, block_size=2, threshold=0.3, max_draft_tokens=8)
    strategies = {"plain": None, "sd-fixed-4": "sd-fixed-4", "pacer (untrained)": preverifier}
    prompts = [torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(args.seed + i))
               for i in range(args.prompts)]
    rows = []
    reference = [target.generate(p, max_new_tokens=args.max_new_tokens, do_sample=False) for p in prompts]
    for name, pacer in strategies.items():
        start, tokens, forwards, drafted = time.perf_counter(), 0, 0, []
        for prompt, expected in zip(prompts, reference):
            kwargs = {"assistant_model": draft, "pacer": pacer} if pacer is not None else {}
            out = target.generate(prompt, max_new_tokens=args.max_new_tokens, do_sample=False, **kwargs)
            if not torch.equal(out, expected):
                raise SystemExit(f"{name}: output differs from plain greedy decoding (a bug; please report it)")
            tokens += out.shape[1] - prompt.shape[1]
            stats = pacer_hf.last_stats(target) if pacer is not None else None
            forwards += stats.target_forwards if stats else out.shape[1] - prompt.shape[1]
            drafted += stats.draft_lengths if stats else []
        seconds = time.perf_counter() - start
        rows.append((name, tokens / seconds, tokens / forwards, sum(drafted) / max(len(drafted), 1)))
    base = rows[0][1]
    print(f"{'strategy':<20}{'tokens/s':>10}{'speedup':>9}{'tau':>7}{'mean draft':>12}")
    for name, tps, tau, mean_draft in rows:
        print(f"{name:<20}{tps:>10.1f}{tps / base:>8.2f}x{tau:>7.2f}{mean_draft:>12.2f}")
    print("all outputs identical to plain greedy decoding")
    return 0
