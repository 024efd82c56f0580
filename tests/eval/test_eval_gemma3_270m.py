"""The real Gemma 3 270M base model on four GSM8K dev questions: complete files, and an
honest report that a base model does not answer in the trained format."""

from __future__ import annotations

import json

import pytest

from tunix_rt.eval.scoring import metrics


@pytest.mark.slow
def test_base_model_eval_is_complete_and_honest(cli, gemma3_270m, monkeypatch, tmp_path):
    monkeypatch.setenv("TUNIX_RT_HOME", str(gemma3_270m.parents[1]))  # the fixture's home: no re-import
    out = tmp_path / "eval"
    r = cli("eval", "--model", "gemma3-270m", "--dataset", "gsm8k", "--split", "dev", "--limit", "4",
            "--max-new-tokens", "64", "--device", "cpu", "--out", out)
    assert r.code == 0, r.err
    summary = json.loads((out / "eval_summary.json").read_text())
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 4 and summary["dataset"]["n"] == 4 and summary["dataset"]["name"] == "gsm8k"
    assert "null" not in (out / "eval_summary.json").read_text()
    assert all(v is not None for p in preds for v in p.values())
    assert summary["metrics"] == metrics(preds).to_dict()  # the summary is what the items say
    assert summary["metrics"]["format_rate"] <= 0.25  # the base model never learned the tags
    assert all(1 <= p["n_tokens"] <= 64 for p in preds) and summary["tokens_per_s"] > 0
    assert "accuracy" in r.out and str(out) in r.out.replace("\n", "")


@pytest.mark.slow
def test_int8_screened_head_decodes_the_real_model_like_full_logits(gemma3_270m):
    """Gemma 3 270M (262,144-token head), 4 GSM8K prompts, 32 tokens, greedy and sampled (T = 1
    with top_p 1 and 0.95, one seed): the same ids with the int8 screen as with full fp32
    logits, and where this CPU's int8 kernel is exact the screen rescored few tokens. (32
    tokens, not 48: 85 s of the suite was this test on a 2-core EPYC; the tiny models'
    tests cover the paths, this one the real head's logit spread.)"""
    import torch

    from tunix_rt.eval.generate import DecodeConfig, TorchGenerator
    from tunix_rt.eval.runner import load_model
    from tunix_rt.eval.screened_head import int8_matmul_is_exact, int8_matmul_is_fast
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.render import prompt_ids

    tok = load_tokenizer(str(gemma3_270m), None)
    model = load_model(gemma3_270m, None, "cpu")
    prompts = [prompt_ids(q, tok) for q in (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
        "in May. How many clips did Natalia sell altogether in April and May?",
        "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
        "How much did she earn?",
        "What is 7 times 8?",
        "A train travels 60 km in 45 minutes. What is its speed in km per hour?",
    )]
    on, off = TorchGenerator(model, tok), TorchGenerator(model, tok)
    off.lean._screen = None
    if on.lean.screen() is not None:
        on.lean.screen().certify_top_p = True  # the certified top-p path too (off by default)
    for kw in (dict(), dict(temperature=1.0), dict(temperature=1.0, top_p=0.95)):
        cfg = DecodeConfig(max_new_tokens=32, batch_size=4, seed=3, **kw)
        with torch.inference_mode():
            screened = [g.ids for g in on.generate(prompts, cfg)]
            full = [g.ids for g in off.generate(prompts, cfg)]
        assert screened == full, kw
        screen = on.lean.screen()
        if screen is None:  # on a CPU fp32 head, only an int8 kernel that saturates or is slow turns it off
            assert not (int8_matmul_is_exact(2, model.config.hidden_size, model.config.vocab_size)
                        and int8_matmul_is_fast())
            continue
        # greedy and plain sampling rescore few tokens; the certified top-p path (off by
        # default) must bound the nucleus too: measured 53k of 262k per step (20%) on an AVX2 EPYC
        share = 0.25 if kw.get("top_p") else 0.05
        assert screen.steps > 0 and screen.candidates / screen.steps < share * screen.vocab, kw
        screen.steps = screen.candidates = screen.full_rows = 0
