"""The min-rounds candidate, installed on `PacerStopRule` for this process only (an experiment: the package keeps the
shipped rule): a call may go plain only after `MIN_ROUNDS` drafted rounds of its own besides `MIN_TRIED` judged
tokens; a pair known not to pay still starts plain. `install(marked_only=True)` applies it to pre-verifier objects
marked `_min_rounds` (an A/B in one process), `install(False)` to every one."""
from pacer_hf.loops import stop_rule
from pacer_hf.loops.recent_acceptance import saving_per_token

MIN_ROUNDS = 4


def install(marked_only: bool) -> None:
    rule = stop_rule.PacerStopRule
    shipped_drafts, shipped_end, shipped_init = rule.drafts_this_round, rule.end_round, rule.__init__

    def init(self, *args, **kwargs):
        shipped_init(self, *args, **kwargs)
        self.drafted_rounds = 0

    def end_round(self, accepted, drafted, target_scores):
        shipped_end(self, accepted, drafted, target_scores)
        self.drafted_rounds += drafted > 0

    def drafts_this_round(self, unread=1, left=None):
        applies = getattr(self.preverifier, "_min_rounds", False) or not marked_only
        if applies and self.costs is not None and self.drafted_rounds < MIN_ROUNDS:
            recent, table = self.recent, self.costs.seconds()
            if not (recent.known and saving_per_token(recent.long_first_share, recent.long_next_share, table) <= 0):
                recent.skipped = 0
                return True
        return shipped_drafts(self, unread, left)

    rule.__init__, rule.end_round, rule.drafts_this_round = init, end_round, drafts_this_round
