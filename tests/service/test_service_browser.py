"""The web UI in headless Debian chromium, driven by Playwright (no browser download: the
system's /usr/bin/chromium). Opens every page, follows jobs from queued to finished while a
real worker runs them, and filters predictions."""

from __future__ import annotations

import json
import threading

import pytest

from requires import require_chromium
from service_testlib import TOKEN, LiveServer, live_app, models_of
from registry_testlib import seed_home, write_dataset_file, write_eval, write_run

pytestmark = pytest.mark.browser

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture
def site(home, browser):
    from tunix_rt.registry.record import sync_home

    ids = seed_home(home)
    sync_home(home)
    with LiveServer(live_app(home, home.database_url, sse_poll_s=0.1)) as srv:
        page = browser.new_page()
        page.set_default_timeout(15000)
        yield srv, page, ids
        page.close()
        if getattr(srv.server.config.app.state, "models", None) is not None:
            models_of(srv.server.config.app).close()  # the playground's decode threads


def work_one_job(page, home) -> None:
    """A worker in a thread takes the queued job while the job page shows it: returns once the
    page says succeeded (the worker joined)."""
    from tunix_rt.registry.worker import Worker, WorkerConfig

    worker = threading.Thread(target=Worker(home, WorkerConfig(lease_s=10, poll_s=0.05, max_jobs=1)).run)
    worker.start()
    try:
        page.wait_for_selector("[data-testid=status]:has-text('succeeded')", timeout=170000)
    finally:
        worker.join(timeout=200)


def _login(page, srv) -> None:
    page.goto(f"{srv.url}/#token={TOKEN}")
    page.wait_for_selector("[data-testid=leaderboard]")
    assert "token" not in page.url  # the token leaves the address bar at once


def test_login_refuses_a_wrong_token(site):
    srv, page, _ = site
    page.goto(srv.url + "/")
    page.fill("#token", "not-the-token-at-all")
    page.click("#login")
    page.wait_for_selector("[data-testid=login-error]:has-text('refused')")
    page.fill("#token", TOKEN)
    page.click("#login")
    page.wait_for_selector("[data-testid=leaderboard]")


def test_every_page_renders(site):
    srv, page, ids = site
    _login(page, srv)
    rows = page.locator("[data-testid=leaderboard-row]")
    assert rows.count() == 2 and ids["eval_base"] in rows.nth(0).inner_text()
    page.goto(f"{srv.url}/#/runs")
    page.wait_for_selector("[data-testid=runs]")
    assert page.locator("[data-testid=runs] tbody tr").count() == 2
    page.click(f"text={ids['run']}")
    page.wait_for_selector("[data-testid=loss-chart] polyline")
    assert "null" not in page.inner_text("main")  # no stray null above the charts or at the bottom
    assert page.locator("[data-testid=loss-chart] polyline").count() == 2  # train loss and eval loss
    assert page.locator("[data-testid=lr-chart] polyline").count() == 1
    assert "lr: 0.003" in page.inner_text("[data-testid=config]")
    assert "config.yaml" in page.inner_text("[data-testid=artifacts]")
    assert page.inner_text("[data-testid=status]") == "succeeded"
    page.goto(f"{srv.url}/#/datasets")
    page.wait_for_selector("[data-testid=datasets] td:has-text('tiny')")
    page.goto(f"{srv.url}/#/jobs")
    page.wait_for_selector("text=No jobs yet.")
    page.goto(f"{srv.url}/#/leaderboard")
    page.wait_for_selector("[data-testid=leaderboard]")
    page.locator("[data-testid=leaderboard-row] input[type=checkbox]").nth(0).check()
    page.locator("[data-testid=leaderboard-row] input[type=checkbox]").nth(1).check()
    page.click("#compare-picked")
    page.wait_for_selector("[data-testid=compare-metrics]")
    assert page.locator("[data-testid=fixed] .item").count() == 2
    assert page.locator("[data-testid=broken] .item").count() == 3
    assert "2 fixed, 3 broken · exact McNemar p = 1.00" in page.inner_text("[data-testid=mcnemar]")  # C(5,≤2)/2^5·2
    page.goto(f"{srv.url}/#/runs")
    page.click("text=tiny-gemma3-20261122-050000-cd34")  # the failed run: an error line, no job
    page.wait_for_selector("text=RuntimeError: boom")
    assert "null" not in page.inner_text("main")


