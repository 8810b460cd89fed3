"""The loop-feature variant A/B on the demo pair (stdlib prompts), every variant interleaved, 3 runs."""
import loop_variants  # noqa: F401  (installs the readings compared; this folder is on sys.path)
import torch

import pacer_hf
import pacer_hf.training.validate as validate
from pacer_hf.data.prompts import CATEGORIES, build_prompts
from pacer_hf.pairs import load_pair

torch.set_num_threads(1)
pair = load_pair("stdlib")

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
