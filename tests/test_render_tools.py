"""Rendering with tools: the model turn is tokenized piece by piece (tools.segments), what
the tool writes has loss mask 0 and every other model-turn token 1, token by token, with
the tiny tokenizer and the real Gemma 3 tokenizer; the batch labels skip tool tokens."""

from __future__ import annotations

import pytest

from tunix_rt.errors import BadInput
from tunix_rt.render import parse_completion, render_dataset, render_example, supervised_text, target_body
from tunix_rt.tools import segments
from tunix_rt.train.data import IGNORE, collate

CALC = ["calculator"]
STEPS = ["Natalia sold 48/2 = <<48/2=24>>24 clips in May.",
         "She sold 48+24 = <<48+24=72.00>>72 clips in all, $<<72*.5=36>>36 in profit.",
         "Per clip: <<36/72=.5>>0.5, and a third is <<1/3=0.33>>0.33."]
TOOL_TEXTS = ["24>>", "72>>", "36>>", "0.5>>", "0.3333>>"]  # what the calculator writes now


def _runs(ids: list[int], mask: list[int]) -> list[tuple[list[int], int]]:
    """Consecutive runs of equal mask: (ids, mask value)."""
    out: list[tuple[list[int], int]] = []
    for i, m in zip(ids, mask):
        if out and out[-1][1] == m:
            out[-1][0].append(i)
        else:
            out.append(([i], m))
    return out


def _check_token_by_token(tok):
    r = render_example("a", "How many clips?", STEPS, "72", tok, tools=CALC)
    pieces = segments(target_body(STEPS, "72"), CALC)
    assert [t for t, by_tool in pieces if by_tool] == TOOL_TEXTS
    target_ids, target_mask = r.ids[r.prompt_len:], r.loss_mask[r.prompt_len:]
    # token by token: the ids are each piece encoded on its own, the mask 0 exactly on the
    # tool's pieces and 1 on every token the model writes, <end_of_turn> included
    expected_ids, expected_mask = [], []
    for text, by_tool in pieces:
        ids = tok.encode(text)
        expected_ids += ids
        expected_mask += [0 if by_tool else 1] * len(ids)
    assert target_ids == expected_ids + [tok.eot_id]
    assert target_mask == expected_mask + [1]
    assert r.loss_mask[: r.prompt_len] == [0] * r.prompt_len
    # the masked-out runs of the model turn decode to the tool's results, in order
    assert [tok.decode(ids) for ids, m in _runs(target_ids, target_mask) if m == 0] == TOOL_TEXTS
    # the text: results as the tool writes them now (GSM8K wrote 72.00, .5, 0.33)
    assert r.target_text == "".join(t for t, _ in pieces) + "<end_of_turn>"
    assert "<<48+24=72>>72" in r.target_text and "<<1/3=0.3333>>0.33." in r.target_text
    assert supervised_text(r, tok) == r.model_text == "".join(t for t, b in pieces if not b) + "<end_of_turn>"
    # the answer still reads back, tool results inside the reasoning
    parsed = parse_completion(r.target_text)
    assert parsed.format_ok and parsed.answer == "72" and "<<48/2=24>>24 clips" in parsed.reasoning
    return r


def test_tool_tokens_have_mask_0_token_by_token_tiny(tiny_tok):
    _check_token_by_token(tiny_tok)


@pytest.mark.slow
def test_tool_tokens_have_mask_0_token_by_token_gemma(gemma3_270m):
    from tunix_rt.models.tokenizer import ChatTokenizer

    _check_token_by_token(ChatTokenizer.from_file(gemma3_270m))


def test_without_tools_nothing_changes(tiny_tok):
    plain = render_example("a", "q", STEPS, "72", tiny_tok)
    body = target_body(STEPS, "72")
    assert plain.ids[plain.prompt_len:] == tiny_tok.encode(body) + [tiny_tok.eot_id]
    assert plain.loss_mask == [0] * plain.prompt_len + [1] * (len(plain.ids) - plain.prompt_len)
    assert plain.model_text is None and supervised_text(plain, tiny_tok) == plain.target_text
    # a turn without any call renders the same with or without the calculator
    no_calls = render_example("a", "q", ["48/2 = 24"], "24", tiny_tok, tools=CALC)
    assert no_calls == render_example("a", "q", ["48/2 = 24"], "24", tiny_tok)


def test_a_result_the_calculator_refuses_is_written_as_its_error(tiny_tok):
    r = render_example("a", "q", ["x <<5/0=0>>0"], "0", tiny_tok, tools=CALC)
    assert "<<5/0=error: division by zero>>0" in r.target_text
    with pytest.raises(BadInput, match=r"^b: calculator call '<<2\+2=' has no result"):
        render_example("b", "q", ["x <<2+2=4"], "4", tiny_tok, tools=CALC)


def test_batch_labels_never_target_a_tool_token(tiny_tok):
    class T:
        def __init__(self, i, steps):
            self.id, self.question, self.steps, self.answer = i, "q", steps, "72"

    examples, _ = render_dataset([T("a", STEPS), T("b", STEPS[:1])], tiny_tok, 4096, tools=CALC)
    batch = collate([[examples[0]], [examples[1]]], tiny_tok.pad_id)
    for row, ex in enumerate(examples):
        n = len(ex.ids)
        want = [ex.ids[t + 1] if ex.loss_mask[t + 1] else IGNORE for t in range(n - 1)]
        assert batch.labels[row, : n - 1].tolist() == want
        tool_positions = [t for t in range(ex.prompt_len, n) if not ex.loss_mask[t]]
        assert tool_positions and all(batch.labels[row, t - 1] == IGNORE for t in tool_positions)
    assert batch.n_supervised == sum(sum(ex.loss_mask) for ex in examples)
