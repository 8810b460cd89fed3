"""How often a round's first drafted token is accepted, against the tokens after it (given those before them were),
in the rounds recorded by earlier benchmark runs on this machine: `python docs/benchmarks/epyc_zen5/first_tokens/first_tokens.py`
writes first_tokens.json beside it. A round that drafted n and had m accepted judged its first token (accepted when
m > 0) and m + [m < n] - 1 later ones, m - 1 of them accepted."""

import json
from pathlib import Path

HERE = Path(__file__).parent
ZEN5 = HERE.parent
SOURCES = {  # pair: (calls file, strategies)
    "smollm2-int8": (ZEN5 / "default_preverifier/smol_int8_synced/calls.json", ("pacer-default", "sd-fixed-4")),
    "demo": (ZEN5 / "default_preverifier/demo_synced/calls.json", ("pacer", "sd-fixed-4")),
    "qwen2.5-coder": (ZEN5 / "greedy_generic_synced/calls.jsonl", ("PacerPreVerifier", "sd-fixed-4", "sd-fixed-8")),
}


def calls(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":  # percall.py's log: the strategy is the pre-verifier's repr or the setting's name
        return [dict(row, strategy=row["pacer"]) for row in map(json.loads, path.read_text().splitlines())]
    return json.loads(path.read_text())


def shares(rounds: list[tuple[int, int]]) -> dict:
    first = [0, 0]
    later = [0, 0]
    for drafted, accepted in rounds:
        if drafted == 0:
            continue
        first[0] += accepted > 0
        first[1] += 1
        later[0] += max(accepted - 1, 0)
        later[1] += accepted + (accepted < drafted) - 1
    return {"rounds": first[1], "first_token_accepted_ratio": round(first[0] / first[1], 3),
            "later_tokens_judged": later[1], "later_token_accepted_ratio": round(later[0] / later[1], 3)}


result = {}
for pair, (path, strategies) in SOURCES.items():
    rows = calls(path)
    for strategy in strategies:
        rounds = [(d, a) for row in rows if row["strategy"].startswith(strategy)
                  for d, a in zip(row.get("draft_lengths", []), row.get("accepted", []))]
        result[f"{pair} {strategy}"] = shares(rounds)
(HERE / "first_tokens.json").write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps(result, indent=1))
