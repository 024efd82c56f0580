"""/v1/models and /v1/chat/completions through the real `openai` client against a real
uvicorn server on loopback serving the tiny Gemma 3 (and a tiny LoRA run trained here):
plain and streamed calls equal `tunix-rt eval`'s greedy output, 16 concurrent requests
share decode steps, unknown models are 404, bad parameters 400, a missing or wrong token
401, a full queue 429, and a client that disconnects mid-stream frees its row at once."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from registry_testlib import import_tiny_dataset
from service_testlib import TOKEN, LiveServer, live_app, models_of

from tunix_rt.eval.generate import DecodeConfig
from tunix_rt.home import Home

QUESTIONS = ["What is 3+4?", "Tom has 12 apples and gives away 5. How many are left?", "Double 21.",
             "A train travels 60 km per hour for 3 hours. How far does it go?"]
RUN_SYSTEM = "Answer like a terse calculator."


@pytest.fixture(scope="module")
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the server's decode thread and the test share 2 cores
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def served(tmp_path_factory, one_thread):
    """(home, server, run_id): a home with the tiny dataset and a 2-step LoRA run with its
    own system prompt, served with a cap of 1500 tokens."""
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.driver import train

    home = Home.resolve(tmp_path_factory.mktemp("serve-home")).ensure()
    import_tiny_dataset(home)
    cfg = TrainConfig.load("smoke", ["dataset=tiny@v1", "split=all", "max_steps=2", "batch_size=2", "eval_interval=0",
                                     "save_interval=0", "warmup_steps=0", "max_seq_len=256", f"system_prompt={RUN_SYSTEM}"])
    run_dir = train(cfg, home, None)
    app = live_app(home, home.database_url, serve_max_tokens=1500)
    with LiveServer(app) as srv:
        yield home, srv, app, run_dir.name
    models_of(app).close()


def _client(srv, token: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=token, max_retries=0, timeout=120)


def _eval(home, max_new: int, **target):
    """`tunix-rt eval`'s predictions on the tiny dataset, by id."""
    from tunix_rt.eval.runner import EvalRequest, run_eval

    out = run_eval(EvalRequest(dataset="tiny@v1", split="all", limit=4, decode=DecodeConfig(max_new_tokens=max_new),
                               **target), home)
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def test_models_lists_catalog_and_runs(served):
    home, srv, _, run_id = served
    ids = [m.id for m in _client(srv).models.list().data]
    assert "tiny-gemma3" in ids and "tiny-gemma2" in ids and run_id in ids
    assert _client(srv).models.retrieve(run_id).owned_by == "tunix-rt"


