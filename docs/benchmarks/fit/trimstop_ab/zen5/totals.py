"""totals.json: the trim-at-stop A/B on the Zen 5 EPYC. The two bench folders through ../../totals.py's arithmetic
(new tokens over seconds per strategy, per category and in total); the Qwen comparison from its results.json
(each category 3 x 64 tokens, so a setting's time is the sum of 1 / tokens_per_s).

    python docs/benchmarks/fit/trimstop_ab/zen5/totals.py
"""
import json
import subprocess
import sys
from pathlib import Path

here = Path(__file__).parent
subprocess.run([sys.executable, str(here.parent.parent / "totals.py"), str(here / "bench_totals.json"),
                str(here / "trimstop_smol"), str(here / "trimstop_demo")], check=True, capture_output=True)
out = json.loads((here / "bench_totals.json").read_text())
(here / "bench_totals.json").unlink()
r = json.loads((here / "trimstop_qwen" / "results.json").read_text())
shipped, trimstop = r["/tmp/s8/ab/qwen-shipped"], r["/tmp/s8/ab/qwen-trimstop"]
out["trimstop_qwen"] = {
    "trimstop_speedup_vs_shipped": {c: round(trimstop[c]["tokens_per_s"] / shipped[c]["tokens_per_s"], 3) for c in shipped},
    "trimstop_speedup_vs_shipped_total": round(sum(1 / v["tokens_per_s"] for v in shipped.values())
                                               / sum(1 / v["tokens_per_s"] for v in trimstop.values()), 3),
    "mean_draft": {name: {c: round(v[c]["mean_draft"], 2) for c in v} for name, v in (("shipped", shipped), ("trimstop", trimstop))},
}
(here / "totals.json").write_text(json.dumps(out, indent=1))
print(json.dumps({k: out[k].get("pacer_vs_pacer_default", out[k].get("trimstop_speedup_vs_shipped_total")) for k in out if k != "what"}))
