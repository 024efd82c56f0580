"""The methods between SFT and RL through the job API and sweeps: POST /api/runs takes
method dpo (every pref_loss), rft and distill with their main fields, checked by TrainConfig
(400 on a bad value); a distillation `teacher` follows the home-name rule `init` follows (a
catalog model or a run id of this home, never a path: 422 at the door, bad input to a worker
given the row directly); preference pairs uploaded through the API become a dataset of the
home that a dpo job trains on; a sweep varies pref_loss and pref_beta of a preference base."""

from __future__ import annotations

import pytest

from registry_testlib import write_run
from service_testlib import make_client
from tunix_rt.home import Home
from tunix_rt.registry import db, queue
from tunix_rt.registry.models import Job
from tunix_rt.registry.worker import Worker, WorkerConfig

SMALL = {"dataset": "tiny@v1", "max_steps": 2, "warmup_steps": 0}


def _submit(client, preset: str = "smoke", **overrides):
    return client.post("/api/runs", json={"preset": preset, "overrides": {**SMALL, **overrides}})


@pytest.mark.parametrize("preset,overrides", [
    ("cpu-simpo", {}),
    ("gpu-dpo", {"pref_loss": "ipo", "pref_beta": 0.5}),
    ("smoke", {"method": "dpo", "pref_loss": "orpo", "orpo_lambda": 0.2, "pairs": "rollouts", "group_size": 2}),
    ("smoke", {"method": "dpo", "pref_loss": "dpo", "label_smoothing": 0.1, "pairs": "rollouts"}),
    ("cpu-rft", {"rft_round_steps": 1, "group_size": 2}),
    ("smoke", {"method": "distill", "teacher": "tiny-gemma3", "kd_loss": "reverse_kl", "kd_alpha": 0.5}),
    ("smoke", {"method": "grpo", "rl_loss": "gspo"}),
    ("smoke", {"method": "grpo", "rl_loss": "rloo"}),
])
def test_the_api_queues_each_method_with_its_fields(home, preset, overrides):
    with make_client(home, home.database_url) as client:
        r = _submit(client, preset, **overrides)
        assert r.status_code == 202, r.text
        assert r.json()["params"]["preset"] == preset
        assert r.json()["params"]["overrides"] == {**SMALL, **overrides}


@pytest.mark.parametrize("overrides,why", [
    ({"method": "dpo", "pref_loss": "kto"}, "pref_loss must be one of dpo|ipo|simpo|orpo"),
    ({"method": "dpo", "pref_beta": 0}, "pref_beta"),
    ({"method": "dpo", "label_smoothing": 0.5}, "label_smoothing"),
    ({"method": "distill"}, "needs a teacher"),
    ({"method": "distill", "teacher": "tiny-gemma3", "kd_loss": "tvd"}, "kd_loss"),
    ({"method": "sft", "teacher": "tiny-gemma3"}, "teacher is for a method with a teacher"),
    ({"method": "rft", "rft_round_steps": 0}, "rft_round_steps"),
    ({"method": "grpo", "rl_loss": "ppo"}, "rl_loss"),
    ({"method": "kto"}, "method must be one of"),
])
def test_the_api_refuses_bad_method_fields_as_the_cli_does(home, overrides, why):
    with make_client(home, home.database_url) as client:
        r = _submit(client, **overrides)
        assert r.status_code == 400 and "train job parameters" in r.text and why in r.text, (overrides, r.text)
        assert queue.list_jobs(url=home.database_url) == []


def test_a_teacher_is_a_catalog_model_or_a_run_of_this_home_never_a_path(home, tmp_path):
    write_run(home, "sft-run")
    other = str(write_run(Home(tmp_path / "other-home").ensure(), "victim-run"))
    (home.runs / "escape").symlink_to(other, target_is_directory=True)
    with make_client(home, home.database_url) as client:
        bad = {other: "not a path", "/etc": "not a path", "../victim-run": "not a path", "escape": "link out",
               "no-such-run": "no run 'no-such-run'", "src": "no run 'src'"}
        for teacher, why in bad.items():
            r = _submit(client, method="distill", teacher=teacher)
            assert r.status_code == 422 and why in r.json()["detail"] and "teacher" in r.json()["detail"], (teacher, r.text)
        assert queue.list_jobs(url=home.database_url) == []
        for teacher in ("sft-run", "gemma3-1b", "tiny-gemma3"):
            assert _submit(client, method="distill", teacher=teacher).status_code == 202, teacher


def test_a_teacher_is_never_read_from_the_current_directory(home, tmp_path, monkeypatch):
    """The teacher lookup takes a directory first (the CLI's convenience): a same-named
    directory in the process's current directory would be read instead of the catalog model
    or the home's run, so it is refused."""
    write_run(home, "sft-run")
    cwd = tmp_path / "cwd"
    for name in ("tiny-gemma3", "sft-run"):
        (cwd / name).mkdir(parents=True)
    monkeypatch.chdir(cwd)
    with make_client(home, home.database_url) as client:
        for teacher in ("tiny-gemma3", "sft-run"):
            r = _submit(client, method="distill", teacher=teacher)
            assert r.status_code == 422 and "current directory" in r.json()["detail"], (teacher, r.text)
        assert _submit(client, method="distill", teacher="gemma3-1b").status_code == 202
    monkeypatch.chdir(home.runs)  # the home's own runs/ holds the same run: fine
    with make_client(home, home.database_url) as client:
        assert _submit(client, method="distill", teacher="sft-run").status_code == 202


