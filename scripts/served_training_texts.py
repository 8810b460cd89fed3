"""Training texts like the benchmark's prompts, for the demo pair's pre-verifier (docs/TRAINING.md §5.4).

Writes two JSONL files (`{"text": ...}` per line), never from the benchmark's own prompts or files:
- `train.jsonl`: the benchmark's prompt builders over a sample of the pair's *train* split of stdlib files
  (continuation and literal-table texts, 800 docstring-to-body texts), plus the HumanEval tasks of the
  "choose" half of `served_calibration_texts.py` (repeated 4 times: the collector draws other positions);
- `boilerplate.jsonl`: `def test_` windows and literal tables from the stdlib's `test/test_*.py` files outside
  the tenth the benchmark reads (the pair's corpus splits hold no test files).

    python scripts/served_training_texts.py --out /work/served-train
"""

from __future__ import annotations

import argparse
import json
import random
import sysconfig
from pathlib import Path

from served_calibration_texts import bench_humaneval_indices

from pacer_hf._paths import hub_cards_dir
from pacer_hf.data.prompts import (
    boilerplate_texts,
    continuation_texts,
    docstring_texts,
    humaneval_texts,
    stdlib_test_files,
)


def write(path: Path, texts: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({"text": text}) + "\n")
    print(f"{path}: {len(texts)} texts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--target", default=str(hub_cards_dir() / "demo-target"))
    parser.add_argument("--train-files", type=int, default=300, help="train-split files sampled")
    args = parser.parse_args()
    root = Path(sysconfig.get_paths()["stdlib"])
    splits = json.loads((Path(args.target) / "corpus_splits.json").read_text())
    train = sorted(splits["train"])
    random.Random(1).shuffle(train)
    files = [root / name for name in train[: args.train_files] if (root / name).is_file()]
    tasks = humaneval_texts()
    served = [text for i, (_, text) in enumerate(tasks) if i not in bench_humaneval_indices(len(tasks))]
    docstrings = random.Random(0).sample([text for _, text in docstring_texts(files)], 800)
    texts = served[0::2] * 4 + [text for _, text in continuation_texts(files)] + docstrings
    texts += [text for _, text in boilerplate_texts(files)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write(out / "train.jsonl", texts)
    benchmark = set(stdlib_test_files())
    tests = [path for path in sorted((root / "test").glob("test_*.py")) if path not in benchmark]
    boilerplate = [text for _, text in boilerplate_texts(tests)]
    random.Random(0).shuffle(boilerplate)
    write(out / "boilerplate.jsonl", boilerplate[:450])


if __name__ == "__main__":
    main()
