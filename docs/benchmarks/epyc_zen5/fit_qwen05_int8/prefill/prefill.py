"""What a speculative call pays before its first token: the 0.5B target's forward over a chat prompt (float32) against
its int8 draft's (the same files made cheap as cheap_draft.json says), medians of 5, 1 thread, one bench prompt of
each category.

    OMP_NUM_THREADS=1 python docs/benchmarks/epyc_zen5/fit_qwen05_int8/prefill/prefill.py TARGET DRAFT_FOLDER > prefill.json
"""
import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pacer_hf.cheap_draft import apply_cheap_draft
from pacer_hf.data.chat_prompts import CHAT_CATEGORIES, chat_prompts

torch.set_num_threads(1)
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
target = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
draft = apply_cheap_draft(AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32).eval(), sys.argv[2])


@torch.no_grad()
def seconds(model, ids: torch.Tensor, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model(ids, use_cache=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


rows = {}
for category in CHAT_CATEGORIES:
    ids = torch.tensor([list(chat_prompts(tokenizer, category, "bench", n=1)[0].ids)])
    full, cheap = seconds(target, ids), seconds(draft, ids)
    rows[category] = {"prompt_tokens": ids.shape[1], "target_s": round(full, 3), "draft_s": round(cheap, 3),
                      "draft_over_target": round(cheap / full, 3)}
print(json.dumps(rows, indent=1))
