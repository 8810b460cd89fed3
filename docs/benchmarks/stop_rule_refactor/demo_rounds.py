import torch, pacer_hf, sys
from pacer_hf.pairs import load_pair
from pacer_hf.data.prompts import build_prompts
torch.set_num_threads(1)
pair = load_pair("stdlib")
pacer_hf.attach(pair.draft, pair.preverifier)
tok = pair.tokenizer
costs = [1.0, 1.12, 1.15, 1.2, 1.25, 1.3, 1.33, 1.36, 1.4, 1.5, 1.55, 1.6, 1.7]
out = []
for text in ["def parse_args(argv):\n    parser = argparse.ArgumentParser(", "class Queue:\n    def __init__(self", "import os\nimport sys\n\ndef main("]:
    ids = tok(text, return_tensors="pt")
    pair.target.generate(**ids, assistant_model=pair.draft, pacer=True, do_sample=False, max_new_tokens=64, pacer_costs=costs)
    s = pacer_hf.last_stats(pair.target)
    out.append((s.draft_lengths, s.accepted))
print(sys.argv[1], out)
