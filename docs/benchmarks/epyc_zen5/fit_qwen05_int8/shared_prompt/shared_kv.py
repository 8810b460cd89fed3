"""Teacher-forced agreement of the int8 draft with the 0.5B target's greedy answers (2 bench prompts a chat category,
64 tokens) when the draft reads the prompt itself ("own") and when it starts from the target's keys and values for
the prompt ("target", what pacer_hf does for a draft that is a copy of its target; loops/shared_prompt.py):
`agree` the share of answer tokens that are the draft's argmax, `tokens_per_round` the tokens a fixed 8-token round
would produce along the answer.

    OMP_NUM_THREADS=2 python docs/benchmarks/epyc_zen5/fit_qwen05_int8/shared_prompt/shared_kv.py \
        TARGET DRAFT_FOLDER 2 shared_kv.json
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


def rounds(agree, k=8):
    pos = acc = r = 0
    while pos < len(agree):
        j = 0
        while j < k and pos + j < len(agree) and agree[pos + j]:
            j += 1
        r, acc, pos = r + 1, acc + j, pos + j + 1
    return round(len(agree) / r, 2)


out = {}
with torch.no_grad():
    for cat in CHAT_CATEGORIES:
        for i, p in enumerate(chat_prompts(tok, cat, "bench", n=N)):
            ids = torch.tensor([list(p.ids)])
            ans = target.generate(ids, max_new_tokens=64, do_sample=False)[0, ids.shape[1]:]
            L = ids.shape[1]
            row = {"prompt_tokens": L, "answer_tokens": len(ans)}
            for name, model in (("own", draft), ("target", target)):
                cache = model(ids[:, :-1], use_cache=True).past_key_values
                seq = torch.cat([ids[:, -1:], ans[None, :-1]], 1)
                pred = draft(seq, past_key_values=cache).logits[0].argmax(-1)
                agree = (pred == ans).tolist()
                row[name] = {"agree": round(sum(agree) / len(agree), 3), "tokens_per_round": rounds(agree)}
            out[f"{cat}/{i}"] = row
            print(cat, i, json.dumps(row), flush=True)
json.dump(out, open(sys.argv[4], "w"), indent=1)
