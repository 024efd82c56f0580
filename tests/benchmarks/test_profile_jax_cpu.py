"""benchmarks/profile_jax_cpu.py: the HLO parsing, the timeline attribution and the op classes
of both sides, on a hand-built module and trace, and on a real XLA:CPU trace of a small
jitted gradient."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import profile_jax_cpu as prof  # noqa: E402

HLO = """HloModule jit_grad, is_scheduled=true, entry_computation_layout={(f32[8,16]{1,0})->f32[16,16]{1,0}}

FileNames
1 "x.py"

%fused_dot (param_0: f32[8,16], param_1: f32[16,16]) -> f32[8,16] {
  %param_0 = f32[8,16]{1,0} parameter(0)
  %param_1 = f32[16,16]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,16]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_mul (param_0.1: f32[8,16]) -> f32[8,16] {
  %param_0.1 = f32[8,16]{1,0} parameter(0)
  %tanh.0 = f32[8,16]{1,0} tanh(%param_0.1)
  ROOT %mul.0 = f32[8,16]{1,0} multiply(%tanh.0, %tanh.0)
}

%add_f32 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add.9 = f32[] add(%a, %b)
}

%fused_reduce (param_0.2: f32[8,16]) -> f32[8] {
  %param_0.2 = f32[8,16]{1,0} parameter(0)
  %constant.3 = f32[] constant(0)
  ROOT %reduce.1 = f32[8]{0} reduce(%param_0.2, %constant.3), dimensions={1}, to_apply=%add_f32
}

%fused_transpose (param_0.3: f32[8,16]) -> f32[16,8] {
  %param_0.3 = f32[8,16]{1,0} parameter(0)
  ROOT %transpose.2 = f32[16,8]{0,1} transpose(%param_0.3), dimensions={1,0}
}

%fused_dus (param_0.4: f32[4,8,16], param_1.4: f32[8,16], param_2.4: s32[]) -> f32[4,8,16] {
  %param_0.4 = f32[4,8,16]{2,1,0} parameter(0)
  %param_1.4 = f32[8,16]{1,0} parameter(1)
  %bitcast.1 = f32[1,8,16]{2,1,0} bitcast(%param_1.4)
  %param_2.4 = s32[] parameter(2)
  %constant.4 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = f32[4,8,16]{2,1,0} dynamic-update-slice(%param_0.4, %bitcast.1, %param_2.4, %constant.4, %constant.4)
}

%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p = (s32[], f32[8,16]{1,0}) parameter(0)
  %gte.0 = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %w = f32[16,16]{1,0} constant({...})
  %ynn_fusion = f32[8,16]{1,0} fusion(%gte.0, %w), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(f)/jvp()/dot_general"}, backend_config={"outer_dimension_partitions":[],"fusion_config":{"kind":"__ynn_fusion"}}
  %mul_fusion = f32[8,16]{1,0} fusion(%ynn_fusion), kind=kLoop, calls=%fused_mul, metadata={op_name="jit(f)/transpose(jvp())/mul"}
  %gte.1 = s32[] get-tuple-element(%p), index=0
  ROOT %tuple.0 = (s32[], f32[8,16]{1,0}) tuple(%gte.1, %mul_fusion)
}

