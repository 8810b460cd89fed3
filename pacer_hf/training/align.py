"""Align a draft to its target with a LoRA adapter (knowledge distillation on target logits); report alpha.

A draft that imitates the target better gets more tokens accepted. The adapter (PEFT LoRA) trains
on KL(target || draft) over corpus windows while both base models stay frozen; acceptance alpha at
a fixed draft length is measured on held-out texts before and after. A `PeftModel` draft works
directly as `assistant_model` (retrain the pre-verifier on the aligned draft: its hidden states change).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from ..loading import check_pair, load_causal_lm, load_tokenizer
from .collect import CollectConfig, plan_units, propose_and_label
from .common import cli_errors
from .sources import load_texts


@torch.no_grad()
def measure_alpha(target: PreTrainedModel, draft: PreTrainedModel, token_ids: list[list[int]], gamma: int = 4,
                  positions_per_text: int = 8, context: int = 256, batch_size: int = 16, seed: int = 1) -> dict:
    """Greedy acceptance at fixed draft length gamma: alpha = accepted/drafted, and mean accepted per round."""
    config = CollectConfig(max_draft_tokens=gamma, positions_per_text=positions_per_text, context=context, seed=seed)
    units = plan_units(token_ids, config)
    if not units:
        raise ValueError("No evaluation text is long enough to measure alpha.")
    accepted = []
    for start in range(0, len(units), batch_size):
        chunk = units[start:start + batch_size]
        prefixes = [token_ids[t][max(0, p - context):p] for t, p in chunk]
        labels = propose_and_label(target, draft, prefixes, gamma)["labels_unmasked"]
        accepted.append(np.cumprod(labels > 0, axis=1).sum(1))
    accepted = np.concatenate(accepted)
    return {"alpha": float(accepted.mean() / gamma), "mean_accepted": float(accepted.mean()), "gamma": gamma,
            "rounds": int(len(accepted))}


def align_draft(draft: PreTrainedModel, target: PreTrainedModel, token_ids: list[list[int]], *, steps: int = 200,
                seq_len: int = 128, batch_size: int = 8, learning_rate: float = 1e-3, rank: int = 8,
                lora_alpha: int = 16, target_modules: str | list[str] = "all-linear", temperature: float = 1.0,
                seed: int = 0, progress: bool = True):
    """Wrap `draft` in a LoRA `PeftModel` and distil the target into it; returns the PeftModel (eval mode)."""
    from peft import LoraConfig, PeftModel, get_peft_model

    check_pair(target, draft)
    stream = torch.as_tensor([i for ids in token_ids for i in ids], dtype=torch.long)
    if len(stream) <= seq_len + 1:
        raise ValueError(f"The corpus has {len(stream)} tokens, fewer than seq_len={seq_len}; use more text.")
    torch.manual_seed(seed)
    if isinstance(draft, PeftModel):
        raise ValueError("draft is already a PeftModel; merge it (merge_and_unload) or align its base model.")
    modules = target_modules if target_modules == "all-linear" else list(target_modules)
    model = get_peft_model(draft, LoraConfig(r=rank, lora_alpha=lora_alpha, target_modules=modules,
                                             lora_dropout=0.0, task_type="CAUSAL_LM"))
    model.train()
    target.eval()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
    generator = torch.Generator().manual_seed(seed)
    bar = tqdm(range(steps), desc="align-draft", disable=not progress)
    for _ in bar:
        starts = torch.randint(0, len(stream) - seq_len, (batch_size,), generator=generator)
        batch = torch.stack([stream[s:s + seq_len] for s in starts]).to(draft.device)
        with torch.no_grad():
            teacher = F.log_softmax(target(input_ids=batch.to(target.device)).logits.float().to(draft.device)
                                    / temperature, -1)
        student = F.log_softmax(model(input_ids=batch).logits.float() / temperature, -1)
        loss = F.kl_div(student, teacher, log_target=True, reduction="batchmean") * temperature**2 / seq_len
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        bar.set_postfix(kl=f"{loss.item():.3f}")
    return model.eval()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--tokenizer", help="default: --target")
    parser.add_argument("--source", help="training texts: datasets name/path, .jsonl, folder")
    parser.add_argument("--file-list", help="training texts: file with one path per line")
    parser.add_argument("--column", default="text")
    parser.add_argument("--eval-source", help="held-out texts for alpha (default: the last 10%% of the texts)")
    parser.add_argument("--eval-file-list")
    parser.add_argument("--out", required=True, help="folder for the LoRA adapter (and alignment.json)")
    parser.add_argument("--merge", action="store_true", help="also save the merged draft to OUT/merged")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--lora-alpha", type=int, default=16)
    parser.add_argument("--target-modules", default="all-linear", help="'all-linear' or comma-separated names")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--gamma", type=int, default=4, help="draft length at which alpha is measured")
    parser.add_argument("--eval-positions", type=int, default=8, help="positions per held-out text for alpha")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32")


@cli_errors("align-draft")
def run(args: argparse.Namespace) -> int:
    tokenizer = load_tokenizer(args.tokenizer or args.target)
    texts = load_texts(args.source, column=args.column, file_list=args.file_list)
    if args.eval_source or args.eval_file_list:
        held = load_texts(args.eval_source, column=args.column, file_list=args.eval_file_list)
    else:
        cut = max(1, len(texts) // 10)
        if len(texts) < 2:
            raise ValueError("Pass --eval-source/--eval-file-list: one training text cannot be split for evaluation.")
        texts, held = texts[:-cut], texts[-cut:]
    train_ids = [tokenizer(t)["input_ids"] for t in texts]
    held_ids = [tokenizer(t)["input_ids"] for t in held]
    target = load_causal_lm(args.target, args.dtype)
    draft = load_causal_lm(args.draft, args.dtype)
    check_pair(target, draft, tokenizer)
    before = measure_alpha(target, draft, held_ids, args.gamma, args.eval_positions)
    modules = args.target_modules if args.target_modules == "all-linear" else args.target_modules.split(",")
    aligned = align_draft(draft, target, train_ids, steps=args.steps, seq_len=args.seq_len,
                          batch_size=args.batch_size, learning_rate=args.lr, rank=args.rank,
                          lora_alpha=args.lora_alpha, target_modules=modules, temperature=args.temperature,
                          seed=args.seed)
    after = measure_alpha(target, aligned, held_ids, args.gamma, args.eval_positions)
    out = Path(args.out)
    aligned.save_pretrained(str(out))
    result = {"before": before, "after": after, "steps": args.steps, "rank": args.rank, "draft": args.draft,
              "target": args.target}
    if args.merge:
        aligned.merge_and_unload().save_pretrained(str(out / "merged"))
        tokenizer.save_pretrained(str(out / "merged"))
    (out / "alignment.json").write_text(json.dumps(result, indent=2))
    print(f"alpha at gamma={args.gamma}: {before['alpha']:.3f} -> {after['alpha']:.3f} "
          f"(mean accepted {before['mean_accepted']:.2f} -> {after['mean_accepted']:.2f}, "
          f"{after['rounds']} held-out rounds); adapter saved to {out}")
    return 0
