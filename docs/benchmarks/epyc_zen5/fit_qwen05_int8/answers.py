"""What draft_window/agree.py and shared_prompt/shared_kv.py share: the 0.5B target and its int8 copy, the target's
greedy 64-token answers to N bench prompts of each chat category, and the tokens a fixed 8-token round would give."""
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pacer_hf.cheap_draft import apply_cheap_draft
from pacer_hf.data.chat_prompts import CHAT_CATEGORIES, chat_prompts


def load(target_dir: str, draft_dir: str):
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = apply_cheap_draft(AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval(), draft_dir)
    return tokenizer, target, draft


@torch.no_grad()
def answers(tokenizer, target, n: int):
    """(category, index, prompt ids (1, P), answer ids (A,)) for n bench prompts of each chat category."""
    for category in CHAT_CATEGORIES:
        for i, prompt in enumerate(chat_prompts(tokenizer, category, "bench", n=n)):
            ids = torch.tensor([list(prompt.ids)])
            yield category, i, ids, target.generate(ids, max_new_tokens=64, do_sample=False)[0, ids.shape[1]:]


def tokens_per_round(agree: list[bool], k: int = 8) -> float:
    """Answer tokens per round of k drafted tokens along the answer, given where the draft's argmax agrees."""
    pos = rounds = 0
    while pos < len(agree):
        j = 0
        while j < k and pos + j < len(agree) and agree[pos + j]:
            j += 1
        rounds, pos = rounds + 1, pos + j + 1
    return round(len(agree) / rounds, 2)
