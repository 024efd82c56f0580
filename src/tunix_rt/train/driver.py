"""The order of things, for every method and engine:

    device check → plan → data and rewards (the method) → open run → setup → restore →
    loop of method steps (eval and save at their intervals) → final eval and checkpoint →
    export → finish

Everything a user's input can get wrong (config, plan, dataset, rewards) is checked before
the run directory exists: a refused run leaves no run behind, not even a `failed` one.

A method (train.sft, train.grpo) says what one step does with the engine; an engine
(train.torch_engine, train.jax_engine) says how a step runs. Neither opens run files nor
decides when to save: that is here, once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from tunix_rt import rundir
from tunix_rt.home import Home
from tunix_rt.train import checkpoint, dist, engines
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.engine import Engine
from tunix_rt.train.faults import fault_point
from tunix_rt.train.method import Method, make_method
from tunix_rt.train.metrics import MetricsLog, OnUpdate, ignore_update, plot_loss
from tunix_rt.train.run import RunDir, RunStopped, never, open_run
from tunix_rt.train.schedule import lr_at


def train(cfg: TrainConfig, home: Home, resume: str | None = None,
          should_stop: Callable[[], bool] = never, on_update: OnUpdate = ignore_update) -> Path:
    """Train; returns the run directory. `resume` is a run id or directory; `should_stop` is
    polled after every step (the job worker's stop hook): the step just done is checkpointed
    and RunStopped raised. `on_update(run_dir)` is told after every metrics line (the
    registry's live index, passed in by the entry points that have one)."""
    from tunix_rt.files import weights_sha256
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.traces.dataset import load_dataset

    name = engines.pick(cfg.engine, cfg.device)
    dist.init(name)  # the launcher's process group (torchrun); nothing to do in one process
    cfg = dist.main_first("init model", resolve_init, cfg, home)
    engine: Engine = engines.engine_class(name)(cfg)
    facts = engine.devices()
    predicted = check_plan(cfg, name, facts)
    model_dir, dataset_sha = dist.main_first(  # imports into the home happen once, on process 0
        "model and dataset import", lambda: (ensure_model(cfg.model, home), load_dataset(cfg.dataset, home).sha256))
    identity = {"engine": name, "device_kind": facts["platform"], "model_sha256": weights_sha256(model_dir),
                "dataset_sha256": dataset_sha, "config_digest": checkpoint.config_digest(cfg)}
    engine.check_model(model_dir)
    tok = load_tokenizer(cfg.model, home)
    method = make_method(cfg, home, tok)
    cfg.check_total_steps(method.total_steps)  # with epochs, the step count is known only now
    run = open_run(cfg, home, resume, name)
    ckpt = checkpoint.latest(run.path)
    state = checkpoint.check_resumable(ckpt, identity, cfg) if ckpt else None  # before anything is touched
    with run.recording():
        counts = engine.setup(model_dir, tok)
        start = restore(engine, method, ckpt, state)
        info = {**counts, "method": cfg.method, "finetune": cfg.finetune, "dtype": cfg.dtype,
                "loss_impl": cfg.loss_impl, "total_steps": method.total_steps, **method.summary(), **predicted}
        run.update(device=facts, summary=info, dataset=method.dataset,
                   model={"name": cfg.model, "dir": str(model_dir), "sha256": identity["model_sha256"]},
                   **({"resumed_from_step": start} if start else {}))
        print_summary(run, facts, info, start)

        def save(step: int) -> None:
            checkpoint.save(run.path, step, engine.save, {**identity, **method.state()}, cfg, cfg.keep_checkpoints)

        with dist.on_main(MetricsLog, run.path, start, on_update) as log:
            fit(engine, method, log, start, save, should_stop, run.run_id)
            final = final_eval(engine, method, log, run.path, start)
        if start < method.total_steps:
            save(method.total_steps)
        fault_point("export")  # the final checkpoint is committed, the run not finished
        outputs = engine.export(rundir.final_dir(run.path))
        plot_loss(run.path)
        run.update(outputs=outputs, final=final_metrics(run.path, final))
    dist.leave()  # finished on every process: the process group goes down before the interpreter
    return run.path


def fit(engine: Engine, method: Method, log: MetricsLog, start: int, save: Callable[[int], None],
        should_stop: Callable[[], bool], run_id: str) -> None:
    """Steps start+1 .. total, with logging, eval and checkpoints at their intervals."""
    from tunix_rt.train.progress import TrainProgress

    cfg, total = method.cfg, method.total_steps
    with dist.on_main(TrainProgress, total, start) as bar:
        for step in range(start, total):
            t0, lr = time.perf_counter(), lr_at(step, cfg, total)
            row, ids = method.step(engine, step, lr)
            done, dt = step + 1, time.perf_counter() - t0
            row = {"step": done, **row, "lr": lr, "tokens_per_s": row["tokens"] / dt, "step_s": dt,
                   "peak_mem_bytes": engine.peak_memory_bytes()}
            log.log_order(done, ids)
            if done % cfg.log_interval == 0 or done == total:
                log.log(row)
            bar.update(done, row["loss"], row["tokens_per_s"])
            fault_point("step")
            if done == total:
                break
            if cfg.eval_interval and done % cfg.eval_interval == 0:
                log.log({"step": done, **method.evaluate(engine)})
            saved = bool(cfg.save_interval) and done % cfg.save_interval == 0
            if saved:
                save(done)
            if should_stop():
                if not saved:
                    save(done)
                raise RunStopped(f"stopped at step {done} of {total} on request; checkpoint step-{done:06d} "
                                 f"kept (continue with --resume {run_id})")


def final_eval(engine: Engine, method: Method, log: MetricsLog, run_dir: Path, start: int) -> dict[str, float]:
    """The evaluation after the last step, logged once. It is logged before the final
    checkpoint is saved, so a run resumed from that checkpoint holds its row already: read
    back, not evaluated and logged again."""
    from tunix_rt.train.metrics import read_jsonl

    total = method.total_steps
    if start == total:
        rows = [r for r in read_jsonl(run_dir / rundir.METRICS) if r.get("step") == total and "loss" not in r]
        return {k: v for k, v in rows[-1].items() if k != "step"} if rows else {}
    final = method.evaluate(engine)
    if final:
        log.log({"step": total, **final})
    return final


def resolve_init(cfg: TrainConfig, home: Home) -> TrainConfig:
    """cfg with `model` set to the model `init` names: a run's final/merged, or its adapter
    merged into the base it was trained on, installed once as <home>/models/init-<run_id>/
    (numpy merge: no framework needed). The run then records exactly what it started from,
    and eval, compare and serving resolve its base like any run's."""
    import dataclasses

    from tunix_rt.errors import BadInput
    from tunix_rt.train.run import RunDir, resolve_run

    if not cfg.init:
        return cfg
    src = RunDir.open(resolve_run(cfg.init, home))
    target = run_model_dir(src, home, "init")
    if Path(cfg.model).resolve() == target.resolve():
        return cfg
    bases = lineage(src, home)
    if cfg.model != str(target) and not any(cfg.model == b or Path(cfg.model) == Path(b) for b in bases):
        raise BadInput(f"init: run {src.run_id} was trained on {bases[0]!r}"
                       + (f" (from {', '.join(map(repr, bases[1:]))})" if bases[1:] else "")
                       + f", not model {cfg.model!r}")
    return dataclasses.replace(cfg, model=str(target))


def lineage(src, home: Home) -> list[str]:
    """The models a run (a RunDir) descends from: the one it trained on, then, where that one
    came from a run of its own (`init`: SFT → SimPO → GRPO), each model before it. A chain
    names its first model (`model=gemma3-270m init=<the SimPO run>`) as a single run does."""
    from tunix_rt.errors import BadInput
    from tunix_rt.train.run import RunDir, resolve_run

    out, seen = [], set()
    while src is not None and src.run_id not in seen:
        seen.add(src.run_id)
        cfg = src.config()
        out.append(cfg.model)
        try:
            src = RunDir.open(resolve_run(cfg.init, home)) if cfg.init else None
        except BadInput:  # the earlier run is gone: the chain known so far
            src = None
    return out


def run_model_dir(src, home: Home, field: str = "init") -> Path:
    """The model a finished run (a RunDir) trained: its final/merged, or its adapter merged
    into its base, installed once as <home>/models/init-<run_id>/ (`init`, and a distillation
    `teacher` given as a run). `field` names the config field in the error."""
    from tunix_rt.errors import BadInput
    from tunix_rt.files import MODEL_MANIFEST

    merged = rundir.merged_dir(src.path)
    if list(merged.glob("*.safetensors")):
        return merged
    if (rundir.adapter_dir(src.path) / rundir.ADAPTER_WEIGHTS).is_file():
        target = home.models / f"init-{src.run_id}"
        if not (target / MODEL_MANIFEST).is_file():
            install_merged_adapter(src, target, home)
        return target
    raise BadInput(f"{field}: run {src.run_id} has no final/adapter or final/merged (status "
                   f"{src.manifest.get('status')!r}); finish it first")


def install_merged_adapter(src: RunDir, target: Path, home: Home) -> None:
    """<home>/models/init-<run>/: the run's base with its LoRA adapter merged (HF layout,
    safetensors, model manifest with every file's sha256), written atomically."""
    import json

    from safetensors.numpy import save_file

    from tunix_rt.files import MODEL_MANIFEST, atomic_dir, sha256_file
    from tunix_rt.models.lora import merge_adapter
    from tunix_rt.models.store import ensure_model
    from tunix_rt.train.export import copy_side_files

    base_dir = ensure_model(src.config().model, home)
    adapter = rundir.adapter_dir(src.path)
    tensors = merge_adapter(base_dir, adapter)

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        copy_side_files(base_dir, tmp)
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / MODEL_MANIFEST).write_text(json.dumps({
            "name": target.name, "source": {"kind": "run", "run_id": src.run_id, "base": str(base_dir),
                                            "adapter_sha256": sha256_file(adapter / rundir.ADAPTER_WEIGHTS)},
            "files": files}, indent=2))

    home.models.mkdir(parents=True, exist_ok=True)
    atomic_dir(target, write)


def restore(engine: Engine, method: Method, ckpt: Path | None, state: dict[str, Any] | None) -> int:
    """Continue from the newest committed checkpoint (0 when there is none)."""
    if ckpt is None:
        return 0
    engine.restore(ckpt, state)
    method.load_state(state)
    checkpoint.restore_host_rng(state)
    return int(state["step"])


def check_plan(cfg: TrainConfig, engine: str, facts: dict[str, Any]) -> dict[str, Any]:
    """Ask the memory plan and refuse a run predicted not to fit (unless cfg.force)."""
    from tunix_rt.errors import BadInput
    from tunix_rt.plan import plan_train

    # torch: one device per torchrun process; JAX: the mesh's devices, over every process
    ranks = facts.get("processes", facts["count"]) if engine == "torch" else facts["count"]
    plan = plan_train(cfg, facts["platform"], ranks, engine=engine)
    if not plan.fits and not cfg.force:
        raise BadInput(f"the memory plan predicts this run does not fit:\n{plan.render()}\n"
                       "change the config as suggested, or pass --force to run anyway")
    return {"predicted_peak_bytes": int(plan.peak_bytes_per_device), "capacity_bytes": int(plan.capacity_bytes),
            "plan_fits": bool(plan.fits)}


def final_metrics(run_dir: Path, final: dict[str, float]) -> dict[str, Any]:
    from tunix_rt.train.metrics import read_jsonl

    rows = [r for r in read_jsonl(run_dir / rundir.METRICS) if "loss" in r]
    out: dict[str, Any] = dict(final)
    if rows:
        out.update({"steps": rows[-1]["step"], "first_loss": rows[0]["loss"], "last_loss": rows[-1]["loss"],
                    "peak_mem_bytes": max(r["peak_mem_bytes"] for r in rows)})
    return out


@dist.main_only
def print_summary(run: RunDir, facts: dict, info: dict, start: int) -> None:
    from rich.console import Console

    console, gib = Console(stderr=True), 2 ** 30
    mem = ", ".join(f"{m / gib:.1f} GiB" for m in facts["memory_bytes"])
    console.print(f"[bold]run[/bold] {run.run_id}" + (f" (resuming after step {start})" if start else ""))
    console.print(f"device: {facts['platform']} x{facts['count']} ({', '.join(facts['names'])}; {mem})")
    console.print(f"params {info['params']:,}, trainable {info['trainable_params']:,} ({info['method']}, "
                  f"{info['finetune']}, {info['dtype']}, loss {info['loss_impl']})")
    console.print(f"examples {info.get('train_examples')} (dropped as too long: {info.get('dropped_overlong')}), "
                  f"<= {info.get('max_tokens_per_step')} tokens/step, {info['total_steps']} steps")
    console.print(f"predicted peak memory: {info['predicted_peak_bytes'] / gib:.2f} GiB")
    if tasks := info.get("curriculum_tasks"):
        from tunix_rt.train.curriculum import Curriculum

        for line in Curriculum.describe(tasks):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
