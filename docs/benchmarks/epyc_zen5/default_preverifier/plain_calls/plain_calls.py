"""All-plain Pacer calls against the target alone: the demo target with its 10-layer copy as the draft (a draft that
cannot pay), the pair's memory set to "does not pay" before every Pacer call, so every round is a plain step; ten
interleaved pairs of 96-token greedy calls on one 1,500-character code prompt, outputs compared.

    OMP_NUM_THREADS=1 python plain_calls.py /tmp/s8/demo-drop10 > output.txt
"""
import cProfile, pstats, statistics, sys, time
import torch
import pacer_hf
from transformers import AutoModelForCausalLM, AutoTokenizer

torch.set_num_threads(1)
target = pacer_hf.enable(AutoModelForCausalLM.from_pretrained("hub_cards/demo-target"))
draft = AutoModelForCausalLM.from_pretrained(sys.argv[1] if len(sys.argv) > 1 else "/tmp/s8/demo-drop10")
tok = AutoTokenizer.from_pretrained("hub_cards/demo-target")
text = open(torch.__file__.replace("__init__.py", "functional.py")).read()[2000:3500]
inputs = tok(text, return_tensors="pt")
N = 96
kw = dict(max_new_tokens=N, min_new_tokens=N, do_sample=False)
target.generate(**inputs, assistant_model=draft, pacer=True, max_new_tokens=8)
from pacer_hf.loops.recent_acceptance import recent_acceptance_for
r = recent_acceptance_for(target, draft, False)
def loser():  # the pair known not to pay: every round plain
    r.long_tried, r.long_accepted, r.tried, r.accepted = 200.0, 0.0, 200.0, 0.0
def one(pacer):
    t = time.perf_counter()
    if pacer:
        loser()
        out = target.generate(**inputs, assistant_model=draft, pacer=True, **kw)
    else:
        out = target.generate(**inputs, **kw)
    return time.perf_counter() - t, out
ratios = []
for i in range(10):
    a, o1 = one(False); b, o2 = one(True)
    assert torch.equal(o1, o2)
    ratios.append(a / b)
    print(f"plain {a*1000/N:.2f} ms/token  pacer {b*1000/N:.2f} ms/token  ratio {a/b:.3f}  drafted {sum(pacer_hf.last_stats(target).draft_lengths)}")
print("median ratio", statistics.median(ratios))
if "--profile" in sys.argv:
    pr = cProfile.Profile(); pr.enable(); one(True); pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    pr = cProfile.Profile(); pr.enable(); one(False); pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(15)
