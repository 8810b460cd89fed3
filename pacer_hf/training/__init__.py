"""Train and fine-tune Pacer pre-verifiers for any (draft, target) pair: collect -> train -> calibrate.

    collect(target, draft, "traces", texts=texts, tokenizer=tok)      # resumable, sharded datasets.Dataset
    model, metrics = train_preverifier("traces", "pv")               # transformers.Trainer
    report = calibrate_preverifier(model, held_out, measure_costs(target, draft, model))
"""

from .align import align_draft, measure_alpha
from .calibrate import calibrate_preverifier, format_table, measure_costs, measure_loop_costs
from .collect import CollectConfig, collect, load_traces, propose_and_label, read_manifest
from .simulate import CostModel, best_setting, pacer_lengths, speedup, speedup_table
from .sources import load_texts
from .train import PacerTrainer, TraceCollator, auc_ece, predict_probs, split_by_text, train_preverifier

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