def test_a_worker_refuses_a_teacher_path_in_a_job_row(home, tmp_path):
    """A row written straight into the database (not through enqueue): dead at its first
    attempt, no run started, the other home's run never read."""
    other = str(write_run(Home(tmp_path / "other-home").ensure(), "victim-run"))
    url = home.database_url
    db.get_engine(url)
    params = {"preset": "smoke", "overrides": {**SMALL, "method": "distill", "teacher": other}}
    with db.session(url) as s:
        job = Job(kind="train", params=params, status=queue.QUEUED, max_attempts=3, attempts=0, lease_token=0,
                  cancel_requested=False)
        s.add(job)
        s.flush()
        jid = job.id
    assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1, url=url)).run() == 1
    job = queue.get_job(jid, url=url)
    assert (job.status, job.attempts) == ("dead", 1) and "teacher must be a catalog model or run id" in job.error, job.error
    assert not home.runs.exists() or not any(home.runs.iterdir())


def test_a_sweep_varies_the_preference_loss_and_its_beta(home):
    from tunix_rt.errors import BadInput
    from tunix_rt.sweep.space import parse_space
    from tunix_rt.sweep.study import create_sweep, list_sweeps

    base = {"model": "tiny-gemma3", "dataset": "tiny@v1", "method": "dpo", "pairs": "rollouts", "max_steps": 2,
            "warmup_steps": 0, "group_size": 2, "rl_prompts": 2, "rollout_max_new_tokens": 8}
    space = parse_space({"params": {"pref_loss": {"type": "categorical", "choices": ["dpo", "ipo", "simpo", "orpo"]},
                                    "pref_beta": {"type": "float", "low": 0.05, "high": 2.5, "log": True},
                                    "simpo_gamma": {"type": "float", "low": 0.0, "high": 1.5}},
                         "enqueue": [{"pref_loss": "simpo", "pref_beta": 2.0, "simpo_gamma": 1.0}]})
    create_sweep("pref", base, space, 3)
    assert [s["name"] for s in list_sweeps()] == ["pref"]
    assert len(queue.list_jobs(kind="trial", url=home.database_url)) == 3
    # every bound and choice is checked with the base before anything is written
    with pytest.raises(BadInput, match="label_smoothing"):
        create_sweep("bad", base, parse_space({"params": {"label_smoothing": {"type": "float", "low": 0.0,
                                                                              "high": 0.6}}}), 2)
    with pytest.raises(BadInput, match="teacher must be a catalog model or run id"):
        create_sweep("kd", {**base, "method": "distill", "teacher": "/etc"},
                     parse_space({"params": {"kd_temperature": {"type": "float", "low": 0.5, "high": 2.0}}}), 2)
    assert [s["name"] for s in list_sweeps()] == ["pref"]


PAIRS = "".join(f'{{"prompt": "Add {i} and 2?", "chosen": "<answer>{i + 2}</answer>", '
                f'"rejected": "<answer>{3 * i + 1}</answer> no"}}\n' for i in range(10)).encode()


def test_uploaded_pairs_are_a_dataset_a_dpo_job_trains_on(home):
    """The upload is read as pairs (format auto finds them; a bad pair is named by line), a
    worker imports it as a dataset version of the home, and a SimPO job names it."""
    import json

    with make_client(home, home.database_url) as client:
        bad = PAIRS + b'{"prompt": "p", "chosen": "same", "rejected": "same"}\n'
        r = client.post("/api/datasets", files={"file": ("prefs.jsonl", bad)}, data={"name": "prefs"})
        assert r.status_code == 422 and r.json()["detail"]["errors"][0]["line"] == 11, r.text
        assert "the same text as chosen" in r.json()["detail"]["errors"][0]["message"]
        r = client.post("/api/datasets", files={"file": ("prefs.jsonl", PAIRS)}, data={"name": "prefs"})
        assert r.status_code == 202 and r.json()["format"] == "pairs" and r.json()["records"] == 10, r.text
        dataset = r.json()["dataset"]
        assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1)).run() == 1
        version = client.get("/api/datasets").json()
        assert [(d["name"], d["count"]) for d in version] == [("prefs", 10)]
        name, ver = dataset.split("@")
        assert client.get(f"/api/datasets/{name}/{ver}").json()["manifest"]["importer"] == "pairs"
        assert set(client.get(f"/api/datasets/{name}/{ver}/records", params={"limit": 1}).json()[0]) == \
            {"id", "prompt", "chosen", "rejected"}
        r = client.post("/api/runs", json={"preset": "smoke", "evaluate": False, "overrides": {
            "method": "dpo", "pref_loss": "simpo", "pref_beta": 2.0, "pairs": "dataset", "dataset": dataset,
            "split": "all", "eval_split": "all", "eval_limit": 4, "max_steps": 2, "warmup_steps": 0,
            "max_seq_len": 128, "save_interval": 0, "eval_interval": 0}})
        assert r.status_code == 202, r.text
        assert Worker(home, WorkerConfig(lease_s=10, poll_s=0.05, max_jobs=1)).run() == 1
        job = client.get(f"/api/jobs/{r.json()['id']}").json()
        assert job["status"] == "succeeded", job["error"]
        run = home.runs / job["run_id"]
        manifest = json.loads((run / "run_manifest.json").read_text())
        assert manifest["config"]["dataset"] == dataset and manifest["status"] == "succeeded"
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        assert any("rewards_margin" in r for r in rows) and any("eval_rewards_accuracy" in r for r in rows)
