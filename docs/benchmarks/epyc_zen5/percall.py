"""examples/compare_stop_rules.py with every timed call logged: seconds, new tokens and, for pacer_hf calls, the
rounds (draft lengths, accepted tokens) and the costs that decided, one JSON line per call to $PERCALL_LOG.

    PERCALL_LOG=calls.jsonl python docs/benchmarks/epyc_zen5/percall.py <compare_stop_rules.py arguments>
"""
import json
import os
import runpy
import sys
import time

import pacer_hf.training.validate as validate
from pacer_hf.generation import last_stats

log = open(os.environ["PERCALL_LOG"], "w")
timed = validate.timed


def logged(call, device=None):
    began = time.time()
    elapsed, out = timed(call, device)
    pacer = call.keywords.get("pacer")
    record = {"t": began, "pacer": str(pacer)[:60], "seconds": elapsed, "prompt_len": call.args[0].shape[1],
              "new": out.shape[1] - call.args[0].shape[1]}
    stats = last_stats(call.func.__self__) if pacer not in (None, False) else None
    if stats is not None:
        record.update(draft_lengths=list(stats.draft_lengths), accepted=list(stats.accepted),
                      target_forwards=stats.target_forwards, draft_forwards=stats.draft_forwards,
                      pv_seconds=stats.preverifier_seconds, costs=stats.costs)
    log.write(json.dumps(record, default=str) + "\n")
    log.flush()
    return elapsed, out


validate.timed = logged
sys.argv = ["compare_stop_rules.py", *sys.argv[1:]]
runpy.run_path("examples/compare_stop_rules.py", run_name="__main__")
