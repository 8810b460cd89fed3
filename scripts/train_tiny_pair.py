"""Train a tiny (target, draft) Llama pair on Python stdlib source, for validating the training pipeline.

Not the demo pair (pacer_hf/recipes/demo_pair.py): a few CPU minutes, so acceptance is non-trivial but small.
    python scripts/train_tiny_pair.py --out runs/tiny --minutes 3
Writes OUT/tokenizer, OUT/target, OUT/draft and OUT/heldout.txt (held-out stdlib files, one per line).
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import sysconfig
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/tiny")
    parser.add_argument("--minutes", type=float, default=3.0, help="per model")
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    random.Random(0).shuffle(files)
    held, train = files[:20], files[20:]
    (out / "heldout.txt").write_text("\n".join(held) + "\n")
    (out / "train.txt").write_text("\n".join(train) + "\n")
    text = [Path(f).read_text(errors="ignore") for f in train]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=["<eos>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>")
    hf_tok.save_pretrained(out / "tokenizer")
    ids = torch.tensor([i for t in text for i in hf_tok(t)["input_ids"]])
    print("train tokens", len(ids))
    for name, layers, hidden in (("target", 2, 256), ("draft", 1, 128)):
        config = LlamaConfig(vocab_size=len(hf_tok), hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                             max_position_embeddings=1024, eos_token_id=0, pad_token_id=0, bos_token_id=None,
                             tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
        opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
        start, step = time.time(), 0
        while time.time() - start < args.minutes * 60:
            starts = torch.randint(0, len(ids) - args.seq - 1, (16,))
            batch = torch.stack([ids[s : s + args.seq] for s in starts])
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            step += 1
            if step % 50 == 0:
                print(name, step, round(loss.item(), 3), flush=True)
        model.save_pretrained(out / name)
        hf_tok.save_pretrained(out / name)
        print(name, "done", step, "steps, loss", round(loss.item(), 3))


if __name__ == "__main__":
    main()
