import torch

import pacer_hf
from pacer_hf.loops.preverifier_kernel import round_scorer

torch.set_num_threads(1)
for path in ("hub_cards/qwen-coder-preverifier", "hub_cards/demo-preverifier"):
    pv = pacer_hf.PacerPreVerifier.from_pretrained(path)
    V = pv.config.vocab_size if hasattr(pv.config, "vocab_size") else 151936
    g = torch.Generator().manual_seed(0)
    hid = torch.randn(8, pv.config.draft_hidden_size, generator=g)
    logits = torch.randn(8, V, generator=g) * 4
    for loop in ([0, 0, 0], [3 / 24, 0, 0.9], [1, 1, 0.9], [0.5, 0, 0.9]):
        s = round_scorer(pv)
        s.start([float(x) for x in loop])
        print(path[10:], loop, [round(s.add(hid[i], logits[i], int(logits[i].argmax())), 2) for i in range(8)])
