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
