"""Gemma's tokenizer rebuilt from a GGUF file as the BPE tokenizer Gemma really is.

Why not transformers' GGUF conversion: it builds a *Unigram* model over the GGUF's scores.
Gemma's SentencePiece model is BPE, and its scores are minus the merge rank, so a Unigram
Viterbi over them prefers many short pieces: " leading space" becomes "▁le|ad|ing|▁sp|ace"
instead of "▁leading|▁space", sequences grow, and the model sees token strings it was
never trained on. Worse, "<end_of_turn>" typed by a user becomes the control token itself,
because the Unigram vocabulary contains it as a piece.

Here the pieces keep their GGUF ids; the merges are every split of a normal piece into two
normal pieces, ranked by the merged piece's score (SentencePiece BPE merges the adjacent
pair whose union scores highest, which is what llama.cpp does with this file); control
tokens are special added tokens; user-defined pieces ("\\n", runs of spaces, tabs, HTML
tags) are non-special added tokens matched before BPE, as SentencePiece and llama.cpp
match them. The pipeline (normalizer, pre-tokenizer, decoder) is transformers'
GemmaTokenizer's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# GGUF token types (llama.cpp's LLAMA_TOKEN_TYPE_*)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer arrays of a GGUF file, indexed by token id."""

    tokens: list[str]
    scores: list[float]
    types: list[int]
    model: str  # tokenizer.ggml.model: "llama" means SentencePiece

    @classmethod
    def read(cls, path: str | Path) -> "GGUFVocab":
        from gguf import GGUFReader

        fields = GGUFReader(str(path)).fields

        def array(key: str) -> list:
            f = fields[key]
            return [f.parts[i] for i in f.data]

        model = bytes(fields["tokenizer.ggml.model"].parts[-1]).decode()
        return cls(
            tokens=[bytes(p).decode("utf-8") for p in array("tokenizer.ggml.tokens")],
            scores=[float(p[0]) for p in array("tokenizer.ggml.scores")],
            types=[int(p[0]) for p in array("tokenizer.ggml.token_type")],
            model=model,
        )


def bpe_merges(vocab: GGUFVocab) -> list[tuple[str, str]]:
    """Every (left, right) split of a normal piece into two normal pieces, best-scored
    merged piece first; splits of one piece ordered by their parts' ids."""
    normal = {t: i for i, t in enumerate(vocab.tokens) if vocab.types[i] == NORMAL}
    ranked = []
    for piece, pid in normal.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in normal and right in normal:
                ranked.append((-vocab.scores[pid], pid, normal[left], normal[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def build_tokenizer(vocab: GGUFVocab):
    """The `tokenizers.Tokenizer` of a SentencePiece-BPE GGUF vocabulary (Gemma)."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    if vocab.model != "llama":
        raise ValueError(f"GGUF tokenizer model {vocab.model!r} is not SentencePiece ('llama')")
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    tk = Tokenizer(BPE(
        vocab=ids, merges=bpe_merges(vocab), unk_token="<unk>", fuse_unk=True,
        byte_fallback=True, dropout=None,
    ))
    tk.normalizer = normalizers.Replace(" ", "▁")
    tk.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    added = [
        AddedToken(t, special=vocab.types[i] == CONTROL, normalized=False, lstrip=False, rstrip=False, single_word=False)
        for i, t in enumerate(vocab.tokens)
        if vocab.types[i] in (CONTROL, USER_DEFINED, UNKNOWN)
    ]
    tk.add_tokens(added)
    if tk.get_vocab_size(with_added_tokens=True) != len(vocab.tokens):
        raise ValueError("GGUF vocabulary has duplicate pieces; ids would shift")
    return tk
