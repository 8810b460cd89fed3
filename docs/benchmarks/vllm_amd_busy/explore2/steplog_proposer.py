"""Experiment: PacerLookupProposer (no cache) that drafts on every other clean step only and logs every step's
(rows, drafted tokens, seconds) so drafted and plain steps at the same row count can be compared side by side."""
import atexit
import json
import os
import time

from pacer_hf.vllm.proposer import PacerLookupProposer


class Alternate(PacerLookupProposer):
    def __init__(self, vllm_config, gate=None):
        super().__init__(vllm_config, gate)
        self.suffix_cache = None
        self.log = []
        self._prev = None  # (rows, proposed) of the last call
        self._t = None
        self._n = 0
        atexit.register(self.dump)

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        now = time.perf_counter()
        prefill = any(not s for s in sampled_token_ids)
        if self._prev is not None and not prefill:
            self.log.append((self._prev[0], self._prev[1], now - self._t, self._prev[2]))
        drafts = super().propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings)
        self._n += 1
        rows = sum(1 for s in sampled_token_ids if s)
        if self._n % 2 == 0:
            drafts = [[] for _ in drafts]
            self._pending_tokens = rows if self._pending_tokens is not None else None
            for entry in self._rows.values():
                entry.proposed = 0
        self._prev = (rows, sum(len(d) for d in drafts), prefill)
        self._t = time.perf_counter()
        return drafts

    def dump(self):
        path = os.environ.get("STEPLOG", "/tmp/ab/steplog.json")
        with open(path + f".{os.getpid()}", "w") as f:
            json.dump(self.log, f)
