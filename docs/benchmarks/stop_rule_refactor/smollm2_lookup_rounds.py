import torch, pacer_hf, sys
from pacer_hf.pairs import load_pair
torch.set_num_threads(1)
pair = load_pair("smollm2")
tok = pair.tokenizer
costs = [1.0 + 0.05 * k for k in range(11)]
out = []
for text in ["Rewrite this sentence in the passive voice: The cat chased the mouse across the garden.",
             "Extract the names from: Alice met Bob and Carol at the station, then Bob left with Dave."]:
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    o = pair.target.generate(**ids, prompt_lookup_num_tokens=10, pacer=True, do_sample=False, max_new_tokens=48, pacer_costs=costs)
    s = pacer_hf.last_stats(pair.target)
    out.append((o[0].tolist()[-5:], s.draft_lengths))
print(sys.argv[1], out)
