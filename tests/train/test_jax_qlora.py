"""QLoRA in the JAX engine (qwix LoRA with lora_weight_qtype) on the tiny Gemma 3, on CPU.

One nf4 QLoRA run and the same run as plain LoRA, in this process through the driver on the
JAX engine (the trained models are kept by wrapping `JaxEngine.export`, which still writes
the outputs):

- QLoRA trains: a finite loss that falls on a repeated batch; its run directory is laid out
  like the LoRA run's (final/adapter in PEFT format, final/merged); the same parameter counts;
- the trained model's targeted projections really are quantised: nf4 codes (uint4) and scales
  that dequantise to within nf4's error of the original weights, while the LoRA run keeps the
  float32 weights; QLoRA's first loss (B = 0: the base model's own) differs from LoRA's.
  int8 likewise, on a freshly loaded model (qwix runs both on a CPU);
- the exported adapter in PEFT on the HF tiny model gives, up to float32 rounding, the JAX
  model's logits with the same factors on the full-precision base (what export_adapter
  promises; final/merged is that model too), the QLoRA model's own logits on the dequantised
  base, and the QLoRA model's within the quantisation error on the full-precision base;
- a bad qtype (or a run that would ignore it) fails in the config, before any model loads.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from requires import require_module

from tunix_rt.errors import BadInput
from tunix_rt.train.config import TrainConfig
from train_testlib import write_traces  # noqa: E402

pytestmark = pytest.mark.jax

STEPS = 6
EXACT = 1e-4  # float32, different summation order (the cross-engine golden test's bound)
#: PEFT on the full-precision base vs the QLoRA model: nf4 (16 levels, an absmax scale per
#: 32-wide tile) moves each base weight by ~9% relative RMS (measured 8.7-9.5% over the 12
#: projections), which through 2 layers moves the logits by ~0.17 of their largest magnitude
#: (measured 0.166). 0.3 leaves room while staying far under the adapter's own effect (~1.0)
#: and the gap to a lost/garbled adapter.
NF4_LOGIT_TOL = 0.3



def _traces(path, n=16):
    return write_traces(path, n)


class Trained:
    def __init__(self, path, model, setup):
        self.path, self.model, self.setup = path, model, setup


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"qlora": Trained, "lora": Trained}: the same 6 steps on the same 4 examples (one batch,
    repeated), nf4 QLoRA and plain LoRA, both with merge=true."""
    require_module("jax")
    from tunix_rt.home import Home
    from tunix_rt.train import driver
    from tunix_rt.train.jax_engine import JaxEngine

    root = tmp_path_factory.mktemp("qlora")
    kept = {}
    real = JaxEngine.export

    def keep(engine, final_dir):
        kept[engine.cfg.run_name] = (engine.model(), engine)
        return real(engine, final_dir)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNIX_RT_HOME", str(root / "home"))
        mp.delenv("DATABASE_URL", raising=False)
        mp.setattr(JaxEngine, "export", keep)
        home = Home.resolve().ensure()
        data = _traces(root / "traces.jsonl")
        out = {}
        for name, qtype in (("qlora", "nf4"), ("lora", None)):
            cfg = TrainConfig(model="tiny-gemma3", dataset=data, split="all", limit=4, eval_split="all",
                              eval_limit=4, system_prompt="Be brief.", batch_size=4, max_seq_len=128,
                              max_steps=STEPS, lr=1e-2, schedule="constant", lora_rank=4, lora_alpha=8.0,
                              loss_chunk_bytes=64 * 1024 * 4, engine="jax", device="cpu", lora_weight_qtype=qtype,
                              run_name=name, merge=True)
            path = driver.train(cfg, home)
            out[name] = Trained(path, *kept[name])
    return out


def _losses(run):
    from tunix_rt.train.metrics import read_jsonl

    return [r["loss"] for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]


def _layout(run) -> set[str]:
    """Relative paths, content-addressed names (orbax chunks, TensorBoard events) as *."""
    def norm(part):
        return "*" if re.fullmatch(r"[0-9a-f]{32}", part) or part.startswith("events.out.tfevents") else part

    return {"/".join(norm(x) for x in p.relative_to(run).parts) for p in run.rglob("*")}