@pytest.mark.parametrize("model", ["tiny-gemma3", "run"])
def test_plain_and_streamed_equal_eval(served, model):
    """Greedy chat output for a dataset question is eval's completion, token for token
    (the run: its adapter merged, its own system prompt)."""
    home, srv, _, run_id = served
    target = {"model": "tiny-gemma3"} if model == "tiny-gemma3" else {"adapter": run_id}
    name = model if model == "tiny-gemma3" else run_id
    preds = _eval(home, 40, **target)
    client = _client(srv)
    for p in preds:
        r = client.chat.completions.create(model=name, messages=[{"role": "user", "content": p["question"]}], max_tokens=40)
        assert r.choices[0].message.content == p["completion"]
        assert r.choices[0].finish_reason == p["finish_reason"]
        assert r.usage.completion_tokens == p["n_tokens"] and r.usage.prompt_tokens == p["prompt_tokens"]
        assert r.usage.total_tokens == p["n_tokens"] + p["prompt_tokens"] and r.model == name
    p = preds[0]
    chunks = list(client.chat.completions.create(model=name, messages=[{"role": "user", "content": p["question"]}],
                                                 max_tokens=40, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == p["completion"] and sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [p["finish_reason"]]
    assert chunks[-1].usage.completion_tokens == p["n_tokens"] and not chunks[-1].choices


def test_system_message_stop_n_and_sampling(served):
    _, srv, _, _ = served
    client = _client(srv)
    msgs = [{"role": "user", "content": QUESTIONS[0]}]
    base = client.chat.completions.create(model="tiny-gemma3", messages=msgs, max_tokens=30).choices[0].message.content
    other = client.chat.completions.create(model="tiny-gemma3", max_tokens=30,
                                           messages=[{"role": "system", "content": "Be brief."}, *msgs])
    assert other.usage.prompt_tokens != client.chat.completions.create(
        model="tiny-gemma3", messages=msgs, max_tokens=1).usage.prompt_tokens
    stop = base[5:8]
    cut = client.chat.completions.create(model="tiny-gemma3", messages=msgs, max_tokens=30, stop=[stop])
    assert cut.choices[0].message.content == base[: base.index(stop)] and cut.choices[0].finish_reason == "stop"
    sampled = client.chat.completions.create(model="tiny-gemma3", messages=msgs, max_tokens=20, n=3,
                                             temperature=1.0, top_p=0.95, seed=7)
    texts = [c.message.content for c in sampled.choices]
    assert [c.index for c in sampled.choices] == [0, 1, 2] and len(set(texts)) > 1
    again = client.chat.completions.create(model="tiny-gemma3", messages=msgs, max_tokens=20, n=3,
                                           temperature=1.0, top_p=0.95, seed=7)
    assert [c.message.content for c in again.choices] == texts  # seeded per (seed, choice)


def test_sixteen_concurrent_requests_share_decode_steps(served):
    _, srv, app, _ = served
    client = _client(srv)
    prompts = [f"{q} ({i})" for i in range(4) for q in QUESTIONS]
    # distinct budgets: rows of one batch end at different steps, so the waiting requests take the
    # freed rows of a batch that is still decoding (equal budgets could end the batch all at once)
    budget = {p: 20 + 2 * i for i, p in enumerate(prompts)}

    def ask(p):
        return client.chat.completions.create(model="tiny-gemma3", messages=[{"role": "user", "content": p}],
                                              max_tokens=budget[p]).choices[0].message.content

    solo = [ask(p) for p in prompts]
    sched = models_of(app).get("tiny-gemma3").scheduler
    joined, peak = sched.joined_running, sched.peak_rows
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(ask, prompts))
    assert together == solo
    assert sched.step_level and sched.peak_rows == 8 >= peak  # serve_max_batch rows decoded together
    assert sched.joined_running > joined  # requests joined a batch that was already decoding


def test_errors_unknown_model_bad_params_and_tokens(served):
    _, srv, _, _ = served
    client = _client(srv)
    msgs = [{"role": "user", "content": "hi"}]
    for name in ("no-such-model", "../runs", "gemma3-1b"):  # gemma3-1b: in the catalog, not imported
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model=name, messages=msgs)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    bad = [dict(temperature=-1), dict(top_p=0), dict(n=0), dict(max_tokens=0), dict(n=9),
           dict(messages=[]), dict(messages=[{"role": "assistant", "content": "hi"}]),
           dict(messages=[{"role": "wizard", "content": "hi"}]),
           dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
           dict(messages=[{"role": "user", "content": "x " * 1200}], max_tokens=1400)]
    for extra in bad:
        kwargs = {"model": "tiny-gemma3", "messages": msgs, "max_tokens": 4, **extra}
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**kwargs)
        assert e.value.status_code == 400 and e.value.body["message"], extra
    with pytest.raises(openai.AuthenticationError):
        _client(srv, "wrong-token-wrong-token").chat.completions.create(model="tiny-gemma3", messages=msgs)
    assert httpx.post(srv.url + "/v1/chat/completions", json={"model": "tiny-gemma3", "messages": msgs}).status_code == 401
    assert httpx.get(srv.url + "/v1/models").status_code == 401


def test_defaults_come_from_decode_config_and_max_tokens_is_capped():
    from tunix_rt.service.routers.openai import ChatCompletionRequest

    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    assert body.decode_config(cap=10**6) == DecodeConfig()
    asked = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5000, seed=3)
    assert asked.decode_config(cap=100) == DecodeConfig(max_new_tokens=100, seed=3)


