"""What the rule A/B scripts under this folder share: every timed `generate` call of `validate.compare_in_generate`
logged as one JSON line (setting, seconds, new tokens, each round's drafted and accepted tokens), and the loop over
chat categories that makes those calls."""
import json

import pacer_hf.training.validate as validate
from pacer_hf.data.chat_prompts import chat_prompts
from pacer_hf.generation import last_stats


def log_calls(settings: dict, path: str, plain: str = "ar") -> None:
    """From now on, `validate.timed` also writes each call to `path`; a call's setting is the name in `settings`
    whose pre-verifier it ran (`plain` for the target alone)."""
    log = open(path, "w")
    timed = validate.timed

    def logged(call, device=None):
        elapsed, out = timed(call, device)
        pacer = call.keywords.get("pacer")
        name = next((k for k, v in settings.items() if v is pacer), plain if pacer in (None, False) else str(pacer)[:20])
        record = {"setting": name, "seconds": elapsed, "new": out.shape[1] - call.args[0].shape[1]}
        stats = last_stats(call.func.__self__) if pacer not in (None, False) else None
        if stats is not None:
            record.update(draft_lengths=list(stats.draft_lengths), accepted=list(stats.accepted))
        log.write(json.dumps(record) + "\n")
        log.flush()
        return elapsed, out

    validate.timed = logged


def run_categories(target, draft, tokenizer, settings: dict, categories: list[str], prompts: int) -> None:
    """Each category's first `prompts` bench prompts, every setting interleaved (one run, 64 new tokens, a warm-up
    call per setting first); prints each category's speeds against the target alone and mean draft lengths."""
    for category in categories:
        ids = [list(p.ids) for p in chat_prompts(tokenizer, category, "bench", n=prompts)]
        rows = validate.compare_in_generate(target, draft, ids, settings, 1, 64, warmup=True)
        print(category, {k: (round(v["vs_ar"], 3), round(v["mean_draft"], 2)) for k, v in rows.items()}, flush=True)


def load_ab_pair(pair: str, draft_folder: str):
    """The pair an A/B script runs and its two pre-verifier objects: `pair` "qwen2.5-coder" (its shipped pre-verifier
    and a second copy of it; 3 code categories x 3 requests) or a target folder drafted by `draft_folder` (the default
    pre-verifier and a second copy of it; every chat category x 2 requests). Returns (target, draft, tokenizer,
    shipped, variant, categories, requests per category); the caller marks `variant`."""
    import pacer_hf
    from pacer_hf.data.chat_prompts import CHAT_CATEGORIES
    from pacer_hf.pairs import load_pair

    if pair == "qwen2.5-coder":
        loaded = load_pair("qwen2.5-coder")
        variant = pacer_hf.PacerPreVerifier.from_pretrained("hub_cards/qwen-coder-preverifier")
        return (loaded.target, loaded.draft, loaded.tokenizer, loaded.preverifier, variant,
                ["chat-humaneval", "chat-docstring", "chat-edit"], 3)
    from transformers import AutoTokenizer

    from pacer_hf._paths import hub_cards_dir
    from pacer_hf.attached import DEFAULT_PREVERIFIER
    from pacer_hf.bench.user_pair import load_draft
    from pacer_hf.loading import load_causal_lm

    target, draft = load_causal_lm(pair), load_draft(draft_folder, "float32")
    shipped = pacer_hf.default_preverifier(False, draft.device)
    variant = pacer_hf.PacerPreVerifier.from_pretrained(hub_cards_dir() / DEFAULT_PREVERIFIER).eval()  # its own object
    return target, draft, AutoTokenizer.from_pretrained(pair), shipped, variant, list(CHAT_CATEGORIES), 2


def run_ab(argv: list[str], name: str, mark: str) -> None:
    """The whole A/B of an A/B script (argv: pair, draft folder, calls log): the pair at 1 torch thread, its second
    pre-verifier object marked `mark` and run as `name` beside "shipped", every call logged."""
    import torch

    torch.set_num_threads(1)
    target, draft, tokenizer, shipped, variant, categories, n = load_ab_pair(argv[1], argv[2])
    setattr(variant, mark, True)
    settings = {"shipped": shipped, name: variant}
    log_calls(settings, argv[3])
    run_categories(target, draft, tokenizer, settings, categories, n)
