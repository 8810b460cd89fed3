"""Fit a pre-verifier for your own (target, draft) pair in one command: answers, traces, training, calibration.

    pacer-hf fit --target ORG/TARGET --draft ORG/DRAFT --out pv --budget-minutes 15
    pacer-hf bench --target ORG/TARGET --draft ORG/DRAFT --preverifier pv

Hub ids and local folders load as transformers loads them (the tokenizer from the target unless --tokenizer).
Rerun the same command after an interruption to resume. On a GPU (--device auto or cuda) the answers, the traces,
training and the calibration all run there. See docs/TRAINING.md.
"""

from __future__ import annotations

import argparse
import json

from .common import cli_errors


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, help="target model: Hub id or local folder")
    parser.add_argument("--draft", required=True, help="draft model: Hub id or local folder (same tokenizer)")
    parser.add_argument("--out", required=True, help="folder for the pre-verifier, its card and the resumable work")
    parser.add_argument("--tokenizer", help="tokenizer id or folder (default: the target's)")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="auto", help="dtype the pair serves in: auto (bfloat16 on CUDA, float32 "
                        "on CPU), float32, bfloat16, float16")
    parser.add_argument("--prompts", help="a .jsonl file of user requests (--prompt-column, default 'text'), a text "
                        "folder or a datasets name (--prompt-split); default: pacer_hf's mixed set")
    parser.add_argument("--prompt-column", default="text")
    parser.add_argument("--prompt-split", default="train")
    parser.add_argument("--budget-minutes", type=float, help="the whole command's wall-clock budget (default: none, "
                        "every prompt is answered)")
    parser.add_argument("--decoding", default="greedy", choices=("greedy", "sampling", "both"))
    parser.add_argument("--max-draft-tokens", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="length cap of the target's answers")
    parser.add_argument("--threads", type=int, help="torch threads (match how the pair will serve)")
    parser.add_argument("--push-to-hub", metavar="REPO", help="publish the pre-verifier (with its card) to this repo")
    parser.add_argument("--overwrite", action="store_true", help="delete --out first instead of resuming")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-progress", action="store_true")


@cli_errors("fit", "The finished stages are kept in --out: rerun the same command to resume.")
def run(args: argparse.Namespace) -> int:
    import torch

    from .fit import fit_preverifier

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.budget_minutes is not None and args.budget_minutes <= 0:
        raise ValueError(f"--budget-minutes {args.budget_minutes} must be positive.")
    fitted = fit_preverifier(
        args.target, args.draft, args.tokenizer, prompts=args.prompts, decoding=args.decoding,
        budget_s=None if args.budget_minutes is None else 60 * args.budget_minutes, output_dir=args.out,
        push_to_hub=args.push_to_hub, device=args.device, dtype=args.dtype, max_draft_tokens=args.max_draft_tokens,
        max_new_tokens=args.max_new_tokens, prompt_column=args.prompt_column, prompt_split=args.prompt_split,
        seed=args.seed, overwrite=args.overwrite, progress=not args.no_progress)
    fitted = fitted if isinstance(fitted, dict) else {args.decoding: fitted}
    for mode, preverifier in fitted.items():
        report = preverifier.fit_report
        summary = {"decoding": mode, "held-out AUC": round(report["auc"], 4), "held-out ECE": round(report["ece"], 4),
                   "seconds": report["total_seconds"], **(report["speed_check"] or {}).get("summary", {})}
        print(json.dumps(summary))
    print(f"saved to {args.out}; measure it: pacer-hf bench --target {args.target} --draft {args.draft} "
          f"--preverifier {args.out}")
    return 0
