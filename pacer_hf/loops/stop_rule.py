"""Pacer's stop rule, in one place: how a drafted block is scored, which costs decide, the decision, the round's record.

Every loop that drafts with a pre-verifier runs it through here: the single-row drafting loop (`draft_loop.py`, reused
by PEARL, Ouroboros and prompt lookup with a draft) through `PacerStopRule`, the batched loop through `BatchStopRule`.
The scoring path follows where the draft's tensors live: the compiled numba scorer on CPU (`preverifier_kernel.py`),
one CUDA graph per block on CUDA (`block_scorer.GraphBlockScorer`), the torch forward elsewhere. The decision reads the
round costs measured where the call runs (`RoundCosts`), a batch's own clock (`BatchClock`) or, said explicitly, the
stored calibration; whether a round drafts at all reads what is kept of the pair between calls (`recent_acceptance.py`).
A call's rule and the measuring of its costs: `stop_rule_setup.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from ..costs import BatchClock, RoundClock, RoundCosts
from ..costs.curve import extrapolate
from ..modeling_pacer import (
    PacerPreVerifier,
    acceptance_probability,
    best_prefix,
    loop_features,
    rows_continue,
)
from ..stats import PacerStats
from .block_scorer import scorer_for
from .recent_acceptance import (
    MAX_PROBE_EVERY,
    MIN_TRIED,
    PROBE_EVERY,
    PROBE_SHARE,
    RecentAcceptance,
    saving_per_token,
)


def next_round_loop(preverifier: PacerPreVerifier, accepted: int, drafted: int, target_scores: torch.Tensor) -> list[float]:
    """`loop_features` for the round after a verified one; `target_scores`: the target's scores where it chose its
    last token (its confidence there is their top probability). A round that drafted nothing leaves the features at
    zero whatever the confidence, so a plain round skips the softmax over the vocabulary."""
    confidence = float(torch.softmax(target_scores.float(), dim=-1).max()) if drafted > 0 else 0.0
    return loop_features(accepted, drafted, confidence, preverifier.config.max_draft_tokens)


class PacerStopRule:
    """The pre-verifier deciding, after every `block_size` drafted tokens, whether the next block is worth drafting.

    Stop-only, a failed block is still verified (exact under sampling); with `trim_failed_block` (greedy only) a stopped
    round proposes a prefix, `self.trim` the tokens dropped; a `greedy` call with `trim_first_block` (the default) does
    so only for a round stopped at its first block. `costs`: measured round costs (expected gain); None: calibration."""

    def __init__(self, preverifier: PacerPreVerifier, stats: PacerStats, costs: RoundCosts | None = None,
                 draft_device: torch.device | None = None, recent: RecentAcceptance | None = None,
                 greedy: bool = False):
        self.preverifier, self.costs, self.stats = preverifier.eval(), costs, stats
        self.block_size = preverifier.config.block_size
        on_cpu = draft_device is None or torch.device(draft_device).type == "cpu"
        if on_cpu:  # the compiled scorer reads the draft's tensors as numpy arrays: CPU drafts only
            from .preverifier_kernel import round_scorer  # numba, imported when Pacer first runs

            self.scorer = round_scorer(preverifier)
        else:
            self.scorer = None
        self.blocks = scorer_for(self.preverifier, draft_device)  # where `scorer` is None
        self.token_logits: list[float] = []  # acceptance logits of every token drafted this round
        self.round_costs: dict | None = None  # `costs_now()` as the round started
        config = preverifier.config
        expected_gain = config.decision_rule == "expected_gain"
        self.trims = expected_gain and config.trim_failed_block  # greedy only: a stopped round's best prefix
        # greedy calls: a round stopped at its first block proposes the block's best prefix, none included
        self.trims_first = (expected_gain and greedy and not self.trims and costs is not None
                            and getattr(config, "trim_first_block", True))
        # the expected-gain rule under measured costs, compiled beside the scorer (`decide` otherwise)
        self.compiled_rule = self.scorer is not None and expected_gain
        self.unjudged: float | None = None  # a round trimmed to nothing: its first token's predicted acceptance
        self.seconds_by_length: np.ndarray | None = None  # the round costs for k = 0..max_draft_tokens
        self.trim = 0
        self.reads_loop = bool(getattr(preverifier.config, "loop_features", False))
        self.loop = loop_features(0, 0, 0.0, preverifier.config.max_draft_tokens)  # before the first round
        self.recent = recent if recent is not None else RecentAcceptance()  # shared with the pair's other calls
        self.recent.start_call()
        self.calibration = self.recent.calibration_for(preverifier)  # None: the logits decide as they are
        stats.online_calibration = self.calibration.summary() if self.calibration is not None else None
        self.raw_logits: list[float] = []  # this round's logits before `calibration`
        self.judged = 0  # drafted tokens judged in this call
        self.rounds_verified = 0

    @property
    def path(self) -> str:
        """Which scoring path runs: "compiled" (numba, CPU), "graph" (CUDA graphs) or "torch"."""
        return "compiled" if self.scorer is not None else self.blocks.path

    def end_round(self, accepted: int, drafted: int, target_scores: torch.Tensor) -> None:
        """What the next round may read (`config.loop_features`): the round just verified and the target's confidence
        in its last token (`target_scores`: its scores there). A call's opening round, often against a first token no
        draft could guess (a chat answer's opening), counts toward the pair's long-run counts only, not the call's
        judged tokens or shares, unless the pair is known not to pay (then it is a probe, the evidence asked for)."""
        if self.reads_loop:
            self.loop = next_round_loop(self.preverifier, accepted, drafted, target_scores)
        opening = self.rounds_verified == 0 and not (self.costs is not None and self.recent.known_loser(self.costs.seconds()))
        self.rounds_verified += 1
        judged = self.recent.add(accepted, drafted, recent=not opening)
        if not opening:
            self.judged += judged
            if drafted == 0 and self.unjudged is not None:  # trimmed to nothing: no verdict, the prediction stands in
                self.judged += self.recent.add_predicted(self.unjudged)
        self.unjudged = None

    def observe(self, proposed: int, accepted: int) -> None:
        """The verdict on this round's first `proposed` drafted tokens, for the online calibration (single-row
        loops that verify the round they drafted: not PEARL, whose next round is drafted before the verdict)."""
        if self.calibration is not None and proposed > 0:
            self.calibration.update(np.asarray(self.raw_logits[:proposed], dtype=np.float64), accepted)
            self.stats.online_calibration = self.calibration.summary()

    def drafts_this_round(self, unread: int = 1, left: int | None = None) -> bool:
        """Whether this round drafts at all: a draft that cannot pay would still cost a draft step and a wider verify
        every round. Under measured costs the round drafts when some length, at the pair's per-token acceptance
        (`RecentAcceptance`, kept between calls), is expected to beat a plain target step, and proposes nothing
        otherwise. A call drafts until `MIN_TRIED` of its own tokens were judged after its opening round (`end_round`)
        unless the pair is `known` not to pay (then it starts plain). A probe round drafts anyway, so the estimate
        follows the text: after `PROBE_EVERY` plain rounds; for a known loser after `probe_every` (doubled by each
        unpaid probe, up to `MAX_PROBE_EVERY`) once the catch-up over the `unread` skipped tokens costs at most
        `PROBE_SHARE` of those plain rounds and of the `left` steps; a known pair's rounds must also win that catch-up
        back within `left` tokens (`_read_pays`)."""
        recent = self.recent
        if self.costs is None or self.preverifier.config.decision_rule != "expected_gain":
            return True
        table = self.costs.seconds()
        saving_now = saving_per_token(recent.first_share, recent.next_share, table)
        known_loser = recent.known_loser(table)
        read_pays = self._read_pays(unread, left, max(saving_now, recent.long_saving(table)))
        if ((self.judged < MIN_TRIED and not known_loser) or saving_now > 0) and read_pays:
            recent.skipped, recent.probe_every = 0, PROBE_EVERY
            return True
        recent.skipped += 1
        if known_loser:  # a catch-up within PROBE_SHARE of the plain steps since the last probe and of those left
            plain = recent.skipped if left is None else min(recent.skipped, left)
            probe = recent.skipped > recent.probe_every and unread * recent.read_seconds <= PROBE_SHARE * plain * table[0]
            if probe:
                recent.probe_every = min(2 * recent.probe_every, MAX_PROBE_EVERY)
        else:
            probe = recent.skipped > PROBE_EVERY and read_pays
        if probe:
            recent.skipped = 0
        return probe

    def _read_pays(self, unread: int, left: int | None, saving: float) -> bool:
        """Whether the draft's catch-up over `unread` tokens costs at most what drafting is expected to save over
        the `left` tokens still to generate, `saving` seconds a token (the better of the recent and long-run share's:
        the saving grows with the share); true until the pair is known."""
        recent = self.recent
        if not recent.known or left is None or not recent.read_seconds:
            return True
        return unread * recent.read_seconds <= left * saving

    def read(self, tokens: int, seconds: float) -> None:
        """The draft read `tokens` tokens it had not seen in `seconds` (what a probe's catch-up will cost)."""
        self.recent.read(tokens, seconds)

    def start_round(self) -> None:
        self.token_logits, self.raw_logits, self.trim = [], [], 0
        calibration = self.calibration
        self.logit_map = (calibration.scale, calibration.shift) if calibration is not None else (1.0, 0.0)
        self.round_costs = self.costs_now()  # the costs change only when a round's verdict is observed
        if self.compiled_rule and self.round_costs is not None:  # every length the rule may price, extended as ever
            lengths = np.arange(self.preverifier.config.max_draft_tokens + 1)
            self.seconds_by_length = extrapolate(self.round_costs["round_cost"], lengths)
        if self.scorer is not None:
            self.scorer.start(self.loop, self.logit_map)
        else:
            self.blocks.start([self.loop])

    def costs_now(self) -> dict | None:
        """The costs `decide` reads: measured (`draft_cost`: what trimming cannot save), or None (calibration)."""
        if self.costs is None:
            return None
        return {"round_cost": self.costs.seconds(), "draft_cost": self.costs.token_seconds() or 0.0}

    @torch.no_grad()
    def add_token(self, hidden: torch.Tensor, logits: torch.Tensor, token: torch.Tensor) -> bool:
        """Record one drafted token (draft hidden state, raw logits, id `(1, 1)`); True when drafting should stop.

        The compiled scorer scores each token as it comes; the torch paths score each block when it is full. Either
        way the decision is taken at block boundaries, on the host, from the block's logits read back once."""
        start = time.perf_counter()
        scale, shift = self.logit_map
        if self.scorer is not None:
            self.raw_logits.append(self.scorer.add(hidden[0], logits[0], int(token[0, 0])))
            self.token_logits.append(scale * self.raw_logits[-1] + shift)
            done = len(self.token_logits) % self.block_size == 0
        else:
            scored = self.blocks.add(hidden, logits, token[:, 0])
            done = scored is not None
            if done:
                self.raw_logits = scored[0]
                self.token_logits = [scale * z + shift for z in self.raw_logits]
        stop = owes_trim = False  # owes_trim: the compiled rule stopped a `trim_failed_block` round, untrimmed yet
        if done and self.compiled_rule and self.round_costs is not None:
            per_token = self.round_costs["draft_cost"] if self.trims else -1.0
            stop = not self.scorer.continues(self.seconds_by_length, self.block_size, per_token)
            owes_trim = self.trims
        elif done:
            stop, self.trim = self.preverifier.decide(self.token_logits, self.round_costs)  # `decide` trims itself
        if stop and (owes_trim or self._first_block()):
            self.trim = len(self.token_logits) - self._best_prefix()
        if stop and self.trim == len(self.token_logits):
            self.unjudged = acceptance_probability(self.token_logits[0])
        self.stats.preverifier_seconds += self._seconds(start)
        return stop

    def _first_block(self) -> bool:
        """Whether a stop now may propose a prefix of the first block (`trim_first_block`, greedy): where a narrow
        verify costs more than a plain step, the round that doubts its first block is cheaper as a plain step."""
        return self.trims_first and self.round_costs is not None and len(self.token_logits) == self.block_size

    def _best_prefix(self) -> int:
        """How many of this round's drafted tokens to propose: the prefix of the best expected rate under its costs."""
        if self.compiled_rule:
            return self.scorer.best_prefix(self.seconds_by_length, self.round_costs["draft_cost"])
        return best_prefix([acceptance_probability(z) for z in self.token_logits], self.round_costs)

    def _seconds(self, start: float) -> float:
        """The rule's own time since `start` (on the graph path: not the wait for the draft's queued kernels)."""
        if self.scorer is None and self.blocks.path == "graph":
            return self.blocks.take_seconds(time.perf_counter() - start)
        return time.perf_counter() - start


class RoundRecord:
    """What a single-row candidate generator records of each round: the proposal, the verdict, the round's time for
    the costs that decide (`RoundClock`) and what the stop rule's next round may read (`PacerStopRule.end_round`)."""

    def __init__(self, stats: PacerStats, stop: PacerStopRule | None = None, costs: RoundCosts | None = None):
        self.stats, self.stop = stats, stop
        self.clock = RoundClock(costs)
        self.rounds = 0

    def proposed(self, tokens: int, start: float | None, drafted: int | None = None) -> None:
        """A round hands out `tokens` of the `drafted` it drafted; `start`: when its work began (None: untimed)."""
        if drafted is not None and drafted > tokens:
            self.stats.trimmed[self.rounds] = drafted - tokens
        self.stats.target_forwards += 1
        self.stats.draft_lengths.append(tokens)
        self.clock.handed_out(tokens, start)
        self.rounds += 1

    def verified(self, accepted: int, target_scores: torch.Tensor) -> None:
        """The target accepted `accepted` of them; `target_scores` (1, positions, vocab): its scores of the round."""
        self.clock.verdict()
        self.stats.accepted.append(accepted)
        if self.stop is not None:
            self.stop.end_round(accepted, self.clock.proposed, target_scores[0, accepted])


class BatchStopRule:
    """Pacer in the batched loop: after every block the pre-verifier scores every row in one call. `mode` "row": each
    row stops by its own decision, under the round costs of the batch's clock once it has timed two verify widths
    (before that, explicitly, the pre-verifier's stored calibration); "batch": the rows stop together
    (`rows_continue`: a padded verify slot is paid whether a row fills it or not), per-row until the clock is ready."""

    def __init__(self, preverifier: PacerPreVerifier, stats: PacerStats, mode: str, clock: BatchClock,
                 draft_device: torch.device | None = None):
        self.preverifier, self.stats, self.mode, self.clock = preverifier.eval(), stats, mode, clock
        self.block_size = preverifier.config.block_size
        self.blocks = scorer_for(self.preverifier, draft_device)

    def start(self, loops: list[list[float]]) -> None:
        """A new round; `loops`: each row's `loop_features(...)` (read when `config.loop_features`)."""
        self.blocks.start(loops)

    def add(self, hidden: torch.Tensor, raw: torch.Tensor, tokens: torch.Tensor, drafted: list[list[int]],
            drafting: list[bool]) -> list[tuple[bool, int]] | None:
        """Record one drafted token per row; at a block boundary, (stop, trim) per row."""
        start = time.perf_counter()
        logits = self.blocks.add(hidden, raw, tokens)
        if logits is None:
            return None
        table = self.round_seconds(len(drafted)) if self.clock.ready() else None
        if self.mode == "batch" and table is not None:
            decisions = [(not batch_continues(_open_probs(logits, drafted), drafting, self.block_size,
                                              self.preverifier.config.max_draft_tokens, table), 0)] * len(drafted)
        else:
            costs = {"round_cost": table, "draft_cost": self.clock.draft_step} if table is not None else None
            decisions = [self.preverifier.decide(row, costs) for row in logits]
        seconds = time.perf_counter() - start
        if self.blocks.path == "graph":
            seconds = self.blocks.take_seconds(seconds)
        self.stats.preverifier_seconds += seconds
        self.clock.preverifier_call = self.clock.average(self.clock.preverifier_call, seconds)
        return decisions

    def round_seconds(self, rows: int) -> list[float]:
        """Seconds of a lockstep round drafting n = 0..max_draft_tokens tokens per row: n draft steps, a pre-verifier
        call per block, a verify forward over rows * (n + 1) tokens (the clock's measurements)."""
        clock, block = self.clock, self.block_size
        return [n * clock.draft_step + -(-n // block) * clock.preverifier_call + clock.verify_seconds(rows * (n + 1))
                for n in range(self.preverifier.config.max_draft_tokens + 1)]


def _open_probs(logits: list[list[float]], drafted: list[list[int]]) -> list[list[float]]:
    """Acceptance probabilities of each row's drafted tokens (a row that stopped: its filler is not a draft)."""
    return [torch.sigmoid(torch.tensor(row[: len(d)], dtype=torch.float64)).tolist() for row, d in zip(logits, drafted)]


def batch_continues(probs: list[list[float]], open_rows: list[bool], block_size: int, max_tokens: int,
                    seconds: list[float] | Callable[[int], float]) -> bool:
    """Pacer's expected-gain rule for a padded batch (`pacer_batch_stop="batch"`): the single-row rule generalised
    to rows drafting together (`modeling_pacer.rows_continue`), `seconds[n]` the time of a round of n drafted
    tokens, n = 0..max_tokens (a table, or a function that fills one: the rule reads numbers and calls nothing back)."""
    table = [seconds(n) for n in range(max_tokens + 1)] if callable(seconds) else list(seconds)
    return rows_continue(probs, open_rows, block_size, max_tokens, table.__getitem__)
