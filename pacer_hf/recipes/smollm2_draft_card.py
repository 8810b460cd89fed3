"""The model card (README.md) of the SmolLM2 draft `pacer-hf build-draft` ships (smollm2_draft_train.stage_ship),
written from what the build measured."""

from __future__ import annotations

import json
from pathlib import Path


def write_card(path: Path, measured: dict) -> None:
    """README.md of the shipped draft, from what the build measured (work/measured.json)."""
    history = measured["agreement"]["history"]
    layers = measured["agreement"]["layers"]
    best = max(history, key=lambda h: h["agreement"])
    rows = "\n".join(f"| {h['elapsed'] / 60:.1f} | {h['step']} | {h['agreement']:.3f} |" for h in history)
    costs = measured.get("costs")
    e2e = measured.get("end_to_end")
    lines = [
        "---", "library_name: transformers", "base_model: HuggingFaceTB/SmolLM2-135M-Instruct",
        "tags: [speculative-decoding, draft-model, pacer-hf]", "---", "",
        "# A draft for SmolLM2-135M-Instruct", "",
        "A small `LlamaForCausalLM` for speculative decoding with SmolLM2-135M-Instruct as the target "
        "(`pacer_hf.pairs.load_pair(\"smollm2\").draft`). It shares the target's tokenizer and 49152-token "
        "vocabulary, so verification is exact: greedy output with it is identical to the target's.", "",
        "## What it is", "",
        f"- The target's embedding (tied to the `lm_head`, frozen), its layers {layers} copied as layers "
        f"0..{len(layers) - 1} and trained, and its final norm (trained): {measured['parameters'] / 1e6:.1f} M "
        f"parameters, {measured['size_mb']} MiB on disk in bfloat16.",
        "- Trained on the target's own greedy answers (on-policy) to TRAIN-split chat prompts of the six "
        "`pacer_hf.data.chat_prompts` categories: soft cross-entropy against the target's top-16 "
        "log-probabilities plus cross-entropy on its greedy token, teacher-forced, embedding and head frozen.",
        "", "## Greedy agreement on held-out answers", "",
        "Teacher-forced on the target's answers to held-out prompts (never trained on): how often the "
        "draft's top-1 is the target's greedy token.", "",
        "| training minutes | step | agreement |", "|---|---|---|", rows, "",
        f"Shipped: the best checkpoint, agreement **{best['agreement']:.3f}** after {best['elapsed'] / 60:.1f} "
        "minutes of training.", "",
    ]
    if costs:
        lines += ["## Cost", "",
                  f"One draft step through pacer_hf's drafting forward: {costs['draft_ms']} ms; one target "
                  f"step (1 token after a cached 128-token prefix): {costs['target_ms']} ms; **c = {costs['c']}**; "
                  f"a 4-token verification: {costs['verify4_ms']} ms (float32, 1 torch thread).", ""]
    if e2e:
        lines += ["## End to end", "",
                  "Greedy, 64 new tokens on 3 BENCH-split chat prompts, outputs asserted identical to plain decoding:",
                  "", "| strategy | tokens/s | speedup | τ | α |", "|---|---|---|---|---|"]
        for name, row in e2e.items():
            lines.append(f"| {name} | {row['tok_s']} | {row.get('speedup', 1.0)} | {row.get('tau', 1.0)} | "
                         f"{row.get('alpha', '')} |")
        lines.append("")
    lines += ["## Reproduce", "", "```bash",
              "OMP_NUM_THREADS=1 python -m pacer_hf.recipes.smollm2_draft --work-dir W --stage all  # resumable",
              "```", "", "(or one `--stage` at a time: responses, train, ship). Settings of the invocation that "
              f"shipped it: `{json.dumps(measured.get('command'))}`", ""]
    path.write_text("\n".join(lines))
