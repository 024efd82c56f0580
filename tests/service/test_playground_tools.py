"""The playground with tools, in headless chromium: a run trained with tools is listed with
them, its pane says so and marks the tools' results apart from the model's text (a styled
span per calculator result / python output), and "use the runs' tools" unchecked asks the
server to decode without them (the reply then equals /v1's with use_tools false)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from requires import require_chromium
from service_testlib import TOKEN, LiveServer, live_app, models_of

pytestmark = pytest.mark.browser

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
RUN = "grpo-tiny-tools"


@pytest.fixture
def page_on(home):
    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    from tunix_rt.models.store import ensure_model

    run = home.runs / RUN
    shutil.copytree(ensure_model("tiny-gemma3", home), run / "final" / "merged")
    (run / "config.yaml").write_text(yaml.safe_dump({"model": "tiny-gemma3", "system_prompt": "", "tools": ["calculator"]}))
    with sync_playwright() as p, LiveServer(live_app(home, home.database_url)) as srv:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        page = browser.new_page()
        page.set_default_timeout(30000)
        page.goto(f"{srv.url}/#token={TOKEN}")
        page.wait_for_selector("#nav a[href='#/playground']", state="visible")  # the token is kept: logged in
        page.goto(f"{srv.url}/#/playground")
        page.wait_for_selector(f"#play-a option[value='{RUN}']", state="attached")
        try:
            yield srv, page
        finally:
            browser.close()
            if getattr(srv.server.config.app.state, "models", None) is not None:
                models_of(srv.server.config.app).close()


def test_tool_results_are_marked_apart_from_the_model_text(page_on):
    _, page = page_on
    pieces = page.evaluate("toolPieces('So <<3*4=12>>12 apples, <<1/0=error>> and <<2+', ['calculator'])")
    assert pieces == [{"text": "So <<3*4=", "tool": False}, {"text": "12>>", "tool": True},
                      {"text": "12 apples, <<1/0=", "tool": False}, {"text": "error>>", "tool": True},
                      {"text": " and <<2+", "tool": False}]
    python = page.evaluate("toolPieces('<python>print(2)</python><output>2\\n</output> so <<1=', ['python'])")
    assert python == [{"text": "<python>print(2)</python>", "tool": False}, {"text": "<output>2\n</output>", "tool": True},
                      {"text": " so <<1=", "tool": False}]
    assert page.evaluate("toolPieces('a <<3*4=12>>', [])") == [{"text": "a <<3*4=12>>", "tool": False}]
    marked = page.evaluate("""() => { const el = document.body.appendChild(document.createElement('pre'));
        showTurn(el, 'So <<3*4=12>>12.', ['calculator']);
        return [el.textContent, [...el.querySelectorAll('span.tool')].map((s) => s.textContent),
                getComputedStyle(el.querySelector('span.tool')).backgroundColor]; }""")
    assert marked[0] == "So <<3*4=12>>12." and marked[1] == ["12>>"] and marked[2] not in ("", "rgba(0, 0, 0, 0)")


def test_a_run_with_tools_is_asked_with_them_unless_unchecked(page_on):
    import httpx

    srv, page = page_on
    page.select_option("#play-a", RUN)
    page.fill("#question", "What is 3*4?")
    page.fill("#max-tokens", "6")
    page.click("#ask")
    page.wait_for_selector("[data-testid=pane-0] [data-testid=pane-status]:has-text('finished')")
    assert "tools: calculator" in page.inner_text("[data-testid=pane-0] [data-testid=pane-tools]")
    page.uncheck("#use-tools")
    page.click("#ask")
    page.wait_for_selector("[data-testid=pane-0] [data-testid=pane-status]:has-text('finished')")
    assert page.locator("[data-testid=pane-0] [data-testid=pane-tools]").count() == 0
    got = page.get_attribute("[data-testid=pane-0] [data-testid=reasoning]", "data-raw")
    r = httpx.post(srv.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60,
                   json={"model": RUN, "messages": [{"role": "user", "content": "What is 3*4?"}], "max_tokens": 6,
                         "use_tools": False})
    assert got == r.json()["choices"][0]["message"]["content"] != ""
    listed = httpx.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}).json()["data"]
    assert {m["id"]: m["tools"] for m in listed}[RUN] == ["calculator"]
    assert {m["id"]: m["tools"] for m in listed}["tiny-gemma3"] == []


def test_an_rl_run_with_tools_charts_its_tool_calls_and_errors(page_on, home):
    import json

    from registry_testlib import write_run
    from tunix_rt.registry.record import record_run

    srv, page = page_on
    run = write_run(home, "grpo-20261122-080000-cd56", steps=3, ckpts=(3,))
    rows = [{"step": s, "loss": 0.01 * s, "lr": 2e-5, "grad_norm": 0.5, "reward": 0.2 * s, "reward_answer": 0.1 * s,
             "tool_calls": 4 * s, "tool_errors": s - 1, "tool_tokens": 12 * s} for s in range(1, 4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record_run(run)
    page.goto(f"{srv.url}/#/run/{run.name}")
    page.wait_for_selector("[data-testid=tool-chart] polyline", state="attached")
    assert page.locator("[data-testid=tool-chart] polyline").count() == 2  # calls, errors
    assert "tool errors" in page.text_content("[data-testid=tool-chart]")


def test_eval_page_marks_the_tools_results_in_each_prediction(home):
    """An eval decoded with tools: its page says which, shows the tool-use metrics, and each
    prediction's reasoning shows the calculator's result as a tool span, not the model's text."""
    import json

    from tunix_rt.registry.record import sync_home

    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    d = home.root / "evals" / "calc-eval"
    d.mkdir(parents=True)
    reasoning = "3*4 = <<3*4=12>>12 so it is 12"
    pred = {"id": "q1", "question": "What is 3*4?", "gold": "12", "reasoning": reasoning, "answer": "12",
            "completion": f"<reasoning>{reasoning}</reasoning><answer>12</answer>", "correct": True, "format_ok": True,
            "n_tokens": 14, "finish_reason": "stop",
            "tool_calls": [{"tool": "calculator", "call": "3*4", "result": "12>>", "error": False}], "tool_tokens": 3}
    metrics = {"accuracy": 1.0, "format_rate": 1.0, "answer_found_rate": 1.0, "mean_completion_tokens": 14,
               "truncated_rate": 0.0, "n": 1, "tool_calls_per_item": 1.0, "tool_error_rate": 0.0, "tool_use_rate": 1.0,
               "tool_tokens_per_item": 3.0}
    (d / "predictions.jsonl").write_text(json.dumps(pred) + "\n")
    (d / "eval_summary.json").write_text(json.dumps({
        "model": "tiny-gemma3", "adapter": None, "engine": "torch", "device": "cpu",
        "dataset": {"name": "tiny", "version": "v1", "split": "dev", "sha256": "0" * 64, "n": 1},
        "decoding": {"strategy": "greedy", "max_new_tokens": 64, "tools": ["calculator"]}, "metrics": metrics,
        "by_category": {}, "started_at": "2026-11-26T06:02:00+00:00", "finished_at": "2026-11-26T06:03:00+00:00",
        "duration_s": 60.0, "tokens_per_s": 12.5}))
    sync_home(home)
    with sync_playwright() as p, LiveServer(live_app(home, home.database_url)) as srv:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.set_default_timeout(30000)
            page.goto(f"{srv.url}/#token={TOKEN}")
            page.wait_for_selector("#nav a[href='#/playground']", state="visible")
            page.goto(f"{srv.url}/#/eval/calc-eval")
            page.wait_for_selector("[data-testid=prediction]")
            assert "tools calculator" in page.inner_text("[data-testid=eval-tools]")
            assert "tool calls per item 1\n" in page.inner_text("[data-testid=eval-tools]")
            spans = page.locator("[data-testid=reasoning] span.tool")
            assert spans.count() == 1 and spans.inner_text() == "12>>"
            assert page.inner_text("[data-testid=reasoning]") == reasoning
        finally:
            browser.close()
