"""Our batched generation against transformers' generate on tiny Gemma 3 and Gemma 2:
identical greedy tokens with left padding and mixed prompt lengths (the tiny models' sliding
window is 16, so it is exercised), per-row stops with cache compaction, sampling seeds."""

from __future__ import annotations

import pytest
import torch

from eval_testlib import QUESTIONS, stop_early
from tunix_rt.errors import BadInput
from tunix_rt.eval.generate import DecodeConfig, TorchGenerator, left_pad
from tunix_rt.eval.runner import load_model
from tunix_rt.render import prompt_ids


def _prompts(tok):
    """Mixed lengths: with and without the system prompt (about 10 to 90 tokens)."""
    return [prompt_ids(q, tok, "" if i % 2 else "Think, then answer.") for i, q in enumerate(QUESTIONS)]


def hf_greedy(model, tok, prompts, max_new):
    ids, mask = left_pad(prompts, tok.pad_id, "cpu")
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                             eos_token_id=list(tok.stop_ids), pad_token_id=tok.pad_id,
                             top_p=None, top_k=None, temperature=None)
    rows = []
    for row in out[:, ids.shape[1]:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in tok.stop_ids), len(row))
        rows.append(row[:cut])
    return rows


@pytest.fixture(scope="module", params=["tiny-gemma3", "tiny-gemma2"])
def model_and_tok(request, tiny_dirs):
    from tunix_rt.models.tokenizer import ChatTokenizer

    d = tiny_dirs[request.param]
    return load_model(d, None, "cpu"), ChatTokenizer.from_file(d)


def test_greedy_equals_hf_generate(model_and_tok):
    model, tok = model_and_tok
    prompts = _prompts(tok)
    assert len({len(p) for p in prompts}) == len(prompts)  # really mixed lengths
    ours = TorchGenerator(model, tok).generate(prompts, DecodeConfig(max_new_tokens=24, batch_size=4))
    assert [g.ids for g in ours] == hf_greedy(model, tok, prompts, 24)
    assert all(g.n_tokens == len(g.ids) == 24 and g.finish_reason == "length" for g in ours)


def test_batching_does_not_change_greedy_output(model_and_tok):
    """Left padding, masks and positions are right: a prompt decodes the same alone and in
    a batch with longer and shorter neighbours."""
    model, tok = model_and_tok
    prompts = _prompts(tok)
    gen = TorchGenerator(model, tok)
    alone = [gen.generate([p], DecodeConfig(max_new_tokens=20, batch_size=1))[0].ids for p in prompts]
    together = [g.ids for g in gen.generate(prompts, DecodeConfig(max_new_tokens=20, batch_size=len(prompts)))]
    assert together == alone


def test_rows_stop_at_end_of_turn(tiny_dirs):
    """Make <end_of_turn> the token the model likes to emit, so rows stop at different steps;
    finished rows leave the batch (cache compacted) and the rest still match HF generate."""
    from tunix_rt.models.tokenizer import ChatTokenizer

    d = tiny_dirs["tiny-gemma3"]
    tok = ChatTokenizer.from_file(d)
    model = load_model(d, None, "cpu")
    prompts = _prompts(tok)
    stop_early(model, tok, prompts)
    ours = TorchGenerator(model, tok).generate(prompts, DecodeConfig(max_new_tokens=12, batch_size=len(prompts)))
    assert [g.ids for g in ours] == hf_greedy(model, tok, prompts, 12)
    stopped = [g for g in ours if g.finish_reason == "stop"]
    assert stopped and len({g.n_tokens for g in stopped} | {12}) > 1, "rows should stop at different steps"
    for g in ours:
        if g.finish_reason == "stop":
            assert g.ids[-1] == tok.eot_id and tok.eot_id not in g.ids[:-1]
            assert "<end_of_turn>" not in g.text and g.n_tokens < 12
        else:
            assert g.n_tokens == 12 and tok.eot_id not in g.ids


def test_sampling_is_reproducible_with_a_seed(model_and_tok):
    model, tok = model_and_tok
    prompts = _prompts(tok)[:3]
    gen = TorchGenerator(model, tok)

    def sample(seed, batch_size=3):
        cfg = DecodeConfig(max_new_tokens=16, temperature=1.0, top_p=0.95, top_k=50, seed=seed, batch_size=batch_size)
        return [g.ids for g in gen.generate(prompts, cfg)]

    a = sample(7)
    assert a == sample(7)
    assert a != sample(8)
    assert a != [g.ids for g in gen.generate(prompts, DecodeConfig(max_new_tokens=16))]  # not greedy


@pytest.mark.parametrize("bad", [dict(max_new_tokens=0), dict(batch_size=0), dict(temperature=-1.0),
                                 dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)])
def test_decode_config_rejects_bad_values(bad):
    with pytest.raises(BadInput):
        DecodeConfig(**bad)
