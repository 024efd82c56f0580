"""Builds the small byte-level BPE tokenizer of the tiny test models (vocab 1024).

It shares Gemma's control-token texts and their first ids (<pad>=0, <eos>=1, <bos>=2), so
rendering, masking and stopping run the same code on tiny and real models. The result is
committed as assets/tiny_tokenizer.json; `python -m tunix_rt.models.tiny_tokenizer` rebuilds
it byte for byte from the vendored GSM8K file (a test checks that).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 1024
CORPUS_LINES = 2000
ASSET = Path(__file__).resolve().parents[1] / "assets" / "tiny_tokenizer.json"
GSM8K = Path(__file__).resolve().parents[1] / "assets" / "gsm8k" / "train.jsonl"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]


def corpus(path: Path = GSM8K, n: int = CORPUS_LINES) -> list[str]:
    texts = ["user\nmodel\n<reasoning>\n</reasoning>\n<answer></answer>"] * 50
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i >= n:
                break
            row = json.loads(line)
            texts += [row["question"], row["answer"]]
    return texts


def build(path: Path = GSM8K) -> Tokenizer:
    tk = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(corpus(path), trainer=trainer)
    return tk


def main(out: str | None = None) -> None:
    target = Path(out) if out else ASSET
    target.parent.mkdir(parents=True, exist_ok=True)
    build().save(str(target), pretty=False)
    print(f"wrote {target}")


if __name__ == "__main__":
    main(*sys.argv[1:])
