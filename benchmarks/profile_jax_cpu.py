"""Where the JAX engine's CPU step loses to the PyTorch engine's: one step of each, op by op.

    flock /tmp/bench.lock env TUNIX_RT_HOME=.cache/test-home .venv/bin/python \
        benchmarks/profile_jax_cpu.py [--model gemma3-270m] [--warmup 1] [--steps 2] [--remat] \
        [--sides jax,torch] [--top 15]

The config and batches are bench_jax_loss's (`--sides ours,torch` there): Gemma 3 270M, LoRA
r16 alpha 32 on all projections, batch 4 (GSM8K rendered by tunix_rt.render), fp32, AdamW 2e-4,
the same batches in the same order on both sides. Each side runs in its own process through
the bench's own worker (bench_jax_loss.worker for JAX, bench_torch_vs_trl.worker_ours for
torch), so the engine, its config and its batches are exactly the bench's; this script only
wraps the engine class's `train_step` in that process to time every call and to profile the
last one: --warmup calls compile/warm up, the calls between are timed unprofiled (step_s),
the last is profiled.

- JAX: `jax.profiler` traces the step; XLA:CPU's thunk executor records one event per
  executed HLO op (fusion, dot, copy, custom call, while...) with its `hlo_op` and
  `hlo_module`, and an `end: <op>` event where an async op (a dot on Eigen's pool) completes.
  The optimized HLO (dumped with --xla_dump_to; the worker turns the persistent compilation
  cache off, since XLA dumps only what it compiles) gives each op's opcode, shapes, the opcodes
  fused inside it and its JAX metadata (`transpose(jvp(...))` marks the backward pass). The
  timeline is swept so that overlapping ops share the wall time they overlap in, and a
  control-flow op (while, call, conditional) gets only the time when none of its ops runs:
  the attributed seconds add up to at most the step's wall time.
- torch: `torch.profiler` over the step; each aten op's self CPU time, its phase from its
  ancestors (inside `autograd::engine::evaluate_function` = backward, inside `Optimizer.step`
  = optimizer).

Both are grouped into the same classes (dot/matmul, elementwise, reduction, transpose/copy,
scatter/gather, rng/other); "unattributed" is the profiled wall time no op covers (Python,
dispatch, waiting). Last line: `RESULT jax_step_s=… torch_step_s=… jax_dot_s=… torch_mm_s=…
… gap_<class>_s=…` (JAX minus torch seconds per class, in the profiled step).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

CLASSES = ("dot", "elementwise", "reduce", "copy", "gather", "other")
"""The op classes of the tables, in order; RESULT names torch's dot class `mm`."""
CLASS_TITLES = {"dot": "dot/matmul/conv", "elementwise": "elementwise", "reduce": "reductions",
                "copy": "transposes/copies", "gather": "scatter/gather/dyn-slice", "other": "rng/other"}

_DOT = {"dot", "convolution"}
_GATHER = {"scatter", "gather", "dynamic-slice", "dynamic-update-slice", "select-and-scatter"}
_REDUCE = {"reduce", "reduce-window"}
_LAYOUT = {"copy", "transpose", "bitcast", "reshape", "broadcast", "slice", "concatenate", "pad", "reverse",
           "parameter", "constant", "tuple", "get-tuple-element", "copy-start", "copy-done", "bitcast-convert"}
_OTHER = {"rng", "rng-bit-generator", "rng-get-and-update-state", "custom-call", "sort", "infeed", "outfeed",
          "after-all", "partition-id", "replica-id", "all-reduce", "all-gather", "optimization-barrier"}
PHASE_KEYS = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}
CONTROL = {"while", "conditional", "call"}
"""Ops whose event spans the ops they run: they get only the time when none of those runs."""


# --------------------------------------------------------------------------- HLO text

@dataclass
class HloOp:
    name: str
    opcode: str
    shape: str
    operands: list[str] = field(default_factory=list)  # operand shapes, in order
    fused: set[str] = field(default_factory=set)  # opcodes inside a fusion (nested calls included)
    meta: str = ""  # JAX's op_name metadata
    fusion_kind: str = ""  # kLoop, kInput, kOutput, kCustom (+ the backend's kind, e.g. __ynn_fusion)


