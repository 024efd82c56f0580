"""models.hf.auto_causal_lm: loading a model does not import scikit-learn (and its scipy,
pandas, pyarrow), and sklearn stays importable after it."""

from __future__ import annotations

import subprocess
import sys

from requires import require_module

CODE = """
import sys
from tunix_rt.models.hf import auto_causal_lm, load_causal_lm
from tunix_rt.models.store import ensure_model
from tunix_rt.home import Home
model = load_causal_lm(ensure_model("tiny-gemma3", Home.resolve(sys.argv[1])))
heavy = sorted(m for m in ("sklearn", "pandas", "pyarrow") if m in sys.modules)
import sklearn.metrics
print(",".join(heavy) or "none", sklearn.metrics.roc_curve.__name__)
"""


def test_model_loading_leaves_sklearn_out_and_importable(tmp_path):
    require_module("sklearn")  # lm-eval installs it: what transformers would import
    r = subprocess.run([sys.executable, "-c", CODE, str(tmp_path / "home")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["none", "roc_curve"]
