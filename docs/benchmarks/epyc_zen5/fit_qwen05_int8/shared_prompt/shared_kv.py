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
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from answers import answers, load, tokens_per_round  # noqa: E402

torch.set_num_threads(2)
tokenizer, target, draft = load(sys.argv[1], sys.argv[2])
out = {}
with torch.no_grad():
    for cat, i, ids, ans in answers(tokenizer, target, int(sys.argv[3])):
        row = {"prompt_tokens": ids.shape[1], "answer_tokens": len(ans)}
        for name, model in (("own", draft), ("target", target)):
            cache = model(ids[:, :-1], use_cache=True).past_key_values
            seq = torch.cat([ids[:, -1:], ans[None, :-1]], 1)
            pred = draft(seq, past_key_values=cache).logits[0].argmax(-1)
            agree = (pred == ans).tolist()
            row[name] = {"agree": round(sum(agree) / len(agree), 3), "tokens_per_round": tokens_per_round(agree)}
        out[f"{cat}/{i}"] = row
        print(cat, i, json.dumps(row), flush=True)
json.dump(out, open(sys.argv[4], "w"), indent=1)
