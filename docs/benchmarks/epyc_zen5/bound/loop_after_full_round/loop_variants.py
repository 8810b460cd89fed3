"""The loop-feature readings the two A/B scripts here compare, installed on `PacerStopRule` for this process only (an
experiment: the package reads the shipped features). A pre-verifier object marked `_loop_variant` reads, after a
round that stopped with every drafted token accepted: "full", [1, 1, confidence] (no miss seen); "carry", the last
loop features that saw a miss or a full round, confidence updated. Unmarked ones read the shipped features."""
from pacer_hf.loops import stop_rule

shipped_end_round = stop_rule.PacerStopRule.end_round


def end_round(self, accepted, drafted, target_scores):
    variant = getattr(self.preverifier, "_loop_variant", None)
    before = self.loop
    shipped_end_round(self, accepted, drafted, target_scores)
    if variant and 0 < drafted < self.preverifier.config.max_draft_tokens and accepted >= drafted:
        confidence = self.loop[2]
        if variant == "full":
            self.loop = [1.0, 1.0, confidence]
        elif variant == "carry" and any(before[:2]):
            self.loop = [before[0], before[1], confidence]


stop_rule.PacerStopRule.end_round = end_round
