"""`PacerLookupProposer`: prompt-lookup drafts for vLLM, as many per request as the lookup gate expects to pay.

vLLM imports the class named in `speculative_config={"method": "custom_class", "model":
"pacer_hf.vllm.PacerLookupProposer", "num_speculative_tokens": K}` in its worker process, builds it with
the engine's `VllmConfig` and, after every step, calls `propose(sampled_token_ids, num_tokens_no_spec,
token_ids_cpu)`: one list of draft tokens per batch row back, of any length up to K (empty: no speculation
for that row). vLLM verifies them as it verifies its own n-gram drafts, so outputs are vLLM's.

Each step: for every decoding row, the earlier occurrence of its last n-gram and the gate's log-odds for the
up to K tokens that followed it (`kernels.lookup_logits`: the search, features and gate of
`generate(prompt_lookup_num_tokens=N, pacer=True)`, compiled), recalibrated to the acceptances this engine
has seen (`loops/online_calibration.py`), then one choice for the whole batch (`kernels.best_prefixes`) under the
step-cost curve this engine measured (`StepCosts`): a draft token is proposed only while it adds more
expected tokens than the step time it adds, so a busy engine proposes fewer.

What vLLM does not hand a proposer, and what stands in for it: request ids (a row is followed across steps
by its first `SIGNATURE_TOKENS` tokens, its length and its last token; two requests share that key only with
the same opening, length and last token, and then only their prompt lengths mix), prompt lengths (a row's
length when first seen, minus its one sampled token), the target's probability of its last token (the gate's
confidence feature is set to `CONFIDENCE`) and whether the request samples (scored as greedy).
"""

from __future__ import annotations

import atexit
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..costs.step_costs import StepCosts
from ..loops.online_calibration import OnlineCalibration
from ..modeling_lookup_gate import PacerLookupGate
from .kernels import CompiledGate
from .suffix_cache import ProposerCache, cache_settings

GATE_ENV = "PACER_HF_VLLM_GATE"  # a lookup gate folder or Hub id; else additional_config["pacer_hf"]["gate"]
STATS_ENV = "PACER_HF_VLLM_STATS"  # a JSON file the proposer keeps its counters and cost curve in
CONFIDENCE = 0.9  # the gate's confidence input: vLLM gives a proposer no target probabilities
SIGNATURE_TOKENS = 8
STATS_EVERY = 64  # steps between stats-file writes (and one at exit)


@dataclass
class _Row:
    prompt_length: int
    proposed: int = 0  # drafts proposed for this row at the last step
    batch: int = 0  # decoding rows of that step
    logits: np.ndarray | None = None  # the gate's log-odds of those drafts (for the calibration's labels)
    text: np.ndarray | None = None  # the row's text (with the suffix cache: added to it when the row leaves)


@dataclass
class ProposerStats:
    steps: int = 0
    rows: int = 0
    proposed: int = 0
    accepted: int = 0
    propose_seconds: float = 0.0
    timed_steps: int = 0
    step_seconds: float = 0.0
    proposed_by_batch: dict = field(default_factory=dict)  # decoding rows of a step -> drafts proposed in it
    accepted_by_batch: dict = field(default_factory=dict)  # -> those of them the target accepted

    def as_dict(self, costs: StepCosts, calibration: OnlineCalibration) -> dict:
        out = {k: v for k, v in self.__dict__.items() if not k.endswith("_by_batch")}
        for name in ("proposed_by_batch", "accepted_by_batch"):
            out[name] = {str(k): v for k, v in sorted(getattr(self, name).items())}
        out["acceptance"] = self.accepted / self.proposed if self.proposed else None
        out["proposer_share_of_step"] = (self.propose_seconds / self.steps) / (self.step_seconds / self.timed_steps) \
            if self.steps and self.timed_steps else None
        out["step_costs"] = {str(n): v for n, v in costs.table().items()}
        out["calibration"] = {"scale": calibration.scale, "shift": calibration.shift, "labels": calibration.labels}
        return out


def _load_gate(vllm_config) -> PacerLookupGate:
    extra = getattr(vllm_config, "additional_config", None) or {}
    source = os.environ.get(GATE_ENV) or (extra.get("pacer_hf", {}) if isinstance(extra, dict) else {}).get("gate")
    if source is None:
        from ..attached import default_lookup_gate

        return default_lookup_gate()
    where = f"(from ${GATE_ENV} or additional_config['pacer_hf']['gate'])"
    local = Path(source).expanduser()
    if (local.is_absolute() or source.startswith(".")) and not (local / "config.json").is_file():
        raise ValueError(f"PacerLookupProposer: cannot load the lookup gate {source!r} {where}: no config.json there; "
                         "name a folder written by PacerLookupGate.save_pretrained or a Hub id.")
    try:
        gate = PacerLookupGate.from_pretrained(source)
    except (OSError, ValueError) as error:
        raise ValueError(f"PacerLookupProposer: cannot load the lookup gate {source!r} {where}: {error}") from error
    return gate.eval()


