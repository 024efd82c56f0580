"""The golden test: the JAX engine (google-tunix) and the PyTorch engine (transformers) agree
on the same tiny HF checkpoint (Gemma 3 and Gemma 2 architectures, random weights saved by
transformers): the same logits, the same masked loss, the same loss after 3 SGD steps of
full fine-tuning; and what the JAX engine exports (merged HF safetensors, a PEFT adapter)
loads in transformers/PEFT with the same logits."""

from __future__ import annotations

import numpy as np
import pytest
from requires import require_module

pytestmark = pytest.mark.jax

jax = require_module("jax")
torch = require_module("torch")

LR = 0.1
STEPS = 3


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory):
    from tunix_rt.home import Home

    return Home.resolve(tmp_path_factory.mktemp("home")).ensure()


def _batch(tok, seq=40):
    """Two rendered examples, longer than the sliding window (16), right-padded."""
    from tunix_rt.render import render_example

    rows = [render_example("a", "Tom has 3 apples and buys 4 more. How many now?", ["3 + 4 = 7"], "7", tok,
                           system_prompt="Think."),
            render_example("b", "What is 6 times 7?", ["6 * 7 = 42"], "42", tok, system_prompt="")]
    ids = np.zeros((2, seq), np.int32)
    mask = np.zeros((2, seq), np.int32)
    for i, r in enumerate(rows):
        n = min(len(r.ids), seq)
        ids[i, :n], mask[i, :n] = r.ids[:n], r.loss_mask[:n]
    assert mask[:, 1:].sum() > 0 and (ids[0] != 0).sum() > 16
    return ids, mask


def _torch_loss(model, ids, mask):
    out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor((ids != 0).astype(np.int64)))
    logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
    tgt = torch.tensor(ids[:, 1:], dtype=torch.long)
    m = torch.tensor(mask[:, 1:], dtype=torch.float32)
    nll = -logp.gather(-1, tgt[..., None])[..., 0]
    return (nll * m).sum() / m.sum(), out.logits


def _jax_logits(model, ids):
    from tunix_rt.train.jax_loss import model_inputs

    inp = model_inputs(jax.numpy.asarray(ids), jax.numpy.asarray(ids != 0))
    logits, _ = model(inp["input_tokens"], inp["positions"], None, inp["attention_mask"])
    return np.asarray(logits)


def _rel(a, b, valid):
    return float(np.abs(a - b)[valid].max() / np.abs(b)[valid].max())


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-gemma2"])
def test_same_logits_loss_and_sgd_trajectory(name, shared_home, tiny_tok, tmp_path):
    import optax
    from flax import nnx
    from transformers import AutoModelForCausalLM

    from tunix_rt.models.hf import load_causal_lm
    from tunix_rt.models.jax_loader import load_model, make_mesh
    from tunix_rt.models.store import ensure_model
    from tunix_rt.train.export import export_merged
    from tunix_rt.train.jax_loss import make_loss_fn, model_inputs, weights

    model_dir = ensure_model(name, shared_home)
    ids, mask = _batch(tiny_tok)
    valid = ids != 0

    tm = load_causal_lm(model_dir, dtype="fp32", device="cpu", attn="eager")
    mesh = make_mesh()
    with jax.set_mesh(mesh):
        jm, _ = load_model(model_dir, mesh, "fp32")
        # same logits
        t_loss, t_logits = _torch_loss(tm, ids, mask)
        assert _rel(_jax_logits(jm, ids), t_logits.detach().numpy(), valid) < 1e-4

        # same masked loss (our chunked loss, model turn only, per supervised token)
        loss_fn = make_loss_fn(chunk_bytes=16 * 4 * jm.embedder.input_embedding.shape[0])  # 16 tokens
        inputs = model_inputs(jax.numpy.asarray(ids), jax.numpy.asarray(valid),
                              loss_weights=jax.numpy.asarray(weights(mask, mask[:, 1:].sum())))
        step = nnx.jit(lambda m, o, x: _sgd_step(m, o, x, loss_fn))
        opt = nnx.Optimizer(jm, optax.sgd(LR), wrt=nnx.Param)

        # 3 SGD steps of full fine-tuning in both
        tm.train()
        t_traj, j_traj = [], []
        for _ in range(STEPS):
            t_loss, _ = _torch_loss(tm, ids, mask)
            tm.zero_grad()
            t_loss.backward()
            with torch.no_grad():
                for p in tm.parameters():
                    p -= LR * p.grad
            t_traj.append(float(t_loss.detach()))
            j_traj.append(float(step(jm, opt, inputs)))
        t_final, t_logits = _torch_loss(tm, ids, mask)
        t_traj.append(float(t_final))
        j_traj.append(float(loss_fn(jm, **inputs)))
        j_logits = _jax_logits(jm, ids)

    assert abs(j_traj[0] - t_traj[0]) < 1e-5, (j_traj, t_traj)
    np.testing.assert_allclose(j_traj, t_traj, rtol=1e-4)
    assert t_traj[-1] < t_traj[0] - 1e-2, t_traj  # the steps moved the weights: the check has teeth

    # the JAX export (HF layout) loads in transformers and gives the trained logits
    out = tmp_path / "merged"
    out.mkdir()
    export_merged(jm, "gemma3" if name == "tiny-gemma3" else "gemma2", model_dir, out)
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        r_loss, r_logits = _torch_loss(reloaded, ids, mask)
    assert _rel(r_logits.numpy(), j_logits, valid) < 1e-4
    assert _rel(r_logits.numpy(), t_logits.detach().numpy(), valid) < 1e-4


