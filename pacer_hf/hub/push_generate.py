"""Publish the pacer `custom_generate` repo, so `generate(custom_generate=<repo>, trust_remote_code=True)` runs pacer_hf.

The repo is generated from this installed pacer_hf (custom_generate/generate.py from
pacer_hf/hub/hub_generate.py, the modules it imports copied next to it, requirements.txt and a
README.md from hub_cards/). Use --output-dir to build it locally without uploading.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .publish import build_custom_generate_repo, push_custom_generate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repo_id", help="Hub repo id, e.g. my-org/pacer")
    parser.add_argument("--revision", help="branch to push to (created from main if new)")
    parser.add_argument("--tag", help="tag the new commit")
    parser.add_argument("--private", action="store_true", help="create the repo private")
    parser.add_argument("--message", help="commit message")
    parser.add_argument("--output-dir", type=Path, help="only build the repo into this folder; upload nothing")


def run(args: argparse.Namespace) -> int:
    if args.output_dir is not None:
        out = build_custom_generate_repo(args.output_dir, repo_id=args.repo_id)
        print(f"built {args.repo_id} in {out}")
        return 0
    info = push_custom_generate(args.repo_id, revision=args.revision, tag=args.tag, private=args.private or None,
                                commit_message=args.message)
    print(f"pushed {args.repo_id}: {info.commit_url}")
    return 0