def test_predictions_browser_filters(site):
    srv, page, ids = site
    _login(page, srv)
    page.goto(f"{srv.url}/#/eval/{ids['eval_base']}")
    page.wait_for_selector("[data-testid=prediction]")
    cards = page.locator("[data-testid=prediction]")
    assert cards.count() == 6
    first = cards.nth(0).inner_text()
    assert "What is 2+2?" in first and "✓ right" in first and "step for q1" in first
    page.check("#wrong-only")
    page.wait_for_function("document.querySelectorAll('[data-testid=prediction]').length === 3")
    assert all("✗ wrong" in t for t in cards.all_inner_texts())
    page.check("#format-violations")
    page.wait_for_function("document.querySelectorAll('[data-testid=prediction]').length === 1")
    assert "format violation" in cards.nth(0).inner_text() and "What is 10/2?" in cards.nth(0).inner_text()
    page.uncheck("#wrong-only")
    page.wait_for_function("document.querySelectorAll('[data-testid=prediction]').length === 2")
    page.uncheck("#format-violations")
    page.fill("#search", "apples")
    page.wait_for_function("document.querySelectorAll('[data-testid=prediction]').length === 1")
    assert "Apples" in cards.nth(0).inner_text() and page.inner_text("[data-testid=count]") == "1 item(s)"


def test_upload_follows_a_job_from_queued_to_finished(site, home, tmp_path):
    from tunix_rt.registry.worker import Worker, WorkerConfig

    srv, page, _ = site
    _login(page, srv)
    page.goto(f"{srv.url}/#/datasets")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "question": "q", "steps": [], "answer": "1"}\n')
    page.set_input_files("#upload-file", str(bad))
    page.fill("#upload-name", "fromui")
    page.click("#upload")
    page.wait_for_selector("[data-testid=upload-errors]")
    assert "bad.jsonl:1: steps: empty list" in page.inner_text("[data-testid=upload-errors]")
    good = write_dataset_file(tmp_path / "good.jsonl", 6, "ui")
    page.set_input_files("#upload-file", str(good))
    page.click("#upload")
    page.click("[data-testid=upload-result] a")
    page.wait_for_selector("[data-testid=status]:has-text('queued')")
    worker = threading.Thread(target=Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1)).run)
    worker.start()
    page.wait_for_selector("[data-testid=status]:has-text('succeeded')", timeout=60000)
    worker.join(timeout=30)
    page.wait_for_selector("[data-testid=logs]:has-text('attempt 1: succeeded')")
    assert "fromui@job" in page.inner_text("[data-testid=job-result]")
    page.goto(f"{srv.url}/#/jobs")
    page.wait_for_selector("[data-testid=jobs] .badge.succeeded")
    page.goto(f"{srv.url}/#/datasets")
    page.wait_for_selector("[data-testid=datasets] td:has-text('fromui')")


def test_submit_a_train_run_and_follow_it_to_finished(site, home):
    """A real tiny-gemma3 LoRA run (3 steps on the 8-record dataset) queued from the runs page,
    trained and evaluated by a worker, followed live on the job page, then shown on its run
    page and on the leaderboard."""
    srv, page, _ = site
    _login(page, srv)
    page.goto(f"{srv.url}/#/runs")
    page.select_option("#preset", "smoke")
    assert page.is_checked("#evaluate")  # evaluated afterwards: the run reaches the leaderboard
    page.fill("#overrides", "dataset=tiny@v1\nsplit=all\neval_split=all\nmax_steps=3\nbatch_size=2\n"
                            "eval_interval=0\nsave_interval=0\nwarmup_steps=0\nmax_seq_len=256")
    page.click("#submit-run")
    page.wait_for_selector("[data-testid=status]:has-text('queued')")
    work_one_job(page, home)
    page.wait_for_selector("[data-testid=loss-chart] polyline", timeout=15000)
    assert "attempt 1: succeeded" in page.inner_text("[data-testid=logs]")
    page.click("[data-testid=job-run] a")
    page.wait_for_selector("[data-testid=loss-chart] polyline")
    assert page.inner_text("[data-testid=status]") == "succeeded"
    assert page.locator("[data-testid=lr-chart] polyline").count() == 1
    assert "run_manifest.json" in page.inner_text("[data-testid=artifacts]")
    assert "max_steps: 3" in page.inner_text("[data-testid=config]")
    run_id = page.url.rsplit("/", 1)[1]
    page.goto(f"{srv.url}/#/leaderboard")
    page.wait_for_selector(f"[data-testid=leaderboard-row]:has-text('{run_id}')")  # the newest board first
    assert page.locator("[data-testid=leaderboard-row]").count() == 1  # tiny / all: its own board
    assert "tiny@v1 / all (1)" in page.inner_text("#board option:checked")


