"""Pacer's rounds against the stop-only oracle's, request by request, from a calls.jsonl that
docs/benchmarks/epyc_zen5/percall.py logged: python rounds.py greedy_generic/calls.jsonl [shipped|default] > rounds.json
("shipped": the pair's own pre-verifier, which reads the draft's hidden states; "default": pacer_hf's default one).

Every output of the run is the target's own, so both settings walk the same tokens. A Pacer round is "cut" when every
drafted token was accepted (the oracle drafts on to the first rejection or the cap), "overran" when it drafted two or
more tokens past the first rejection (the oracle stops one past it), "exact" otherwise; "plain" proposed nothing.
Each round is priced with the round costs the call decided with (`costs.table`, target steps), so the modelled time
of the two settings splits into what cut rounds cost (the rounds Pacer needed beyond the oracle's) and what overrun
tokens cost (their draft steps and the wider verify)."""
import json
import statistics
import sys
from collections import defaultdict

PREVERIFIERS = {"shipped": "PacerPreVerifier(\n  (hidden_proj)", "default": "PacerPreVerifier(\n  (feature_proj)"}
WARMUP_TOKENS = 4


def is_stop_only_oracle(name: str) -> bool:
    return name.startswith("OracleStopConfig") and "trim=False" in name and "curve=True" not in name


def calls(path: str) -> dict[str, list[dict]]:
    """The timed calls by setting; the untimed warm-up calls (4 new tokens each, one per setting and category) left out."""
    by_setting = defaultdict(list)
    for line in open(path):
        record = json.loads(line)
        if record["new"] > WARMUP_TOKENS:
            by_setting[record["pacer"]].append(record)
    return by_setting


def priced(call: dict, table: list[float]) -> float:
    return sum(table[min(k, len(table) - 1)] for k in call["draft_lengths"])


def kinds(call: dict) -> dict:
    out = defaultdict(int)
    for k, a in zip(call["draft_lengths"], call["accepted"]):
        out["plain" if k == 0 else "cut" if a == k else "overran" if k - a >= 2 else "exact"] += 1
    return out


def overrun_steps(call: dict, table: list[float]) -> float:
    """What the tokens drafted past one beyond the first rejection cost: the round priced as drafted, less the round
    priced as the oracle would have drafted it."""
    return sum(table[min(k, len(table) - 1)] - table[a + 1] for k, a in zip(call["draft_lengths"], call["accepted"])
               if k - a >= 2)


def main(path: str, which: str = "shipped") -> dict:
    settings = calls(path)
    pacer = next(v for k, v in settings.items() if k.startswith(PREVERIFIERS[which]))
    oracle = next(v for k, v in settings.items() if is_stop_only_oracle(k))
    rows = []
    for p, o in zip(pacer, oracle):
        if p["prompt_len"] != o["prompt_len"]:
            raise SystemExit("the two settings' calls do not line up")
        table = p["costs"]["table"]
        rows.append({
            "prompt_len": p["prompt_len"], "pacer_seconds": round(p["seconds"], 3), "oracle_seconds": round(o["seconds"], 3),
            "pacer_rounds": len(p["draft_lengths"]), "oracle_rounds": len(o["draft_lengths"]),
            "pacer_mean_draft": round(statistics.mean(p["draft_lengths"]), 2),
            "oracle_mean_draft": round(statistics.mean(o["draft_lengths"]), 2),
            "pacer_kinds": dict(kinds(p)),
            "pacer_priced_steps": round(priced(p, table), 2), "oracle_priced_steps": round(priced(o, table), 2),
            "pacer_overrun_steps": round(overrun_steps(p, table), 2),
            "pacer_draft_lengths": p["draft_lengths"], "pacer_accepted": p["accepted"],
            "oracle_draft_lengths": o["draft_lengths"], "oracle_accepted": o["accepted"],
        })
    total = {key: round(sum(r[key] for r in rows), 2) for key in
             ("pacer_seconds", "oracle_seconds", "pacer_rounds", "oracle_rounds", "pacer_priced_steps",
              "oracle_priced_steps", "pacer_overrun_steps")}
    counts = defaultdict(int)
    for r in rows:
        for kind, n in r["pacer_kinds"].items():
            counts[kind] += n
    total["pacer_kinds"] = dict(counts)
    gap = total["pacer_priced_steps"] - total["oracle_priced_steps"]
    total["priced_gap_steps"] = round(gap, 2)
    total["priced_gap_share_overrun"] = round(total["pacer_overrun_steps"] / gap, 3) if gap > 0 else None
    return {"what": __doc__.splitlines()[0], "preverifier": which, "total": total, "requests": rows}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:3]), indent=1))
