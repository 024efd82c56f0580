"""The web UI in headless Debian chromium, driven by Playwright (no browser download: the
system's /usr/bin/chromium). Opens every page, follows jobs from queued to finished while a
real worker runs them, and filters predictions."""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from service_testlib import TOKEN, LiveServer, live_app
from registry_testlib import seed_home, write_dataset_file

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _why_not() -> str | None:
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        return "Debian chromium is not installed (.ci/run installs it: apt-get install chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (dev extra)"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium"),
                              args=ARGS, headless=True)
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
    from tunix_rt.registry.worker import Worker, WorkerConfig

    srv, page, _ = site
    _login(page, srv)
    page.goto(f"{srv.url}/#/runs")
    page.select_option("#preset", "smoke")
    assert page.is_checked("#evaluate")  # evaluated afterwards: the run reaches the leaderboard
    page.fill("#overrides", "dataset=tiny@v1\nsplit=all\neval_split=all\nmax_steps=3\nbatch_size=2\n"
                            "eval_interval=0\nsave_interval=0\nwarmup_steps=0\nmax_seq_len=256")
    page.click("#submit-run")
    page.wait_for_selector("[data-testid=status]:has-text('queued')")
    worker = threading.Thread(target=Worker(home, WorkerConfig(lease_s=10, poll_s=0.05, max_jobs=1)).run)
    worker.start()
    try:
        page.wait_for_selector("[data-testid=status]:has-text('succeeded')", timeout=170000)
    finally:
        worker.join(timeout=200)
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
    page.wait_for_selector(f"[data-testid=leaderboard-row]:has-text('{run_id}')")
    assert page.locator("[data-testid=leaderboard-row]").count() == 3
