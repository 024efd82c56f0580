"""A slow, plain reference of SentencePiece-BPE encoding (the algorithm llama.cpp runs on a
GGUF vocabulary), to check the fast tokenizer built from the same GGUF against."""

from __future__ import annotations

from tunix_rt.models.gguf_tokenizer import NORMAL, USER_DEFINED, GGUFVocab


class ReferenceSPM:
    def __init__(self, vocab: GGUFVocab):
        self.ids = {t: i for i, t in enumerate(vocab.tokens)}
        self.normal = {t: vocab.scores[i] for i, t in enumerate(vocab.tokens) if vocab.types[i] == NORMAL}
        self.user = sorted((t for i, t in enumerate(vocab.tokens) if vocab.types[i] == USER_DEFINED),
                           key=len, reverse=True)

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for fragment, is_user in self._partition(text):
            out += [self.ids[fragment]] if is_user else self._bpe(fragment.replace(" ", "▁"))
        return out

    def _partition(self, text: str):
        """User-defined pieces first (leftmost, then longest), BPE on what is between."""
        i, start = 0, 0
        while i < len(text):
            hit = next((u for u in self.user if text.startswith(u, i)), None)
            if hit is None:
                i += 1
                continue
            if start < i:
                yield text[start:i], False
            yield hit, True
            i = start = i + len(hit)
        if start < len(text):
            yield text[start:], False

    def _bpe(self, s: str) -> list[int]:
        symbols = list(s)
        while True:
            best, best_score = None, None
            for k in range(len(symbols) - 1):
                score = self.normal.get(symbols[k] + symbols[k + 1])
                if score is not None and (best_score is None or score > best_score):
                    best, best_score = k, score
            if best is None:
                break
            symbols[best:best + 2] = [symbols[best] + symbols[best + 1]]
        ids: list[int] = []
        for sym in symbols:
            if sym in self.normal:
                ids.append(self.ids[sym])
            else:
                ids += [self.ids[f"<0x{b:02X}>"] for b in sym.encode("utf-8")]
        return ids
