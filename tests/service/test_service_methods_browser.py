"""The methods between SFT and RL in the web UI (headless Debian chromium via Playwright, as
test_service_browser): the run page of a preference run (DPO/SimPO: implicit rewards of the
chosen and rejected completions, margin, accuracy), of a rejection-sampling run (kept share
per round) and of a distillation run (KL to the teacher) from real tiny runs; the run form's
presets and method fields, a SimPO job queued from it and trained by a real worker, and its
refusals (a bad value, a teacher given as a path)."""

from __future__ import annotations

import json

import pytest

from test_service_browser import _login, browser, site, work_one_job  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

BASE = dict(model="tiny-gemma3", split="all", eval_split="all", eval_limit=2, batch_size=4, max_seq_len=96, max_steps=3,
            lr=1e-2, warmup_steps=0, save_interval=0, log_interval=1, eval_interval=0, device="cpu", engine="torch",
            system_prompt="Be brief.")


def _train(home, **fields):
    """A real tiny run on the site's home, indexed as the worker's live index would."""
    import torch

    from tunix_rt.registry.record import record_run
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.driver import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = train(TrainConfig(**{**BASE, **fields}), home)
    finally:
        torch.set_num_threads(threads)
    record_run(run)
    return run


def _traces(path, n=8) -> str:
    path.write_text("".join(json.dumps({"id": f"t{i}", "question": f"Add {i} and 2?", "steps": [f"{i} + 2 = {i + 2}"],
                                        "answer": str(i + 2)}) + "\n" for i in range(n)))
    return str(path)


def _pairs(path, n=8) -> str:
    path.write_text("".join(json.dumps({"prompt": f"Add {i} and 2?", "chosen": f"<answer>{i + 2}</answer>",
                                        "rejected": f"<answer>{3 * i + 1}</answer> no"}) + "\n" for i in range(n)))
    return str(path)


def _lines(page, chart: str) -> int:
    page.wait_for_selector(f"[data-testid={chart}] polyline", state="attached")  # a flat line has no height
    return page.locator(f"[data-testid={chart}] polyline").count()


def test_a_simpo_run_page_charts_implicit_rewards_margin_and_accuracy(site, home, tmp_path):
    srv, page, _ = site
    run = _train(home, dataset=_pairs(tmp_path / "pairs.jsonl"), method="dpo", pref_loss="simpo", pref_beta=2.0,
                 simpo_gamma=1.0)
    _login(page, srv)
    page.goto(f"{srv.url}/#/run/{run.name}")
    assert _lines(page, "pref-rewards-chart") == 2  # chosen and rejected
    assert _lines(page, "pref-margin-chart") == 2 and _lines(page, "pref-accuracy-chart") == 2  # train and held out
    assert "chosen (solid), rejected (dashed)" in page.text_content("[data-testid=pref-rewards-chart]")
    assert page.locator("[data-testid=pref-accuracy-chart] .axis-title").nth(1).text_content() == "share of pairs (0–1)"
    for absent in ("reward-chart", "kl-chart", "kept-chart", "kd-chart", "pref-paired-chart"):  # pairs from a file
        assert page.locator(f"[data-testid={absent}]").count() == 0, absent
    assert "pref_loss: \"simpo\"" in page.inner_text("[data-testid=config]")
    assert page.inner_text("main .row .muted").startswith("dpo (simpo) · torch · cpu")


def test_an_rft_run_page_charts_kept_share_and_no_grpo_only_chart(site, home, tmp_path):
    srv, page, _ = site
    run = _train(home, dataset=_traces(tmp_path / "traces.jsonl"), method="rft", max_steps=2, group_size=2, rl_prompts=2,
                 rollout_max_new_tokens=8, rft_round_steps=1, rft_accept={"format": 0.0})  # every sample accepted
    _login(page, srv)
    page.goto(f"{srv.url}/#/run/{run.name}")
    assert _lines(page, "kept-chart") == 1 and _lines(page, "reward-chart") >= 1
    assert _lines(page, "rollout-chart") == 2 and _lines(page, "time-chart") == 2
    for absent in ("kl-chart", "zero-var-chart", "pref-rewards-chart"):  # GRPO's and DPO's, nothing to draw
        assert page.locator(f"[data-testid={absent}]").count() == 0, absent


def test_a_distill_run_page_charts_the_kl_to_the_teacher(site, home, tmp_path):
    srv, page, _ = site
    run = _train(home, dataset=_traces(tmp_path / "traces.jsonl"), method="distill", teacher="tiny-gemma3", kd_alpha=0.5,
                 kd_loss="forward_kl", batch_size=2, max_steps=2)
    _login(page, srv)
    page.goto(f"{srv.url}/#/run/{run.name}")
    assert _lines(page, "kd-chart") == 2 and _lines(page, "kd-nll-chart") == 1  # train and held-out KL
    assert page.locator("[data-testid=kd-chart] .axis-title").nth(1).text_content() == "KL (nats/token)"
    assert page.locator("[data-testid=reward-chart]").count() == 0
    assert page.inner_text("main .row .muted").startswith("distill (forward_kl) from tiny-gemma3 · torch")


