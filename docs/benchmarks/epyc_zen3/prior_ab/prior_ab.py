"""A/B of the recent shares' prior in one interleaved run (greedy), at the commit in commit.txt, where the rule took a
known pair's long-run shares as its recent shares' prior (two counts; `t1_prior/` measured it at T = 1):
examples/compare_stop_rules.py, every call logged by percall.py, with the shipped pre-verifier and OLD-PRIOR, a copy of its folder whose
calls ran the rule as it was before (and is again: the change was reverted after this run), each recent share pulled
toward a half by one success and one failure and a known pair's call seeded with its long-run shares weighed as
MIN_TRIED judged tokens. Against today's code the patch below is a no-op.

    OLD_PRIOR=/tmp/OLD-PRIOR PERCALL_LOG=calls.jsonl python prior_ab.py hub_cards/qwen-coder-preverifier \
        /tmp/OLD-PRIOR --pair qwen2.5-coder --gammas 8 --prompts 3 --runs 1 --max-new-tokens 64 --out results.json
"""
import os
import runpy
import sys
from contextlib import contextmanager
from pathlib import Path

from pacer_hf.loops import recent_acceptance as ra

OLD = Path(os.environ["OLD_PRIOR"]).resolve()
state = {"old": False}
Recent = ra.RecentAcceptance
new_first, new_next, new_start, new_of = Recent.first_share, Recent.next_share, Recent.start_call, ra.SeparateMemories.of


def _half_prior(accepted, tried):
    return (accepted + 1) / (tried + 2)


def first_share(self):
    return _half_prior(self.first_accepted, self.first_tried) if state["old"] else new_first.fget(self)


def next_share(self):
    if state["old"]:
        return _half_prior(self.accepted - self.first_accepted, self.tried - self.first_tried)
    return new_next.fget(self)


def start_call(self):
    if not state["old"]:
        return new_start(self)
    if self.known:
        half = ra.MIN_TRIED / 2
        self.first_tried, self.first_accepted = half, self.long_first_share * (half + 2) - 1
        self.tried = ra.MIN_TRIED
        self.accepted = self.first_accepted + self.long_next_share * (half + 2) - 1
    else:
        self.tried = self.accepted = self.first_tried = self.first_accepted = 0.0
        self.skipped, self.probe_every = 0, ra.PROBE_EVERY


@contextmanager
def of(self, name):
    state["old"] = Path(name).resolve() == OLD
    try:
        with new_of(self, name):
            yield
    finally:
        state["old"] = False


Recent.first_share, Recent.next_share, Recent.start_call = property(first_share), property(next_share), start_call
ra.SeparateMemories.of = of
sys.argv = [sys.argv[0], *sys.argv[1:]]
runpy.run_path(str(Path(__file__).resolve().parents[2] / "epyc_zen5" / "percall.py"), run_name="__main__")
