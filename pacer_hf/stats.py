"""What happened in the last `generate` call, round by round (read by tests and benchmarks)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class PacerStats:
    """Counters of one `generate` call through a pacer_hf strategy.

    `draft_lengths[i]` tokens were proposed in round i and the target accepted `accepted[i]` of them;
    `trimmed[i]`, where present, more were drafted in round i and left out (`trim_failed_block`, greedy only);
    every round costs one target forward (the first one also reads the prompt, or the prompt's last token when the
    target read the rest beforehand for a draft that takes its states: `prompt_kv_from_target`). `loop` is the
    verification loop that ran: "lean" (pacer_hf's) or "transformers" (`_assisted_decoding`);
    `draft_forward` the draft's forward that ran: "lean" (`lean_draft.py`), "model" (its own
    `forward`) or "compiled" (`compile_draft`). `preverifier` says which pre-verifier decided the rounds:
    "passed" (`pacer=<pre-verifier>`), "attached" (`pacer_hf.attach`), "default" (the one shipped in the
    package, for a draft with none), None when none did. `prompt_kv_from_target`: prompt positions the draft took
    from the target's cache instead of reading them (a copy of the target, `loops/shared_prompt.py`).
    `online_calibration`: the map of the pre-verifier's logits to this pair's acceptances as the call ended (`scale`,
    `shift`, `labels` seen, kept between calls: `PacerConfig.online_calibration`), None when they decide as they
    are. With batch > 1
    the counters are the batch's totals (a round is one target forward for every row; `new_tokens` excludes
    padding) and `rows[b]` holds row b's own rounds.
    """

    strategy: str
    draft_lengths: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    trimmed: dict[int, int] = field(default_factory=dict)
    draft_forwards: int = 0
    target_forwards: int = 0
    new_tokens: int = 0
    preverifier_seconds: float = 0.0
    seconds: float = 0.0
    loop: str = "lean"
    draft_forward: str = "model"
    preverifier: str | None = None
    prompt_kv_from_target: int = 0
    online_calibration: dict | None = None
    rows: list[PacerStats] = field(default_factory=list)

    @property
    def costs(self) -> dict | None:
        """Which round costs decided the call's expected-gain rule (lookup gate or pre-verifier), as they stood when
        it ended: `source` ("probe", "probe+online", "prior" or "given"), the `table` relative to k = 0, the probe's
        wall time (0 when it was cached) and what it measured on (device, dtype, threads, processor). None when no
        rule decided by cost."""
        round_costs = getattr(self, "_round_costs", None)
        return None if round_costs is None else round_costs.summary()

    def use_costs(self, round_costs) -> None:
        """Record the `RoundCosts` (costs/round_costs.py) this call decides with."""
        self._round_costs = round_costs

    @property
    def tau(self) -> float:
        """Mean tokens produced per target forward (docs/ALGORITHM.md §5)."""
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def alpha(self) -> float:
        """Accepted draft tokens / drafted tokens."""
        drafted = sum(self.draft_lengths)
        return sum(self.accepted) / drafted if drafted else 0.0

    @property
    def mean_draft_len(self) -> float:
        return sum(self.draft_lengths) / len(self.draft_lengths) if self.draft_lengths else 0.0

    def to_dict(self) -> dict:
        return {**asdict(self), "costs": self.costs, "tau": self.tau, "alpha": self.alpha, "mean_draft_len": self.mean_draft_len}
