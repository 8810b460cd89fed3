"""Opening rounds of the Qwen pair on requests neither its pre-verifier's training nor the benchmark saw.

The TRAIN split's requests past the prefix `pacer-hf build-qwen-coder` answered (`qwen_coder.PLAN`), the float32
target's greedy answers to them (first 32 tokens: an opening round drafts at most 24), and the int8 draft's traces
along them (`collect_along_answers`, 24-token rounds). Resumable: rerun to go on.

    OMP_NUM_THREADS=2 python docs/benchmarks/epyc_zen5/bound/opening_calibration/collect.py WORK
"""
import sys
from pathlib import Path

import torch

from pacer_hf.data.chat_prompts import chat_prompts
from pacer_hf.pairs import load_pair
from pacer_hf.recipes.qwen_coder import PLAN
from pacer_hf.training.collect_answers import collect_along_answers
from pacer_hf.training.fit_data import generate_answers

EXTRA = {"chat-humaneval": 40, "chat-docstring": 80, "chat-edit": 60}

work = Path(sys.argv[1])
torch.set_num_threads(2)
pair = load_pair("qwen2.5-coder")
prompts = []
for category, extra in EXTRA.items():
    for p in chat_prompts(pair.tokenizer, category, "train", n=PLAN[category] + extra)[PLAN[category]:]:
        prompts.append({"key": p.id, "category": category, "prompt": list(p.ids), "heldout": True})
print(len(prompts), "requests", {c: sum(p["category"] == c for p in prompts) for c in EXTRA})
answers = generate_answers(pair.target, pair.tokenizer, prompts, work / "answers.jsonl", max_new_tokens=32,
                           batch_size=8, budget_s=None, do_sample=False)
collect_along_answers(pair.draft, answers, work / "traces", max_draft_tokens=24, context=1024, batch_size=8,
                      teacher_forced=True, draft_name="qwen-coder-draft (int8)",
                      target_name="Qwen/Qwen2.5-Coder-1.5B-Instruct")
print("done")
