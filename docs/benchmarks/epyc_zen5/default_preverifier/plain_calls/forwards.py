"""The target's forwards inside all-plain Pacer calls and inside the target alone, timed alike: a wrapper around the
target's forward times every call; per mode (six interleaved calls each, 96 tokens) the median total, the prefill
and the mean decode forward. What is left of the total is the loop around the forwards.

    OMP_NUM_THREADS=1 python forwards.py > forwards.txt   (the 10-layer draft saved at /tmp/s8/demo-drop10)
"""
import time, statistics, collections, torch, pacer_hf
from transformers import AutoModelForCausalLM, AutoTokenizer
from pacer_hf.loops.recent_acceptance import recent_acceptance_for
torch.set_num_threads(1)
target = pacer_hf.enable(AutoModelForCausalLM.from_pretrained("hub_cards/demo-target"))
draft = AutoModelForCausalLM.from_pretrained("/tmp/s8/demo-drop10")
tok = AutoTokenizer.from_pretrained("hub_cards/demo-target")
text = open(torch.__file__.replace("__init__.py", "functional.py")).read()[2000:3500]
inputs = tok(text, return_tensors="pt")
N = 96; kw = dict(max_new_tokens=N, min_new_tokens=N, do_sample=False)
target.generate(**inputs, assistant_model=draft, pacer=True, max_new_tokens=8)
r = recent_acceptance_for(target, draft, False)
times = []
orig = type(target).forward
def fwd(self, *a, **k):
    t = time.perf_counter(); out = orig(self, *a, **k); times.append(time.perf_counter() - t); return out
type(target).forward = fwd
res = collections.defaultdict(list)
for i in range(6):
    for mode in ("plain", "pacer"):
        times.clear()
        if mode == "pacer":
            r.long_tried, r.long_accepted, r.tried, r.accepted = 200.0, 0.0, 200.0, 0.0
        t = time.perf_counter()
        target.generate(**inputs, **({"assistant_model": draft, "pacer": True} if mode == "pacer" else {}), **kw)
        total = time.perf_counter() - t
        res[mode].append((total, times[0], sum(times[1:]) / (len(times) - 1), len(times)))
for mode, v in res.items():
    print(mode, "total ms %.1f" % (1e3 * statistics.median(x[0] for x in v)), "prefill ms %.2f" % (1e3 * statistics.median(x[1] for x in v)),
          "decode fwd us %.1f" % (1e6 * statistics.median(x[2] for x in v)), "forwards", v[0][3])
