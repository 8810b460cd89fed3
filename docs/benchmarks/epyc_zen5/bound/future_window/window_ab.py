"""A/B: the rule's estimate of the tokens not drafted yet from the last 3 drafted tokens (`window.py`), against the
shipped rule, interleaved in one process. argv: pair (qwen2.5-coder | a target folder), draft folder (for a folder
target), calls log.

    OMP_NUM_THREADS=1 python docs/benchmarks/epyc_zen5/bound/future_window/window_ab.py qwen2.5-coder - qwen15_calls.jsonl
    OMP_NUM_THREADS=1 python docs/benchmarks/epyc_zen5/bound/future_window/window_ab.py \
        ~/.cache/pacer_hf/qwen2.5-coder/draft DRAFT_FOLDER qwen05_calls.jsonl
    (DRAFT_FOLDER: the 0.5B files with docs/benchmarks/epyc_zen5/fit_qwen05_int8/cheap_draft.json beside them)
"""
import sys
from pathlib import Path

import window  # this folder is on sys.path when the script runs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ab_calls  # noqa: E402  (the folder above)

window.install()
ab_calls.run_ab(sys.argv, "window-3", "_future_window")
