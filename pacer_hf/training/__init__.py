"""Train and fine-tune Pacer pre-verifiers for any (draft, target) pair: collect -> train -> calibrate.

    collect(target, draft, "traces", texts=texts, tokenizer=tok)      # resumable, sharded datasets.Dataset
    model, metrics = train_preverifier("traces", "pv")               # transformers.Trainer
    report = calibrate_preverifier(model, held_out, measure_costs(target, draft, model))
"""

import importlib
from typing import TYPE_CHECKING

from .collect import collect, propose_and_label
from .simulate import CostModel, best_setting, pacer_lengths, speedup, speedup_table
from .sources import load_texts
from .traces import CollectConfig, load_traces, read_manifest

# The modules that need transformers.Trainer are imported on first use (PEP 562), so the benchmark's
# cost model (`pacer_hf.training.simulate`) does not load the Trainer stack.
_LAZY = {
    "align": ["align_draft", "measure_alpha"],
    "calibrate": ["calibrate_preverifier", "format_table", "measure_costs", "measure_loop_costs"],
    "train": ["PacerTrainer", "TraceCollator", "auc_ece", "predict_probs", "split_by_text", "train_preverifier"],
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}

if TYPE_CHECKING:
    from .align import align_draft, measure_alpha
    from .calibrate import calibrate_preverifier, format_table, measure_costs, measure_loop_costs
    from .train import PacerTrainer, TraceCollator, auc_ece, predict_probs, split_by_text, train_preverifier


def __getattr__(name: str):
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "CollectConfig",
    "CostModel",
    "PacerTrainer",
    "TraceCollator",
    "align_draft",
    "auc_ece",
    "best_setting",
    "calibrate_preverifier",
    "collect",
    "format_table",
    "load_texts",
    "load_traces",
    "measure_alpha",
    "measure_costs",
    "measure_loop_costs",
    "pacer_lengths",
    "predict_probs",
    "propose_and_label",
    "read_manifest",
    "speedup",
    "speedup_table",
    "split_by_text",
    "train_preverifier",
]
