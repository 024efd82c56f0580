"""The model cache: ids are catalog names or run ids (never paths), loaded once, and the
least recently used model is unloaded past the bound (its decode thread stops)."""

from __future__ import annotations

import pytest

from tunix_rt.errors import TunixRtError
from tunix_rt.eval.generate import DecodeConfig
from tunix_rt.serving.models import ModelCache, ModelNotFound, ServeConfig, available, eval_request
from tunix_rt.serving.scheduler import Request


def test_ids_are_names_not_paths(home):
    (home.runs / "half-run").mkdir()
    for bad, why in (("../models", "does not exist"), ("/etc", "does not exist"), ("gemma3-270m", "not imported"),
                     ("half-run", "no final/adapter"), ("nope", "does not exist")):
        with pytest.raises(ModelNotFound, match=why):
            eval_request(bad, home)
    assert {"tiny-gemma3", "tiny-gemma2"} <= {m["id"] for m in available(home)}
    assert "half-run" not in {m["id"] for m in available(home)}


def test_lru_unloads_the_least_recently_used(home):
    cache = ModelCache(home, ServeConfig(max_models=1, device="cpu"))
    try:
        first = cache.get("tiny-gemma3")
        assert cache.get("tiny-gemma3") is first and cache.loaded() == ["tiny-gemma3"]
        cache.get("tiny-gemma2")
        assert cache.loaded() == ["tiny-gemma2"]
        with pytest.raises(TunixRtError, match="unloaded"):
            first.scheduler.submit(Request([2, 105], DecodeConfig(max_new_tokens=2), lambda ev: None))
    finally:
        cache.close()


def test_a_model_in_use_is_never_unloaded_by_a_load(home):
    """With room for one model: while tiny-gemma3 is held (looked up, not yet submitted) a
    load of tiny-gemma2 waits, then gives up with ModelsBusy (503 + Retry-After upstream);
    while a request decodes on it, the load waits for that request to finish, which ends
    "done", never "the model was unloaded"; once idle it is unloaded for the newcomer."""
    import threading
    import time

    from tunix_rt.serving.models import ModelsBusy

    cache = ModelCache(home, ServeConfig(max_models=1, device="cpu", load_wait_s=0.3))
    try:
        first = cache.acquire("tiny-gemma3")
        t0 = time.monotonic()
        with pytest.raises(ModelsBusy) as busy:
            cache.acquire("tiny-gemma2")
        assert time.monotonic() - t0 >= 0.3 and busy.value.retry_after_s > 0
        assert cache.loaded() == ["tiny-gemma3"]

        events = []
        first.scheduler.submit(Request([2, 105, 10, 11], DecodeConfig(max_new_tokens=300), events.append))
        cache.release(first)  # submitted: from here the scheduler keeps it busy
        assert not first.scheduler.idle
        cache.cfg = ServeConfig(max_models=1, device="cpu", load_wait_s=120)
        got = {}
        loader = threading.Thread(target=lambda: got.setdefault("m", cache.acquire("tiny-gemma2")))
        loader.start()
        loader.join(timeout=180)
        assert events[-1].kind == "done" and not [e for e in events if e.kind == "error"]
        assert got["m"].id == "tiny-gemma2" and cache.loaded() == ["tiny-gemma2"]
        cache.release(got["m"])
    finally:
        cache.close()