def _sgd_step(model, opt, inputs, loss_fn):
    from flax import nnx

    loss, grads = nnx.value_and_grad(loss_fn)(model, **inputs)
    opt.update(model, grads)
    return loss


def test_lora_adapter_loads_in_peft_with_same_logits(shared_home, tiny_tok, tmp_path):
    """A qwix LoRA with non-zero factors on every projection, exported in PEFT format and
    merged: PeftModel and the merged checkpoint give the JAX LoRA model's logits."""
    from flax import nnx
    from peft import PeftModel

    from tunix_rt.models.hf import load_causal_lm
    from tunix_rt.models.jax_loader import load_model, make_mesh
    from tunix_rt.models.store import ensure_model
    from tunix_rt.train.config import TrainConfig
    from tunix_rt.train.export import export_adapter, export_merged
    from tunix_rt.train.jax_engine import apply_lora

    model_dir = ensure_model("tiny-gemma2", shared_home)  # GQA: k/v fused in kv_einsum
    cfg = TrainConfig(dataset="x", lora_rank=4, lora_alpha=8.0)
    ids, _ = _batch(tiny_tok)
    mesh = make_mesh()
    with jax.set_mesh(mesh):
        jm, tcfg = load_model(model_dir, mesh, "fp32")
        jm = apply_lora(jm, cfg, tcfg)
        rng = np.random.default_rng(1)
        for _, var in nnx.to_flat_state(nnx.state(jm, nnx.LoRAParam)):
            var[...] = jax.numpy.asarray(rng.normal(0, 0.05, var[...].shape), jax.numpy.float32)
        j_logits = _jax_logits(jm, ids)
    adapter, merged = tmp_path / "adapter", tmp_path / "merged"
    adapter.mkdir(), merged.mkdir()
    export_adapter(jm, model_dir, adapter, cfg.lora_rank, cfg.lora_alpha, 0.0, cfg.lora_targets)
    export_merged(jm, "gemma2", model_dir, merged, cfg.lora_alpha / cfg.lora_rank)

    valid = ids != 0
    tok = torch.tensor(ids, dtype=torch.long)
    am = torch.tensor(valid.astype(np.int64))
    base = load_causal_lm(model_dir, dtype="fp32", device="cpu", attn="eager")
    with torch.no_grad():
        plain = base(input_ids=tok, attention_mask=am).logits.numpy()
        peft_logits = PeftModel.from_pretrained(base, adapter).eval()(input_ids=tok, attention_mask=am).logits.numpy()
        m_logits = load_causal_lm(merged, dtype="fp32", device="cpu", attn="eager")(
            input_ids=tok, attention_mask=am).logits.numpy()
    assert _rel(plain, j_logits, valid) > 1e-2  # the adapter changes the output
    assert _rel(peft_logits, j_logits, valid) < 1e-4
    assert _rel(m_logits, j_logits, valid) < 1e-4