@pytest.mark.serial
def test_client_disconnect_mid_stream_frees_the_row(served):
    _, srv, app, _ = served
    sched = models_of(app).get("tiny-gemma3").scheduler
    body = {"model": "tiny-gemma3", "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 1500, "stream": True}
    with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any('"content"' in x for x in got) and sched.active == 1
        req = sched.rows[0].req
    deadline = time.monotonic() + 5
    while sched.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sched.active == 0 and req.cancelled
    produced = req.generated
    time.sleep(0.2)
    assert req.generated == produced < 1500  # stopped when the client left, not at max_tokens

    plain = dict(body, stream=False)
    with pytest.raises(httpx.ReadTimeout):  # a non-streaming client that gives up
        httpx.post(srv.url + "/v1/chat/completions", json=plain, timeout=0.5, headers={"Authorization": f"Bearer {TOKEN}"})
    deadline = time.monotonic() + 5
    while sched.active and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sched.active == 0 and time.monotonic() < deadline


def test_full_queue_answers_429(tmp_path, one_thread):
    """One row decoding and one request waiting fill a server of batch 1 and queue 1: the
    next requests are refused at once with a 429 that names the limit, and both held
    requests are answered when decoding goes on. The decode step waits on an event, so each
    state is reached before the next request is sent (CI once saw six requests sent
    together end as [429, 429, 200, 429, 429, 429]: the first was still in the queue)."""
    import threading

    home = Home.resolve(tmp_path / "home").ensure()
    app = live_app(home, home.database_url, serve_max_batch=1, serve_max_queue=1, serve_max_tokens=400)
    try:
        with LiveServer(app) as srv:
            client = _client(srv)

            def ask(i):
                try:
                    client.chat.completions.create(model="tiny-gemma3", max_tokens=20, temperature=1.0, seed=i,
                                                   messages=[{"role": "user", "content": f"Story {i}"}])
                    return 200
                except openai.RateLimitError as e:
                    assert "queue limit 1" in e.body["message"]
                    return 429

            client.chat.completions.create(model="tiny-gemma3", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
            sched = models_of(app).get("tiny-gemma3").scheduler
            go, step = threading.Event(), sched.batch.step

            def held(*a, **k):  # the real step, once the test lets it run
                assert go.wait(60)
                return step(*a, **k)

            sched.batch.step = held

            def until(cond):
                deadline = time.monotonic() + 30
                while not cond() and time.monotonic() < deadline:
                    time.sleep(0.005)
                return cond()

            with ThreadPoolExecutor(2) as pool:
                try:
                    decoding = pool.submit(ask, 0)
                    assert until(lambda: sched.active == 1)
                    waiting = pool.submit(ask, 1)
                    assert until(lambda: len(sched._pending) == 1)
                    refused = [ask(i) for i in range(2, 5)]
                finally:
                    go.set()
                answered = [decoding.result(timeout=60), waiting.result(timeout=60)]
    finally:
        models_of(app).close()
    assert refused == [429, 429, 429] and answered == [200, 200], (refused, answered)


def test_malformed_messages_and_types_are_400_and_the_connection_lives(served):
    """A lone surrogate ("\\ud800", not Unicode), a user message with no or null content, and
    max_tokens sent as a string are each a clean JSON 400, and the next request on the same
    keep-alive connection is answered."""
    import http.client

    _, srv, _, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=120)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    ok = {"model": "tiny-gemma3", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    bad = ['{"model": "tiny-gemma3", "max_tokens": 2, "messages": [{"role": "user", "content": "a\\ud800b"}]}',
           '{"model": "tiny-gemma3", "max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
           '{"model": "tiny-\\ud800", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}',
           json.dumps({**ok, "messages": [{"role": "user"}]}),
           json.dumps({**ok, "messages": [{"role": "user", "content": None}]}),
           json.dumps({**ok, "max_tokens": "8"}), json.dumps({**ok, "n": "1"}), json.dumps({**ok, "stream": "false"}),
           json.dumps({**ok, "temperature": "0.5"})]
    conn.request("POST", "/v1/chat/completions", body=json.dumps(ok), headers=headers)
    assert conn.getresponse().read() and conn.sock is not None
    sock = conn.sock
    for body in bad:
        conn.request("POST", "/v1/chat/completions", body=body.encode(), headers=headers)
        r = conn.getresponse()
        err = json.loads(r.read())["error"]
        assert r.status == 400 and err["type"] == "invalid_request_error" and err["message"], (body, err)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(ok), headers=headers)
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["choices"], body
        assert conn.sock is sock, body  # still the same connection
    conn.close()


def test_loading_a_model_never_fails_requests_in_flight(served):
    """30 requests rotating over three models with --max-models 2: a model with requests in
    flight is never unloaded under them; each request succeeds or, had no model gone idle in
    time, gets a retryable 503 with Retry-After; never a 500 ("the model was unloaded")."""
    _, srv, app, run_id = served
    models = ["tiny-gemma3", "tiny-gemma2", run_id]
    assert app.state.settings.serve_max_models == 2

    def ask(i: int) -> tuple[int, str, dict]:
        body = {"model": models[i % 3], "max_tokens": 24 + i % 5,
                "messages": [{"role": "user", "content": QUESTIONS[i % 4]}]}
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=300,
                       headers={"Authorization": f"Bearer {TOKEN}"})
        return r.status_code, r.text, dict(r.headers)

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(ask, range(30)))
    codes = [c for c, _, _ in results]
    assert set(codes) <= {200, 503}, [(c, t) for c, t, _ in results if c not in (200, 503)]
    assert all(int(h["retry-after"]) > 0 for c, _, h in results if c == 503)
    assert codes.count(200) >= 20, codes
    assert len(models_of(app).loaded()) <= 2


@pytest.mark.serial
def test_a_request_cancelled_while_its_model_loads_does_not_pin_it(tmp_path, one_thread):
    """A request cancelled (server shutdown, a client gone) while its model loads on a worker
    thread: what the thread acquired is released, so the model can still be unloaded later
    (with room for one, the next model loads instead of waiting for a slot that never frees)."""
    import asyncio

    from tunix_rt.service.routers.openai import hold_model, model_cache

    home = Home.resolve(tmp_path / "home").ensure()
    app = live_app(home, home.database_url, serve_max_models=1, serve_load_wait_s=0.5)

    async def cancel_then_load_another():
        cache = model_cache(app)
        # The load waits behind the cache's one-load-at-a-time lock, held here, so the request is
        # surely still loading when it is cancelled (a tiny model loads in under 50 ms on a warm
        # process: a sleep alone let it finish first in a full-suite run).
        with cache._load_lock:
            task = asyncio.create_task(hold_model(app, cache, "tiny-gemma3"))
            await asyncio.sleep(0.05)  # the load is on its thread, waiting for the lock
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        while "tiny-gemma3" not in cache.loaded():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.05)
        return await hold_model(app, cache, "tiny-gemma2")

    try:  # a hold never released: OpenAIError 503 "all 1 loaded models … are serving requests"
        served = asyncio.run(cancel_then_load_another())
        assert served.id == "tiny-gemma2" and models_of(app).loaded() == ["tiny-gemma2"]
    finally:
        models_of(app).close()
