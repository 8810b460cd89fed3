"""The Qwen pair's int8 draft two ways (issue 52 item 7): torch.ao's `quantize_dynamic` (what
`cheap_draft.quantize_linears` ships) against torchao's `quantize_` with int8 dynamic activations and int8
per-channel weights, every linear and the head: bare step time (1 thread, 128-token cached context, interleaved
medians) and greedy agreement with the target's answers (the draft recipe's measure, teacher-forced).

    PYTHONPATH=<torchao installed here> OMP_NUM_THREADS=1 python scripts/draft_int8_torchao.py \
        --answers runs/curve_replay/answers.json --out docs/benchmarks/qwen_coder/draft_levers/torchao.json

The step goes through the forward the drafting loop would take (`draft_step_timer`: the lean forward where the
draft passes its check, else its own forward) and, for every variant, through the model's own forward. torchao's
int8 weights need two accommodations in the lean forward, made here for the measurement only (`positional_projection`,
`check_lean`): what moving the lever would also change in `loops/lean_draft.py`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import time

import torch
import torch.nn.functional as F
from torch import nn

from pacer_hf.cheap_draft import quantize_linears
from pacer_hf.costs import cpu_name
from pacer_hf.costs.measure import cached_forward_timer, interleaved
from pacer_hf.loops import lean_draft
from pacer_hf.loops.draft_forwards import draft_step_timer
from pacer_hf.pairs import load_pair
from pacer_hf.recipes.smollm2_draft_train import agreement

CONTEXT = 128


def torchao_int8(draft: nn.Module) -> nn.Module:
    """int8 weights (one scale per output channel) and int8 activations quantized per token at each call, every
    nn.Linear including the head: torchao's counterpart of torch.ao's per-channel dynamic qconfig."""
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(draft, Int8DynamicActivationInt8WeightConfig(), filter_fn=lambda m, _: isinstance(m, nn.Linear))
    return draft


def positional_projection(module: nn.Module):
    """The lean forward's projection with F.linear's weight passed positionally: torchao's Int8Tensor dispatch reads
    it from args[1], so `lean_draft._projection`'s keyword call fails on it (an IndexError inside torchao)."""
    if type(module) is nn.Linear:
        weight, bias = module.weight, module.bias
        return lambda x: F.linear(x, weight, bias)
    return module


def check_lean(draft: nn.Module) -> str | None:
    """The lean forward's check for a torchao-quantized draft, at the bound it keeps for torch.ao's int8 (its
    weights are tensors, so the lean forward takes it for a float draft and holds it to 1e-4); None: it passes,
    and `draft_step_timer` then times the lean forward."""
    lean = lean_draft.LeanDraft(draft)
    lean.tolerance = lean_draft._QUANTIZED_TOLERANCE
    reason = lean._mismatch(draft)
    lean_draft._CHECKED.setdefault(draft, {})[(lean.dtype, lean.device)] = reason
    return reason


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", required=True, help="the target's answers (scripts/curve_replay.py writes them)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import torchao

    uptime_start = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    pair = load_pair("qwen2.5-coder", cheap_draft=False)
    lean_draft._projection = positional_projection  # the same call for every variant (float and torch.ao alike)
    variants = {"float32": pair.draft,
                "torch.ao quantize_dynamic (shipped)": quantize_linears(copy.deepcopy(pair.draft), include_head=True),
                "torchao quantize_ int8 dynamic": torchao_int8(copy.deepcopy(pair.draft))}
    lean = {name: lean_draft.LeanDraft.for_model(model, CONTEXT + 2)[1] for name, model in list(variants.items())[:2]}
    lean["torchao quantize_ int8 dynamic"] = check_lean(variants["torchao quantize_ int8 dynamic"])
    runs = {"target step": cached_forward_timer(pair.target, 1, CONTEXT, logits_to_keep=1)}
    for name, model in variants.items():
        runs[f"{name}: loop forward"] = draft_step_timer(model, CONTEXT)
        runs[f"{name}: model forward"] = cached_forward_timer(model, 1, CONTEXT, logits_to_keep=1)
    medians = interleaved(runs, args.repeats, progress=False)
    records = json.loads(open(args.answers).read())
    step = medians["target step"]
    result = {
        "command": f"OMP_NUM_THREADS=1 python scripts/draft_int8_torchao.py --answers {args.answers} --out {args.out}",
        "machine": {"cpu": cpu_name(), "logical_cpus": os.cpu_count(), "torch_threads": 1, "torch": torch.__version__,
                    "torchao": torchao.__version__},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "uptime_start": uptime_start,
        "answers": f"{len(records)} target answers ({sum(len(r['response']) for r in records)} tokens) from {args.answers}",
        "target_step_ms": round(1000 * step, 2),
        "variants": {},
    }
    for name, model in variants.items():
        result["variants"][name] = {
            "loop_forward_ms": round(1000 * medians[f"{name}: loop forward"], 2),
            "model_forward_ms": round(1000 * medians[f"{name}: model forward"], 2),
            "x_target_step": round(medians[f"{name}: loop forward"] / step, 4),
            "lean_forward": lean[name] is None, "lean_refused_because": lean[name],
            "agreement": round(agreement(model, records), 4),
        }
        print(name, result["variants"][name], flush=True)
    result["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
