"""The GGUF → BPE tokenizer rebuild, on a small hand-made SentencePiece vocabulary written
as a real GGUF file (the real 262K vocabulary is checked in the slow tests)."""

from __future__ import annotations

import pytest

from tunix_rt.models.gguf_tokenizer import (
    BYTE, CONTROL, NORMAL, USER_DEFINED, GGUFVocab, bpe_merges, build_tokenizer,
)
from spm_reference import ReferenceSPM

# Gemma's layout in miniature: controls first, user-defined whitespace, bytes, then pieces
# with score = minus merge rank.
_PIECES = ["▁", "t", "h", "e", "a", "n", "d", "▁t", "he", "▁the", "an", "▁an", "▁and",
           "nd", "▁a", "é", "日"]


def _toy() -> GGUFVocab:
    tokens, scores, types = [], [], []
    for t in ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]:
        tokens.append(t), scores.append(-1000.0), types.append(CONTROL)
    for t in ["\n", "\n\n", "  "]:
        tokens.append(t), scores.append(-1000.0), types.append(USER_DEFINED)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>"), scores.append(0.0), types.append(BYTE)
    for rank, t in enumerate(_PIECES):
        tokens.append(t), scores.append(-float(rank)), types.append(NORMAL)
    return GGUFVocab(tokens=tokens, scores=scores, types=types, model="llama")


@pytest.fixture(scope="module")
def toy_file(tmp_path_factory):
    import numpy as np
    from gguf import GGUFWriter

    v = _toy()
    path = tmp_path_factory.mktemp("gguf") / "toy.gguf"
    w = GGUFWriter(str(path), "gemma3")
    w.add_tokenizer_model("llama")
    w.add_token_list(v.tokens)
    w.add_token_scores(v.scores)
    w.add_token_types(v.types)
    w.add_tensor("dummy", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


TEXTS = [" the and", "the  and\n\nan", " leading", "thé 日本", "<end_of_turn>he", "hand\nthe ", ""]


def test_reads_a_gguf_file(toy_file):
    assert GGUFVocab.read(toy_file) == _toy()


@pytest.mark.parametrize("text", TEXTS)
def test_bpe_equals_sentencepiece_reference_and_round_trips(text):
    v = _toy()
    tk = build_tokenizer(v)
    tk.encode_special_tokens = True
    ids = tk.encode(text, add_special_tokens=False).ids
    assert ids == ReferenceSPM(v).encode(text)
    assert tk.decode(ids) == text


def test_user_text_never_becomes_a_control_token():
    v = _toy()
    tk = build_tokenizer(v)
    tk.encode_special_tokens = True
    ids = tk.encode("<end_of_turn>", add_special_tokens=False).ids
    assert v.tokens.index("<end_of_turn>") not in ids


def test_merges_rank_by_the_merged_piece_score():
    merges = bpe_merges(_toy())
    assert merges.index(("▁", "t")) < merges.index(("h", "e")) < merges.index(("▁t", "he"))
    assert ("▁a", "nd") in merges and ("▁an", "d") in merges


def test_refuses_a_non_sentencepiece_vocabulary():
    v = _toy()
    with pytest.raises(ValueError, match="not SentencePiece"):
        build_tokenizer(GGUFVocab(v.tokens, v.scores, v.types, model="gpt2"))


def test_the_fast_shared_reader_parses_what_gguf_py_parses(toy_file, tmp_path):
    """FastGGUFReader (plain-ndarray slices) yields gguf-py's fields and tensors byte for byte,
    and shared_readers() hands every GGUFReader(path) inside it one parse, then restores gguf."""
    import gguf
    import numpy as np

    from tunix_rt.models.gguf_reader import FastGGUFReader, shared_readers

    # a second file with a quantised-looking tensor layout: several tensors, odd sizes, an offset
    other = tmp_path / "t.gguf"
    w = gguf.GGUFWriter(str(other), "gemma3")
    w.add_uint32("x.n", 7)
    w.add_array("x.f", [1.5, -2.0, 3.25])
    rng = np.random.default_rng(0)
    for i, shape in enumerate([(3,), (5, 7), (2, 3, 4)]):
        w.add_tensor(f"t{i}", rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()

    for path in (toy_file, other):
        slow, fast = gguf.GGUFReader(str(path)), FastGGUFReader(str(path))
        assert list(slow.fields) == list(fast.fields)
        for name, f in slow.fields.items():
            g = fast.fields[name]
            assert (f.offset, f.data, f.types) == (g.offset, g.data, g.types), name
            assert [bytes(p) for p in f.parts] == [bytes(p) for p in g.parts], name
            assert all(type(p) is np.ndarray for p in g.parts), name  # no memmap slices
        assert [(t.name, t.tensor_type, list(t.shape), t.data_offset) for t in slow.tensors] == \
               [(t.name, t.tensor_type, list(t.shape), t.data_offset) for t in fast.tensors]
        for a, b in zip(slow.tensors, fast.tensors):
            np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))

    saved = gguf.GGUFReader
    with shared_readers():
        first = gguf.GGUFReader(str(toy_file))
        assert isinstance(first, FastGGUFReader)
        assert gguf.GGUFReader(toy_file) is first  # the same file (str or Path): one parse
        assert gguf.GGUFReader(str(other)) is not first
        assert GGUFVocab.read(toy_file) == _toy()
    assert gguf.GGUFReader is saved
