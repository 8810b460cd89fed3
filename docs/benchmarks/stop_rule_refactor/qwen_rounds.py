import torch, pacer_hf, sys
from pacer_hf.pairs import load_pair
torch.set_num_threads(1)
pair = load_pair("qwen2.5-coder")
tok = pair.tokenizer
costs = [1.0, 2.0, 2.1, 2.2, 2.3, 2.4, 2.45, 2.5, 2.55, 2.6, 2.7, 2.8, 2.9, 3.0, 3.1, 3.2, 3.3, 3.4, 3.5, 3.6, 3.7, 3.8, 3.9, 4.0, 4.1]
ids = tok.apply_chat_template([{"role": "user", "content": "Write a Python function that merges two sorted lists."}],
                              add_generation_prompt=True, return_tensors="pt", return_dict=True)
o = pair.target.generate(**ids, assistant_model=pair.draft, pacer=True, do_sample=False, max_new_tokens=40, pacer_costs=costs)
s = pacer_hf.last_stats(pair.target)
print(sys.argv[1], o[0].tolist()[-8:], s.draft_lengths, s.accepted)
