"""The REST API over a seeded registry, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import sys

import pytest

from registry_testlib import write_dataset_file
from service_testlib import make_client
from tunix_rt.registry.worker import Worker, WorkerConfig


def test_health_and_openapi(seeded):
    client, _ = seeded
    assert client.get("/api/health").json()["status"] == "ok"
    paths = client.get("/api/openapi.json").json()["paths"]
    for p in ("/api/runs", "/api/runs/{run_id}/artifacts/{path}", "/api/evaluations/leaderboard",
              "/api/evaluations/compare", "/api/datasets", "/api/models", "/api/jobs/{job_id}/logs"):
        assert p in paths


def test_runs_list_filter_show_metrics_artifacts(seeded):
    client, ids = seeded
    assert {r["id"] for r in client.get("/api/runs").json()} == {ids["run"], "tiny-gemma3-20261122-050000-cd34"}
    failed = client.get("/api/runs", params={"status": "failed"}).json()
    assert [r["status"] for r in failed] == ["failed"] and failed[0]["error"] == "RuntimeError: boom"
    run = client.get(f"/api/runs/{ids['run']}").json()
    assert run["config"]["lr"] == 0.003 and [c["step"] for c in run["checkpoints"]] == [5, 10]
    assert [e["id"] for e in run["evaluations"]] == [ids["eval_run"]]
    metrics = client.get(f"/api/runs/{ids['run']}/metrics").json()
    assert len([m for m in metrics if m["loss"] is not None]) == 10
    assert any("eval_loss" in m["values"] for m in metrics)
    files = {a["path"]: a["size"] for a in client.get(f"/api/runs/{ids['run']}/artifacts").json()}
    assert {"config.yaml", "run_manifest.json", "metrics.jsonl", "loss.png", "eval/dev-1/predictions.jsonl"} <= set(files)
    r = client.get(f"/api/runs/{ids['run']}/artifacts/eval/dev-1/eval_summary.json")
    assert r.status_code == 200 and r.json()["metrics"]["n"] == 6
    assert r.headers["content-security-policy"] == "sandbox"
    assert client.get(f"/api/runs/{ids['run']}/artifacts/nope.txt").status_code == 404
    assert client.get("/api/runs/no-such-run").status_code == 404
    assert client.post(f"/api/runs/{ids['run']}/cancel").status_code == 409  # not made by a job


def test_evaluations_leaderboard_predictions_compare(seeded):
    client, ids = seeded
    board = client.get("/api/evaluations/leaderboard", params={"metric": "accuracy"}).json()
    assert [e["id"] for e in board] == [ids["eval_base"], ids["eval_run"]]
    assert client.get("/api/evaluations/leaderboard", params={"metric": "nonsense"}).status_code == 400
    ev = client.get(f"/api/evaluations/{ids['eval_base']}").json()
    assert ev["summary"]["decoding"]["max_new_tokens"] == 64
    page = client.get(f"/api/evaluations/{ids['eval_base']}/predictions", params={"wrong_only": True}).json()
    assert page["total"] == 3 and {p["item_id"] for p in page["items"]} == {"q2", "q4", "q6"}
    bad = client.get(f"/api/evaluations/{ids['eval_base']}/predictions", params={"format_violations": True}).json()
    assert {p["item_id"] for p in bad["items"]} == {"q4", "q5"}
    found = client.get(f"/api/evaluations/{ids['eval_base']}/predictions", params={"q": "apples"}).json()
    assert [p["item_id"] for p in found["items"]] == ["q3"]
    cmp = client.get("/api/evaluations/compare", params={"a": ids["eval_base"], "b": ids["eval_run"]}).json()
    assert {f["item_id"] for f in cmp["fixed"]} == {"q2", "q4"} and {f["item_id"] for f in cmp["broken"]} == {"q1", "q3", "q5"}
    assert round(cmp["delta"]["accuracy"], 3) == -0.167
    assert client.get("/api/evaluations/compare", params={"a": "x", "b": ids["eval_run"]}).status_code == 404


def test_datasets_models_and_upload_errors(seeded, home):
    client, _ = seeded
    assert [(d["name"], d["version"], d["count"]) for d in client.get("/api/datasets").json()] == [("tiny", "v1", 8)]
    assert client.get("/api/datasets/tiny/v1").json()["manifest"]["count"] == 8
    assert len(client.get("/api/datasets/tiny/v1/records", params={"limit": 3}).json()) == 3
    assert client.get("/api/models").json() == []
    bad = b'{"id": "a", "question": "q", "steps": ["s"], "answer": "1"}\n{"id": "b", "question": "", "steps": ["s"], "answer": "2"}\nnot json\n'
    r = client.post("/api/datasets", files={"file": ("../../evil.jsonl", bad)}, data={"name": "up"})
    assert r.status_code == 422
    errors = r.json()["detail"]["errors"]
    assert [(e["line"], e["field"]) for e in errors][:2] == [(2, "question"), (3, "<line>")]
    assert errors[0]["message"].startswith("evil.jsonl:2: question")
    big = b'{"id": "a", "question": "q", "steps": ["s"], "answer": "1"}\n' * 2000
    assert client.post("/api/datasets", files={"file": ("big.jsonl", big)}, data={"name": "up"}).status_code == 413
    huge = b'{"id": "a", "question": "q", "steps": ["s"], "answer": "1"}\n' * 4000  # over limit + 64 KiB
    assert client.post("/api/datasets", files={"file": ("huge.jsonl", huge)}, data={"name": "up"}).status_code == 413
    assert client.post("/api/datasets", files={"file": ("x.jsonl", b"")}, data={"name": "up"}).status_code == 422
    assert client.post("/api/datasets", files={"file": ("x.jsonl", bad)}, data={"name": "../up"}).status_code == 422
    assert not any(p.name.startswith(".upload") for p in (home.root / "uploads").iterdir())


def test_upload_becomes_an_import_job_that_a_worker_runs(seeded, home, any_db):
    client, _ = seeded
    src = write_dataset_file(home.root / "up.jsonl", 4, "u")
    r = client.post("/api/datasets", files={"file": ("up.jsonl", src.read_bytes())}, data={"name": "uploaded"})
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    assert r.json() == {"job_id": job_id, "dataset": f"uploaded@job{job_id}", "records": 4, "format": "record"}
    assert client.get(f"/api/jobs/{job_id}").json()["status"] == "queued"
    assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1, url=any_db)).run() == 1
    job = client.get(f"/api/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["result"]["dataset"] == f"uploaded@job{job_id}"
    assert client.get(f"/api/datasets/uploaded/job{job_id}").json()["count"] == 4
    events = _sse(client, f"/api/jobs/{job_id}/logs")
    assert [e["event"] for e in events][-1] == "end"
    text = "".join(json.loads(e["data"])["text"] for e in events if e["event"] == "log")
    assert "attempt 1: succeeded" in text
    assert any(e["event"] == "status" and json.loads(e["data"])["status"] == "succeeded" for e in events)
    later = _sse(client, f"/api/jobs/{job_id}/logs", headers={"Last-Event-ID": events[0]["id"]})
    assert [e["event"] for e in later if e["event"] == "log"] == ["log"] * (sum(e["event"] == "log" for e in events) - 1)


@pytest.mark.parametrize("filename, stem", [("train.jsonl", "train"), ("GSM8K test (2).jsonl", "test-2")])
def test_gsm8k_upload_and_data_import_of_one_file_give_the_same_ids_and_split(home, monkeypatch, filename, stem):
    """GSM8K rows carry no ids: both paths name them after the file (not after the upload's
    stored name, uploads/<sha256>.jsonl), so the id-hash split is the same too."""
    from tunix_rt.cli import main
    from tunix_rt.traces.dataset import VENDORED_GSM8K

    n = 80
    src = home.root / filename
    src.write_text("".join(VENDORED_GSM8K.read_text(encoding="utf-8").splitlines(keepends=True)[:n]), encoding="utf-8")
    with make_client(home, home.database_url) as client:
        r = client.post("/api/datasets", files={"file": (filename, src.read_bytes())}, data={"name": "api"})
        assert r.status_code == 202 and r.json()["format"] == "gsm8k", r.text
        assert Worker(home, WorkerConfig(lease_s=5, poll_s=0.05, max_jobs=1)).run() == 1
        assert client.get(f"/api/jobs/{r.json()['job_id']}").json()["status"] == "succeeded"
    monkeypatch.setattr(sys, "argv", ["tunix-rt", "data", "import", "gsm8k", str(src), "--name", "cli"])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0

    api, cli = home.datasets / "api" / f"job{r.json()['job_id']}", home.datasets / "cli" / "v1"
    assert (api / "data.jsonl").read_bytes() == (cli / "data.jsonl").read_bytes()
    ids = [json.loads(line)["id"] for line in (api / "data.jsonl").read_text(encoding="utf-8").splitlines()]
    assert ids == [f"gsm8k-{stem}-{i:05d}" for i in range(n)]
    splits = [json.loads((d / "manifest.json").read_text())["splits"] for d in (api, cli)]
    assert splits[0] == splits[1] and splits[0]["train"] + splits[0]["dev"] == n and splits[0]["dev"] > 0


def test_an_upload_name_is_a_bare_name():
    from tunix_rt.errors import BadInput
    from tunix_rt.registry.jobs import validate_params
    from tunix_rt.traces.dataset import ImportRequest

    with pytest.raises(BadInput, match="filename"):
        validate_params("import", {"upload": "0" * 64 + ".jsonl", "name": "x", "filename": "../train.jsonl"})
    with pytest.raises(BadInput, match="bare file name"):
        ImportRequest("gsm8k", "uploads/x.jsonl", "x", source_name="dir/train.jsonl")


def test_submit_train_cancel_and_bad_params(seeded):
    client, _ = seeded
    r = client.post("/api/runs", json={"preset": "smoke", "overrides": {"max_steps": 2}})
    assert r.status_code == 202 and r.json()["kind"] == "train" and r.json()["status"] == "queued"
    job_id = r.json()["id"]
    assert client.post(f"/api/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    assert client.post("/api/runs", json={"preset": "smoke", "overrides": {"dataset": "../../etc"}}).status_code == 400
    assert client.post("/api/runs", json={"preset": "/etc/passwd"}).status_code == 400
    odd = client.post("/api/runs", json={"preset": "smoke", "overrides": {"method": "dpo", "batch_size": 3}})
    assert odd.status_code == 400 and "even batch_size" in odd.text  # refused at the door, not by the worker
    # mappings and number lists are overrides too (rewards, rft_accept, filter_pass_rate), user code is not
    rft = client.post("/api/runs", json={"preset": "smoke", "overrides": {
        "method": "rft", "rewards": {"answer": 1.0, "format": {"weight": 0.5}}, "rft_accept": {"answer": 1.0}}})
    assert rft.status_code == 202, rft.text
    assert rft.json()["params"]["overrides"]["rft_accept"] == {"answer": 1.0}
    band = client.post("/api/runs", json={"preset": "smoke", "overrides": {"method": "grpo", "filter_pass_rate": [0.1, 0.9]}})
    assert band.status_code == 202, band.text
    user = client.post("/api/runs", json={"preset": "smoke", "overrides": {"method": "grpo", "rewards": {"os:system": 1.0}}})
    assert user.status_code == 400 and "user code" in user.text
    assert client.post(f"/api/jobs/{rft.json()['id']}/cancel").status_code == 200
    assert client.post(f"/api/jobs/{band.json()['id']}/cancel").status_code == 200
    assert client.post("/api/jobs", json={"kind": "shell", "params": {"cmd": "id"}}).status_code == 400
    cancelled = {j["id"] for j in client.get("/api/jobs", params={"status": "cancelled"}).json()}
    assert cancelled == {job_id, rft.json()["id"], band.json()["id"]}


def test_the_rest_train_body_is_the_train_jobs_parameter_model(seeded):
    from pydantic import BaseModel, create_model

    from tunix_rt.registry.jobs import TrainParams, request_fields
    from tunix_rt.service.schemas import TrainSubmit

    def names_and_defaults(model: type[BaseModel]) -> dict:
        return {n: f.get_default(call_default_factory=True) for n, f in model.model_fields.items()}

    assert names_and_defaults(TrainSubmit) == names_and_defaults(TrainParams)
    assert names_and_defaults(TrainSubmit) == {"preset": "smoke", "overrides": {}, "evaluate": True,
                                               "eval_limit": 32, "max_new_tokens": 256}

    class MoreParams(TrainParams):  # a field added to the job's model is in the body
        note: str = "x"

    assert create_model("Body", **request_fields(MoreParams)).model_fields["note"].default == "x"
    client, _ = seeded
    # a malformed body is the door's 422; a well-formed one with bad values the queue's 400
    assert client.post("/api/runs", json={"preset": "smoke", "nosuch": 1}).status_code == 422
    assert client.post("/api/runs", json={"evaluate": "maybe"}).status_code == 422
    assert client.post("/api/runs", json={"eval_limit": "many"}).status_code == 422
    for bad in ({"eval_limit": 0}, {"max_new_tokens": 5000}, {"overrides": {"rewards": {"format": {"weight": {"deep": 1}}}}},
                {"overrides": {"rewards": {"mod:fn": 1}}}):
        r = client.post("/api/runs", json={"preset": "smoke", **bad})
        assert r.status_code == 400 and "train job parameters" in r.text, (bad, r.text)


def _sse(client, path: str, headers=None) -> list[dict]:
    events, current = [], {}
    with client.stream("GET", path, headers=headers or {}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line:
                if current:
                    events.append(current)
                current = {}
                continue
            key, _, value = line.partition(": ")
            current[key] = value
    return events


def test_eval_job_reaches_the_leaderboard(sqlite_seeded, home):
    """A real eval job (tiny-gemma3, 4 items, 8 new tokens) submitted through /api/jobs."""
    client, _ = sqlite_seeded
    params = {"model": "tiny-gemma3", "dataset": "tiny@v1", "split": "all", "limit": 4, "max_new_tokens": 8}
    r = client.post("/api/jobs", json={"kind": "eval", "params": params})
    assert r.status_code == 202, r.text
    assert Worker(home, WorkerConfig(lease_s=10, poll_s=0.05, max_jobs=1)).run() == 1
    job = client.get(f"/api/jobs/{r.json()['id']}").json()
    assert job["status"] == "succeeded", job["error"]
    eval_id = job["result"]["eval_id"]
    board = {e["id"]: e for e in client.get("/api/evaluations/leaderboard").json()}
    assert board[eval_id]["n"] == 4 and board[eval_id]["model"] == "tiny-gemma3"
    assert client.get(f"/api/evaluations/{eval_id}/predictions").json()["total"] == 4
    assert client.post("/api/jobs", json={"kind": "eval", "params": {"dataset": "tiny"}}).status_code == 400
