"""Single calls traced: the fitted pre-verifier on the SmolLM2 int8 pair, humaneval, summarization and QA requests,
two passes, each call beside the target alone; per call the drafted rounds, their accepted tokens and the pair's memory.
Run: python call_traces.py chat-humaneval,chat-summarize,chat-qa"""
import time, torch, pacer_hf, sys
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
cats = sys.argv[1].split(",")
for rep in range(2):
  for c in cats:
    for p in chat_prompts(tok, c, "bench", n=2):
        ids = torch.tensor([list(p.ids)])
        t0 = time.perf_counter(); target.generate(ids, max_new_tokens=64, do_sample=False, pacer=None); t_ar = time.perf_counter() - t0
        t0 = time.perf_counter(); target.generate(ids, max_new_tokens=64, do_sample=False, assistant_model=draft, pacer=pv); t_pv = time.perf_counter() - t0
        s = pacer_hf.last_stats(target); r = recent_acceptance_for(target, draft, False)
        print(f"{c} prompt {ids.shape[1]} ar {t_ar:.2f}s pv {t_pv:.2f}s ratio {t_ar/t_pv:.3f} rounds {len(s.draft_lengths)} drafted {[d for d in s.draft_lengths if d]} acc {[a for a, d in zip(s.accepted, s.draft_lengths) if d]} share {r.share:.2f} long {r.long_share:.2f} known {r.known} read_ms {1000*r.read_seconds:.2f}", flush=True)
