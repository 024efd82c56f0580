"""The chat tokenizer: a `tokenizers.Tokenizer` plus Gemma's control-token ids.

User text is never allowed to become a control token: a question that contains the text
"<end_of_turn>" is encoded as ordinary characters, so a trace cannot forge a turn.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from tunix_rt import heap
from tunix_rt.errors import BadInput
from tunix_rt.models.catalog import SPECIAL_TOKENS


class ChatTokenizer:
    """Encodes text without adding specials; exposes pad/eos/bos/turn ids by name."""

    def __init__(self, tk: Tokenizer, source: str = "<memory>"):
        self._tk = tk
        self._tk.encode_special_tokens = True  # special-token text in user input stays text
        self.source = source
        ids = {name: tk.token_to_id(text) for name, text in SPECIAL_TOKENS.items()}
        missing = [SPECIAL_TOKENS[n] for n, i in ids.items() if i is None]
        if missing:
            raise BadInput(f"{source}: tokenizer lacks control tokens {missing}")
        self.pad_id: int = ids["pad"]
        self.eos_id: int = ids["eos"]
        self.bos_id: int = ids["bos"]
        self.sot_id: int = ids["start_of_turn"]
        self.eot_id: int = ids["end_of_turn"]

    @classmethod
    def from_file(cls, path: str | Path) -> "ChatTokenizer":
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise BadInput(f"{path}: no tokenizer.json")
        tk = Tokenizer.from_file(str(path))
        heap.trim()  # the JSON parse's freed blocks (~190 MiB for Gemma 3's 33 MB file)
        return cls(tk, source=str(path))

    @property
    def vocab_size(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=True)

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Generation stops at <end_of_turn> or <eos>."""
        return (self.eot_id, self.eos_id)

    @property
    def control_ids(self) -> frozenset[int]:
        return frozenset({self.pad_id, self.eos_id, self.bos_id, self.sot_id, self.eot_id})

    def encode(self, text: str) -> list[int]:
        return self._tk.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tk.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self._tk.id_to_token(token_id)