_SHAPE = re.compile(r"\b(?:pred|[sfu]\d+|bf16|c64|c128|token)\[[\d,]*\]")
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


def _split_shape(rest: str) -> tuple[str, str]:
    """`f32[4,8]{1,0} dot(...)` or `(f32[2], s32[]) while(...)` -> (shape, the rest)."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                return rest[:i + 1], rest[i + 1:].lstrip()
    shape, _, tail = rest.partition(" ")
    return shape, tail


def _strip_layout(shape: str) -> str:
    return re.sub(r"\{[^{}]*\}", "", shape)


def parse_hlo(text: str) -> dict[str, HloOp]:
    """Every instruction of an optimized HLO module's text (all computations), by name, with
    its opcode, result and operand shapes, metadata and, for a fusion or call, the opcodes of
    the computations it calls (transitively)."""
    ops: dict[str, HloOp] = {}
    comp_ops: dict[str, set[str]] = defaultdict(set)
    calls: dict[str, list[str]] = {}  # instruction -> computations it calls
    comp_calls: dict[str, list[str]] = defaultdict(list)
    comp = None
    for line in text.splitlines():
        if comp is None:
            m = _COMP.match(line)
            if m and not line.startswith("HloModule"):
                comp = m.group(2)
            continue
        if line.strip() == "}":
            comp = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        name, rest = m.groups()
        shape, tail = _split_shape(rest)
        opcode, _, args = tail.partition("(")
        depth, i = 1, 0
        while i < len(args) and depth:
            depth += {"(": 1, ")": -1}.get(args[i], 0)
            i += 1
        operand_text, attrs = args[:i - 1], args[i:]
        meta = re.search(r'op_name="([^"]*)"', attrs)
        kind = re.search(r"kind=(\w+)", attrs)
        backend_kind = re.search(r'"fusion_config":\{"kind":"([^"]+)"', attrs)
        custom = re.search(r'custom_call_target="([^"]+)"', attrs)
        shapes = _SHAPE.findall(operand_text)  # older printers write operand shapes inline
        if not shapes:  # newer ones only the names: resolved below
            shapes = ["%" + x for x in re.findall(r"%([\w.\-]+)", operand_text)]
        op = HloOp(name, opcode.strip(), _strip_layout(shape), shapes,
                   meta=meta.group(1) if meta else "",
                   fusion_kind=" ".join(x.group(1) for x in (kind, backend_kind) if x))
        if custom:
            op.fusion_kind = custom.group(1)
        called = re.findall(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-]+)", attrs)
        called += re.findall(r"branch_computations=\{([^}]*)\}", attrs)
        calls[name] = [c.strip().lstrip("%") for x in called for c in x.split(",")]
        comp_calls[comp] += calls[name]
        comp_ops[comp].add(op.opcode)
        ops[name] = op

    def opcodes(c: str, seen: frozenset = frozenset()) -> set[str]:
        out = set(comp_ops.get(c, ()))
        for sub in comp_calls.get(c, ()):
            if sub not in seen:
                out |= opcodes(sub, seen | {c})
        return out

    for name, op in ops.items():
        op.operands = [ops[x[1:]].shape if x.startswith("%") and x[1:] in ops else x for x in op.operands]
        if op.opcode == "fusion":
            op.fused = set().union(*(opcodes(c) for c in calls[name])) - {"parameter"} if calls[name] else set()
    return ops


def op_class(op: HloOp | None) -> str:
    """The class of one executed HLO op (None: an op the HLO text does not name)."""
    if op is None:
        return "other"
    inside = op.fused if op.opcode == "fusion" else {op.opcode}
    if inside & _DOT or (op.opcode == "custom-call" and re.search(r"matmul|onednn|dot|gemm", op.fusion_kind, re.I)):
        return "dot"
    if inside & _GATHER:
        return "gather"
    if inside & _REDUCE:
        return "reduce"
    if op.opcode in CONTROL or inside & _OTHER:
        return "other"
    if inside <= _LAYOUT:
        return "copy"
    return "elementwise"


def phase_of(meta: str, module: str) -> str:
    """forward, backward (JAX's transpose of a jvp) or optimizer (the update module)."""
    if "update" in module:
        return "optimizer"
    return "backward" if "transpose(" in meta else "forward"


def describe(op: HloOp | None) -> str:
    """One line: opcode (kind), result shape <- operand shapes, the fused opcodes that matter."""
    if op is None:
        return "(not in the HLO)"
    what = op.opcode + (f" {op.fusion_kind}" if op.fusion_kind else "")
    inside = ""
    if op.fused:
        key = sorted(op.fused - _LAYOUT - {"parameter", "constant"}) or sorted(op.fused)
        inside = " {" + ",".join(key[:8]) + (",…" if len(key) > 8 else "") + "}"
    return f"{what}{inside} {op.shape} <- {', '.join(op.operands[:4])}"


# --------------------------------------------------------------------------- the JAX trace

@dataclass(frozen=True)
class Span:
    """One execution of one HLO op: from its thunk's start to its end (for an async op, the
    `end:` event where it completes)."""
    start_ns: float
    end_ns: float
    module: str  # "<program_id>:<module name>"
    op: str


def thunk_spans(events) -> list[Span]:
    """Spans from (name, start_ns, duration_ns, stats dict) events of every thread: a thunk
    event carries `hlo_op`, `hlo_module`, `program_id` and a flow id `_p`; its `end: <op>`
    event, possibly on another thread, carries the same id as `_c`."""
    ends = {}
    starts = []
    for name, start, dur, stats in events:
        if "hlo_op" in stats:
            starts.append((name, start, dur, stats))
        elif name.startswith("end: ") and "_c" in stats:
            ends[stats["_c"]] = start + dur
    out = []
    for name, start, dur, stats in starts:
        end = max(start + dur, ends.get(stats.get("_p"), 0.0))
        out.append(Span(start, end, f"{stats.get('program_id', '?')}:{stats['hlo_module']}", stats["hlo_op"]))
    return out


def attribute(spans: list[Span], control: set[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """Seconds per (module, op): every instant of the timeline is split equally among the ops
    running then, a control-flow op (in `control`) counting only when no other op runs."""
    marks = sorted({t for s in spans for t in (s.start_ns, s.end_ns)})
    active_at = defaultdict(list)
    for s in spans:
        active_at[s.start_ns].append(("+", s))
        active_at[s.end_ns].append(("-", s))
    active: dict[Span, int] = defaultdict(int)
    out: dict[tuple[str, str], float] = defaultdict(float)
    for a, b in zip(marks, marks[1:]):
        for sign, s in active_at[a]:
            active[s] += 1 if sign == "+" else -1
            if not active[s]:
                del active[s]
        running = [s for s in active if (s.module, s.op) not in control]
        share = running or [s for s in active]
        for s in share:
            out[(s.module, s.op)] += (b - a) / 1e9 / len(share)
    return dict(out)


def events_of(xplane_path: str):
    from jax.profiler import ProfileData

    prof = ProfileData.from_file(xplane_path)
    for plane in prof.planes:
        for line in plane.lines:
            for ev in line.events:
                yield ev.name, float(ev.start_ns), float(ev.duration_ns), dict(ev.stats)


def load_modules(dump_dir: str) -> dict[str, dict[str, HloOp]]:
    """The optimized HLO of every module XLA dumped, by "<program_id>:<name>"."""
    mods = {}
    for path in glob.glob(os.path.join(dump_dir, "module_*.cpu_after_optimizations.txt")):
        m = re.match(r"module_(\d+)\.(.+)\.cpu_after_optimizations\.txt$", os.path.basename(path))
        if m:
            mods[f"{int(m.group(1))}:{m.group(2)}"] = parse_hlo(Path(path).read_text())
    return mods


def summarize_jax(spans: list[Span], modules: dict[str, dict[str, HloOp]], wall_s: float, top: int) -> dict:
    """Seconds per class and per phase, and the `top` ops, of one profiled JAX step."""
    lookup = lambda s: modules.get(s.module, {}).get(s.op)  # noqa: E731
    control = {(s.module, s.op) for s in spans if (lookup(s) and lookup(s).opcode in CONTROL)}
    secs = attribute(spans, control)
    counts = defaultdict(int)
    for s in spans:
        counts[(s.module, s.op)] += 1
    classes, phases = dict.fromkeys(CLASSES, 0.0), defaultdict(float)
    rows = []
    for (mod, name), t in secs.items():
        op = modules.get(mod, {}).get(name)
        cls = op_class(op)
        classes[cls] += t
        phases[phase_of(op.meta if op else "", mod)] += t
        rows.append({"op": name, "module": mod.split(":", 1)[1], "class": cls, "s": t, "count": counts[(mod, name)],
                     "phase": phase_of(op.meta if op else "", mod), "hlo": describe(op)})
    rows.sort(key=lambda r: -r["s"])
    return {"wall_s": wall_s, "classes": classes, "phases": dict(phases), "top": rows[:top],
            "n_ops": len(spans), "span_sum_s": sum(s.end_ns - s.start_ns for s in spans) / 1e9}


# --------------------------------------------------------------------------- torch

_T_DOT = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "einsum", "convolution", "_convolution",
          "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
          "scaled_dot_product_attention", "_scaled_dot_product_attention_math", "addmv", "mv", "dot"}
_T_GATHER = {"embedding", "embedding_backward", "embedding_dense_backward", "index", "index_select", "gather",
             "scatter", "scatter_", "scatter_add", "scatter_add_", "index_put_", "_index_put_impl_", "index_add_",
             "index_add", "take_along_dim", "masked_select", "index_copy_", "nonzero", "masked_scatter_"}
_T_REDUCE = {"sum", "mean", "amax", "amin", "max", "min", "logsumexp", "norm", "linalg_vector_norm", "_foreach_norm",
             "var", "std", "var_mean", "_softmax", "_log_softmax", "softmax", "log_softmax", "_softmax_backward_data",
             "_log_softmax_backward_data", "argmax", "cumsum", "prod", "all", "any", "count_nonzero", "nll_loss",
             "nll_loss_forward", "nll_loss_backward", "cross_entropy_loss", "topk", "sort"}
_T_COPY = {"copy_", "clone", "contiguous", "transpose", "t", "permute", "_to_copy", "to", "view", "reshape",
           "_reshape_alias", "expand", "as_strided", "cat", "stack", "slice", "select", "narrow", "split", "chunk",
           "unsqueeze", "squeeze", "flatten", "repeat", "_unsafe_view", "unbind", "detach", "alias", "view_as",
           "expand_as", "split_with_sizes", "transpose_", "t_", "slice_backward", "select_backward", "unfold",
           "repeat_interleave", "_reshape_copy", "lift_fresh", "flip", "roll", "movedim", "unflatten"}
_T_OTHER = {"empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
            "resize_", "new_empty", "new_zeros", "new_empty_strided", "arange", "rand", "randn", "bernoulli_",
            "dropout", "native_dropout", "item", "_local_scalar_dense", "is_nonzero", "set_", "result_type"}


def torch_op_class(name: str) -> str:
    """The class of one torch profiler event by its name (`aten::mm` -> dot; oneDNN's products,
    `mkldnn::_linear_pointwise[.binary]`, which train.cpu_matmul routes the fp32 CPU step's
    products through, -> dot; not an aten op, e.g. an autograd node's own bookkeeping, -> other)."""
    if name.startswith("mkldnn::_linear_pointwise"):
        return "dot"
    if not name.startswith("aten::"):
        return "other"
    op = name[6:]
    for cls, names in (("dot", _T_DOT), ("gather", _T_GATHER), ("reduce", _T_REDUCE), ("copy", _T_COPY),
                       ("other", _T_OTHER)):
        if op in names:
            return cls
    if op.startswith("_foreach_norm"):
        return "reduce"
    return "elementwise"  # add, mul, rsqrt, tanh, gelu, where, _foreach_* of the optimizer, ...


def torch_phase(ev) -> str:
    p = ev
    while p is not None:
        if p.name.startswith("Optimizer.step") or p.name.startswith("Optimizer.zero_grad"):
            return "optimizer"
        if p.name.startswith("autograd::engine::evaluate_function"):
            return "backward"
        p = p.cpu_parent
    return "forward"


def summarize_torch(events, wall_s: float, top: int) -> dict:
    """Seconds per class and phase (self CPU time of each op) and the top op names."""
    classes, phases, by_name, counts = dict.fromkeys(CLASSES, 0.0), defaultdict(float), defaultdict(float), \
        defaultdict(int)
    for ev in events:
        t = ev.self_cpu_time_total / 1e6
        if t <= 0:
            continue
        classes[torch_op_class(ev.name)] += t
        phases[torch_phase(ev)] += t
        by_name[ev.name] += t
        counts[ev.name] += 1
    rows = [{"op": k, "class": torch_op_class(k), "s": v, "count": counts[k]}
            for k, v in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]]
    return {"wall_s": wall_s, "classes": classes, "phases": dict(phases), "top": rows}


# --------------------------------------------------------------------------- workers

def instrument(cls, n_calls: int, profile, record: dict) -> None:
    """Wrap cls.train_step: time every call; run the last one (of n_calls) inside `profile()`
    (a context manager), its wall time kept apart."""
    orig = cls.train_step

    def train_step(self, *a, **k):
        last = len(record["walls"]) + 1 == n_calls
        ctx = profile() if last else _Null()
        with ctx:
            t0, c0 = time.perf_counter(), time.process_time()
            out = orig(self, *a, **k)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
        record["walls"].append(dt)
        record["cpu"].append(dc)
        record["load"].append(os.getloadavg()[0])
        return out

    cls.train_step = train_step


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def jax_worker(args, data: dict) -> dict:
    dump = tempfile.mkdtemp(prefix="xla-dump-")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_dump_to={dump} --xla_dump_hlo_as_text").strip()
    # XLA dumps a program's optimized HLO only when it compiles it: one read from the persistent
    # compilation cache left no dump, and every op of the step in "rng/other"
    os.environ["TUNIX_RT_JAX_CACHE"] = "off"
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
    import jax
    from bench_jax_loss import worker as bench_worker  # benchmarks/ is sys.path[0]

    from tunix_rt.train.jax_engine import JaxEngine

    trace = tempfile.mkdtemp(prefix="jax-trace-")

    class Profile:
        def __enter__(self):
            jax.profiler.start_trace(trace)

        def __exit__(self, *exc):
            jax.profiler.stop_trace()
            return False

    record = {"walls": [], "cpu": [], "load": []}
    instrument(JaxEngine, len(data["steps"]), Profile, record)
    bench_worker(argparse.Namespace(data=args.data, worker="ours", seq=args.seq, chunk_bytes=args.chunk_bytes,
                                    remat=args.remat, warmup=args.warmup, pad=args.pad))
    xplane = glob.glob(os.path.join(trace, "**", "*.xplane.pb"), recursive=True)[0]
    spans = thunk_spans(events_of(xplane))
    out = summarize_jax(spans, load_modules(dump), record["walls"][-1], args.top)
    out.update(step_walls=record["walls"], step_cpu=record["cpu"], load=record["load"],
               tokens=f"{len(data['steps'][-1])}x{args.seq}", xla_flags=args.xla_flags)
    return out


def torch_worker(args, data: dict) -> dict:
    import torch
    from bench_torch_vs_trl import worker_ours  # benchmarks/ is sys.path[0]

    from tunix_rt.train.torch_engine import TorchEngine

    holder = {}

    class Profile:
        def __enter__(self):
            self.p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.p.__enter__()

        def __exit__(self, *exc):
            self.p.__exit__(*exc)
            holder["events"] = self.p.events()
            return False

    record = {"walls": [], "cpu": [], "load": []}
    instrument(TorchEngine, len(data["steps"]), Profile, record)
    worker_ours(data, argparse.Namespace(warmup=args.warmup, ours_gc=args.remat))
    out = summarize_torch(holder["events"], record["walls"][-1], args.top)
    width = max(len(e["ids"]) for e in data["steps"][-1])
    out.update(step_walls=record["walls"], step_cpu=record["cpu"], load=record["load"],
               tokens=f"{len(data['steps'][-1])}x{width}",
               threads=torch.get_num_threads())
    return out


def worker(args) -> None:
    data = json.loads(Path(args.data).read_text())
    out = (jax_worker if args.worker == "jax" else torch_worker)(args, data)
    Path(args.out).write_text(json.dumps(out))


# --------------------------------------------------------------------------- parent

def step_s(res: dict, warmup: int) -> float:
    """Median wall time of the unprofiled, measured steps (the profiled one if none)."""
    timed = res["step_walls"][warmup:-1]
    return statistics.median(timed) if timed else res["step_walls"][-1]


def print_report(res: dict, warmup: int) -> list[str]:
    """The class table (seconds and share of the profiled step), the phases, the top ops;
    returns the RESULT fields."""
    sides = list(res)
    print(f"\n{'class':26s}" + "".join(f"{s + ' s':>10s}{'share':>7s}" for s in sides)
          + ("   jax-torch s" if len(sides) == 2 else ""))
    for cls in CLASSES:
        row = "".join(f"{res[s]['classes'][cls]:10.3f}{res[s]['classes'][cls] / res[s]['wall_s']:7.1%}" for s in sides)
        gap = f"{res['jax']['classes'][cls] - res['torch']['classes'][cls]:+14.3f}" if len(sides) == 2 else ""
        print(f"{CLASS_TITLES[cls]:26s}{row}{gap}")
    un = {s: res[s]["wall_s"] - sum(res[s]["classes"].values()) for s in sides}
    print(f"{'unattributed (host, idle)':26s}" + "".join(f"{un[s]:10.3f}{un[s] / res[s]['wall_s']:7.1%}" for s in sides))
    print(f"{'profiled step wall':26s}" + "".join(f"{res[s]['wall_s']:10.3f}{'':7s}" for s in sides))
    print(f"{'unprofiled step (median)':26s}" + "".join(f"{step_s(res[s], warmup):10.3f}{'':7s}" for s in sides))
    print(f"{'profiled step CPU-s':26s}" + "".join(f"{res[s]['step_cpu'][-1]:10.3f}{'':7s}" for s in sides))
    print(f"{'load avg after each step':26s}" + "".join(f"{'/'.join(f'{x:.1f}' for x in res[s]['load']):>17s}"
                                                       for s in sides))
    for s in sides:
        ph = ", ".join(f"{k} {v:.3f} s" for k, v in sorted(res[s]["phases"].items()))
        print(f"{s} by phase: {ph}; batch {res[s]['tokens']} tokens")
    if "jax" in res:
        j = res["jax"]
        print(f"\njax: {j['n_ops']} op executions, their spans sum to {j['span_sum_s']:.3f} s "
              f"(overlap shared out above); top {len(j['top'])} ops (self seconds, executions):")
        for r in j["top"]:
            print(f"  {r['s']:7.3f} s {r['count']:5d}x {r['class']:11s} {r['phase']:9s} {r['module']}/{r['op']}: "
                  f"{r['hlo'][:150]}")
    if "torch" in res:
        print(f"\ntorch ({res['torch']['threads']} threads): top ops by self time:")
        for r in res["torch"]["top"]:
            print(f"  {r['s']:7.3f} s {r['count']:5d}x {r['class']:11s} {r['op']}")
    out = []
    for s in sides:
        out += [f"{s}_step_s={step_s(res[s], warmup):.3f}", f"{s}_prof_step_s={res[s]['wall_s']:.3f}",
                f"{s}_prof_cpu_s={res[s]['step_cpu'][-1]:.3f}"]
    for s in sides:
        for cls in CLASSES:
            key = "mm" if (s == "torch" and cls == "dot") else cls
            out.append(f"{s}_{key}_s={res[s]['classes'][cls]:.3f}")
        for ph in ("forward", "backward", "optimizer"):
            out.append(f"{s}_{PHASE_KEYS[ph]}_s={res[s]['phases'].get(ph, 0.0):.3f}")
        out.append(f"{s}_unattributed_s={un[s]:.3f}")
    if len(sides) == 2:
        gaps = {c: res["jax"]["classes"][c] - res["torch"]["classes"][c] for c in CLASSES}
        gaps["unattributed"] = un["jax"] - un["torch"]
        total = res["jax"]["wall_s"] - res["torch"]["wall_s"]
        worst = max(gaps, key=lambda c: gaps[c] if total >= 0 else -gaps[c])
        print(f"\nthe gap: jax - torch = {total:+.3f} s in the profiled step; "
              f"{'jax loses most' if total >= 0 else 'jax gains most'} in {worst} ({gaps[worst]:+.3f} s)")
        out += [f"gap_{c}_s={v:.3f}" for c, v in gaps.items()]
        out.append(f"jax_vs_torch_step={step_s(res['jax'], warmup) / step_s(res['torch'], warmup):.3f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", help="TUNIX_RT_HOME holding (or to receive) the model")
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2, help="steps after warm-up; the last is profiled")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--chunk-bytes", type=int, default=None, help="our loss's chunk (default: the config's)")
    ap.add_argument("--remat", action="store_true", help="gradient checkpointing on both sides (as bench_jax_loss)")
    ap.add_argument("--pad", choices=("seq", "longest"), default="seq",
                    help="the JAX side's batches: padded to --seq, or to the longest row (bucketed by the engine), "
                         "as bench_jax_loss --pad")
    ap.add_argument("--sides", default="jax,torch")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--xla-flags", default="", help="added to XLA_FLAGS of the JAX side")
    ap.add_argument("--worker", choices=("jax", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.chunk_bytes is None:
        from tunix_rt.train.chunking import DEFAULT_CHUNK_BYTES

        args.chunk_bytes = DEFAULT_CHUNK_BYTES
    if args.worker:
        if args.worker == "jax" and args.xla_flags:
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + args.xla_flags).strip()
        return worker(args)
    if args.home:
        os.environ["TUNIX_RT_HOME"] = os.path.abspath(args.home)
    from bench_jax_loss import prepare  # benchmarks/ is sys.path[0]
    from sides import run_worker

    data = prepare(args)
    res = {}
    for side in [x for x in args.sides.split(",") if x]:
        out = data.with_name(f"profile-{side}.json")
        flags = ["--out", str(out), "--seq", str(args.seq), "--chunk-bytes", str(args.chunk_bytes), "--warmup",
                 str(args.warmup), "--top", str(args.top), "--pad", args.pad, f"--xla-flags={args.xla_flags}"] + (["--remat"] if args.remat else [])
        run_worker(__file__, side, data, flags)
        res[side] = json.loads(out.read_text())
        print(f"{side}: step walls {', '.join(f'{w:.2f}' for w in res[side]['step_walls'])} s "
              f"(the last profiled); XLA_FLAGS={os.environ.get('XLA_FLAGS', '')} {args.xla_flags}"
              if side == "jax" else
              f"{side}: step walls {', '.join(f'{w:.2f}' for w in res[side]['step_walls'])} s (the last profiled)",
              flush=True)
    print(f"\n{args.model}, LoRA r16 on all projections, batch {args.batch} x <= {args.seq}, fp32, CPU "
          f"({os.cpu_count()} cores), AdamW 2e-4, gradient checkpointing {'on' if args.remat else 'off'}; "
          f"{args.warmup} warm-up, then timed steps, the last profiled")
    print("RESULT " + " ".join(print_report(res, args.warmup)))


if __name__ == "__main__":
    main()
