"""Teacher-forced agreement of the int8 draft with the 0.5B target's greedy answers (2 bench prompts a chat category,
64 tokens) when the draft reads only the last W prompt tokens (None: all): a cheaper draft prefill costs the draft
what it copies from the prompt.

    OMP_NUM_THREADS=2 python docs/benchmarks/epyc_zen5/fit_qwen05_int8/draft_window/agree.py TARGET DRAFT_FOLDER 2 agree.json
"""
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from answers import answers, load, tokens_per_round  # noqa: E402

torch.set_num_threads(2)
tokenizer, target, draft = load(sys.argv[1], sys.argv[2])
WINDOWS = [None, 512, 256, 128, 64, 32, 16]
out = {}
with torch.no_grad():
    for cat, i, ids, ans in answers(tokenizer, target, int(sys.argv[3])):
        row = {"prompt_tokens": ids.shape[1], "answer_tokens": len(ans)}
        for w in WINDOWS:
            ctx = ids if w is None else ids[:, -w:]
            pred = draft(torch.cat([ctx, ans[None]], 1)).logits[0, ctx.shape[1] - 1 : -1].argmax(-1)
            agree = (pred == ans).tolist()
            row[str(w)] = {"agree": round(sum(agree) / len(agree), 3), "tokens_per_round": tokens_per_round(agree)}
        out[f"{cat}/{i}"] = row
        print(cat, i, json.dumps(row), flush=True)
json.dump(out, open(sys.argv[4], "w"), indent=1)
