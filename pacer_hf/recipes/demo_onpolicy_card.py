"""The model card of the demo draft that stage `onpolicy` fits and ships (recipes/demo_onpolicy.py): every number
from the stage's report.json."""

from __future__ import annotations


def draft_card(report: dict) -> str:
    """The model card of the fitted draft; every number from the stage's report.json."""
    before, after, data = report["before"], report["after"], report["data"]
    best = max(report["history"], key=lambda h: h["agreement"])
    greedy, sampled = data["responses.jsonl"], data["responses_sampled.jsonl"]
    rows = "\n".join(f"| {h['elapsed'] / 60:.1f} | {h['step']} | {h['agreement']:.3f} |" for h in report["history"])

    def line(name: str, m: dict) -> str:
        r = m["rounds_at_cap"]
        return (f"| {name} | {m['agreement_greedy_path']:.3f} | {r['mean']:.2f} | {m['decode_step_ms']['draft']} | "
                f"{m['decode_step_ms']['target']} | {m['c']} |")

    return f"""---
library_name: transformers
license: apache-2.0
pipeline_tag: text-generation
tags:
- pacer_hf
- speculative-decoding
- demo-draft
datasets:
- python-stdlib (local, see corpus_splits.json)
---
# pacer_hf demo draft

The draft half of pacer_hf's embedded demo pair: a 1-layer Llama ({report['parameters']:,} parameters) with the
tokenizer of its partner `demo-target`, trained on the Python standard library and then fitted to the target
on the target's own text (on-policy distillation, as in DistillSpec). It exists so that `pacer-hf demo` runs
speculative decoding on a real pair offline; it is a toy, not a useful code model.

## Fitted to its target

The target wrote greedy answers ({greedy['answers']:,} answers, {greedy['tokens']:,} tokens) and T = 1 answers
({sampled['answers']:,}, {sampled['tokens']:,} tokens) of at most {after['new_tokens']} tokens to prompts from
TRAIN-split files only (function signatures with docstrings, literal tables, windows of library code, and
`def test_` windows of stdlib test suites the benchmark never samples), keeping its top-32 log-probabilities at
every step. The draft (all weights) was trained on them for {report['train_minutes']:g} minutes: soft
cross-entropy against the target's top-32 distribution plus cross-entropy on the target's token, AdamW lr
{report['lr']}. Answers of one prompt in ten are held out; the checkpoint with the best held-out agreement ships.

| training minutes | step | held-out agreement |
|---|---|---|
{rows}

Shipped: agreement {best['agreement']:.3f} after {best['elapsed'] / 60:.1f} minutes.

## Measured on HumanEval prompts (never trained on)

Greedy agreement along the target's own greedy path ({after['prompts']}, {after['new_tokens']} new tokens,
teacher-forced), mean accepted draft tokens per round of {after['rounds_at_cap']['cap']} drafted tokens
(HumanEval/0..19), decode step of each model (1 token after a cached 128-token prefix, float32,
{after['torch_threads']} torch thread(s), lowest median of interleaved rounds):

| draft | agreement | mean accepted at γ = {after['rounds_at_cap']['cap']} | draft ms | target ms | c |
|---|---|---|---|---|---|
{line("before fitting", before)}
{line("shipped", after)}

Rebuilt with:

```
{report['command']}
```

Load with `AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)`.
"""
