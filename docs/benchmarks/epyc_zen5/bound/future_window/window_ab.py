"""A/B: the rule's estimate of the tokens not drafted yet from the last 3 drafted tokens (`window.py`), against the
shipped rule, interleaved in one process. argv: pair (qwen2.5-coder | a target folder), draft folder (for a folder
target), calls log.

    OMP_NUM_THREADS=1 python docs/benchmarks/epyc_zen5/bound/future_window/window_ab.py qwen2.5-coder - qwen15_calls.jsonl
    OMP_NUM_THREADS=1 python docs/benchmarks/epyc_zen5/bound/future_window/window_ab.py \
        ~/.cache/pacer_hf/qwen2.5-coder/draft DRAFT_FOLDER qwen05_calls.jsonl
    (DRAFT_FOLDER: the 0.5B files with docs/benchmarks/epyc_zen5/fit_qwen05_int8/cheap_draft.json beside them)
"""
import sys
from pathlib import Path

import torch
import window  # this folder is on sys.path when the script runs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import ab_calls  # noqa: E402  (the folder above)

import pacer_hf  # noqa: E402
from pacer_hf.data.chat_prompts import CHAT_CATEGORIES  # noqa: E402
from pacer_hf.pairs import load_pair  # noqa: E402

window.install()
torch.set_num_threads(1)
if sys.argv[1] == "qwen2.5-coder":
    pair = load_pair("qwen2.5-coder")
    target, draft, tokenizer, shipped = pair.target, pair.draft, pair.tokenizer, pair.preverifier
    variant = pacer_hf.PacerPreVerifier.from_pretrained("hub_cards/qwen-coder-preverifier")
    categories, n = ["chat-humaneval", "chat-docstring", "chat-edit"], 3
else:
    from transformers import AutoTokenizer

    from pacer_hf._paths import hub_cards_dir
    from pacer_hf.attached import DEFAULT_PREVERIFIER
    from pacer_hf.bench.user_pair import load_draft
    from pacer_hf.loading import load_causal_lm

    target, draft = load_causal_lm(sys.argv[1]), load_draft(sys.argv[2], "float32")
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
    shipped = pacer_hf.default_preverifier(False, draft.device)
    variant = pacer_hf.PacerPreVerifier.from_pretrained(hub_cards_dir() / DEFAULT_PREVERIFIER).eval()  # its own object
    categories, n = list(CHAT_CATEGORIES), 2
variant._future_window = True
settings = {"shipped": shipped, "window-3": variant}
ab_calls.log_calls(settings, sys.argv[3])
ab_calls.run_categories(target, draft, tokenizer, settings, categories, n)
