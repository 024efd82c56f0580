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
