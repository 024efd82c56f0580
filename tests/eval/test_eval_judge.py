"""The LLM judge against our own server serving the tiny Gemma 3 on loopback: a score read
from the real reply (as a reward and as an eval metric), and every way a judge can fail
(garbage, down, timeout, HTTP error, bad config) failing loudly, never with a default."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from registry_testlib import import_tiny_dataset  # noqa: E402
from service_testlib import TOKEN, LiveServer, live_app, models_of  # noqa: E402

from tunix_rt.errors import BadInput  # noqa: E402
from tunix_rt.eval.judge import JudgeConfig, JudgeError, judge_prompt, make_batch_judge, make_judge, parse_score  # noqa: E402
from tunix_rt.home import Home  # noqa: E402

ANY_DIGIT = r"(\d)"
"""The tiny random model cannot follow a rubric; its greedy replies hold digits, so a
parser that reads the first digit (scale 0-9) scores them. A real judge uses the default."""
RECORD = {"question": "What is 3+4?", "answer": "7"}


@pytest.fixture(scope="module")
def judge_server(tmp_path_factory):
    home = Home.resolve(tmp_path_factory.mktemp("judge-home")).ensure()
    import_tiny_dataset(home)
    app = live_app(home, home.database_url, serve_max_tokens=2000)
    with LiveServer(app) as srv:
        yield home, srv
    models_of(app).close()


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("TUNIX_RT_JUDGE_API_KEY", TOKEN)


def _cfg(srv, **kw) -> JudgeConfig:
    values = dict(url=srv.url + "/v1", model="tiny-gemma3", score_pattern=ANY_DIGIT, score_min=0, score_max=9,
                  max_tokens=200, max_retries=1, timeout_s=30)
    values.update(kw)
    return JudgeConfig(**values)


def _direct_reply(srv, cfg: JudgeConfig, prompt: str) -> str:
    import httpx

    r = httpx.post(srv.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60,
                   json={"model": cfg.model, "messages": [{"role": "user", "content": prompt}],
                         "max_tokens": cfg.max_tokens, "temperature": 0})
    return r.json()["choices"][0]["message"]["content"]


def test_judge_reads_the_score_of_the_real_reply(judge_server, key):
    _, srv = judge_server
    cfg = _cfg(srv)
    reward = make_judge(cfg)
    items = [(RECORD, f"<reasoning>{i}+{i}</reasoning><answer>{2 * i}</answer>", f"{i}+{i}", str(2 * i)) for i in range(3)]
    scores = [reward(*it) for it in items]
    expected = [parse_score(cfg, _direct_reply(srv, cfg, judge_prompt(cfg, *it))) for it in items]
    assert scores == expected and all(0.0 <= s <= 1.0 for s in scores)
    assert make_batch_judge(cfg)(items) == scores  # concurrent, same order


def test_judge_as_an_eval_metric(judge_server, key):
    from tunix_rt.eval.generate import DecodeConfig
    from tunix_rt.eval.runner import EvalRequest, run_eval

    home, srv = judge_server
    cfg = _cfg(srv)
    out = run_eval(EvalRequest(dataset="tiny@v1", split="all", limit=3, model="tiny-gemma3",
                               decode=DecodeConfig(max_new_tokens=8), judge=cfg), home)
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    summary = json.loads((out / "eval_summary.json").read_text())
    assert all(0 <= p["judge_score"] <= 1 for p in preds)
    assert summary["metrics"]["judge_score"] == pytest.approx(sum(p["judge_score"] for p in preds) / 3)
    assert summary["judge"]["model"] == "tiny-gemma3" and TOKEN not in json.dumps(summary)

    down = _cfg(srv, url=f"http://127.0.0.1:{_free_port()}/v1", max_retries=0)
    before = sorted((home.root / "evals").iterdir())
    with pytest.raises(JudgeError, match="cannot reach the endpoint"):
        run_eval(EvalRequest(dataset="tiny@v1", split="all", limit=2, model="tiny-gemma3",
                             decode=DecodeConfig(max_new_tokens=4), judge=down), home)
    assert sorted((home.root / "evals").iterdir()) == before  # nothing half-written


@pytest.mark.serial
def test_judge_fails_loudly(judge_server, key, monkeypatch):
    _, srv = judge_server
    args = (RECORD, "<answer>7</answer>", "", "7")
    with pytest.raises(JudgeError, match=r"no score in the reply: .* \(after 2 attempts\)"):
        make_judge(_cfg(srv, score_pattern=r"^SCORE: (\d+)$"))(*args)  # garbage for this rubric
    with pytest.raises(JudgeError, match=r"score \d\.0 outside \[0, 0\.5\]"):
        make_judge(_cfg(srv, score_max=0.5))(*args)
    t0 = time.monotonic()
    with pytest.raises(JudgeError, match="cannot reach the endpoint.*after 2 attempts"):
        make_judge(_cfg(srv, url=f"http://127.0.0.1:{_free_port()}/v1"))(*args)
    assert time.monotonic() - t0 < 5
    with pytest.raises(JudgeError, match="timed out after 0.2 s"):
        make_judge(_cfg(srv, max_tokens=1800, timeout_s=0.2, max_retries=0))(*args)
    with pytest.raises(JudgeError, match="HTTP 404.*model_not_found"):
        make_judge(_cfg(srv, model="no-such-judge"))(*args)
    monkeypatch.setenv("TUNIX_RT_JUDGE_API_KEY", "wrong-token-wrong-token")
    with pytest.raises(JudgeError, match="HTTP 401"):
        make_judge(_cfg(srv))(*args)


def test_judge_config_is_checked(tmp_path):
    ok = dict(url="http://127.0.0.1:1/v1", model="m")
    for bad, why in ((dict(url="ftp://x"), "url"), (dict(score_pattern=r"\d+"), "one group"),
                     (dict(score_pattern="(("), "score_pattern"), (dict(rubric="{question} {nope}"), "nope"),
                     (dict(score_min=5, score_max=5), "below"), (dict(max_retries=-1), "max_retries"),
                     (dict(timeout_s=0), "timeout_s")):
        with pytest.raises(BadInput, match=why):
            JudgeConfig(**{**ok, **bad})
    path = tmp_path / "judge.yaml"
    path.write_text("judge:\n  url: http://127.0.0.1:8765/v1\n  model: tiny-gemma3\n  score_max: 5\n")
    assert JudgeConfig.from_yaml(path) == JudgeConfig(url="http://127.0.0.1:8765/v1", model="tiny-gemma3", score_max=5)
    path.write_text("url: http://x/v1\nmodel: m\nscore: 1\n")
    with pytest.raises(BadInput, match="unknown judge keys"):
        JudgeConfig.from_yaml(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_judge_is_a_registered_rl_reward_and_fails_the_run_when_down(judge_server, key):
    """`judge` in a config's rewards: the same score as make_judge; an endpoint that is
    down fails scoring naming the reward and the record (no default score)."""
    from tunix_rt.errors import TunixRtError
    from tunix_rt.traces.schema import Trace
    from tunix_rt.train.rewards import RewardSet

    _, srv = judge_server
    record = Trace(id="r1", question=RECORD["question"], steps=["3+4=7"], answer="7")
    text = "<reasoning>3+4=7</reasoning><answer>7</answer>"
    fields = {"url": srv.url + "/v1", "model": "tiny-gemma3", "score_pattern": ANY_DIGIT, "score_max": 9,
              "max_tokens": 200, "max_retries": 1, "timeout_s": 30}
    total, parts = RewardSet.from_config({"judge": {"weight": 2.0, **fields}}).score([record], [text])
    direct = make_judge(_cfg(srv))(record, text, "3+4=7", "7")
    assert parts["judge"][0] == direct and total[0] == 2.0 * direct
    down = RewardSet.from_config({"judge": {**fields, "url": f"http://127.0.0.1:{_free_port()}/v1",
                                            "max_retries": 0, "timeout_s": 2}})
    with pytest.raises(TunixRtError, match="reward 'judge' on record r1: JudgeError"):
        down.score([record], [text])
