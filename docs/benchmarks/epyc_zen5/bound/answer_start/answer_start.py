"""What the shipped Qwen2.5-Coder greedy pre-verifier predicts at an answer's start against later in it, from
`rounds.jsonl` (record_rounds.py: the 9 timed requests of docs/benchmarks/epyc_zen5/greedy_generic_split, every round
drafted to 24 tokens and scored, the rule never stopping). Per position j of a round, over the rounds whose tokens
before j were accepted: the mean predicted acceptance of token j and the share accepted, for a call's first round
(round 0) and the others; and where the shipped rule (block size 1, stop-only) would end each first round under the
round costs that run measured, against the tokens the target accepted.

    python docs/benchmarks/epyc_zen5/bound/answer_start/answer_start.py
"""
import json
from pathlib import Path

from pacer_hf.modeling_pacer import acceptance_probability as sigmoid
from pacer_hf.modeling_pacer import rows_continue

HERE = Path(__file__).parent
CALLS = HERE.parents[1] / "greedy_generic_split" / "calls.jsonl"
table = next(json.loads(line)["costs"]["table"] for line in CALLS.open()
             if '"costs": {' in line and json.loads(line)["new"] == 64)


def rule_stops_at(logits: list[float]) -> int:
    """Where the shipped expected-gain rule (block size 1, stop-only, 24-token cap) ends the round under `table`: the
    package's own `modeling_pacer.rows_continue`, asked after each drafted token."""
    probs = [sigmoid(x) for x in logits]
    cap = len(table) - 1
    for n in range(1, min(len(probs), cap) + 1):
        if not rows_continue([probs[:n]], [True], 1, cap, table.__getitem__):
            return n
    return min(len(probs), cap)


positions = {"first round": {}, "later rounds": {}}
first_rounds = []
for line in (HERE / "rounds.jsonl").open():
    call = json.loads(line)
    drafted_rounds = [r for r in call["rounds"] if r["drafted"]]
    for index, r in enumerate(drafted_rounds):
        kind = "first round" if index == 0 else "later rounds"
        for j, logit in enumerate(r["logits"][: r["accepted"] + 1][:8]):
            cell = positions[kind].setdefault(j + 1, [0, 0.0, 0])
            cell[0] += 1
            cell[1] += sigmoid(logit)
            cell[2] += j < r["accepted"]
        if index == 0:
            first_rounds.append({"category": call["category"], "request": call["index"], "accepted": r["accepted"],
                                 "drafted": r["drafted"], "rule_stops_at": rule_stops_at(r["logits"]),
                                 "predicted": [round(sigmoid(x), 3) for x in r["logits"][:8]]})
out = {"table": table,
       "by_position": {kind: {j: {"rounds": n, "mean_predicted": round(p / n, 3), "accepted_share": round(a / n, 3)}
                              for j, (n, p, a) in sorted(cells.items())} for kind, cells in positions.items()},
       "first_rounds": first_rounds}
(HERE / "answer_start.json").write_text(json.dumps(out, indent=1) + "\n")
print(json.dumps(out["by_position"], indent=1))
for row in first_rounds:
    print(row)
