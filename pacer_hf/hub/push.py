"""Publish a saved pre-verifier folder to the Hub: weights, config, remote code and a generated model card.

The folder is re-loaded (safetensors only) and re-saved, so the repo holds exactly what loads:
model.safetensors, config.json with auto_map, configuration_pacer.py/modeling_pacer.py, README.md
(from hub_cards/templates/preverifier_card.md, numbers from config.calibration and pacer_metrics.json)
and pacer_metrics.json when present. Use --output-dir to build the repo locally without uploading.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .publish import build_preverifier_repo, push_preverifier


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path, help="folder written by PacerPreVerifier.save_pretrained")
    parser.add_argument("repo_id", help="Hub repo id, e.g. my-org/pacer-llama-68m")
    parser.add_argument("--revision", help="branch to push to (created from main if new)")
    parser.add_argument("--tag", help="tag the new commit")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--message", help="commit message")
    parser.add_argument("--license", default="apache-2.0", help="license in the card metadata")
    parser.add_argument("--dataset", action="append", dest="datasets", help="training dataset id (repeatable)")
    parser.add_argument("--custom-generate-repo", default="<org>/pacer",
                        help="the custom_generate repo the card's no-install example points to")
    parser.add_argument("--with-custom-generate", action="store_true",
                        help="also ship custom_generate/ in this repo (custom_generate=<this repo> then works)")
    parser.add_argument("--output-dir", type=Path, help="only build the repo into this folder; upload nothing")


def run(args: argparse.Namespace) -> int:
    card = {"license": args.license, "datasets": args.datasets, "custom_generate_repo": args.custom_generate_repo,
            "include_custom_generate": args.with_custom_generate}
    if args.output_dir is not None:
        out = build_preverifier_repo(args.folder, args.output_dir, repo_id=args.repo_id, **card)
        print(f"built {args.repo_id} in {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
        return 0
    info = push_preverifier(args.folder, args.repo_id, revision=args.revision, tag=args.tag,
                            private=args.private or None, commit_message=args.message, **card)
    print(f"pushed {args.repo_id}: {info.commit_url}")
    return 0
