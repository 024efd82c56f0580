"""Sampled evaluations (`eval --samples K`) in the registry, the REST API and the web UI: the
pass@k / maj@K metrics recorded and shown, and the comparison's paired pass@1 test."""

from __future__ import annotations

import json

import pytest

from registry_testlib import write_eval
from requires import require_chromium
from service_testlib import TOKEN, LiveServer, live_app, make_client

from tunix_rt.eval.passk import item_counts, paired_sign_test
from tunix_rt.eval.runner import sampled_prediction, sampled_scores


def _sample(answer: str, gold: str) -> dict:
    ok = answer == gold
    return {"id": "i", "question": "q", "gold": gold, "completion": f"<reasoning>r</reasoning><answer>{answer}</answer>",
            "reasoning": "r", "answer": answer, "correct": ok, "format_ok": True, "n_tokens": 7,
            "finish_reason": "stop", "answer_source": "tag", "correct_lenient": ok, "category": "uncategorized",
            "prompt_tokens": 9, "arith_claims": 0, "arith_true": 0}


def write_sampled_eval(d, right_per_item: list[int], k: int = 4):
    """An eval dir as `eval --samples k` writes it; item i has right_per_item[i] right samples."""
    lines = []
    for i, right in enumerate(right_per_item):
        gold = str(i)
        samples = [_sample(gold if j < right else "wrong", gold) for j in range(k)]
        lines.append(sampled_prediction(samples) | {"id": f"q{i}", "question": f"What is {i}?"})
    metrics, by_cat = sampled_scores(lines)
    d.mkdir(parents=True)
    (d / "predictions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "eval_summary.json").write_text(json.dumps({
        "eval_id": d.name, "model": "tiny-gemma3", "adapter": "base model (no adapter)", "run_id": "not a run (base model)",
        "engine": "torch", "device": "cpu",
        "dataset": {"name": "tiny", "version": "v1", "split": "dev", "sha256": "0" * 64, "n": len(lines)},
        "decoding": {"strategy": "sample", "temperature": 1.0, "seed": 0, "samples": k}, "metrics": metrics,
        "by_category": by_cat, "started_at": "2026-11-22T06:02:00+00:00", "finished_at": "2026-11-22T06:03:00+00:00",
        "duration_s": 60.0, "tokens_per_s": 12.5}))
    return lines, metrics


@pytest.fixture
def sampled_home(home):
    from tunix_rt.registry.record import sync_home

    evals = home.root / "evals"
    a = write_sampled_eval(evals / "sampled-a", [0, 1, 1, 2, 0, 0])
    b = write_sampled_eval(evals / "sampled-b", [4, 3, 2, 4, 1, 3])
    write_eval(evals / "greedy-a")
    write_eval(evals / "greedy-b", flip=True)
    sync_home(home)
    return home, a, b


def test_api_records_sampled_metrics_and_compares_with_the_paired_test(sampled_home):
    home, (la, ma), (lb, mb) = sampled_home
    client = make_client(home, home.database_url)
    ev = client.get("/api/evaluations/sampled-b").json()
    assert ev["metrics"]["pass@4"] == mb["pass@4"] and ev["metrics"]["maj@4"] == mb["maj@4"]
    assert ev["accuracy"] == mb["pass@1"]  # accuracy of a sampled eval: over all samples
    page = client.get("/api/evaluations/sampled-b/predictions").json()
    assert page["total"] == 6  # one row per item
    cmp = client.get("/api/evaluations/compare", params={"a": "sampled-a", "b": "sampled-b"}).json()
    assert cmp["delta"]["pass@2"] == pytest.approx(mb["pass@2"] - ma["pass@2"])
    p1 = cmp["pass1"]
    assert p1["items"] == 6 and p1["a"] == ma["pass@1"] and p1["b"] == mb["pass@1"]
    assert p1["p"] == paired_sign_test([item_counts(x) for x in la], [item_counts(x) for x in lb]) == 2 / 2**6  # all six items better in B
    plain = client.get("/api/evaluations/compare", params={"a": "greedy-a", "b": "greedy-b"}).json()
    assert plain["pass1"] is None
    board = client.get("/api/evaluations/leaderboard", params={"metric": "pass@4"}).json()
    assert [e["id"] for e in board][:2] == ["sampled-b", "sampled-a"]  # evaluations without pass@4 rank last
    assert client.get("/api/evaluations/leaderboard", params={"metric": "pass@x"}).status_code in (400, 422)


def test_eval_and_compare_pages_show_pass_at_k_and_the_paired_test(sampled_home):
    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    home, (_, ma), (_, mb) = sampled_home
    with sync_playwright() as p, LiveServer(live_app(home, home.database_url)) as srv:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = browser.new_page()
            page.set_default_timeout(15000)
            page.goto(f"{srv.url}/#token={TOKEN}")
            page.wait_for_selector("[data-testid=leaderboard]")
            page.goto(f"{srv.url}/#/leaderboard?dataset=tiny&split=dev&metric=maj@4")
            page.wait_for_function("document.querySelector('#metric')?.value === 'maj@4'")  # not the login's board
            page.wait_for_selector("[data-testid=leaderboard-row]")
            assert page.locator("#metric option[value='pass@4']").count() == 1
            assert "sampled-b" in page.locator("[data-testid=leaderboard-row]").nth(0).inner_text()
            page.goto(f"{srv.url}/#/eval/sampled-b")
            page.wait_for_selector("[data-testid=eval-sampled]")
            shown = page.inner_text("[data-testid=eval-sampled]")
            for k in ("pass@1", "pass@2", "pass@4", "maj@4"):
                assert f"{k} {100 * mb[k]:.1f}%" in shown, (k, shown)
            assert "4 samples per item" in shown
            page.goto(f"{srv.url}/#/eval/greedy-a")  # a hash change: sampled-b's predictions stay until it renders
            page.wait_for_selector("h1:has-text('Evaluation greedy-a')")
            page.wait_for_selector("[data-testid=prediction]")
            assert page.locator("[data-testid=eval-sampled]").count() == 0
            page.goto(f"{srv.url}/#/compare?a=sampled-a&b=sampled-b")
            page.wait_for_selector("[data-testid=pass1-test]")
            table = page.inner_text("[data-testid=compare-metrics]")
            assert "pass@4" in table and "maj@4" in table and table.index("pass@4") < table.index("maj@4")
            assert "exact paired sign-flip test over per-item pass rates p = 0.0313" in page.inner_text("[data-testid=pass1-test]")
            assert "A maj@4, B maj@4" in page.inner_text("[data-testid=mcnemar]")
        finally:
            browser.close()
