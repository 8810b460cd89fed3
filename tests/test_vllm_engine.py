"""PacerLookupProposer inside vLLM on the demo target (the vLLM lane: `make test-vllm`; skipped without vLLM).

Each engine runs in a process of its own (vLLM's engine holds process-wide state), greedy, float32, and is
compared with vLLM without speculation: single requests, a batch, and a batch whose requests finish at
different steps. A proposer that cannot start is reported by vLLM with the proposer's own message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm")

from pacer_hf._paths import hub_cards_dir  # noqa: E402
from pacer_hf.vllm import GATE_ENV, PROPOSER_PATH, STATS_ENV  # noqa: E402

TARGET = hub_cards_dir() / "demo-target"
PACER = {"method": "custom_class", "model": PROPOSER_PATH, "num_speculative_tokens": 10}
SCRIPT = textwrap.dedent("""
    import json, sys
    from vllm import LLM, SamplingParams
    if __name__ == "__main__":
        spec = json.load(open(sys.argv[1]))
        llm = LLM(model=spec["model"], dtype="float32", max_model_len=1024, enforce_eager=True, seed=0,
                  speculative_config=spec["speculative_config"])
        out = {}
        for name, (prompts, max_tokens) in spec["calls"].items():
            params = [SamplingParams(temperature=0.0, max_tokens=m) for m in max_tokens]
            results = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            out[name] = [list(r.outputs[0].token_ids) for r in results]
        json.dump(out, open(sys.argv[2], "w"))
""")


def run_engine(tmp_path, speculative_config, calls, env=None):
    script, spec, result = tmp_path / "engine.py", tmp_path / "spec.json", tmp_path / "out.json"
    script.write_text(SCRIPT)
    spec.write_text(json.dumps({"model": str(TARGET), "speculative_config": speculative_config, "calls": calls}))
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})}
    process = subprocess.run([sys.executable, str(script), str(spec), str(result)], capture_output=True, text=True,
                             env=environment, timeout=600)
    return process, (json.loads(result.read_text()) if process.returncode == 0 else None)


@pytest.fixture(scope="module")
def calls():
    from transformers import AutoTokenizer

    from pacer_hf.data.prompts import build_prompts

    tokenizer = AutoTokenizer.from_pretrained(TARGET)
    prompts, _ = build_prompts(["stdlib-continuation", "docstring-to-body", "boilerplate"],
                               lambda text: tokenizer(text)["input_ids"], 2, prompt_tokens=200, target_dir=TARGET)
    ids = [list(p.ids) for ps in prompts.values() for p in ps]
    return {"alone-0": ([ids[0]], [48]), "alone-1": ([ids[3]], [48]), "batch": (ids, [48] * len(ids)),
            "staggered": (ids, [4, 48, 12, 48, 1, 30])}  # requests that finish while others continue


@pytest.fixture(scope="module")
def plain(calls, tmp_path_factory):
    process, out = run_engine(tmp_path_factory.mktemp("plain"), None, calls)
    assert process.returncode == 0, process.stderr[-3000:]
    return out


def test_greedy_outputs_equal_vllm_without_speculation(calls, plain, tmp_path):
    stats = tmp_path / "stats.json"
    process, out = run_engine(tmp_path, PACER, calls, env={STATS_ENV: str(stats)})
    assert process.returncode == 0, process.stderr[-3000:]
    assert out == plain
    lengths = [len(o) for o in out["staggered"]]
    assert lengths[:4] == [4, 48, 12, 48] and all(n <= m for n, m in zip(lengths, calls["staggered"][1]))
    counters = json.loads(stats.read_text())
    assert counters["proposed"] > 0 and counters["accepted"] > 0  # it did speculate, and drafts were accepted
    assert counters["timed_steps"] > 0 and counters["step_costs"]  # costs measured in this engine


def test_a_proposer_that_cannot_start_is_reported(calls, tmp_path):
    missing = tmp_path / "no-such-gate"
    process, _ = run_engine(tmp_path, PACER, {"alone-0": calls["alone-0"]}, env={GATE_ENV: str(missing)})
    assert process.returncode != 0
    log = process.stdout + process.stderr  # vLLM logs its workers' errors to stdout
    assert "cannot load the lookup gate" in log and GATE_ENV in log and "no config.json" in log
