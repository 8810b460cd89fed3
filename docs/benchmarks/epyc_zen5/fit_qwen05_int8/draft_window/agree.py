"""Teacher-forced agreement of the int8 draft with the 0.5B target's greedy answers (2 bench prompts a chat category,
64 tokens) when the draft reads only the last W prompt tokens (None: all): a cheaper draft prefill costs the draft
what it copies from the prompt.

    OMP_NUM_THREADS=2 python docs/benchmarks/epyc_zen5/fit_qwen05_int8/draft_window/agree.py TARGET DRAFT_FOLDER 2 agree.json
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pacer_hf.cheap_draft import apply_cheap_draft
from pacer_hf.data.chat_prompts import CHAT_CATEGORIES, chat_prompts

torch.set_num_threads(2)
T, D, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(T)
target = AutoModelForCausalLM.from_pretrained(T, dtype=torch.float32).eval()
draft = apply_cheap_draft(AutoModelForCausalLM.from_pretrained(D, dtype=torch.float32).eval(), D)
WINDOWS = [None, 512, 256, 128, 64, 32, 16]
out = {}
with torch.no_grad():
    for cat in CHAT_CATEGORIES:
        for i, p in enumerate(chat_prompts(tok, cat, "bench", n=N)):
            ids = torch.tensor([list(p.ids)])
            ans = target.generate(ids, max_new_tokens=64, do_sample=False)[0, ids.shape[1]:]
            row = {"prompt_tokens": ids.shape[1], "answer_tokens": len(ans)}
            for w in WINDOWS:
                ctx = ids if w is None else ids[:, -w:]
                seq = torch.cat([ctx, ans[None]], 1)
                pred = draft(seq).logits[0, ctx.shape[1] - 1 : -1].argmax(-1)
                agree = (pred == ans).tolist()
                # greedy rounds of 8 along the answer: accepted tokens per round
                pos, acc, rounds = 0, 0, 0
                while pos < len(agree):
                    k = 0
                    while k < 8 and pos + k < len(agree) and agree[pos + k]:
                        k += 1
                    rounds, acc, pos = rounds + 1, acc + k, pos + k + 1
                row[str(w)] = {"agree": round(sum(agree) / len(agree), 3),
                               "tokens_per_round": round(len(agree) / rounds, 2)}
            out[f"{cat}/{i}"] = row
            print(cat, i, json.dumps(row), flush=True)
json.dump(out, open(sys.argv[4], "w"), indent=1)
