"""All-plain Pacer calls against the target alone on a long SmolLM2 prompt: the pair marked as known not to pay
(its memory set to no acceptance), so every round is a plain step; 6 interleaved pairs of calls, 64 tokens each."""
import time, torch, pacer_hf, statistics
from pacer_hf.bench.user_pair import load_draft
from pacer_hf.loading import load_causal_lm
from pacer_hf.data.chat_prompts import chat_prompts
from pacer_hf.loops.recent_acceptance import recent_acceptance_for
from transformers import AutoTokenizer
torch.set_num_threads(1)
T = "/root/.cache/pacer_hf/smollm2-135m-instruct"
target = pacer_hf.enable(load_causal_lm(T)); draft = load_draft("/tmp/fitwork/smol-int8-draft", "float32")
tok = AutoTokenizer.from_pretrained(T)
pv = pacer_hf.PacerPreVerifier.from_pretrained("/tmp/fitwork/smol-pv3")
ids = torch.tensor([list(chat_prompts(tok, "chat-summarize", "bench", n=1)[0].ids)])
target.generate(ids, max_new_tokens=8, do_sample=False, assistant_model=draft, pacer=pv)
r = recent_acceptance_for(target, draft, False); 
def loser():
    r.long_tried, r.long_accepted, r.tried, r.accepted = 200.0, 0.0, 200.0, 0.0
ratios = []
for i in range(6):
    t0 = time.perf_counter(); target.generate(ids, max_new_tokens=64, do_sample=False, pacer=None); a = time.perf_counter() - t0
    loser()
    t0 = time.perf_counter(); target.generate(ids, max_new_tokens=64, do_sample=False, assistant_model=draft, pacer=pv); b = time.perf_counter() - t0
    s = pacer_hf.last_stats(target)
    ratios.append(a / b); print(f"ar {a:.3f} plain-pacer {b:.3f} ratio {a/b:.3f} drafted {sum(s.draft_lengths)} rounds {len(s.draft_lengths)}", flush=True)
print("median", statistics.median(ratios))
