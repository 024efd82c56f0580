"""One fast parse of a GGUF file, shared by every reader of it during an import.

gguf-py's `GGUFReader` slices an `np.memmap` for every value it parses: Gemma 3's vocabulary
(262,144 strings, scores and types) costs ~3 million memmap slices, each paying memmap's
`__array_finalize__`, ~13 s a parse on a 2-core EPYC, and an import parsed the file three
times (our vocabulary, then transformers' config and weights loaders: 34 s of a 61-s import).
`FastGGUFReader` slices a plain ndarray view of the same mapping (the same bytes, the same
fields and tensors, no copy), and `shared_readers()` makes every `gguf.GGUFReader(path)`
inside it return one parse per file.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from gguf import GGUFReader

_lock = threading.Lock()


class FastGGUFReader(GGUFReader):
    """gguf-py's reader, parsing from a plain ndarray view of its memmap."""

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        plain = self.__dict__.get("_plain")  # __init__ sets self.data once, then parses
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        count = int(count)
        itemsize = np.dtype(dtype).itemsize
        arr = plain[offset:offset + itemsize * count].view(dtype=dtype)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))


@contextlib.contextmanager
def shared_readers() -> Iterator[None]:
    """Inside: `gguf.GGUFReader(path)` (read-only) parses each file once, fast. One import
    holds it at a time (a lock; not re-entrant)."""
    import gguf

    cache: dict[str, GGUFReader] = {}

    def reader(path: Any, mode: str = "r") -> GGUFReader:
        if mode != "r":
            return GGUFReader(path, mode)
        key = str(Path(path).resolve())
        if key not in cache:
            cache[key] = FastGGUFReader(path)
        return cache[key]

    with _lock:
        saved = gguf.GGUFReader
        gguf.GGUFReader = reader  # transformers imports it from gguf at each call
        try:
            yield
        finally:
            gguf.GGUFReader = saved
