"""A/B only (not in the package): the stop-only continuation, and once a round stops, its best prefix (none included)
when the pre-verifier's config says trim_at_stop (greedy). Run: python trimstop.py <pacer-hf bench args>."""
import math, sys
from pacer_hf.loops import stop_rule as sr
from pacer_hf.modeling_pacer import best_prefix

original = sr.PacerStopRule.add_token

def add_token(self, hidden, logits, token):
    stop = original(self, hidden, logits, token)
    if stop and getattr(self.preverifier.config, "trim_at_stop", False) and self.round_costs is not None \
            and not self.trim:
        if self.compiled_rule and self.scorer is not None:
            keep = self.scorer.best_prefix(self.seconds_by_length, self.round_costs["draft_cost"])
        else:
            probs = [1 / (1 + math.exp(-max(min(float(x), 60), -60))) for x in self.token_logits]
            keep = best_prefix(probs, self.round_costs)
        self.trim = len(self.token_logits) - keep
        if self.trim == len(self.token_logits):
            self.unjudged = sr.acceptance_probability(self.token_logits[0])
    return stop

sr.PacerStopRule.add_token = add_token

if __name__ == "__main__":
    from pacer_hf.cli import main
    sys.exit(main(sys.argv[1:]))
