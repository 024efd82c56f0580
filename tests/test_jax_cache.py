"""jax_devices.compilation_cache_dir: a second process finds what the first compiled; the user's
own JAX_COMPILATION_CACHE_DIR wins; TUNIX_RT_JAX_CACHE=off keeps nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.jax

# a compile that takes well under JAX's 1 s threshold is cached too when the test says 0
PROGRAM = """
import json, jax, jax.numpy as jnp
from jax import monitoring
from tunix_rt.jax_devices import select_devices
hits = []
monitoring.register_event_listener(lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None)
select_devices("cpu")
x = jax.jit(lambda a: jnp.tanh(a @ a.T).sum())(jnp.ones((8, 8)))
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir, "hits": len(hits), "x": float(x)}))
"""


def _run(env: dict) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "TUNIX_RT_JAX_CACHE"))}
    full.update({"JAX_PLATFORMS": "cpu", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", **env})
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_reuses_the_first_ones_compile(tmp_path):
    xdg = tmp_path / "xdg"
    first = _run({"XDG_CACHE_HOME": str(xdg)})
    cache = xdg / "tunix-rt" / "jax"
    assert first["dir"] == str(cache) and first["hits"] == 0
    entries = sorted(p.name for p in cache.iterdir())
    assert entries
    second = _run({"XDG_CACHE_HOME": str(xdg)})
    assert second["hits"] >= 1 and second["x"] == first["x"]


def test_the_users_cache_dir_wins_and_off_keeps_nothing(tmp_path):
    own = tmp_path / "own"
    got = _run({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "JAX_COMPILATION_CACHE_DIR": str(own),
                "TUNIX_RT_JAX_CACHE": str(tmp_path / "ours")})
    assert got["dir"] == str(own) and any(own.iterdir())
    assert not (tmp_path / "ours").exists() and not (tmp_path / "xdg").exists()
    ours = _run({"TUNIX_RT_JAX_CACHE": str(tmp_path / "ours")})
    assert ours["dir"] == str(tmp_path / "ours") and any((tmp_path / "ours").iterdir())
    off = _run({"XDG_CACHE_HOME": str(tmp_path / "xdg"), "TUNIX_RT_JAX_CACHE": "off"})
    assert off["dir"] in (None, "") and not (tmp_path / "xdg").exists()