class PacerLookupProposer:
    """vLLM `custom_class` proposer: gated prompt lookup with costs from the running engine (module docstring)."""

    def __init__(self, vllm_config, gate: PacerLookupGate | None = None):
        spec = vllm_config.speculative_config
        self.max_tokens = int(spec.num_speculative_tokens)
        if self.max_tokens < 1:
            raise ValueError(f"PacerLookupProposer: num_speculative_tokens must be >= 1; got {self.max_tokens}.")
        self.gate = gate if gate is not None else _load_gate(vllm_config)
        self.scored = min(self.max_tokens, self.gate.config.max_lookup_tokens)
        self.max_ngram = int(self.gate.config.max_ngram_size)
        self.feature_tokens = int(self.gate.config.max_lookup_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        max_rows = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", None) or 256
        self.compiled = CompiledGate(self.gate.scorer(), int(max_rows), self.scored)
        self.compiled.warm_up(self.max_ngram, self.feature_tokens)  # compile now, not in a step
        self.costs = StepCosts()
        self.calibration = OnlineCalibration()
        self.calibration.fit()  # loads numpy's linear algebra now, not in a step (no labels yet: the gate as trained)
        self.stats = ProposerStats()
        settings = cache_settings(vllm_config)  # earlier requests' text (suffix_cache.py), on unless turned off
        self.suffix_cache = ProposerCache(settings, self.gate.scorer()) if settings is not None else None
        self._rows: dict[tuple, _Row] = {}
        self._pending_tokens: int | None = None  # tokens the next step verifies, when it is a clean decode step
        self._last_return: float | None = None
        self._stats_path = os.environ.get(STATS_ENV)
        if self._stats_path:
            atexit.register(self.write_stats)

    def load_model(self, *args, **kwargs) -> None:
        """No model: the gate is loaded in __init__."""

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings=None) -> list[list[int]]:
        start = time.perf_counter()
        rows: list[tuple[tuple, _Row] | None] = []
        decoding, clean = 0, True
        for i, sampled in enumerate(sampled_token_ids):
            if not sampled:  # still in prefill (or discarded): no draft, and the steps around it are not clean
                clean = False
                rows.append(None)
                continue
            decoding += 1
            n = int(num_tokens_no_spec[i])
            text = token_ids_cpu[i, :n]
            head = tuple(text[:SIGNATURE_TOKENS].tolist())
            before = self._rows.get((head, n - len(sampled), int(text[n - len(sampled) - 1])))
            if before is None:
                clean = False
                before = _Row(prompt_length=n - len(sampled))
            elif before.proposed:
                accepted = min(len(sampled) - 1, before.proposed)
                self.stats.accepted += accepted
                self.stats.accepted_by_batch[before.batch] = self.stats.accepted_by_batch.get(before.batch, 0) + accepted
                self.calibration.update(before.logits, accepted)
            if self.suffix_cache is not None:
                self._rows.pop((head, n - len(sampled), int(text[n - len(sampled) - 1])), None)
            rows.append(((head, n, int(text[n - 1])), _Row(before.prompt_length, text=self._copy(text))))
        if self.suffix_cache is not None:  # rows not seen again have finished (or left the batch)
            self.suffix_cache.finished(row.text for row in self._rows.values() if row.text is not None)
        # the step that just ran verified what the last call proposed, and nothing else when no row was in prefill
        if clean and self._pending_tokens is not None and self._last_return is not None:
            self.costs.observe(self._pending_tokens, start - self._last_return)
            self.stats.timed_steps += 1
            self.stats.step_seconds += start - self._last_return
        gate = self.compiled
        counts = np.zeros(len(rows), dtype=np.int64)
        if decoding and self.costs.token_can_pay(decoding) and not (clean and self.measures_plain_step(decoding)):
            live = np.array([i for i, entry in enumerate(rows) if entry is not None], dtype=np.int64)
            lengths = np.asarray(num_tokens_no_spec[: len(rows)], dtype=np.int64)
            rooms = np.minimum(self.scored, self.max_model_len - lengths - 1)
            prompts = np.array([entry[1].prompt_length if entry is not None else 0 for entry in rows], dtype=np.int64)
            gate.run(token_ids_cpu, lengths, live, rooms, prompts, self.max_ngram, self.feature_tokens, CONFIDENCE)
            if self.suffix_cache is not None:
                self.suffix_cache.improve(gate, token_ids_cpu, lengths, live, rooms, prompts, self.max_ngram,
                                          self.feature_tokens, CONFIDENCE)
            available = np.zeros(len(rows), dtype=np.int64)
            available[live] = gate.counts[live]
            curve = self.costs.curve(decoding + int(available.sum()))
            counts = gate.choose(available, self.calibration.scale, self.calibration.shift, curve, decoding)
        drafts: list[list[int]] = []
        proposed = int(counts.sum())
        for i, (k, entry) in enumerate(zip(counts.tolist(), rows)):
            drafts.append(gate.tokens[i, :k].tolist() if k else [])
            if entry is not None and k:
                entry[1].proposed, entry[1].logits, entry[1].batch = k, gate.logits[i, :k].copy(), decoding
        self._rows = dict(entry for entry in rows if entry is not None)
        self._pending_tokens = decoding + proposed if clean else None
        stats = self.stats
        stats.steps += 1
        stats.rows += decoding
        stats.proposed += proposed
        stats.proposed_by_batch[decoding] = stats.proposed_by_batch.get(decoding, 0) + proposed
        self._last_return = time.perf_counter()
        stats.propose_seconds += self._last_return - start
        if self._stats_path and stats.steps % STATS_EVERY == 0:
            self.write_stats()
        return drafts

    def measures_plain_step(self, rows: int) -> bool:
        """Whether this step proposes nothing so that the engine's plain step at `rows` tokens, the one every draft
        is judged against, gets timed: a busy batch drafts in every step, so its plain step would otherwise be a
        guess from larger and smaller steps, and a guess above the real cost makes drafts look better than they are."""
        return not self.costs.measured(rows)

    def _copy(self, text: np.ndarray) -> np.ndarray | None:
        return text.copy() if self.suffix_cache is not None else None

    def write_stats(self) -> None:
        """Counters and the measured step-cost curve, to $PACER_HF_VLLM_STATS (the benchmark reads them)."""
        if self._stats_path:
            Path(self._stats_path).write_text(json.dumps(self.stats.as_dict(self.costs, self.calibration), indent=1))
