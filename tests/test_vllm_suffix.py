"""PacerLookupProposer's cache of earlier requests (pacer_hf/vllm/suffix_cache.py), on vLLM's side of the contract."""

from __future__ import annotations

import numpy as np
import pytest
from test_vllm_proposer import FakeEngine, linear_costs, vllm_config

from pacer_hf.vllm import PacerLookupProposer


def unique_text(seed: int, length: int = 200) -> list[int]:
    """No token repeats: a request's own text never proposes anything."""
    return [int(t) + 5 for t in np.random.default_rng(seed).permutation(2000)[:length]]


def serve(proposer: PacerLookupProposer, text: list[int], steps: int, prompt: int = 12) -> list[list[int]]:
    """One request alone for `steps` steps; its drafts."""
    engine = FakeEngine([text])
    engine.add(0, prompt)
    sampled, drafts = [[text[prompt]]], []
    for _ in range(steps):
        drafts.append(proposer.propose(sampled, np.array(engine.length), engine.buffer)[0])
        sampled = engine.step([drafts[-1]])
    return drafts


@pytest.mark.parametrize("setting", [None, True, {"max_tokens": 1000}, False])
def test_a_finished_request_feeds_the_next_one(setting):
    extra = {} if setting is None else {"pacer_hf": {"suffix_cache": setting}}
    proposer = PacerLookupProposer(vllm_config(k=6, extra=extra))
    proposer.costs = linear_costs(0.010, 0.00001)  # cheap drafts: the gate's rule lets them through
    text = unique_text(0)
    assert not any(serve(proposer, text, 30))  # nothing repeats within the request
    other = [t + 3000 for t in unique_text(1)]  # no token in common with the first request
    drafts = serve(proposer, other[:12] + text[:150], 20, prompt=14)  # the first request has left the batch
    if setting is False:
        assert proposer.suffix_cache is None and not any(drafts)
        return
    assert proposer.suffix_cache.rows_from_cache > 0 and any(drafts)
    assert proposer.stats.accepted > 0
    truth = other[:12] + text[:150]
    position = 15
    for draft in drafts:  # every draft is the continuation the earlier request wrote
        if draft:
            assert draft == truth[position:position + len(draft)] or draft[0] != truth[position]
        position = min(position + 1 + len(draft), len(truth))


def test_bad_cache_setting_names_the_keys():
    with pytest.raises(ValueError, match="max_requests"):
        PacerLookupProposer(vllm_config(extra={"pacer_hf": {"suffix_cache": {"size": 3}}}))


def test_bench_runs_the_proposer_with_and_without_its_cache():
    from pacer_hf.vllm.bench import METHODS, additional_config, speculative_config

    assert {"pacer", "pacer-fresh"} <= set(METHODS)
    assert speculative_config("pacer-fresh") == speculative_config("pacer")
    assert additional_config("pacer-fresh") == {"pacer_hf": {"suffix_cache": False}}
    assert additional_config("pacer") == {}


class _FakeLLM:
    """Stands in for vllm.LLM in the benchmark's worker: answers every prompt with its first four tokens and
    records which calls it served (a warm-up, requests alone, one-call batches)."""

    served: list[tuple[str, int]] = []

    def __init__(self, **kwargs):
        self.method = (kwargs["speculative_config"] or {}).get("method", "none")

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace

        _FakeLLM.served.append((self.method, len(prompts)))
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=p["prompt_token_ids"][:4])]) for p in prompts]

    def get_metrics(self):
        return []


@pytest.mark.parametrize("calls", [("alone",), ("batch",), ("alone", "batch")])
def test_bench_worker_serves_the_calls_asked_for(calls, tmp_path, monkeypatch):
    """--vllm-once runs the requests alone and the one-call batch on separate engines: the worker must serve
    exactly the calls it is given, every prompt once per pass."""
    import json
    import sys
    from types import SimpleNamespace

    from pacer_hf.vllm.bench import worker

    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(LLM=_FakeLLM, SamplingParams=lambda **kw: kw))
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    _FakeLLM.served = []
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]
    spec = {"methods": ["none", "ngram-3"], "model": str(tmp_path), "prompts": prompts, "runs": 1,
            "stats": {"none": str(tmp_path / "a"), "ngram-3": str(tmp_path / "b")}, "max_new_tokens": 4,
            "pacer_tokens": 10, "calls": list(calls)}
    results = worker(spec)
    timed_calls = _FakeLLM.served[2:]  # after one warm-up request per engine
    assert sum(n == 1 for _, n in timed_calls) == (6 if "alone" in calls else 0)
    assert sum(n == 3 for _, n in timed_calls) == (2 if "batch" in calls else 0)
    for result in results.values():
        assert len(result["batch_seconds"]) == (1 if "batch" in calls else 0)
        assert result["outputs"] == ([p[:4] for p in prompts] if "alone" in calls else [[], [], []])
