"""The first-round candidate, installed on `PacerStopRule` for this process only (an experiment until measured): a
call's first round follows the prompt, where the target's first answer token is often not the draft's (a chat
template's answer start), so its verdict is not counted as evidence about the pair (`MIN_TRIED`, the recent and
long-run shares). Written against the rule before b8a4ec1, which ships the second form in the package: installed on a
later package it would wrap rules that already set the opening round apart and leave out their second round too
(command.txt names the worktree each run used).
`install(marked_only=True)` applies it to pre-verifier objects marked `_first_round` (an A/B in one
process), `install(False)` to every one."""
from pacer_hf.loops import stop_rule


def install(marked_only: bool) -> None:
    rule = stop_rule.PacerStopRule
    shipped_end, shipped_init = rule.end_round, rule.__init__

    def init(self, *args, **kwargs):
        shipped_init(self, *args, **kwargs)
        self.rounds_verified = 0

    def end_round(self, accepted, drafted, target_scores):
        applies = getattr(self.preverifier, "_first_round", False) or not marked_only
        first = self.rounds_verified == 0
        self.rounds_verified += 1
        if applies and first:
            if self.reads_loop:
                self.loop = stop_rule.next_round_loop(self.preverifier, accepted, drafted, target_scores)
            self.unjudged = None
            return
        shipped_end(self, accepted, drafted, target_scores)

    rule.__init__, rule.end_round = init, end_round
