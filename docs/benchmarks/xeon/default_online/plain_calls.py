"""The noise floor of a bench folder: per category, the target alone's seconds over `pacer-default`'s in the calls
where pacer-default drafted nothing (the same plain steps as the target alone), beside the category totals.

    python docs/benchmarks/xeon/default_online/plain_calls.py FOLDER OUT.json
"""

import json
import sys
from collections import defaultdict

folder, out = sys.argv[1], sys.argv[2]
calls = json.load(open(f"{folder}/calls.json"))
alone = {(c["run"], c["prompt"]): c["seconds"] for c in calls if c["strategy"] == "ar"}
plain, every = defaultdict(lambda: [0.0, 0.0, 0]), defaultdict(lambda: [0.0, 0.0, 0])
for call in calls:
    if call["strategy"] != "pacer-default" or call["new_tokens"] < 2:
        continue
    key = (call["run"], call["prompt"])
    groups = [every[call["category"]], every["all"]]
    if sum(call["draft_lengths"]) == 0:
        groups += [plain[call["category"]], plain["all"]]
    for group in groups:
        group[0] += alone[key]
        group[1] += call["seconds"]
        group[2] += 1
result = {
    "what": "target-alone seconds over pacer-default seconds per category: in every call with at least 2 new tokens "
            "(every_call) and in the calls where pacer-default drafted nothing (plain_calls: the same work as the "
            "target alone, so their spread is the measurement's noise); calls counted beside each",
    "every_call": {k: {"vs_ar": round(a / p, 3), "calls": n} for k, (a, p, n) in every.items()},
    "plain_calls": {k: {"vs_ar": round(a / p, 3), "calls": n} for k, (a, p, n) in plain.items()},
}
json.dump(result, open(out, "w"), indent=1)
print(json.dumps(result, indent=1))