def _modules(model) -> dict[tuple[str, ...], object]:
    from flax import nnx

    return {tuple(str(k) for k in path): mod for path, mod in nnx.iter_modules(model)}


def _adapted(model) -> dict[tuple[tuple[str, ...], str], object]:
    """(module path, weight name) -> the weight, for every module that got LoRA factors."""
    return {(path, w): getattr(mod, w) for path, mod in _modules(model).items()
            for w in ("w", "kernel") if getattr(mod, f"{w}_lora_a", None) is not None}


def test_qlora_trains_and_writes_the_lora_layout(runs):
    q, lo = runs["qlora"], runs["lora"]
    loss = _losses(q.path)
    assert len(loss) == STEPS and all(math.isfinite(x) for x in loss), loss
    assert all(b < a for a, b in zip(loss, loss[1:])), loss  # the same batch every step
    assert loss[-1] < loss[0] - 0.5, loss

    assert _layout(q.path) == _layout(lo.path)
    for name in ("final/adapter/adapter_model.safetensors", "final/adapter/adapter_config.json",
                 "final/merged/model.safetensors", "config.yaml", "loss.png", "metrics.jsonl"):
        assert (q.path / name).is_file(), name
    manifest = json.loads((q.path / "run_manifest.json").read_text())
    ref = json.loads((lo.path / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["config"]["lora_weight_qtype"] == "nf4"
    # the same model: quantisation scales are not extra parameters
    for key in ("params", "trainable_params"):
        assert manifest["summary"][key] == ref["summary"][key], key
    assert TrainConfig.load(q.path / "config.yaml").lora_weight_qtype == "nf4"

    from safetensors.numpy import load_file

    a = load_file(str(q.path / "final/adapter/adapter_model.safetensors"))
    b = load_file(str(lo.path / "final/adapter/adapter_model.safetensors"))
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
    assert len(a) == 2 * 2 * 7  # 2 layers x 7 projections x (A, B)
    assert all(a[k].dtype == np.float32 for k in a)
    assert min(np.abs(v).max() for k, v in a.items() if "lora_B" in k) > 0  # every B trained
    cfg = json.loads((q.path / "final/adapter/adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8.0
    assert json.loads((q.path / "final/adapter/tunix_rt_adapter.json").read_text())["weight_qtype"] == "nf4"
    assert "weight_qtype" not in json.loads((lo.path / "final/adapter/tunix_rt_adapter.json").read_text())


def test_trained_base_projections_are_nf4(runs):
    import jax.numpy as jnp
    import qwix
    from flax import nnx
    from qwix._src.providers.ptq import WithAux

    qm, lm = runs["qlora"].model, runs["lora"].model
    qw, lw = _adapted(qm), _adapted(lm)
    assert set(qw) == set(lw) and len(qw) == 2 * 6  # q, kv, o, gate, up, down in 2 layers
    for key, w in qw.items():
        fp = lw[key]
        assert isinstance(fp, nnx.Param) and fp[...].dtype == jnp.float32, key  # LoRA: not quantised
        assert isinstance(w, WithAux) and isinstance(w.array, qwix.QArray), (key, type(w))
        arr = w.array
        assert arr.qtype == "nf4" and arr.qvalue.dtype == jnp.uint4 and arr.qvalue.shape == fp.shape, key
        assert arr.scale.dtype == jnp.float32 and arr.scale.size < fp[...].size // 16, key
        codes = np.unique(np.asarray(arr.qvalue, np.int32))
        assert 8 < len(codes) <= 16, (key, codes)
        orig, deq = np.asarray(fp[...]), np.asarray(qwix.dequantize(arr))
        err = np.linalg.norm(deq - orig) / np.linalg.norm(orig)
        assert 0.03 < err < 0.15, (key, err)  # nf4 of these weights, not of anything else
    # what is not targeted stays float32 and untouched
    qp = dict(nnx.to_flat_state(nnx.state(qm, nnx.Param)))
    lp = dict(nnx.to_flat_state(nnx.state(lm, nnx.Param)))
    plain = [k for k in lp if "lora" not in str(k[-1]) and k[-1] != "w" and k[-1] != "kernel"]
    assert any(k[0] == "embedder" for k in plain) and len(plain) > 10
    for k in plain:
        assert qp[k][...].dtype == jnp.float32 and np.array_equal(np.asarray(qp[k][...]), np.asarray(lp[k][...])), k
    # step 1 runs the base model (B = 0): its quantisation shows in the loss
    q1, l1 = _losses(runs["qlora"].path)[0], _losses(runs["lora"].path)[0]
    assert 1e-3 < abs(q1 - l1) < 0.01 * l1, (q1, l1)


def test_int8_quantises_on_cpu_too(runs):
    """int8 on a freshly loaded model: int8 codes, ~0.6% weight error (measured 0.55-0.66%),
    logits close to the float32 base's."""
    import jax
    import jax.numpy as jnp
    import qwix
    from flax import nnx
    from qwix._src.providers.ptq import WithAux

    from tunix_rt.models.jax_loader import load_model
    from tunix_rt.train.jax_engine import apply_lora

    s = runs["lora"].setup
    cfg = TrainConfig(dataset="x", lora_rank=4, lora_alpha=8.0, lora_weight_qtype="int8", engine="jax")
    with jax.set_mesh(s.mesh):
        m, tcfg = load_model(s.model_dir, s.mesh, "fp32")
        m = apply_lora(m, cfg, tcfg)
    ref = _adapted(runs["lora"].model)
    weights = _adapted(m)
    assert set(weights) == set(ref)
    for key, w in weights.items():
        assert isinstance(w, WithAux) and w.array.qvalue.dtype == jnp.int8, key
        orig, deq = np.asarray(ref[key][...]), np.asarray(qwix.dequantize(w.array))
        assert 1e-4 < np.linalg.norm(deq - orig) / np.linalg.norm(orig) < 0.02, key
    ids, valid = _ids()
    fp = nnx.clone(runs["lora"].model)
    for _, var in nnx.to_flat_state(nnx.state(fp, nnx.LoRAParam)):
        var[...] = jnp.zeros_like(var[...])
    a, b = _jax_logits(m, ids, s.mesh), _jax_logits(fp, ids, s.mesh)
    assert 1e-5 < _rel(a, b, valid) < 0.08  # measured 0.025 (nf4: 0.17)


def _ids(seq=40):
    from tunix_rt.models.store import TINY_TOKENIZER
    from tunix_rt.models.tokenizer import ChatTokenizer
    from tunix_rt.render import render_example

    tok = ChatTokenizer.from_file(TINY_TOKENIZER)
    rows = [render_example("a", "Tom has 3 apples and buys 4 more. How many now?", ["3 + 4 = 7"], "7", tok,
                           system_prompt="Think."),
            render_example("b", "What is 6 times 7?", ["6 * 7 = 42"], "42", tok, system_prompt="")]
    ids = np.zeros((2, seq), np.int32)
    for i, r in enumerate(rows):
        n = min(len(r.ids), seq)
        ids[i, :n] = r.ids[:n]
    return ids, ids != 0


def _jax_logits(model, ids, mesh):
    import jax

    from tunix_rt.train.jax_loss import model_inputs

    inp = model_inputs(jax.numpy.asarray(ids), jax.numpy.asarray(ids != 0))
    with jax.set_mesh(mesh):
        logits, _ = model(inp["input_tokens"], inp["positions"], None, inp["attention_mask"])
    return np.asarray(logits)


def _rel(a, b, valid):
    return float(np.abs(a - b)[valid].max() / np.abs(b)[valid].max())


def test_adapter_in_peft_gives_the_qlora_logits_up_to_the_quantisation(runs):
    import jax
    import qwix
    import torch
    from flax import nnx
    from peft import PeftModel

    from tunix_rt.models.hf import load_causal_lm
    from tunix_rt.models.jax_loader import hf_state, load_model

    q, s = runs["qlora"], runs["qlora"].setup
    ids, valid = _ids()
    jq = _jax_logits(q.model, ids, s.mesh)  # the trained QLoRA model
    fp = nnx.clone(runs["lora"].model)  # the same factors on the full-precision base
    nnx.update(fp, nnx.state(q.model, nnx.LoRAParam))
    jfp = _jax_logits(fp, ids, s.mesh)

    # the base the QLoRA factors were trained on, dequantised, in HF layout
    with jax.set_mesh(s.mesh):
        deq, _ = load_model(s.model_dir, s.mesh, "fp32")
    mods = _modules(deq)
    for (path, w), weight in _adapted(q.model).items():
        getattr(mods[path], w)[...] = qwix.dequantize(weight.array)
    deq_state = {k: torch.from_numpy(np.array(v)) for k, v in hf_state(deq, s.family).items()}

    adapter = q.path / "final/adapter"
    tok, am = torch.tensor(ids, dtype=torch.long), torch.tensor(valid.astype(np.int64))

    def run(model):
        with torch.no_grad():
            return model.eval()(input_ids=tok, attention_mask=am).logits.numpy()

    base = load_causal_lm(s.model_dir, dtype="fp32", device="cpu", attn="eager")
    plain = run(base)
    peft_fp = run(PeftModel.from_pretrained(base, adapter))
    merged = run(load_causal_lm(q.path / "final/merged", dtype="fp32", device="cpu", attn="eager"))
    base_q = load_causal_lm(s.model_dir, dtype="fp32", device="cpu", attn="eager")
    missing, unexpected = base_q.load_state_dict(deq_state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    peft_q = run(PeftModel.from_pretrained(base_q, adapter))

    assert _rel(peft_fp, jfp, valid) < EXACT  # the export is exact (on the full-precision base)
    assert _rel(merged, peft_fp, valid) < EXACT  # final/merged is the same model
    assert _rel(peft_q, jq, valid) < EXACT  # on the base it trained on: the QLoRA model itself
    gap = _rel(peft_fp, jq, valid)  # on the full-precision base: off by the nf4 error only
    assert 1e-3 < gap < NF4_LOGIT_TOL, gap
    assert _rel(plain, jfp, valid) > 2 * gap  # the adapter matters more than the quantisation


@pytest.mark.parametrize("items, needle", [
    (["lora_weight_qtype=nf5"], r"lora_weight_qtype must be one of nf4\|int8 .*got 'nf5'"),
    (["lora_weight_qtype=bf16"], r"lora_weight_qtype must be one of nf4\|int8"),
    (["lora_weight_qtype=NF4"], r"lora_weight_qtype must be one of nf4\|int8"),
    (["lora_weight_qtype=nf4", "finetune=full"], "needs finetune=lora"),
    (["lora_weight_qtype=nf4", "engine=torch"], "JAX engine only"),
    (["lora_weight_qtype=int8", "engine=auto", "device=cpu"], "JAX engine only"),
])
def test_bad_qtype_fails_in_the_config(items, needle):
    overrides = items if any(i.startswith("engine=") for i in items) else [*items, "engine=jax"]
    with pytest.raises(BadInput, match=needle):
        TrainConfig.load("smoke", overrides)


def test_good_qtypes_pass_the_config():
    for q in ("nf4", "int8"):
        assert TrainConfig.load("smoke", [f"lora_weight_qtype={q}", "engine=jax"]).lora_weight_qtype == q
    assert TrainConfig.load("smoke", ["lora_weight_qtype=nf4", "device=tpu"]).lora_weight_qtype == "nf4"  # auto: JAX
    assert TrainConfig.load("smoke", ["lora_weight_qtype=null"]).lora_weight_qtype is None


def test_bad_qtype_fails_before_any_model_loads(home, tmp_path):
    from tunix_rt.train.cli import train_cmd

    with pytest.raises(BadInput, match=r"nf4\|int8"):
        train_cmd(overrides=["lora_weight_qtype=int3", f"dataset={_traces(tmp_path / 't.jsonl')}"],
                  config="smoke", engine="jax")
    assert not any(home.models.iterdir()) and not any(home.runs.iterdir())