def _retag(eval_dir, dataset: str, split: str) -> None:
    summary = json.loads((eval_dir / "eval_summary.json").read_text())
    summary["dataset"].update(name=dataset, split=split)
    (eval_dir / "eval_summary.json").write_text(json.dumps(summary))


def test_leaderboard_one_board_per_dataset_and_split(site, home):
    from tunix_rt.registry.record import record_eval

    srv, page, ids = site
    other = write_eval(home.root / "evals" / "gsm-test-1")
    _retag(other, "gsm8k", "test")
    record_eval(other)
    _login(page, srv)
    page.select_option("#board", label="tiny@v1 / dev (2)")
    # the board drawn for the new address (the first board may be this one already: rows alone
    # would not show that its page was drawn)
    page.wait_for_function("location.hash.includes('dataset=tiny') && document.querySelector('#board option:checked')"
                           ".textContent === 'tiny@v1 / dev (2)' && document.querySelectorAll('[data-testid=leaderboard-row]').length === 2")
    assert "gsm-test-1" not in page.inner_text("[data-testid=leaderboard]")
    page.select_option("#board", label="gsm8k@v1 / test (1)")
    page.wait_for_selector("[data-testid=leaderboard-row]:has-text('gsm-test-1')")
    assert page.locator("[data-testid=leaderboard-row]").count() == 1
    heads = page.locator("[data-testid=leaderboard] th").all_inner_texts()
    assert heads == ["pick", "#", "evaluation", "run / model", "n", "accuracy", "format"]  # every column named once
    page.select_option("#metric", "mean_completion_tokens")
    page.wait_for_selector("[data-testid=leaderboard] th:has-text('mean_completion_tokens')")
    assert "gsm-test-1" in page.inner_text("[data-testid=leaderboard]")  # the board is kept


def test_a_page_answered_late_never_draws_over_the_newer_one(site, home):
    """Two boards picked in a row while the first one's rows are slow to come (a loaded
    server): the second board is drawn and stays drawn once the first one's answer arrives."""
    from tunix_rt.registry.record import record_eval

    srv, page, _ = site
    other = write_eval(home.root / "evals" / "gsm-test-1")
    _retag(other, "gsm8k", "test")
    record_eval(other)
    _login(page, srv)
    # the page's own fetch, with the tiny board's rows held back 1.5 s; slowAsked once the page
    # has asked for them, slowSettled once the held-back answer (or its refusal) is in
    page.evaluate("""() => { const f = window.fetch; window.slowAsked = false; window.slowSettled = false;
      window.fetch = (u, o) => {
        if (!(String(u).includes('leaderboard?') && String(u).includes('dataset=tiny'))) return f(u, o);
        window.slowAsked = true;
        const p = new Promise((r) => setTimeout(r, 1500)).then(() => f(u, o));
        p.finally(() => setTimeout(() => { window.slowSettled = true; }, 0)).catch(() => {});
        return p; }; }""")
    page.select_option("#board", label="tiny@v1 / dev (2)")
    # the second pick once the first page waits on its rows (not before: a pick while the first
    # page still reads the board list would cut it off before it asks, on a loaded machine)
    page.wait_for_function("window.slowAsked", timeout=60000)
    page.select_option("#board", label="gsm8k@v1 / test (1)")  # the tiny board's rows not come yet
    page.wait_for_selector("[data-testid=leaderboard-row]:has-text('gsm-test-1')", timeout=60000)
    page.wait_for_function("window.slowSettled", timeout=60000)
    page.wait_for_timeout(300)  # what the late answer would draw, drawn by now
    assert page.locator("[data-testid=leaderboard-row]").count() == 1
    assert "gsm-test-1" in page.inner_text("[data-testid=leaderboard]")
    assert page.inner_text("#board option:checked") == "gsm8k@v1 / test (1)"
    assert page.locator("[data-testid=error]").count() == 0  # the superseded page says nothing


