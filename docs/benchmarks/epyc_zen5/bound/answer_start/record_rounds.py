"""Record, along Pacer's own calls on the Qwen pair, every round's pre-verifier logits with the rule never stopping
(fixed 24-token rounds scored by the shipped pre-verifier) and each round's accepted count, for an offline look at
what the pre-verifier predicts at an answer's start against later in it."""
import json
import sys

import torch

from pacer_hf.data.chat_prompts import chat_prompts
from pacer_hf.loops import stop_rule as sr
from pacer_hf.pairs import load_pair

torch.set_num_threads(1)
pair = load_pair("qwen2.5-coder")
n = int(sys.argv[1])  # requests per category
out = open(sys.argv[2], "w")
log = []
orig_add, orig_end = sr.PacerStopRule.add_token, sr.PacerStopRule.end_round
def add_token(self, *a, **k):
    orig_add(self, *a, **k)
    return False
def end_round(self, accepted, drafted, scores):
    log.append({"accepted": int(accepted), "drafted": int(drafted), "logits": [float(x) for x in self.token_logits]})
    return orig_end(self, accepted, drafted, scores)
sr.PacerStopRule.add_token, sr.PacerStopRule.end_round = add_token, end_round
for category in ("chat-humaneval", "chat-docstring", "chat-edit"):
    for i, p in enumerate(chat_prompts(pair.tokenizer, category, "bench", n=n)):
        log.clear()
        ids = torch.tensor([list(p.ids)])
        pair.target.generate(ids, assistant_model=pair.draft, pacer=True, max_new_tokens=64, do_sample=False)
        out.write(json.dumps({"category": category, "index": i, "rounds": list(log)}) + "\n")
        out.flush()
        print(category, i, [(r["drafted"], r["accepted"]) for r in log], flush=True)
