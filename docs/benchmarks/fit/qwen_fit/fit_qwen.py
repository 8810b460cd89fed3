"""Fit a pre-verifier for the Qwen2.5-Coder pair (int8 draft, as load_pair gives) on TRAIN-split code requests."""
import sys, time, json
import torch
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
import pacer_hf
from pacer_hf.pairs import load_pair
from pacer_hf.data.chat_prompts import chat_prompts
pair = load_pair("qwen2.5-coder")
requests = []
for category in ("chat-humaneval", "chat-docstring", "chat-edit"):
    for p in chat_prompts(pair.tokenizer, category, split="train", n=40):
        requests.append(p.messages[0][1])
print(len(requests), "requests", flush=True)
start = time.time()
pv = pacer_hf.fit_preverifier(pair.target, pair.draft, pair.tokenizer, prompts=requests, budget_s=float(sys.argv[3]) if len(sys.argv) > 3 else 2400,
                              output_dir=sys.argv[1], max_new_tokens=96, speed_check=False)
print("done", time.time() - start, flush=True)