def test_a_long_answer_wraps(site, home):
    from tunix_rt.registry.record import record_eval

    srv, page, _ = site
    d = write_eval(home.root / "evals" / "long-1")
    rows = [json.loads(x) for x in (d / "predictions.jsonl").read_text().splitlines()]
    rows[0].update(answer="9" * 300, reasoning="multiply the two numbers, digit by digit")
    (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record_eval(d)
    _login(page, srv)
    page.goto(f"{srv.url}/#/eval/long-1")
    page.wait_for_selector("[data-testid=prediction]")
    card = page.locator("[data-testid=prediction]").nth(0)
    reasoning, answer = card.locator("pre").bounding_box(), card.locator("[data-testid=answer]").bounding_box()
    assert reasoning["width"] > 0.4 * card.bounding_box()["width"]  # was a few characters wide
    assert answer["x"] + answer["width"] <= card.bounding_box()["x"] + card.bounding_box()["width"] + 1
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_a_cli_run_is_visible_while_it_trains(site, home, monkeypatch):
    """MetricsLog with the registry's live index (what the CLI's training loop logs through)
    indexes the run as it goes: the runs page shows it running, its page draws the curve and
    grows it."""
    from tunix_rt.registry.live import LiveIndex
    from tunix_rt.train.metrics import MetricsLog

    srv, page, _ = site
    _login(page, srv)
    page.goto(f"{srv.url}/#/runs")
    page.wait_for_selector("[data-testid=runs]")
    run = write_run(home, "tiny-gemma3-20261122-070000-ef56", status="running")
    (run / "metrics.jsonl").unlink()
    monkeypatch.setattr(LiveIndex, "REGISTRY_EVERY_S", 0.0)
    log = MetricsLog(run, on_update=LiveIndex())
    try:
        for step in (1, 2, 3):
            log.log({"step": step, "loss": 5.0 - step, "lr": 0.001})
        page.wait_for_selector(f"[data-testid=runs] tr:has-text('{run.name}') .badge.running")  # no reload
        page.click(f"text={run.name}")
        page.wait_for_selector("[data-testid=loss-chart] polyline")
        points = "document.querySelector('[data-testid=loss-chart] polyline').getAttribute('points').split(' ').length"
        assert page.evaluate(points) == 3 and page.inner_text("[data-testid=status]") == "running"
        for step in (4, 5, 6):
            log.log({"step": step, "loss": 5.0 - step, "lr": 0.001})
        page.wait_for_function(f"{points} === 6")
    finally:
        log.close()


@pytest.mark.serial
def test_playground_streams_two_models_side_by_side(site):
    import httpx

    srv, page, _ = site
    _login(page, srv)
    page.goto(f"{srv.url}/#/playground")
    page.wait_for_selector("#play-b option[value='tiny-gemma2']", state="attached")
    page.select_option("#play-a", "tiny-gemma3")
    page.select_option("#play-b", "tiny-gemma2")
    page.fill("#question", "What is 3+4?")
    page.fill("#max-tokens", "40")
    page.click("#ask")
    for k, model in enumerate(("tiny-gemma3", "tiny-gemma2")):
        pane = f"[data-testid=pane-{k}]"
        page.wait_for_selector(f"{pane} [data-testid=pane-status]:has-text('finished')", timeout=60000)
        assert model in page.inner_text(f"{pane} h2") and "40 tokens" in page.inner_text(f"{pane} [data-testid=pane-status]")
        got = page.get_attribute(f"{pane} [data-testid=reasoning]", "data-raw")
        r = httpx.post(srv.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60,
                       json={"model": model, "messages": [{"role": "user", "content": "What is 3+4?"}], "max_tokens": 40})
        assert got == r.json()["choices"][0]["message"]["content"] != ""
    split = page.evaluate("splitAnswer('<reasoning>\\nadd them\\n</reasoning>\\n<answer>7</answer>')")
    assert split == {"reasoning": "\nadd them\n", "answer": "7"}
    page.select_option("#play-b", "")
    page.fill("#max-tokens", "1500")
    page.click("#ask")
    page.wait_for_selector("[data-testid=pane-0] [data-testid=pane-status]:has-text('streaming')")
    page.click("#stop")
    page.wait_for_selector("[data-testid=pane-0] [data-testid=pane-status]:has-text('stopped')")
    sched = models_of(srv.server.config.app).get("tiny-gemma3").scheduler
    page.wait_for_function("true")  # let the abort reach the server
    import time

    deadline = time.monotonic() + 5
    while sched.active and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sched.active == 0


def test_an_rl_run_page_shows_rewards_kl_clip_length_and_time(site, home):
    """A GRPO run's page: the total reward and each reward, rollout accuracy and format rate,
    the zero-variance share, KL and clip fraction, completion length, rollout vs update time."""
    from tunix_rt.registry.record import record_run

    srv, page, _ = site
    run = write_run(home, "grpo-20261122-080000-ab12", steps=4, ckpts=(2, 4))
    rows = [{"step": s, "loss": 0.01 * s, "lr": 2e-5, "grad_norm": 0.5, "reward": 0.2 * s, "reward_answer": 0.1 * s,
             "reward_format": 0.3 * s, "rollout_accuracy": 0.1 * s, "rollout_format_rate": 0.2 * s,
             "zero_variance_share": 0.5, "kl": -1e-7 if s == 1 else 0.001 * s, "clip_fraction": 0.01, "completion_tokens": 80 + s,
             "rollout_s": 30.0, "update_s": 12.0} for s in range(1, 5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record_run(run)
    _login(page, srv)
    page.goto(f"{srv.url}/#/run/{run.name}")
    for chart in ("reward-chart", "rollout-chart", "zero-var-chart", "kl-chart", "length-chart", "time-chart"):
        page.wait_for_selector(f"[data-testid={chart}] polyline", state="attached")  # a flat line has no height
    assert page.locator("[data-testid=reward-chart] polyline").count() == 3  # total, answer, format
    assert "answer, format" in page.text_content("[data-testid=reward-chart]")
    kl = _ticks(page, "kl-chart")  # k3 KL a hair below 0 at step 1: its axis has no -0.0000
    assert _numbers(kl)[0] < 0 and "0" in kl, kl
    assert [page.locator(f"[data-testid={c}] .axis-title").nth(1).text_content() for c in ("time-chart", "length-chart")] \
        == ["seconds", "tokens"]
    page.goto(f"{srv.url}/#/run/{site[2]['run']}")  # an SFT run's page has none of them
    page.wait_for_function("!document.querySelector('[data-testid=reward-chart]')")  # the new page rendered
    page.wait_for_selector("[data-testid=loss-chart] polyline")
    assert page.locator("[data-testid=reward-chart]").count() == 0


# ---- charts and names a person can read ---------------------------------------------------

TICKS = "Array.from(document.querySelectorAll('[data-testid={}] .tick-{} text')).map((t) => t.textContent)"


def _ticks(page, chart: str, axis: str = "y") -> list[str]:
    return page.evaluate(TICKS.format(chart, axis))


def _numbers(labels: list[str]) -> list[float]:
    """Each tick label as a number: plain or scientific (3e-5), never a signed zero, all distinct."""
    values = [float(x) for x in labels]  # raises on anything that is not a number
    assert len(labels) >= 2 and len(set(values)) == len(values), labels
    assert not any(x.startswith("-") and v == 0 for x, v in zip(labels, values)), labels
    return values


def test_run_charts_have_ticks_units_a_hover_readout_and_a_log_scale(site, home):
    """A small learning rate (3e-5) reads 3e-5 on its axis, not 0.0000; every axis has round
    tick values and a title with its unit; hovering names the nearest point's values; the loss
    chart switches to a log10 scale."""
    from tunix_rt.registry.record import record_run

    srv, page, _ = site
    run = write_run(home, "tiny-gemma3-20261122-090000-aa01", steps=10, ckpts=(10,))
    rows = [{"step": s, "loss": 7.0 * 10 ** (-s / 3), "lr": 1.5e-5 if s == 1 else 3e-5, "tokens_per_s": 900.0 + 10 * s,
             "step_s": 0.5} for s in range(1, 11)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record_run(run)
    _login(page, srv)
    page.goto(f"{srv.url}/#/run/{run.name}")
    page.wait_for_selector("[data-testid=throughput-chart] polyline")
    for chart, unit in (("loss-chart", "loss"), ("lr-chart", "lr"), ("throughput-chart", "tokens/s")):
        titles = page.locator(f"[data-testid={chart}] .axis-title").all_text_contents()
        assert titles == ["step", unit], titles
        _numbers(_ticks(page, chart, "y"))
        steps = _numbers(_ticks(page, chart, "x"))
        assert all(float(s).is_integer() and 1 <= s <= 10 for s in steps), steps
    lr = _ticks(page, "lr-chart")
    assert max(_numbers(lr)) >= 3e-5 and "3e-5" in lr, lr  # was 0.0000 at both ends
    assert all(x == "0" or float(x) != 0 for x in lr), lr

    box = page.locator("[data-testid=lr-chart] svg").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.97, box["y"] + box["height"] * 0.3)  # beside the last point
    readout = page.locator("[data-testid=lr-chart] [data-testid=readout]")
    page.wait_for_function("document.querySelector('[data-testid=lr-chart] [data-testid=readout]')"
                           ".getAttribute('visibility') === 'visible'")
    assert readout.text_content() == "step 10lr 3e-5"  # two lines: the step and the value

    chart = page.locator("[data-testid=loss-chart]")
    linear, points = _ticks(page, "loss-chart"), chart.locator("polyline").get_attribute("points")
    assert chart.get_attribute("data-scale") == "linear"
    chart.locator("[data-testid=log-toggle]").check()
    page.wait_for_selector("[data-testid=loss-chart][data-scale=log]")
    logs = _numbers(_ticks(page, "loss-chart"))
    assert _ticks(page, "loss-chart") != linear and chart.locator("polyline").get_attribute("points") != points
    ratios = {round(b / a, 6) for a, b in zip(logs, logs[1:])}
    assert min(logs) <= 7.0 * 10 ** (-10 / 3) and max(logs) >= 7.0 and ratios <= {2.0, 2.5, 10.0}, logs  # decades
    assert "log scale" in chart.locator(".axis-title").nth(1).text_content()
    page.reload()  # the choice is remembered (the run page of a live run redraws every 2 s)
    page.wait_for_selector("[data-testid=loss-chart][data-scale=log]")


def test_numbers_never_print_as_zero_or_minus_zero(site):
    srv, page, _ = site
    _login(page, srv)
    got = page.evaluate("""[fmtNum(3e-4), fmtNum(-0), fmtNum(6.95564), fmtNum(1.5e-5), fmt(3e-5, 4), fmt(-1e-9, 4),
                            fmt(0.625), ...[linearScale(-1e-7, 1e-4), logScale(2e-5, 8e-3), logScale(0.004, 7)]
                            .map((s) => s.ticks.map((t) => t.label))]""")
    assert got[:7] == ["3e-4", "0", "6.956", "1.5e-5", "3e-5", "-1e-9", "0.625"]
    assert got[7] == ["-2e-5", "0", "2e-5", "4e-5", "6e-5", "8e-5", "1e-4"]
    assert got[8] == ["1e-5", "1e-4", "1e-3", "1e-2"] and got[9] == ["0.001", "0.01", "0.1", "1", "10"]


def test_leaderboard_rows_name_runs_never_paths(site, home):
    """An evaluation of a run shows its run id once (its name without the run prefix in the
    evaluation column); one of a merged model outside the run shows the run id, not the path
    (the path is the tooltip)."""
    from tunix_rt.registry.record import record_eval

    srv, page, ids = site
    merged = home.runs / ids["run"] / "final" / "merged"
    record_eval(write_eval(home.root / "evals" / "merged-dev-1", model=str(merged)))
    _login(page, srv)
    page.wait_for_function("document.querySelectorAll('[data-testid=leaderboard-row]').length === 3")
    rows = page.locator("[data-testid=leaderboard-row]")
    texts = rows.all_inner_texts()
    of_run = next(t for t in texts if "dev-1" in t and "merged" not in t and "base" not in t)
    assert of_run.count(ids["run"]) == 1, of_run
    row = rows.filter(has_text="merged-dev-1")
    cell = row.locator("[data-testid=run-or-model]")
    assert cell.inner_text() == ids["run"] and "/" not in row.inner_text()
    assert cell.locator("[title]").get_attribute("title") == str(merged)
    page.click(f"[data-testid=leaderboard-row] a:has-text('{ids['run']}')")
    page.wait_for_selector("[data-testid=loss-chart] polyline")


def test_playground_labels_are_tied_to_their_controls(site):
    srv, page, _ = site
    _login(page, srv)
    page.goto(f"{srv.url}/#/playground")
    page.wait_for_selector("#play-b")
    for name, control in (("model A", "play-a"), ("model B", "play-b"), ("max tokens", "max-tokens"),
                          ("system prompt", "system"), ("question", "question")):
        assert page.get_by_label(name, exact=True).get_attribute("id") == control
    label, select = page.locator("label[for=play-b]").bounding_box(), page.locator("#play-b").bounding_box()
    assert 0 <= select["x"] - (label["x"] + label["width"]) < 16  # right beside it, on the same line
    assert abs((label["y"] + label["height"] / 2) - (select["y"] + select["height"] / 2)) < 6
