"""Decoding with tools (issue 24): a row that closes a call gets the tool's result forced into
it, one id per step, while the other rows go on decoding; batched equals one at a time, token
for token, greedy and sampled, on the torch path (lean step and int8-screened head, and the
transformers step) and the JAX path.

How a tiny random model writes a call, honestly: some prompts already hold the start of the
model turn, ending inside a calculator call ("So <<3*4"), and the model's own greedy first
token there is made "=$" by swapping two rows of the tied embedding (the token it liked best
and "=$"): the model writes the closing "=" itself, inside a token whose text runs past it,
so the replacement rule of tunix_rt.tools applies. A second swap makes "=" a token the model
likes, so sampled rows close their calls too (with whatever they wrote as the body).
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from eval_testlib import QUESTIONS
from requires import require_module
from tunix_rt.errors import BadInput
from tunix_rt.eval.generate import DecodeConfig, ToolRow, TorchGenerator, turn_ids
from tunix_rt.models.hf import load_causal_lm
from tunix_rt.render import prompt_ids
from tunix_rt.tools import Call, respond

CALC = ("calculator",)
EQ, EQ_DOLLAR = "=", "=$"  # "=$" is one token of the tiny tokenizer: its text runs past "="
GREEDY = DecodeConfig(max_new_tokens=16, batch_size=8, tools=CALC)
SAMPLED = replace(GREEDY, temperature=1.0, top_k=40, seed=0)


def the_prompts(tok) -> list[list[int]]:
    """Rows 0 and 2 start inside a call, the others are plain prompts of other lengths."""
    return [prompt_ids(QUESTIONS[0], tok, "") + tok.encode("So <<3*4"),
            prompt_ids(QUESTIONS[1], tok, "Be brief."),
            prompt_ids(QUESTIONS[2], tok, "") + tok.encode("It is <<60*3"),
            prompt_ids(QUESTIONS[3], tok, ""),
            prompt_ids(QUESTIONS[4], tok, "Think.")]


def token(tok, text: str) -> int:
    ids = tok.encode(text)
    assert len(ids) == 1, f"{text!r} is not one token of this tokenizer"
    return ids[0]


def steering_swaps(model, tok, prompts) -> list[tuple[int, int]]:
    """The embedding rows to swap: row 0's greedy first token with "=$", and the token the
    other rows write most with "="."""
    plain = TorchGenerator(model, tok).generate(prompts, replace(GREEDY, tools=()))
    counts: dict[int, int] = {}
    for g in plain[1:]:
        for t in g.ids:
            counts[t] = counts.get(t, 0) + 1
    swaps = [(plain[0].ids[0], token(tok, EQ_DOLLAR)), (max(counts, key=counts.get), token(tok, EQ))]
    assert not {t for pair in swaps for t in pair} & {t for p in prompts for t in p}, "a swap would change a prompt"
    return swaps


def swap_rows(weight, swaps) -> None:
    with torch.no_grad():
        for a, b in swaps:
            weight[[a, b]] = weight[[b, a]]


@pytest.fixture(scope="module", params=["tiny-gemma3", "tiny-gemma2"])
def steered(request, tiny_dirs):
    """(model dir, the steered torch model, tokenizer, prompts, swaps)."""
    return build_steered(tiny_dirs[request.param])


def build_steered(d):
    from tunix_rt.models.tokenizer import ChatTokenizer

    tok = ChatTokenizer.from_file(d)
    model = load_causal_lm(d, dtype="fp32", device="cpu", attn="eager").eval()
    prompts = the_prompts(tok)
    swaps = steering_swaps(model, tok, prompts)
    swap_rows(model.get_input_embeddings().weight, swaps)
    first = TorchGenerator(model, tok).generate(prompts[:1], replace(GREEDY, tools=(), max_new_tokens=1))
    assert first[0].ids == [token(tok, EQ_DOLLAR)]  # the model itself writes "=$" there
    return d, model, tok, prompts, swaps


def one_at_a_time(gen, prompts, cfg):
    return [gen.generate([p], replace(cfg, batch_size=1), keys=[i])[0] for i, p in enumerate(prompts)]


def records(outs):
    return [(g.ids, g.tool_mask, g.tool_calls, g.finish_reason, g.text) for g in outs]


# ---------------------------------------------------------------------------------------------
# The rule, row by row (no model: the picks are scripted)

def test_a_row_forces_the_result_after_the_token_that_closes_a_call(tiny_tok):
    row = ToolRow(tiny_tok, CALC)
    model_ids = tiny_tok.encode("Half is <<48/2") + [token(tiny_tok, EQ_DOLLAR)]
    result = tiny_tok.encode("24>>")
    ignored = token(tiny_tok, " apples")
    emitted = [row.take(t) for t in model_ids] + [row.take(ignored) for _ in result] + [row.take(ignored)]
    want = tiny_tok.encode("Half is <<48/2") + [token(tiny_tok, EQ)] + result + [ignored]
    assert emitted == row.ids == want  # "=$" ran past "=": replaced by "="; picks ignored while forcing
    assert row.mask == [0] * (len(want) - len(result) - 1) + [1] * len(result) + [0]
    assert row.calls == [{"tool": "calculator", "call": "48/2", "result": "24>>", "error": False}]
    assert row.text() == "Half is <<48/2=24>> apples" and not row.forcing


def test_a_call_already_answered_or_in_the_prompt_is_not_answered_again(tiny_tok):
    head = prompt_ids("q", tiny_tok, "")
    assert turn_ids(head, tiny_tok) == []
    row = ToolRow(tiny_tok, CALC, head + tiny_tok.encode("<<2*3=6>> and <<1/0"))
    assert row.turn == tiny_tok.encode("<<2*3=6>> and <<1/0")
    emitted = [row.take(t) for t in tiny_tok.encode("=")]
    bad = tiny_tok.encode(respond(Call("calculator", "1/0")).text)
    emitted += [row.take(0) for _ in bad]
    assert emitted == tiny_tok.encode("=") + bad and row.mask == [0] + [1] * len(bad)
    assert [(c["call"], c["error"]) for c in row.calls] == [("1/0", True)]
    # a prompt whose last turn is not the model's holds nothing of the model turn
    user = [tiny_tok.bos_id, tiny_tok.sot_id] + tiny_tok.encode("user\nhi <<2")
    assert turn_ids(user, tiny_tok) == [] and turn_ids([tiny_tok.bos_id], tiny_tok) == []


def test_stop_ids_pass_through_and_tools_are_checked(tiny_tok):
    row = ToolRow(tiny_tok, CALC, tiny_tok.encode("<<5"))  # no model turn in this prompt: "<<5" does not count
    assert [row.take(t) for t in (token(tiny_tok, EQ), tiny_tok.eot_id)] == [token(tiny_tok, EQ), tiny_tok.eot_id]
    assert row.calls == [] and row.mask == [0, 0]
    with pytest.raises(BadInput, match="tools"):
        DecodeConfig(tools=("abacus",))
    assert DecodeConfig(tools=["calculator"]).tools == CALC
    assert "tools" not in DecodeConfig().to_dict() and DecodeConfig(tools=CALC).to_dict()["tools"] == ["calculator"]


# ---------------------------------------------------------------------------------------------
# Torch

def test_torch_greedy_with_a_calculator(steered):
    _, model, tok, prompts, _ = steered
    gen = TorchGenerator(model, tok)
    outs = gen.generate(prompts, GREEDY)
    plain = gen.generate(prompts, replace(GREEDY, tools=()))
    # row 0: the model wrote "=$" (see the fixture); the row holds "=" then the forced "12>>"
    result = tok.encode("12>>")
    head = [token(tok, EQ)] + result
    assert plain[0].ids[0] == token(tok, EQ_DOLLAR)
    assert outs[0].ids[: len(head)] == head and outs[0].text.startswith("=12>>")
    assert outs[0].tool_mask == [0] + [1] * len(result) + [0] * (len(outs[0].ids) - len(head))
    assert outs[0].tool_calls == [{"tool": "calculator", "call": "3*4", "result": "12>>", "error": False}]
    assert outs[0].n_tokens == GREEDY.max_new_tokens > len(head)  # forced ids count; the model resumed
    # ... after really being fed them: it goes on as a prompt that ends with them would
    rest = gen.generate([prompts[0] + head], replace(GREEDY, tools=(), max_new_tokens=GREEDY.max_new_tokens - len(head)))
    assert outs[0].ids[len(head):] == rest[0].ids
    # rows that close no call decode exactly as without tools, whatever their neighbours do
    free = [i for i, g in enumerate(outs) if not g.tool_calls]
    assert free and len(free) < len(outs)
    for i in free:
        assert outs[i].ids == plain[i].ids and outs[i].tool_mask == [0] * outs[i].n_tokens
    assert plain[1].tool_mask == [0] * plain[1].n_tokens and plain[1].tool_calls == []
    # batched == one at a time == other batchings == the transformers step (full logits)
    assert records(one_at_a_time(gen, prompts, GREEDY)) == records(outs)
    assert records(gen.generate(prompts, replace(GREEDY, batch_size=2))) == records(outs)
    assert records(TorchGenerator(model, tok, lean=False).generate(prompts, GREEDY)) == records(outs)


def test_torch_sampling_with_a_calculator(steered):
    """Seeded sampling (top-k: through the int8 screen where it applies): the calls close,
    their results are forced and masked, and each row samples the same in any batch."""
    _, model, tok, prompts, _ = steered
    gen = TorchGenerator(model, tok)
    outs = gen.generate(prompts, SAMPLED)
    called = [g for g in outs if g.tool_calls]
    assert called, "no sampled row closed a call"
    for g in called:  # the tool-written ids are the results' ids, in order (the last may be cut)
        written = [t for t, m in zip(g.ids, g.tool_mask) if m]
        results = [t for c in g.tool_calls for t in tok.encode(c["result"])]
        assert written and written == results[: len(written)]
        assert len(written) == len(results) or (g.finish_reason == "length" and g.tool_mask[-1] == 1)
    plain = gen.generate(prompts, replace(SAMPLED, tools=()))
    for g, p in zip(outs, plain):
        if not g.tool_calls:
            assert g.ids == p.ids
    assert records(one_at_a_time(gen, prompts, SAMPLED)) == records(outs)
    assert records(gen.generate(prompts, replace(SAMPLED, batch_size=3))) == records(outs)
    assert records(TorchGenerator(model, tok, lean=False).generate(prompts, SAMPLED)) == records(outs)


def test_forced_ids_count_toward_max_new_tokens(steered):
    _, model, tok, prompts, _ = steered
    short = replace(GREEDY, max_new_tokens=3)
    g = TorchGenerator(model, tok).generate(prompts[:1], short)[0]
    assert g.ids == [token(tok, EQ)] + tok.encode("12>>")[:2] and g.tool_mask == [0, 1, 1]
    assert g.finish_reason == "length"


# ---------------------------------------------------------------------------------------------
# JAX

@pytest.fixture(scope="module")
def jax_steered(tiny_dirs):
    """Tiny Gemma 3 only: the tool rule is the same on both architectures, and each batch
    shape costs the JAX path a compile."""
    require_module("jax")
    from tunix_rt.eval.jax_generate import load_generator

    d, model, tok, prompts, swaps = build_steered(tiny_dirs["tiny-gemma3"])
    gen = load_generator(d, None, tok, "cpu")
    jmodel = gen.model
    emb = jmodel.embedder.input_embedding
    table = emb[...]
    for a, b in swaps:
        table = table.at[np.array([a, b])].set(table[np.array([b, a])])
    emb[...] = table
    return gen.load(jmodel), model, tok, prompts


@pytest.mark.jax
def test_jax_greedy_with_a_calculator_matches_torch(jax_steered):
    gen, model, tok, prompts = jax_steered
    outs = gen.generate(prompts, GREEDY)
    assert records(outs) == records(TorchGenerator(model, tok).generate(prompts, GREEDY))
    assert outs[0].tool_calls[0]["result"] == "12>>"
    assert records(one_at_a_time(gen, prompts, GREEDY)) == records(outs)


@pytest.mark.jax
def test_jax_sampling_with_a_calculator_is_the_same_in_any_batch(jax_steered):
    gen, _, tok, prompts = jax_steered
    cfg = SAMPLED
    outs = gen.generate(prompts, cfg)
    assert any(g.tool_calls for g in outs), "no sampled row closed a call"
    assert records(one_at_a_time(gen, prompts, cfg)) == records(outs)
    plain = gen.generate(prompts, replace(cfg, tools=()))
    for g, p in zip(outs, plain):
        if not g.tool_calls:
            assert g.ids == p.ids and g.tool_mask == [0] * g.n_tokens


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_head_moved_to_another_dtype_gets_no_stale_screen(tiny_dirs):
    """module.to() swaps a parameter's data without moving its version counter: the shared
    screen of the old fp32 head must not serve the moved one (seen moving a model to CUDA)."""
    from tunix_rt.eval.fast_gemma import LeanGemma

    model = load_causal_lm(tiny_dirs["tiny-gemma3"], dtype="fp32", device="cpu", attn="eager").eval()
    first = LeanGemma.for_model(model).screen()
    model.to(torch.float64)
    assert LeanGemma.for_model(model).screen() is None, f"a stale screen (built: {first is not None})"
