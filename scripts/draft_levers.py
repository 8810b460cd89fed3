"""The Qwen2.5-Coder pair's draft step under each precision and int8 kernel engine, against the target's step and
a 9-token verify in float32 and bfloat16: one torch thread, a 128-token cached context, interleaved medians.

    OMP_NUM_THREADS=1 python scripts/draft_levers.py docs/benchmarks/qwen_coder/draft_levers/levers.json

The draft step goes through the forward pacer_hf's drafting loop uses (`draft_step_timer`). torch's int8 engine is
process-wide state, so each int8 variant is packed and run under its engine and the default is put back after.
"""

from __future__ import annotations

import copy
import json
import sys

import torch

from pacer_hf.cheap_draft import quantize_linears
from pacer_hf.costs.measure import cached_forward_timer, interleaved
from pacer_hf.loops.draft_forwards import draft_step_timer
from pacer_hf.pairs import load_pair

CONTEXT, REPEATS = 128, 9


def int8_draft(draft, engine: str):
    """A timer of `draft` with int8 linears (head included) packed and run by `engine`'s kernels."""
    default = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        step = draft_step_timer(quantize_linears(copy.deepcopy(draft), include_head=True), CONTEXT)
    finally:
        torch.backends.quantized.engine = default

    def call() -> float:
        torch.backends.quantized.engine = engine
        try:
            return step()
        finally:
            torch.backends.quantized.engine = default

    return call


def main() -> None:
    torch.set_num_threads(1)
    pair = load_pair("qwen2.5-coder", cheap_draft=False)
    target, draft = pair.target, pair.draft
    bf16 = copy.deepcopy(target).to(torch.bfloat16)
    runs = {"target fp32 step": cached_forward_timer(target, 1, CONTEXT, logits_to_keep=1),
            "target fp32 verify 9": cached_forward_timer(target, 9, CONTEXT),
            "target bf16 step": cached_forward_timer(bf16, 1, CONTEXT, logits_to_keep=1),
            "target bf16 verify 9": cached_forward_timer(bf16, 9, CONTEXT),
            "draft fp32": draft_step_timer(draft, CONTEXT),
            "draft bf16": draft_step_timer(copy.deepcopy(draft).to(torch.bfloat16), CONTEXT)}
    for engine in ("x86", "fbgemm", "onednn"):
        if engine in torch.backends.quantized.supported_engines:
            runs[f"draft int8 ({engine} kernels)"] = int8_draft(draft, engine)
    medians = interleaved(runs, REPEATS, progress=False)
    step = medians["target fp32 step"]
    out = {"torch": torch.__version__, "threads": 1, "context": CONTEXT, "repeats": REPEATS,
           "ms": {k: round(1000 * v, 1) for k, v in medians.items()},
           "x_target_fp32_step": {k: round(v / step, 3) for k, v in medians.items()}}
    print(json.dumps(out, indent=1))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as handle:
            json.dump(out, handle, indent=1)


if __name__ == "__main__":
    main()
