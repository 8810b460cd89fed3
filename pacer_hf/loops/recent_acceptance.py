"""What the stop rule keeps of a pair between calls: its per-token acceptance, recent and long-run, the plain rounds
since it last drafted, how fast the draft reads tokens it skipped and the pre-verifiers' online calibration to the
pair (`RecentAcceptance`), and the constants of the decision to draft at all (`PacerStopRule.drafts_this_round`,
docs/ALGORITHM.md "Rounds that draft nothing")."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from transformers import PreTrainedModel

from ..model_state import ModelState
from .online_calibration import OnlineCalibration

PROBE_EVERY = 8  # a draft that is not expected to pay is still tried after this many plain rounds
MAX_PROBE_EVERY = 64  # ... doubled after each probe that did not bring drafting back, up to this many
MIN_TRIED = 4.0  # drafted tokens judged (decayed count) before the rule may fall back to plain rounds
MIN_EVIDENCE = 32.0  # judged tokens (long-run decayed count) before a pair's past decides how a call starts
PROBE_SHARE = 0.01  # of the plain rounds' time since the last probe, what the next probe's catch-up may cost


@dataclass
class RecentAcceptance:
    """A pair's per-token acceptance: a drafted token's chance of acceptance given those before it were accepted, from
    decayed counts with one prior success and failure, over recent rounds (each round weighs 0.9 of the one after it)
    and over the long run (0.99). A round's first token and the tokens after it are counted apart (`first_share`,
    `next_share`): the first follows the target's own token, often a correction the draft did not see coming, and
    is accepted less often than those that follow an accepted one, so one share for both overrates a round that
    stops early and underrates a long one. Kept on the target between calls, per draft and decoding mode
    (`ModelState.recent_acceptance`, `recent_acceptance_for`): once the pair is `known`, a call starts from the
    long-run acceptance weighed as `MIN_TRIED` judged tokens (`start_call`), so a pair whose drafts do not pay starts
    with plain steps instead of paying the draft's pass over the prompt and a few losing rounds again every call,
    while one request the draft could not follow does not turn the next call plain; within a call its own rounds
    take over.
    `skipped`: plain rounds since the last drafting round; `probe_every`: plain rounds before the next probe round;
    `read_seconds`: what the draft took per token to read the tokens it had not seen (its pass over the prompt);
    `calibrations`: pre-verifier -> its `OnlineCalibration` to this pair (`config.online_calibration`)."""

    accepted: float = 0.0  # every judged token, the rounds' first ones included
    tried: float = 0.0
    long_accepted: float = 0.0
    long_tried: float = 0.0
    first_accepted: float = 0.0  # the rounds' first tokens only
    first_tried: float = 0.0
    long_first_accepted: float = 0.0
    long_first_tried: float = 0.0
    skipped: int = 0
    probe_every: int = PROBE_EVERY
    read_seconds: float = 0.0
    calibrations: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)

    first_share = property(lambda self: _share(self.first_accepted, self.first_tried))
    next_share = property(lambda self: _share(self.accepted - self.first_accepted, self.tried - self.first_tried))
    long_first_share = property(lambda self: _share(self.long_first_accepted, self.long_first_tried))
    long_next_share = property(
        lambda self: _share(self.long_accepted - self.long_first_accepted, self.long_tried - self.long_first_tried))

    def add(self, accepted: int, drafted: int, recent: bool = True) -> int:
        """A verified round; returns the drafted tokens it judged (a token is tried only after those before it were
        accepted: m successes, then a failure). `recent=False`: the long-run counts only (a call's opening round)."""
        if drafted == 0:
            return 0
        accepted = min(accepted, drafted)
        tried = accepted + (accepted < drafted)
        self._count(tried, accepted, float(accepted > 0), recent)
        return tried

    def add_predicted(self, probability: float) -> int:
        """A round trimmed to nothing (no verdict): its first drafted token counts as judged, accepted with the
        pre-verifier's `probability`, so a pair whose drafts the pre-verifier keeps dropping stops drafting them."""
        self._count(1, probability, probability)
        return 1

    def _count(self, tried: float, accepted: float, first: float, recent: bool = True) -> None:
        """One round: `tried` judged tokens, `accepted` of them, its first token accepted (`first`, 0 to 1)."""
        if recent:
            self.tried, self.accepted = 0.9 * self.tried + tried, 0.9 * self.accepted + accepted
            self.first_tried, self.first_accepted = 0.9 * self.first_tried + 1, 0.9 * self.first_accepted + first
        self.long_tried, self.long_accepted = 0.99 * self.long_tried + tried, 0.99 * self.long_accepted + accepted
        self.long_first_tried = 0.99 * self.long_first_tried + 1
        self.long_first_accepted = 0.99 * self.long_first_accepted + first

    @property
    def known(self) -> bool:
        """Whether the pair's long-run counts rest on `MIN_EVIDENCE` judged tokens (a few calls' worth)."""
        return self.long_tried >= MIN_EVIDENCE

    def long_saving(self, table: list[float]) -> float:
        """`saving_per_token` at the long-run shares under the round costs `table`."""
        return saving_per_token(self.long_first_share, self.long_next_share, table)

    def known_loser(self, table: list[float]) -> bool:
        """Whether the pair is `known` and no draft length pays at its long-run shares under `table`."""
        return self.known and self.long_saving(table) <= 0

    def start_call(self) -> None:
        """A new call: the recent counts restart at the long-run shares weighed as `MIN_TRIED` judged tokens, half
        of them first tokens, once the pair is `known`, else from nothing (the call judges its own first tokens)."""
        if self.known:
            half = MIN_TRIED / 2
            self.first_tried, self.first_accepted = half, self.long_first_share * (half + 2) - 1
            self.tried = MIN_TRIED
            self.accepted = self.first_accepted + self.long_next_share * (half + 2) - 1
        else:
            self.tried = self.accepted = self.first_tried = self.first_accepted = 0.0
            self.skipped, self.probe_every = 0, PROBE_EVERY

    def calibration_for(self, preverifier) -> OnlineCalibration | None:
        """The map of `preverifier`'s acceptance logits to this pair's acceptances, when its config asks for one."""
        if not getattr(preverifier.config, "online_calibration", False):
            return None
        return self.calibrations.setdefault(preverifier, OnlineCalibration())

    def read(self, tokens: int, seconds: float) -> None:
        """The draft read `tokens` tokens it had not seen in `seconds` (its first forward of a round)."""
        if tokens >= 16:  # a short read is mostly the forward's fixed cost
            self.read_seconds = seconds / tokens


def _share(accepted: float, tried: float) -> float:
    """An acceptance share from decayed counts, with one prior success and one prior failure."""
    return (accepted + 1) / (tried + 2)


def saving_per_token(first: float, share: float, table: list[float]) -> float:
    """Seconds per generated token that the best draft length k saves against plain steps, a round's first drafted
    token accepted with `first` and each later one with `share`, given those before it were, under the round costs
    `table` (seconds of a round drafting k tokens); 0 when no length pays."""
    tokens, alive, best = 1.0, first, table[0]
    for k in range(1, len(table)):
        tokens += alive
        alive *= share
        best = min(best, table[k] / tokens)
    return table[0] - best


def pair_memories(model: PreTrainedModel) -> weakref.WeakKeyDictionary:
    """What the stop rule keeps of `model`'s pairs between calls: draft -> {do_sample: RecentAcceptance}."""
    state = ModelState(model)
    if state.recent_acceptance is None:
        state.recent_acceptance = weakref.WeakKeyDictionary()
    return state.recent_acceptance


def recent_acceptance_for(model: PreTrainedModel, draft: PreTrainedModel | None, do_sample: bool) -> RecentAcceptance:
    """The `RecentAcceptance` this pair and decoding mode carry between calls (a fresh one without a draft)."""
    if draft is None:
        return RecentAcceptance()
    return pair_memories(model).setdefault(draft, {}).setdefault(bool(do_sample), RecentAcceptance())


class SeparateMemories:
    """Each named setting its own memory of one pair. The stop rule keeps one per (target, draft); settings run
    interleaved (a benchmark's strategies, an A/B's pre-verifiers) would otherwise each start from what the others
    learned, where a process serving one of them would not."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel | None):
        self.target, self.draft = target, draft
        self.kept: dict[str, dict] = {}

    @contextmanager
    def of(self, name: str) -> Iterator[None]:
        """Within this, the pair's memory is `name`'s own (empty the first time)."""
        if self.draft is None:
            yield
            return
        memories = pair_memories(self.target)
        memories.pop(self.draft, None)
        if name in self.kept:
            memories[self.draft] = self.kept[name]
        try:
            yield
        finally:
            if self.draft in memories:
                self.kept[name] = memories.pop(self.draft)
