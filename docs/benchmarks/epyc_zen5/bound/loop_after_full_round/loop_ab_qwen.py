"""A/B on the Qwen pair: the loop features after a round that stopped with every drafted token accepted.
Shipped: [accepted / max, 0, confidence] (in training that means "missed at accepted + 1"). Variants:
"full": [1, 1, confidence] (no miss seen); "carry": the last loop features that saw a miss or a full round,
confidence updated. Every call logged (rounds) to argv[2]."""
import json
import sys

import loop_variants  # noqa: F401  (installs the readings compared; this folder is on sys.path)
import torch

import pacer_hf
import pacer_hf.training.validate as validate
from pacer_hf.data.chat_prompts import chat_prompts
from pacer_hf.generation import last_stats
from pacer_hf.pairs import load_pair

torch.set_num_threads(1)
pair = load_pair("qwen2.5-coder")
variants = sys.argv[3].split(",") if len(sys.argv) > 3 else ["full"]

settings = {"shipped": pair.preverifier}
for v in variants:
    pv = pacer_hf.PacerPreVerifier.from_pretrained("hub_cards/qwen-coder-preverifier")
    pv._loop_variant = v
    settings[v] = pv
log = open(sys.argv[2], "w")
timed = validate.timed
def logged(call, device=None):
    elapsed, out = timed(call, device)
    pacer = call.keywords.get("pacer")
    name = next((k for k, v in settings.items() if v is pacer), str(pacer)[:20])
    rec = {"setting": name, "seconds": elapsed, "new": out.shape[1] - call.args[0].shape[1]}
    stats = last_stats(call.func.__self__) if pacer not in (None, False) else None
    if stats is not None:
        rec.update(draft_lengths=list(stats.draft_lengths), accepted=list(stats.accepted))
    log.write(json.dumps(rec) + "\n")
    log.flush()
    return elapsed, out
validate.timed = logged
n = int(sys.argv[1])
for category in ("chat-humaneval", "chat-docstring", "chat-edit"):
    ids = [list(p.ids) for p in chat_prompts(pair.tokenizer, category, "bench", n=n)]
    rows = validate.compare_in_generate(pair.target, pair.draft, ids, settings, 1, 64, warmup=True)
    print(category, {k: (round(v["vs_ar"], 3), round(v["mean_draft"], 2)) for k, v in rows.items()}, flush=True)