def test_the_run_form_offers_every_preset_and_each_methods_fields(site):
    from tunix_rt.train.config import PRESET_DIR
    from tunix_rt.train.methods import METHODS

    srv, page, _ = site
    _login(page, srv)
    page.goto(f"{srv.url}/#/runs")
    page.wait_for_selector("#method")
    options = page.eval_on_selector_all("#preset option", "os => os.map((o) => o.value)")
    assert sorted(options) == sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
    methods = page.eval_on_selector_all("#method option", "os => os.map((o) => o.value)")
    assert methods[0] == "" and sorted(methods[1:]) == sorted(METHODS)
    expect = {"dpo": ["pref_loss", "pref_beta", "simpo_gamma", "label_smoothing", "orpo_lambda", "pairs"],
              "distill": ["teacher", "kd_loss", "kd_temperature", "kd_alpha", "kd_on_policy"],
              "rft": ["rft_round_steps", "group_size", "rl_prompts", "init"],
              "grpo": ["rl_loss", "beta", "init"]}
    for method, names in expect.items():
        page.select_option("#method", method)
        for name in names:
            assert page.locator(f"[data-testid=method-fields] #f-{name}").count() == 1, (method, name)
        assert page.inner_text("[data-testid=method-hint]")
    page.select_option("#method", "grpo")
    assert page.eval_on_selector_all("#f-rl_loss option", "os => os.map((o) => o.value)") == \
        ["", "grpo", "dr_grpo", "dapo", "gspo", "rloo"]
    page.select_option("#method", "dpo")
    assert page.eval_on_selector_all("#f-pref_loss option", "os => os.map((o) => o.value)") == \
        ["", "dpo", "ipo", "simpo", "orpo"]
    page.select_option("#method", "")
    assert page.locator("[data-testid=method-fields] input, [data-testid=method-fields] select").count() == 0


def test_the_run_form_refuses_bad_method_fields_and_queues_nothing(site, home):
    from tunix_rt.registry import queue

    srv, page, _ = site
    _login(page, srv)
    page.goto(f"{srv.url}/#/runs")
    page.select_option("#method", "dpo")
    page.fill("#f-pref_beta", "-1")
    page.fill("#overrides", "dataset=tiny@v1")
    page.click("#submit-run")
    page.wait_for_selector("[data-testid=submit-error]:has-text('pref_beta')")
    page.select_option("#method", "distill")
    page.fill("#f-teacher", "/etc")
    page.click("#submit-run")
    page.wait_for_selector("[data-testid=submit-error]:has-text('teacher')")
    assert "not a path" in page.inner_text("[data-testid=submit-error]")
    page.fill("#f-teacher", "no-such-run")
    page.click("#submit-run")
    page.wait_for_selector("[data-testid=submit-error]:has-text('no run')")
    assert queue.list_jobs(url=home.database_url) == []


def test_a_simpo_run_queued_from_the_form_trains(site, home):
    """SFT's preset with method dpo, pref_loss simpo and on-policy pairs picked in the form: the
    job carries exactly those fields, a real worker trains it, and its run page says dpo."""
    from tunix_rt.registry import queue

    srv, page, _ = site
    _login(page, srv)
    page.goto(f"{srv.url}/#/runs")
    page.select_option("#preset", "smoke")
    page.uncheck("#evaluate")
    page.select_option("#method", "dpo")
    page.select_option("#f-pref_loss", "simpo")
    page.fill("#f-pref_beta", "2")
    page.fill("#f-simpo_gamma", "1")
    page.select_option("#f-pairs", "rollouts")
    page.fill("#f-group_size", "2")
    page.fill("#f-rl_prompts", "2")
    page.fill("#overrides", "dataset=tiny@v1\nsplit=all\neval_split=all\nmax_steps=2\nwarmup_steps=0\nmax_seq_len=128\n"
                            "rollout_max_new_tokens=8\nsave_interval=0\neval_limit=2")
    page.click("#submit-run")
    page.wait_for_selector("[data-testid=status]:has-text('queued')")
    [job] = queue.list_jobs(url=home.database_url)
    ov = job.params["overrides"]
    assert {k: ov[k] for k in ("method", "pref_loss", "pref_beta", "simpo_gamma", "pairs", "group_size", "rl_prompts")} \
        == {"method": "dpo", "pref_loss": "simpo", "pref_beta": 2, "simpo_gamma": 1, "pairs": "rollouts",
            "group_size": 2, "rl_prompts": 2}
    assert "init" not in ov and "label_smoothing" not in ov  # a field left empty keeps the preset's value
    work_one_job(page, home)
    page.click("[data-testid=job-run] a")
    page.wait_for_selector("[data-testid=config]")  # the run page (the job page has a loss chart too)
    assert page.inner_text("main .row .muted").startswith("dpo (simpo), on-policy pairs · torch")
    config = page.inner_text("[data-testid=config]")
    assert 'method: "dpo"' in config and 'pref_loss: "simpo"' in config and 'pairs: "rollouts"' in config


def test_pairs_uploaded_on_the_datasets_page_become_a_pairs_dataset(site, home, tmp_path):
    """The datasets page takes a prompt/chosen/rejected JSONL (format pairs, or auto), a worker
    imports it, and the datasets table lists it with importer pairs: a dataset a dpo run with
    pairs=dataset can name."""
    from tunix_rt.registry.worker import Worker, WorkerConfig

    srv, page, _ = site
    _login(page, srv)
    page.goto(f"{srv.url}/#/datasets")
    page.wait_for_selector("#upload-format")
    assert "pairs" in page.eval_on_selector_all("#upload-format option", "os => os.map((o) => o.value)")
    page.set_input_files("#upload-file", _pairs(tmp_path / "prefs.jsonl"))
    page.fill("#upload-name", "prefs")
    page.select_option("#upload-format", "pairs")
    page.click("#upload")
    page.wait_for_selector("[data-testid=upload-result]:has-text('8 records accepted')")
    assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1)).run() == 1
    page.reload()  # the same address: a reload renders the page again
    row = page.locator("[data-testid=datasets] tr:has-text('prefs')")
    row.wait_for()
    assert "pairs" in row.inner_text()
