"""The first-round candidate, installed on `PacerStopRule` for this process only (an experiment until measured): a
call's first round follows the prompt, where the target's first answer token is often not the draft's (a chat
template's answer start), so its verdict is no evidence about how the call goes on: it counts toward neither the
call's judged tokens (`MIN_TRIED`) nor its recent shares, only toward the pair's long-run counts. Except for a pair
known not to pay, whose call opens with a probe: that verdict is what the probe is for, and counts as before.
(v1/first_round.py, the first form measured: the first round counted nowhere.)
Written against the rule before b8a4ec1, which ships the second form in the package: installed on a
later package it would wrap rules that already set the opening round apart and leave out their second round too
(command.txt names the worktree each run used).
`install(marked_only=True)` applies it to pre-verifier objects marked `_first_round` (an A/B in one process),
`install(False)` to every one."""
from pacer_hf.loops import stop_rule
from pacer_hf.loops.recent_acceptance import saving_per_token


def _long_run_only(recent, accepted: int, drafted: int) -> None:
    """`RecentAcceptance.add` for the long-run counts alone."""
    if drafted == 0:
        return
    accepted = min(accepted, drafted)
    tried = accepted + (accepted < drafted)
    recent.long_tried, recent.long_accepted = 0.99 * recent.long_tried + tried, 0.99 * recent.long_accepted + accepted
    recent.long_first_tried = 0.99 * recent.long_first_tried + 1
    recent.long_first_accepted = 0.99 * recent.long_first_accepted + float(accepted > 0)


def install(marked_only: bool) -> None:
    rule = stop_rule.PacerStopRule
    shipped_end, shipped_init = rule.end_round, rule.__init__

    def init(self, *args, **kwargs):
        shipped_init(self, *args, **kwargs)
        self.rounds_verified = 0

    def known_loser(self) -> bool:
        recent = self.recent
        return (self.costs is not None and recent.known
                and saving_per_token(recent.long_first_share, recent.long_next_share, self.costs.seconds()) <= 0)

    def end_round(self, accepted, drafted, target_scores):
        applies = getattr(self.preverifier, "_first_round", False) or not marked_only
        first = self.rounds_verified == 0
        self.rounds_verified += 1
        if applies and first and not known_loser(self):
            if self.reads_loop:
                self.loop = stop_rule.next_round_loop(self.preverifier, accepted, drafted, target_scores)
            _long_run_only(self.recent, accepted, drafted)
            self.unjudged = None
            return
        shipped_end(self, accepted, drafted, target_scores)

    rule.__init__, rule.end_round = init, end_round
