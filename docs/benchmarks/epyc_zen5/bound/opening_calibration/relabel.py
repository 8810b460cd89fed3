"""Opening rounds whose label flips from accept to reject at some position: is that the batched answer's numerics?
For each such round, one unbatched float32 target forward over prompt + answer[:j]: its argmax at the failed position
against the batched answer's token and the draft's token.

    OMP_NUM_THREADS=2 python docs/benchmarks/epyc_zen5/bound/opening_calibration/relabel.py WORK > relabel.json
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch

from pacer_hf.pairs import load_pair
from pacer_hf.training.traces import load_traces

WORK = Path(sys.argv[1])
torch.set_num_threads(2)
pair = load_pair("qwen2.5-coder")
answers = {}
for line in open(WORK / "answers.jsonl"):
    r = json.loads(line)
    answers[r["key"]] = r
data = load_traces(WORK / "traces")
loop = np.stack(data["loop_features"])
keys = list(answers)  # text_id order = answers order (collect keeps record order)
out = {"rounds": 0, "same_as_batched": 0, "equals_draft": 0, "neither": 0, "by_position": {}}
rows = [i for i in range(len(data)) if not loop[i].any()]
for i in rows:
    row = data[i]
    labels = row["labels"]
    j = next((k for k, label in enumerate(labels) if label == 0), None)
    if j is None:
        continue
    rec = answers[keys[row["text_id"]]]
    assert row["position"] == len(rec["prompt"]), (row["position"], len(rec["prompt"]))
    ids = torch.tensor([rec["prompt"] + rec["response"][:j]])
    with torch.no_grad():
        top = int(pair.target(ids).logits[0, -1].argmax())
    batched, drafted = rec["response"][j], row["draft_tokens"][j]
    out["rounds"] += 1
    kind = "same_as_batched" if top == batched else "equals_draft" if top == drafted else "neither"
    out[kind] += 1
    out["by_position"].setdefault(j + 1, {"same_as_batched": 0, "equals_draft": 0, "neither": 0})[kind] += 1

print(json.dumps(out, indent=1))
