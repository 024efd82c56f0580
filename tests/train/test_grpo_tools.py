"""GRPO with tools: tool-written tokens are observations, not actions.

- the reference objective: a tool token's log-probabilities (policy, old, reference) change
  neither the loss nor the gradient;
- each engine's update on GRPO's own batches (torch: one row per sample and shared-prompt
  rows; JAX: one row per sample): changing a tool-written token changes neither the loss
  nor the gradient, while without the tool mask the same change moves the gradient;
- `arith` ignores a claim whose result a tool wrote; `tool_error` counts failed calls;
- a completion's ToolUse locates the tool-written text from its tool_mask;
- `tunix-rt train --config smoke tools=[calculator] method=grpo` completes on both engines;
- SFT on gsm8k-python (`data import gsm8k --tools python`) with `tools=[python]`, then GRPO
  from it with the python tool, complete on the torch engine (every call in the sandbox).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tunix_rt.eval.generate import Generation
from tunix_rt.traces.schema import Trace
from tunix_rt.train.data import IGNORE
from tunix_rt.train.grpo import GRPO, Group
from tunix_rt.train.metrics import read_jsonl
from tunix_rt.train.rewards import NO_TOOLS, RewardSet, ToolUse, tool_use
from tunix_rt.train.rl_objective import policy_loss
from train_testlib import one_torch_thread, rl_cfg  # noqa: E402,F401 (autouse fixture)


def test_reference_objective_ignores_tool_written_tokens():
    rng = np.random.default_rng(0)
    shape = (3, 7)
    lp, old, ref = (rng.normal(-2.0, 0.5, shape) for _ in range(3))
    adv, coef = rng.normal(size=shape), rng.uniform(0.1, 1.0, shape)
    tool = (rng.uniform(size=shape) < 0.4).astype(float)
    kw = dict(eps_low=0.2, eps_high=0.28, beta=0.1)
    base = policy_loss(lp, old, ref, adv, coef, tool_mask=tool, **kw)
    moved = [lp + 3.0 * tool, old - 1.0 * tool, ref + 2.0 * tool]  # only at the tool tokens
    after = policy_loss(*moved, adv, coef, tool_mask=tool, **kw)
    assert after.loss == pytest.approx(base.loss, abs=1e-12)
    np.testing.assert_allclose(after.dloss_dlogp, base.dloss_dlogp, atol=1e-12)
    assert (base.dloss_dlogp[tool == 1] == 0).all()
    assert base.stats == pytest.approx(after.stats) and base.stats["n_tokens"] == (tool == 0).sum()
    unmasked = policy_loss(*moved, adv, coef, **kw)  # without the mask the same change shows
    assert unmasked.loss != pytest.approx(policy_loss(lp, old, ref, adv, coef, **kw).loss)


def _setup(home, tmp_path, engine="torch", **over):
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.engines import engine_class

    cfg = rl_cfg(tmp_path, engine=engine, lora_dropout=0.0, batch_size=4, beta=0.5, **over)
    tok = load_tokenizer(cfg.model, home)
    engine, method = engine_class(engine)(cfg), GRPO(cfg, home, tok)
    engine.devices()
    engine.setup(ensure_model(cfg.model, home), tok)
    return cfg, tok, engine, method


def _groups(method, tok, last_tool_id: int, masked: bool) -> list[Group]:
    """Two prompts x 2 completions; the first completion of each closes a calculator call
    and ends (truncated) inside the tool's result, so its last ids are tool-written: they
    are the targets of the last positions only and feed no later position."""
    call, result = tok.encode("so <<3*4="), tok.encode("12>>")
    groups = []
    for g, (record, prompt) in enumerate(method.items[:2]):
        tooled = call + result[:-1] + [last_tool_id]
        mask = [0] * len(call) + [int(masked)] * len(result)
        plain = tok.encode(f"plain answer {g}") + [tok.eot_id]
        outs = [Generation(tooled, tok.decode(tooled), len(tooled), "length", mask,
                           [{"tool": "calculator", "call": "3*4", "result": "12>>", "error": False}]),
                Generation(plain, tok.decode(plain[:-1]), len(plain), "stop", [0] * len(plain), [])]
        groups.append(Group(record, prompt, outs, np.array([1.0, 0.0]), {}, np.zeros(2, bool), np.zeros(2, bool)))
    return groups


def _loss_and_grads(engine, method, groups, shared: bool):
    batches = method.update_batches(groups, shared=shared)
    for b in batches:
        b.aux["ref_logp"] = engine.token_logprobs(b, adapter=False)
        b.aux["old_logp"] = np.zeros(b.labels.shape, np.float32)
    if engine.name == "jax":
        from tunix_rt.train.jax_engine import flat

        loss, _, grads = engine.gradients(batches, method.objective)
        return loss, {n: torch.from_numpy(np.array(g, np.float32)) for n, g in flat(grads).items()}
    for p in engine.trainable.values():
        p.grad = None
    loss = 0.0
    for b in batches:
        part, _ = engine.objective_sum(b, method.objective)
        part.backward()
        loss += float(part.detach())
    return loss, {n: p.grad.clone() for n, p in engine.trainable.items()}


@pytest.mark.parametrize("kind,shared", [("torch", False), ("torch", True), pytest.param("jax", False, marks=pytest.mark.jax)],
                         ids=["torch-row-per-sample", "torch-shared-prompt", "jax-row-per-sample"])
def test_the_update_ignores_tool_written_tokens(home, tmp_path, kind, shared):
    if kind == "jax":
        from requires import require_module

        require_module("jax")
    cfg, tok, engine, method = _setup(home, tmp_path, kind, max_seq_len=128)
    twelve = tok.encode("12>>")
    a, b = twelve[-1], tok.encode(" apples")[-1]
    assert a != b
    ref = _loss_and_grads(engine, method, _groups(method, tok, a, True), shared)
    same = _loss_and_grads(engine, method, _groups(method, tok, b, True), shared)
    assert same[0] == pytest.approx(ref[0], abs=1e-7)
    for name, g in ref[1].items():
        torch.testing.assert_close(same[1][name], g, atol=1e-7, rtol=0, msg=name)
    # the test can fail: unmasked, the same change of the last token moves the gradient (the
    # loss value of an on-policy step does not depend on log-probs: its ratio is 1)
    open_ = [_loss_and_grads(engine, method, _groups(method, tok, t, False), shared) for t in (a, b)]
    assert any((open_[0][1][n] - g).abs().max() > 1e-5 for n, g in open_[1][1].items())
    # and the batch says why: no label and no coefficient at a tool-written target
    batch = method.update_batches(_groups(method, tok, a, True), shared=shared)[0]
    n_tool = 2 * len(twelve)
    assert int((batch.labels != IGNORE).sum()) == batch.n_supervised
    unmasked = method.update_batches(_groups(method, tok, a, False), shared=shared)[0]
    assert unmasked.n_supervised - batch.n_supervised == n_tool
    assert ((batch.coef != 0) == (batch.labels != IGNORE)).all()


def test_grpo_metrics_count_tool_calls_errors_and_tokens(tiny_tok):
    from tunix_rt.train.grpo import tool_metrics

    call, result = tiny_tok.encode("<<1/0="), tiny_tok.encode("error>>")
    calls = [{"tool": "calculator", "call": "1/0", "result": "error>>", "error": True},
             {"tool": "calculator", "call": "2+2", "result": "4>>", "error": False}]
    outs = [Generation(call + result, "", len(call + result), "length", [0] * len(call) + [1] * len(result), calls),
            Generation(call, "", len(call), "length", [0] * len(call), [])]
    assert tool_metrics(outs) == {"tool_calls": 2, "tool_errors": 1, "tool_tokens": len(result)}


def trace(answer: str = "12") -> Trace:
    return Trace(id="t1", question="q?", steps=["s"], answer=answer)


def test_arith_counts_only_the_claims_the_model_wrote():
    text = "<reasoning>\nHe has <<3*4=13>>13 apples, and 13 + 1 = 14.\n</reasoning>\n<answer>14</answer>"
    result = text.index("13>>")
    tools = ToolUse(spans=((result, result + len("13>>")),), calls=1)
    arith = RewardSet.from_config({"arith": 1.0})
    # the tool wrote 13: the call's claim 3*4=13 is not the model's, 13 + 1 = 14 is (and holds)
    assert arith.score([trace()], [text], [tools])[0][0] == 1.0
    assert arith.score([trace()], [text])[0][0] == 0.5  # without tools the model wrote 3*4=13: false
    bad = text.replace("13 + 1 = 14", "13 + 1 = 15")
    assert arith.score([trace()], [bad], [tools])[0][0] == 0.0


@pytest.mark.parametrize("mode,expected", [("count", [-2.0, 0.0, 0.0]), ("any", [-1.0, 0.0, 0.0])])
def test_tool_error_reward(mode, expected):
    rs = RewardSet.from_config({"tool_error": {"weight": 1.0, "mode": mode}, "format": 0.0})
    uses = [ToolUse(calls=3, errors=2), ToolUse(calls=1, errors=0), NO_TOOLS]
    total, parts = rs.score([trace()] * 3, ["a", "b", "c"], uses)
    assert list(parts["tool_error"]) == expected and list(total) == expected
    assert list(rs.score([trace()], ["a"])[1]["tool_error"]) == [0.0]  # no tool record: no error


def test_tool_error_mode_is_checked():
    from tunix_rt.errors import BadInput

    with pytest.raises(BadInput, match="reward 'tool_error': mode must be one of count|any"):
        RewardSet.from_config({"tool_error": {"weight": 1.0, "mode": "sum"}})


def test_tool_use_locates_the_tool_written_text(tiny_tok):
    tok = tiny_tok
    pieces = [("Half of 48 is <<48/2=", 0), ("24>>", 1), ("24, and <<24*3=", 0), ("72>>", 1), ("72.", 0)]
    ids, mask = [], []
    for text, written in pieces:
        part = tok.encode(text)
        ids += part
        mask += [written] * len(part)
    ids.append(tok.eot_id)
    mask.append(0)
    calls = [{"tool": "calculator", "call": "48/2", "result": "24>>", "error": False},
             {"tool": "calculator", "call": "24*3", "result": "72>>", "error": True}]
    gen = Generation(ids, tok.decode(ids[:-1]), len(ids), "stop", mask, calls)
    use = tool_use(gen, tok)
    assert [gen.text[a:b] for a, b in use.spans] == ["24>>", "72>>"]
    assert (use.calls, use.errors) == (2, 1)
    assert tool_use(Generation(ids, gen.text, len(ids), "stop", [0] * len(ids), []), tok) is NO_TOOLS


@pytest.mark.parametrize("engine", ["torch", pytest.param("jax", marks=pytest.mark.jax)])
def test_smoke_grpo_with_the_calculator_completes(home, engine):
    from typer.testing import CliRunner

    from tunix_rt.cli import app

    if engine == "jax":
        from requires import require_module

        require_module("jax")
    args = ["train", "--config", "smoke", "--device", "cpu", "--engine", engine, "tools=[calculator]",
            "method=grpo", "max_steps=2", "limit=4", "rl_prompts=2", "group_size=2", "batch_size=4",
            "rollout_max_new_tokens=4", "eval_limit=4", "eval_interval=2", "save_interval=2",
            "rewards={format: 0.5, answer: 1.0, tool_error: 0.1, arith: 0.2}"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    run = next(home.runs.iterdir())
    manifest = json.loads((run / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["engine"] == engine
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("tool_calls", "tool_errors", "tool_tokens", "reward_tool_error", "reward_arith"):
        assert all(key in r for r in rows), key
    assert "calculator" in (run / "config.yaml").read_text()


def test_sft_then_grpo_with_the_python_tool_complete(home):
    """The vendored split's notes as python calls (gsm8k-python, imported on first use): the SFT
    run renders each call in the sandbox (so the tool-written pieces are what it prints, loss
    mask 0), then GRPO from that run samples with the python tool."""
    from requires import require_bwrap
    from typer.testing import CliRunner

    from tunix_rt.cli import app

    require_bwrap()
    common = ["--config", "smoke", "--device", "cpu", "--engine", "torch", "tools=[python]", "max_steps=2",
              "eval_limit=2", "save_interval=2"]
    result = CliRunner().invoke(app, ["train", *common, "dataset=gsm8k-python", "limit=4", "batch_size=2"])
    assert result.exit_code == 0, result.output
    (sft,) = list(home.runs.iterdir())
    manifest = json.loads((sft / "run_manifest.json").read_text())
    assert manifest["status"] == "succeeded" and manifest["config"]["tools"] == ["python"]
    result = CliRunner().invoke(app, ["train", *common, "dataset=gsm8k-python", f"init={sft.name}", "method=grpo",
                                      "limit=4", "rl_prompts=2", "group_size=2", "batch_size=4",
                                      "rollout_max_new_tokens=8", "rewards={format: 0.5, answer: 1.0, tool_error: 0.1}"])
    assert result.exit_code == 0, result.output
    (rl,) = [r for r in home.runs.iterdir() if r != sft]
    assert json.loads((rl / "run_manifest.json").read_text())["status"] == "succeeded"
    rows = [r for r in read_jsonl(rl / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2] and all("tool_calls" in r for r in rows)