%cond (p.1: (s32[], f32[8,16])) -> pred[] {
  %p.1 = (s32[], f32[8,16]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main.1 (x.1: f32[8,16]) -> f32[16,8] {
  %x.1 = f32[8,16]{1,0} parameter(0), metadata={op_name="x"}
  %zero = s32[] constant(0)
  %init = (s32[], f32[8,16]{1,0}) tuple(%zero, %x.1)
  %while.3 = (s32[], f32[8,16]{1,0}) while(%init), condition=%cond, body=%body
  %gte.2 = f32[8,16]{1,0} get-tuple-element(%while.3), index=1
  %reduce_fusion = f32[8]{0} fusion(%gte.2), kind=kInput, calls=%fused_reduce, metadata={op_name="jit(f)/reduce_sum"}
  %buf = f32[4,8,16]{2,1,0} constant({...})
  %dus_fusion = f32[4,8,16]{2,1,0} fusion(%buf, %gte.2, %zero), kind=kLoop, calls=%fused_dus
  %copy.7 = f32[8,16]{0,1} copy(%gte.2)
  ROOT %transpose_fusion = f32[16,8]{0,1} fusion(%gte.2), kind=kLoop, calls=%fused_transpose
}
"""


def test_parse_hlo_reads_opcodes_shapes_fused_ops_and_metadata():
    ops = prof.parse_hlo(HLO)
    ynn = ops["ynn_fusion"]
    assert (ynn.opcode, ynn.shape, ynn.fused) == ("fusion", "f32[8,16]", {"dot"})
    assert ynn.operands == ["f32[8,16]", "f32[16,16]"]  # resolved from the operand names
    assert "__ynn_fusion" in ynn.fusion_kind and "kCustom" in ynn.fusion_kind
    assert ops["mul_fusion"].meta == "jit(f)/transpose(jvp())/mul"
    assert ops["while.3"].shape == "(s32[], f32[8,16])"
    assert "add" in ops["reduce_fusion"].fused  # through the reduction's to_apply
    assert "dynamic-update-slice" in ops["dus_fusion"].fused


@pytest.mark.parametrize(("name", "cls"), [
    ("ynn_fusion", "dot"), ("mul_fusion", "elementwise"), ("reduce_fusion", "reduce"), ("copy.7", "copy"),
    ("transpose_fusion", "copy"), ("dus_fusion", "gather"), ("while.3", "other")])
def test_op_class_of_each_kind_of_hlo_op(name, cls):
    assert prof.op_class(prof.parse_hlo(HLO)[name]) == cls


def test_an_op_missing_from_the_hlo_is_other():
    assert prof.op_class(None) == "other"


def _ev(name, start_ms, dur_ms, op=None, flow=None, end_of=None):
    stats = {}
    if op:
        stats = {"hlo_op": op, "hlo_module": "jit_grad", "program_id": 7, "_p": flow}
    if end_of is not None:
        stats = {"_c": end_of}
    return name, start_ms * 1e6, dur_ms * 1e6, stats


# A step: the while runs 0..14 ms; inside it the dot starts at 0, returns at 2 ms and completes
# (its `end:` event, on another thread) at 10 ms; the multiply fusion runs 10..12 and overlaps the
# reduce fusion (11..13.5); the while's own bookkeeping is 13.5..14; a host event carries no hlo_op.
TRACE = [
    _ev("while.3", 0, 14, "while.3", 1),
    _ev("ynn_fusion", 0, 2, "ynn_fusion", 2),
    _ev("end: ynn_fusion", 10, 0, end_of=2),
    _ev("mul_fusion", 10, 2, "mul_fusion", 3),
    _ev("reduce_fusion", 11, 2.5, "reduce_fusion", 4),
    _ev("ThunkExecutor::Execute (wait for completion)", 0, 14),
]


def test_spans_follow_an_async_op_to_its_end_event():
    spans = {s.op: s for s in prof.thunk_spans(TRACE)}
    assert set(spans) == {"while.3", "ynn_fusion", "mul_fusion", "reduce_fusion"}
    assert (spans["ynn_fusion"].start_ns, spans["ynn_fusion"].end_ns) == (0, 10e6)
    assert spans["ynn_fusion"].module == "7:jit_grad"


def test_attribution_shares_overlap_and_gives_control_flow_its_own_time_only():
    res = prof.summarize_jax(prof.thunk_spans(TRACE), {"7:jit_grad": prof.parse_hlo(HLO)}, wall_s=0.015, top=3)
    got = {k: round(v * 1e3, 6) for k, v in res["classes"].items()}
    # dot 10 ms; 11..12 shared by mul and reduce; the while only 13.5..14
    assert got == {"dot": 10.0, "elementwise": 1.5, "reduce": 2.0, "copy": 0.0, "gather": 0.0, "other": 0.5}
    assert round(res["phases"]["backward"] * 1e3, 6) == 1.5  # the multiply's transpose(jvp) metadata
    assert [r["op"] for r in res["top"]] == ["ynn_fusion", "reduce_fusion", "mul_fusion"]
    assert "f32[8,16] <- f32[8,16], f32[16,16]" in res["top"][0]["hlo"]
    assert round(res["span_sum_s"] * 1e3, 6) == 28.5


@pytest.mark.parametrize(("name", "cls"), [
    ("aten::mm", "dot"), ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "dot"),
    ("aten::_log_softmax", "reduce"), ("aten::sum", "reduce"), ("aten::copy_", "copy"), ("aten::t", "copy"),
    ("aten::embedding_dense_backward", "gather"), ("aten::index_select", "gather"), ("aten::mul", "elementwise"),
    ("aten::_foreach_addcdiv_", "elementwise"), ("aten::empty", "other"), ("mkldnn::_linear_pointwise", "dot"),
    ("mkldnn::_linear_pointwise.binary", "dot"), ("_LoraLinear", "other"),
    ("autograd::engine::evaluate_function: MmBackward0", "other")])
def test_torch_op_class(name, cls):
    assert prof.torch_op_class(name) == cls


@pytest.mark.jax
def test_a_real_xla_cpu_trace_is_attributed_to_its_hlo_ops(tmp_path):
    """The event format of the installed jaxlib: thunk events with hlo_op/hlo_module/program_id,
    matched against the optimized HLO of the same executable (its compiled text)."""
    from requires import require_module

    jax = require_module("jax")
    jnp = jax.numpy
    f = jax.jit(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)))
    w, x = jnp.ones((512, 512)), jnp.ones((256, 512))
    compiled = f.lower(w, x).compile()
    compiled(w, x).block_until_ready()
    jax.profiler.start_trace(str(tmp_path))
    compiled(w, x).block_until_ready()
    jax.profiler.stop_trace()
    spans = prof.thunk_spans(prof.events_of(str(next(tmp_path.rglob("*.xplane.pb")))))
    mine = [s for s in spans if s.module.endswith(":jit__lambda")]
    assert mine, f"no thunk event of the jitted function among {sorted({s.module for s in spans})}"
    ops = prof.parse_hlo(compiled.as_text())
    assert {s.op for s in mine} <= set(ops)
    res = prof.summarize_jax(mine, {mine[0].module: ops}, wall_s=1.0, top=5)
    assert res["classes"]["dot"] > 0 and res["classes"]["elementwise"] > 0
    assert res["phases"]["backward"] > 0 and res["phases"]["forward"] > 0
