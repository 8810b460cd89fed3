"""The loop-feature variant A/B on the demo pair (stdlib prompts), every variant interleaved, 3 runs."""
import json, sys, torch
import pacer_hf
from pacer_hf.loops import stop_rule as sr
from pacer_hf.pairs import load_pair
from pacer_hf.data.prompts import CATEGORIES, build_prompts
import pacer_hf.training.validate as validate

torch.set_num_threads(1)
pair = load_pair("stdlib")
orig_end = sr.PacerStopRule.end_round
def end_round(self, accepted, drafted, target_scores):
    variant = getattr(self.preverifier, "_loop_variant", None)
    before = self.loop
    orig_end(self, accepted, drafted, target_scores)
    cap = self.preverifier.config.max_draft_tokens
    if variant and 0 < drafted < cap and accepted >= drafted:
        conf = self.loop[2]
        if variant == "full":
            self.loop = [1.0, 1.0, conf]
        elif variant == "carry":
            self.loop = [before[0], before[1], conf] if any(before[:2]) else self.loop
sr.PacerStopRule.end_round = end_round
settings = {}
for v in ("shipped", "full", "carry"):
    pv = pacer_hf.PacerPreVerifier.from_pretrained("hub_cards/demo-preverifier")
    if v != "shipped":
        pv._loop_variant = v
    settings[v] = pv
prompts, _ = build_prompts(list(CATEGORIES), lambda t: pair.tokenizer(t).input_ids, 4, 256, target_dir=pair.target.name_or_path)
tot = {}
for category, chosen in prompts.items():
    rows = validate.compare_in_generate(pair.target, pair.draft, [list(p.ids) for p in chosen], settings, 3, 64, warmup=True)
    print(category, {k: (round(v["vs_ar"], 3), round(v["mean_draft"], 2)) for k, v in rows.items()}, flush=True)
