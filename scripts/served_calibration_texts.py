"""Texts like the benchmark's prompts, for calibrating the demo pair's pre-verifier on what is served.

Writes two JSONL files (`{"text": ...}` per line) of prompts of the four benchmark categories, built
by the benchmark's own prompt builders but never from its prompts: HumanEval tasks the benchmark never
picks (any --prompts up to 8) and the pair's *validation* split of stdlib files (the benchmark reads the
*test* split). The tasks and files are halved: `choose.jsonl` picks the setting, `report.jsonl` reports it.

    python scripts/served_calibration_texts.py --out /tmp/served
    pacer-hf collect --source /tmp/served/choose.jsonl --column text ...   (see docs/TRAINING.md)
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

from pacer_hf._paths import hub_cards_dir
from pacer_hf.data.prompts import boilerplate_texts, continuation_texts, docstring_texts, humaneval_texts


def bench_humaneval_indices(total: int, max_prompts: int = 8) -> set[int]:
    """Indices build_prompts can pick (evenly spaced, a too-short prompt replaced by the next ones)."""
    picked = set()
    for n in range(1, max_prompts + 1):
        step = total / n
        picked.update(int(i * step) + shift for i in range(n) for shift in range(3))
    return picked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", default=str(hub_cards_dir() / "demo-target"))
    args = parser.parse_args()
    splits = json.loads((Path(args.target) / "corpus_splits.json").read_text())
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [root / name for name in sorted(splits["validation"]) if (root / name).is_file()]
    tasks = humaneval_texts()
    served = [text for i, (_, text) in enumerate(tasks) if i not in bench_humaneval_indices(len(tasks))]
    halves = {"choose": (files[0::2], served[0::2]), "report": (files[1::2], served[1::2])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, (part_files, humaneval) in halves.items():
        texts = humaneval + [text for build in (continuation_texts, docstring_texts, boilerplate_texts)
                             for _, text in build(part_files)]
        with open(out / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            for text in texts:
                handle.write(json.dumps({"text": text}) + "\n")
        print(f"{out / name}.jsonl: {len(texts)} texts ({len(humaneval)} HumanEval, {len(part_files)} stdlib files)")


if __name__ == "__main__":
    main()
