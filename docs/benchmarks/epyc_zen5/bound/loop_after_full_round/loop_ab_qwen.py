"""A/B on the Qwen pair: the loop features after a round that stopped with every drafted token accepted.
Shipped: [accepted / max, 0, confidence] (in training that means "missed at accepted + 1"). Variants:
"full": [1, 1, confidence] (no miss seen); "carry": the last loop features that saw a miss or a full round,
confidence updated. Every call logged (rounds) to argv[2]."""
import sys
from pathlib import Path

import loop_variants  # noqa: F401  (installs the readings compared; this folder is on sys.path)
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ab_calls  # noqa: E402  (the folder above)

import pacer_hf  # noqa: E402
from pacer_hf.pairs import load_pair  # noqa: E402

torch.set_num_threads(1)
pair = load_pair("qwen2.5-coder")
variants = sys.argv[3].split(",") if len(sys.argv) > 3 else ["full"]

settings = {"shipped": pair.preverifier}
for v in variants:
    pv = pacer_hf.PacerPreVerifier.from_pretrained("hub_cards/qwen-coder-preverifier")
    pv._loop_variant = v
    settings[v] = pv
ab_calls.log_calls(settings, sys.argv[2], plain="None")
n = int(sys.argv[1])
ab_calls.run_categories(pair.target, pair.draft, pair.tokenizer, settings, ["chat-humaneval", "chat-docstring", "chat-edit"], n)
