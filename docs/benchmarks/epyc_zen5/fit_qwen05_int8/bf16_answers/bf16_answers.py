"""How often does a bfloat16 greedy answer (what `pacer-hf fit` traces rounds along when bfloat16 answers faster) leave
the float32 target's greedy path, the one the pair serves? One teacher-forced float32 forward over each answer.

    OMP_NUM_THREADS=2 python bf16_answers.py TARGET ANSWERS.jsonl N > bf16_answers.json
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM

torch.set_num_threads(2)
target = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
answers = [json.loads(line) for line in open(sys.argv[2])][: int(sys.argv[3])]
first, tokens, flips = [], 0, 0
for r in answers:
    ids = torch.tensor([r["prompt"] + r["response"]])
    with torch.no_grad():
        logits = target(ids).logits[0, len(r["prompt"]) - 1: -1]
    top = logits.argmax(-1).tolist()
    diff = [i for i, (a, b) in enumerate(zip(top, r["response"])) if a != b]
    first.append(diff[0] if diff else None)
    n = diff[0] + 1 if diff else len(top)
    tokens += n
    flips += bool(diff)
print(json.dumps({"answers": len(answers), "left_the_float32_path": flips,
                  "first_divergence": first, "tokens_on_path_incl_first_divergence": tokens}))
