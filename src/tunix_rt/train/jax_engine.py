"""The JAX engine: the same runs as the PyTorch engine, on google-tunix (CPU, GPU, TPU).

    train(cfg, home, resume) = devices → run dir → setup → tunix PeftTrainer.train → export

What Tunix provides and we use as is: its Gemma model code (loaded from the HF-layout
directory by `models.jax_loader`), qwix LoRA / QLoRA, `PeftTrainer` (the jitted step,
gradient accumulation through optax.MultiSteps, orbax checkpoints and automatic restore).
What we pass in: our loss (`with_loss_fn`, chunked, model turn only), our model inputs
(`with_gen_model_input_fn`), our data (a `DataHooks` over the same `BatchStream` the torch
engine uses, so both see the same examples in the same order), and a metrics sink that
writes the run directory's metrics.jsonl. Tunix does not save the data position: it goes
into each orbax checkpoint's custom metadata, and a resumed run continues from it.

Checkpoints: runs/<id>/checkpoints/step_000010/ (orbax; written to a temp dir and renamed
by orbax, so a killed save is ignored on restore). Outputs: final/adapter/ (PEFT format)
for LoRA, final/merged/ (HF layout) for full fine-tuning or on `merge: true`.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.evidence import peak_rss_bytes
from tunix_rt.home import Home
from tunix_rt.train.config import TrainConfig

PLATFORMS = {"auto": None, "cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "tpu": "tpu"}
HOW_TO_GET = {
    "tpu": "on Kaggle set Accelerator to TPU v3-8 / v5e-8 (Notebook options); elsewhere run on a "
           "TPU VM with `pip install jax[tpu]`",
    "gpu": "install a CUDA build of jaxlib (`pip install jax[cuda12]`) on a machine where "
           "`nvidia-smi` lists a GPU",
    "cpu": "the CPU backend is always built in; check JAX_PLATFORMS",
}


# --------------------------------------------------------------------------- devices

def maybe_init_distributed() -> bool:
    """Join a multi-host run when the environment describes one (a coordinator address, or
    a TPU pod slice with several workers). Must run before JAX touches a backend."""
    import jax

    pod = len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1
    if not (os.environ.get("JAX_COORDINATOR_ADDRESS") or pod):
        return False
    if jax.distributed.is_initialized():
        return True
    jax.distributed.initialize()
    return True


def select_devices(device: str) -> list:
    """The devices of the asked platform; a clear error saying what exists when it is absent."""
    import jax

    want = PLATFORMS[device]
    if want is None:
        return jax.devices()
    try:
        found = jax.devices(want)
    except RuntimeError:
        found = []
    if not found:
        have = jax.devices()
        names = ", ".join(sorted({str(d.device_kind) for d in have}))
        raise TunixRtError(
            f"--device {device}: JAX found no {want.upper()} device; it sees {len(have)} "
            f"{have[0].platform} device(s) ({names}). To get one: {HOW_TO_GET[want]}"
        )
    return found


def device_facts(devices) -> dict[str, Any]:
    import jax

    return {
        "platform": devices[0].platform,
        "count": len(devices),
        "process_count": jax.process_count(),
        "names": [f"{d.platform}:{d.id} {d.device_kind}" for d in devices],
        "memory_bytes": [_device_limit(d) for d in devices],
    }


def _device_limit(d) -> int:
    try:
        stats = d.memory_stats() or {}
    except Exception:  # the CPU backend has no memory stats
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    import psutil

    return int(psutil.virtual_memory().total)


def peak_memory_bytes(devices) -> int:
    """Accelerators: the largest peak bytes in use of any device; CPU: peak RSS."""
    peaks = []
    for d in devices:
        try:
            peaks.append(int((d.memory_stats() or {}).get("peak_bytes_in_use", 0)))
        except Exception:
            peaks.append(0)
    if max(peaks, default=0) > 0:
        return max(peaks)
    return peak_rss_bytes()


# --------------------------------------------------------------------------- model, LoRA, optimizer

def lora_module_path(cfg: TrainConfig, num_heads: int, num_kv_heads: int) -> str:
    """qwix's module_path regex for cfg.lora_targets. Tunix fuses projections (k and v in
    kv_einsum; q, k and v in qkv_einsum when every head has its own KV head), so those go
    together or not at all."""
    t = set(cfg.lora_targets)
    mods = []
    groups = [({"q_proj", "k_proj", "v_proj"}, "qkv_einsum")] if num_heads == num_kv_heads else [
        ({"q_proj"}, "q_einsum"), ({"k_proj", "v_proj"}, "kv_einsum")]
    groups += [({"o_proj"}, "attn_vec_einsum"), ({"gate_proj"}, "gate_proj"),
               ({"up_proj"}, "up_proj"), ({"down_proj"}, "down_proj")]
    for names, module in groups:
        if names <= t:
            mods.append(module)
        elif names & t:
            raise BadInput(f"lora_targets: Tunix's Gemma fuses {sorted(names)} into {module}; "
                           "target all of them or none")
    return r".*/(?:" + "|".join(mods) + ")"


def apply_lora(model, cfg: TrainConfig, tcfg):
    """qwix LoRA (QLoRA when lora_weight_qtype is set) on the targeted projections."""
    import qwix
    from flax import nnx

    extra = {}
    if cfg.lora_weight_qtype:
        extra = {"weight_qtype": cfg.lora_weight_qtype,
                 "tile_size": _tile(tcfg.embed_dim, tcfg.hidden_dim, tcfg.head_dim)}
    provider = qwix.LoraProvider(
        module_path=lora_module_path(cfg, tcfg.num_heads, tcfg.num_kv_heads),
        rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, **extra,
    )
    return qwix.apply_lora_to_model(model, provider, rngs=nnx.Rngs(cfg.seed), **model.get_model_input())


def _tile(*dims: int) -> int:
    """Quantisation tile along contracting axes (width, MLP width, head_dim): the largest
    power of two up to 256 that divides them all."""
    return next(t for t in (256, 128, 64, 32, 16, 8, 4, 2, 1) if all(d % t == 0 for d in dims))


def make_optimizer(cfg: TrainConfig, total_steps: int):
    """optax optimizer with the torch engine's learning-rate curve (`schedule.lr_at`)."""
    import jax.numpy as jnp
    import optax

    from tunix_rt.train.schedule import lr_at

    table = jnp.asarray([lr_at(s, cfg, total_steps) for s in range(total_steps)], jnp.float32)

    def schedule(count):
        return table[jnp.minimum(count, total_steps - 1)]

    if cfg.optimizer == "adafactor":
        opt = optax.adafactor(learning_rate=schedule, weight_decay_rate=cfg.weight_decay or None)
    else:
        opt = optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-8, weight_decay=cfg.weight_decay)
    if cfg.grad_clip > 0:
        opt = optax.chain(optax.clip_by_global_norm(cfg.grad_clip), opt)
    return opt


# --------------------------------------------------------------------------- data

def jax_batch(rows, pad_id: int, norm: float, process: tuple[int, int] = (0, 1)) -> dict[str, np.ndarray]:
    """One micro-batch as numpy arrays for the trainer: the torch engine's collate (same ids,
    labels, positions), and loss weights = supervised mask / norm. On several hosts each
    process feeds its own rows."""
    from tunix_rt.train.data import IGNORE, collate

    b = collate(rows, pad_id)
    ids = b.input_ids.astype(np.int32)
    labels = b.labels
    idx, count = process
    per = ids.shape[0] // count
    sl = slice(idx * per, (idx + 1) * per)
    return {
        "input_tokens": ids[sl],
        "input_mask": (ids != pad_id)[sl],
        "positions": b.position_ids.astype(np.int32)[sl],
        "loss_weights": ((labels != IGNORE).astype(np.float32) / np.float32(norm))[sl],
    }


def fixed_width(batch: dict[str, np.ndarray], width: int, pad_id: int) -> dict[str, np.ndarray]:
    """Right-pad a batch to `width` so every step has the same shape (one compilation)."""
    n = width - batch["input_tokens"].shape[1]
    if n < 0:
        raise TunixRtError(f"batch of width {batch['input_tokens'].shape[1]} > {width}")
    if n == 0:
        return batch
    pad = {"input_tokens": pad_id, "input_mask": False, "loss_weights": 0.0}
    out = {k: np.pad(v, ((0, 0), (0, n)), constant_values=pad.get(k, 0)) for k, v in batch.items()}
    last = batch["positions"][:, -1:]
    out["positions"][:, -n:] = last + 1 + np.arange(n)[None, :]
    return out


@dataclass
class DataFeed:
    """Tunix DataHooks: the train stream (resumable position) and the fixed eval batches."""

    stream: Any
    cfg: TrainConfig
    total_steps: int
    width: int
    pad_id: int
    eval_batches: list = field(default_factory=list)
    log: Any = None
    tokens: dict = field(default_factory=dict)
    should_stop: Any = None
    stopped_at: int | None = None
    _eval_i: int = 0
    _window: list = field(default_factory=list)
    _norm: float = 1.0

    def load_next_train_batch(self, trainer):
        """The next micro-batch, or None after the last one of the run (or when asked to
        stop: then the step just done is checkpointed with its data position first)."""
        if trainer.iter_steps >= self.total_steps * self.cfg.grad_accum:
            return None
        if not self._window and self._stop_requested(trainer):
            return None
        if not self._window:
            self._window = [self.stream.next_rows() for _ in range(self.cfg.grad_accum)]
            step = trainer.train_steps + 1
            self.tokens[step] = sum(len(ex.ids) for rows in self._window for row in rows for ex in row)
            if self.log is not None:
                self.log.log_order(step, [ex.id for rows in self._window for row in rows for ex in row])
            self._norm = sum(sum(ex.loss_mask[1:].count(1) for ex in row)
                             for rows in self._window for row in rows) / self.cfg.grad_accum
        rows = self._window.pop(0)
        return self._pack(rows, self._norm)

    def _stop_requested(self, trainer) -> bool:
        done = trainer.train_steps
        if self.should_stop is None or done <= getattr(trainer, "first_step", 0) or not self.should_stop():
            return False
        if trainer.checkpoint_manager.latest_step() != done:
            trainer.checkpoint_manager.save(done, trainer.model, trainer.optimizer,
                                            save_only_lora_params=trainer._lora_enabled, force=True,
                                            custom_metadata=trainer.custom_checkpoint_metadata())
        self.stopped_at = done
        return True

    def _pack(self, rows, norm):
        import jax

        b = jax_batch(rows, self.pad_id, norm, (jax.process_index(), jax.process_count()))
        return fixed_width(b, self.width, self.pad_id)

    def load_next_eval_batch(self, trainer):
        if self._eval_i >= len(self.eval_batches):
            self._eval_i = 0
            return None
        self._eval_i += 1
        return self.eval_batches[self._eval_i - 1]

    def build_eval(self, examples: list) -> None:
        """Eval batches in fixed order; each batch's loss is scaled so that the mean over
        batches (what Tunix reports) is the mean per supervised token of the whole split."""
        groups = [examples[i:i + self.cfg.batch_size] for i in range(0, len(examples), self.cfg.batch_size)]
        total = sum(ex.loss_mask[1:].count(1) for ex in examples)
        norm = total / max(len(groups), 1)
        for g in groups:
            rows = [[ex] for ex in g]
            while len(rows) < self.cfg.batch_size:  # a short last batch: pad rows, no loss
                rows.append([])
            self.eval_batches.append(self._pack_eval(rows, norm))

    def _pack_eval(self, rows, norm):
        real = [r for r in rows if r]
        b = self._pack(real, norm)
        missing = len(rows) - len(real)
        if missing:
            b = {k: np.concatenate([v, np.zeros((missing,) + v.shape[1:], v.dtype)]) for k, v in b.items()}
            b["positions"][-missing:] = np.arange(self.width)[None, :]
        return b


# --------------------------------------------------------------------------- the trainer

def make_trainer_class():
    """PeftTrainer that saves the data position with every checkpoint and, like the torch
    engine, does not evaluate before the first step."""
    from tunix.sft import peft_trainer

    class Trainer(peft_trainer.PeftTrainer):
        feed: DataFeed | None = None
        extra_metadata: dict = {}

        def custom_checkpoint_metadata(self) -> dict[str, Any]:
            if self.feed is None:
                return {}
            pos = self.feed.stream.position
            return {"data_position": {"epoch": pos.epoch, "cursor": pos.cursor},
                    "optimizer_step": self.train_steps, **self.extra_metadata}

        def _run_eval(self, eval_ds, eval_step_fn):
            if self.train_steps == getattr(self, "first_step", -1):
                return
            super()._run_eval(eval_ds, eval_step_fn)

        def jit_train_and_eval_step(self, skip_jit: bool = False, cache_nnx_graph: bool = False):
            """Tunix's jitted steps, with the model donated too (Tunix donates only the
            optimizer). nnx.jit returns the model's whole state, frozen base weights
            included: undonated, every step writes them into new buffers, a second copy of
            the model at the peak (1 GB for Gemma 3 270M in fp32) and a copy's worth of time.
            Donated, XLA aliases each unchanged weight to its input buffer."""
            if skip_jit or cache_nnx_graph or self._jitted_train_step_fn is not None:
                return super().jit_train_and_eval_step(skip_jit, cache_nnx_graph)
            import functools

            from flax import nnx
            from jax.interpreters import pxla

            self._shard_optimizer(pxla.thread_resources.env.physical_mesh)
            train = nnx.jit(self.create_train_step_fn(), donate_argnames=("model", "optimizer"))
            evaluate = nnx.jit(self.create_eval_step_fn(), donate_argnames=("model",))
            self._jitted_train_step_fn = functools.partial(train, self.model, self.optimizer)
            self._jitted_eval_step_fn = functools.partial(evaluate, self.model)
            return self._jitted_train_step_fn, self._jitted_eval_step_fn

    return Trainer


class MetricsSink:
    """Tunix's MetricsLogger interface → our metrics.jsonl / TensorBoard (run.MetricsLog).
    Tunix reports a step's loss one step late (it overlaps logging with the next step);
    the row carries that step's own number, lr and token count."""

    def __init__(self, cfg: TrainConfig, total_steps: int, feed: DataFeed, devices):
        from tunix_rt.train.schedule import lr_at

        self.out = None  # the run's MetricsLog, set once the restored step is known
        self.cfg, self.total, self.feed, self.devices = cfg, total_steps, feed, devices
        self._lr = lambda step: lr_at(step - 1, cfg, total_steps)
        self._row: dict[str, float] = {}
        self._t = time.perf_counter()
        self.last: dict[str, Any] = {}
        self.last_eval: tuple[int, float] | None = None
        self.bar = None

    def log(self, prefix, name, value, mode, step):  # noqa: D401 - tunix's signature
        value = float(np.asarray(value))
        if str(mode) == "eval":
            if name == "loss":
                self.last_eval = (int(step), value)
                self.out.log({"step": int(step), "eval_loss": value})
            return
        self._row[name] = value
        if name == "grad_norm":
            self._emit(int(step))

    def _emit(self, step: int) -> None:
        from tunix_rt.train.run import fault_point

        now = time.perf_counter()
        dt, self._t = now - self._t, now
        tokens = self.feed.tokens.get(step, 0)
        row = {"step": step, "loss": self._row["loss"], "lr": self._lr(step),
               "grad_norm": self._row["grad_norm"], "tokens": tokens, "tokens_per_s": tokens / dt,
               "step_s": dt, "peak_mem_bytes": peak_memory_bytes(self.devices)}
        self.last, self._row = row, {}
        if step % self.cfg.log_interval == 0 or step == self.total:
            self.out.log(row)
        if self.bar is not None:
            self.bar.update(step, row["loss"], row["tokens_per_s"])
        fault_point("step")

    # the rest of tunix's MetricsLogger interface
    def metric_exists(self, *a) -> bool:
        return False

    def get_metric(self, prefix, name, mode):
        return self.last_eval[1] if self.last_eval else float("nan")

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- setup

@dataclass
class Setup:
    cfg: TrainConfig
    devices: list
    mesh: Any
    model: Any
    tcfg: Any
    family: str
    model_dir: Path
    feed: DataFeed
    total_steps: int
    facts: dict[str, Any]


def setup(cfg: TrainConfig, home: Home, devices) -> Setup:
    import jax

    from tunix_rt.models.jax_loader import load_model, make_mesh
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.data import BatchStream
    from tunix_rt.train.common import load_data, model_sha256, steps_for

    tok = load_tokenizer(cfg.model, home)
    train_ex, eval_ex, data_facts = load_data(cfg, home, tok)
    model_dir = ensure_model(cfg.model, home)
    mesh = make_mesh(cfg.mesh, devices)
    with jax.set_mesh(mesh):
        model, tcfg = load_model(model_dir, mesh, cfg.dtype, remat=cfg.gradient_checkpointing)
        if cfg.method == "lora":
            model = apply_lora(model, cfg, tcfg)
    from tunix_rt.models.jax_loader import family_of, read_hf_config

    family = family_of(read_hf_config(model_dir))
    total = steps_for(cfg, train_ex, tok.pad_id)
    stream = BatchStream(train_ex, cfg.batch_size, cfg.max_seq_len, cfg.packing, cfg.seed, tok.pad_id)
    width = batch_width(cfg, train_ex + eval_ex)
    feed = DataFeed(stream, cfg, total, width, tok.pad_id)
    feed.build_eval(eval_ex)
    facts = {"dataset": data_facts,
             "model": {"name": cfg.model, "dir": str(model_dir), "sha256": model_sha256(model_dir)}}
    return Setup(cfg, devices, mesh, model, tcfg, family, model_dir, feed, total, facts)


def batch_width(cfg: TrainConfig, examples: list) -> int:
    """One sequence length for every batch (one compilation): the longest example (or
    max_seq_len when packing), rounded up to a multiple of 8, at most max_seq_len."""
    if cfg.packing:
        return cfg.max_seq_len
    longest = max((len(ex.ids) for ex in examples), default=8)
    return min(cfg.max_seq_len, -(-longest // 8) * 8)


def build_trainer(s: Setup, run_dir: Path, sink: MetricsSink):
    """Tunix's PeftTrainer with our loss, inputs, data, checkpoints and metrics."""
    import orbax.checkpoint as ocp
    from tunix.sft import peft_trainer

    from tunix_rt.train.jax_loss import make_loss_fn, model_inputs

    cfg, total = s.cfg, s.total_steps
    interval = cfg.save_interval or total

    def should_save(step: int, last) -> bool:
        return step % interval == 0 or step == total

    options = ocp.CheckpointManagerOptions(
        should_save_fn=should_save, max_to_keep=cfg.keep_checkpoints,
        step_prefix="step", step_format_fixed_length=6,
    )
    tc = peft_trainer.TrainingConfig(
        eval_every_n_steps=cfg.eval_interval or total + 1,
        max_steps=total,
        gradient_accumulation_steps=cfg.grad_accum if cfg.grad_accum > 1 else None,
        checkpoint_root_directory=str(run_dir / "checkpoints"),
        checkpointing_options=options,
        pbar_description=None,
    )
    trainer = make_trainer_class()(s.model, make_optimizer(cfg, total), tc, metrics_logger=sink)
    trainer._pbar = _NoBar()  # our rich progress bar (the sink) replaces tunix's
    trainer.with_gen_model_input_fn(lambda b: model_inputs(**b))
    trainer.with_loss_fn(make_loss_fn(cfg.loss_chunk_tokens, cfg.loss_impl))
    trainer.with_data_hooks(s.feed)
    trainer.feed = s.feed
    trainer.extra_metadata = {"model_sha256": s.facts["model"]["sha256"],
                              "dataset_sha256": s.facts["dataset"]["sha256"], "engine": "jax"}
    return trainer


class _NoBar:
    def update_metrics(self, *a, **k):
        pass

    def update(self, *a, **k):
        pass

    def close(self):
        pass


def restore_position(trainer, s: Setup) -> int:
    """After Tunix restored the newest orbax checkpoint: put the data stream where it was
    and refuse a checkpoint of another model or dataset."""
    from tunix_rt.train.data import DataPosition

    step = trainer.train_steps
    if step == 0:
        return 0
    meta = dict(trainer._restored_custom_metadata or {})
    for key in ("model_sha256", "dataset_sha256"):
        if meta.get(key) != trainer.extra_metadata[key]:
            raise TunixRtError(f"checkpoint step {step}: {key} {meta.get(key)!r} differs from this run's; refusing to resume")
    pos = meta.get("data_position")
    if pos is None:
        raise TunixRtError(f"checkpoint step {step} has no data position; cannot resume exactly")
    s.feed.stream.position = DataPosition(pos["epoch"], pos["cursor"])
    return step


def param_counts(model, method: str) -> dict[str, int]:
    """Parameters of the model and how many of them train (LoRA factors, or all)."""
    import jax
    from flax import nnx

    def count(kind) -> int:  # a QLoRA weight counts once (its qvalue), not its quantisation scales
        return sum(x.size for path, var in nnx.to_flat_state(nnx.state(model, kind))
                   if tuple(map(str, path[-2:])) not in (("array", "scale"), ("array", "zero_point"))
                   for x in jax.tree.leaves(var))
    lora = count(nnx.LoRAParam)
    total = count(nnx.Param)
    return {"params": total - lora, "trainable_params": lora if method == "lora" else total}


# --------------------------------------------------------------------------- outputs

def lora_tensors(model) -> dict[str, np.ndarray]:
    """The trained LoRA weights in PEFT names and HF layout (lora_A [r, in], lora_B [out, r])."""
    out: dict[str, np.ndarray] = {}
    for path, mod in model.iter_modules():
        names = [str(p) for p in path]
        if len(names) < 4 or names[0] != "layers":
            continue
        i, kind = names[1], names[-1]
        pairs = _lora_pairs(mod)
        if not pairs:
            continue
        a, b = pairs
        out.update(_to_peft(i, kind, np.asarray(a, np.float32), np.asarray(b, np.float32)))
    if not out:
        raise TunixRtError("no LoRA weights found in the trained model")
    return out


def _lora_pairs(mod):
    for w in ("w", "kernel"):
        a, b = getattr(mod, f"{w}_lora_a", None), getattr(mod, f"{w}_lora_b", None)
        if a is not None and b is not None:
            return a[...], b[...]
    return None


def _to_peft(i: str, kind: str, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """qwix LoRA factors of one Tunix module → PEFT tensors of the HF projections it holds."""
    pre = f"base_model.model.model.layers.{i}"
    r = a.shape[-1] if kind != "attn_vec_einsum" else b.shape[0]

    def pair(proj, A, B):
        sub = "self_attn" if proj.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
        return {f"{pre}.{sub}.{proj}.lora_A.weight": np.ascontiguousarray(A),
                f"{pre}.{sub}.{proj}.lora_B.weight": np.ascontiguousarray(B)}

    if kind == "q_einsum":  # a [D, r], b [r, N, H]
        return pair("q_proj", a.T, b.reshape(r, -1).T)
    if kind == "kv_einsum":  # a [D, r], b [r, 2, K, H]: k and v share A
        return {**pair("k_proj", a.T, b[:, 0].reshape(r, -1).T), **pair("v_proj", a.T, b[:, 1].reshape(r, -1).T)}
    if kind == "qkv_einsum":  # a [D, r], b [r, 3, N, H]
        return {**pair("q_proj", a.T, b[:, 0].reshape(r, -1).T), **pair("k_proj", a.T, b[:, 1].reshape(r, -1).T),
                **pair("v_proj", a.T, b[:, 2].reshape(r, -1).T)}
    if kind == "attn_vec_einsum":  # a [N, H, r], b [r, D]
        return pair("o_proj", a.reshape(-1, r).T, b.T)
    if kind in ("gate_proj", "up_proj", "down_proj"):  # a [in, r], b [r, out]
        return pair(kind, a.T, b.T)
    raise TunixRtError(f"LoRA on an unknown Tunix module {kind!r}")


def write_adapter(model, s: Setup, target: Path) -> None:
    cfg = s.cfg
    export_adapter(model, s.model_dir, target, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets,
                   weight_qtype=cfg.lora_weight_qtype)


def export_adapter(model, model_dir: Path, target: Path, rank: int, alpha: float, dropout: float,
                   targets: list[str], weight_qtype: str | None = None) -> None:
    """final/adapter: adapter_model.safetensors + adapter_config.json, loadable by
    `peft.PeftModel.from_pretrained` (and so by the torch eval).

    QLoRA (`weight_qtype` set): the factors were trained on the quantised base, but PEFT
    adds them to the full-precision base in model_dir (as final/merged/ does): the exported
    model is the trained one with the base's quantisation error taken out. Its logits equal
    the JAX model's with the same factors on the unquantised base; they differ from the QLoRA
    model's by that error (nf4 on the tiny test model: ~9% relative RMS per weight, ~0.17 of
    the largest logit), and equal them on the dequantised base. tunix_rt_adapter.json records
    the qtype."""
    import json

    from safetensors.numpy import save_file

    save_file(lora_tensors(model), str(target / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_dir),
        "r": rank, "lora_alpha": alpha, "lora_dropout": dropout,
        "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": False,
        "inference_mode": True, "use_rslora": False, "init_lora_weights": True,
        "modules_to_save": None, "layers_to_transform": None, "revision": None,
    }
    (target / "adapter_config.json").write_text(json.dumps(config, indent=2))
    (target / "tunix_rt_adapter.json").write_text(json.dumps(
        {"engine": "jax", "note": "exported from qwix LoRA; Tunix fuses k/v (and q/k/v) projections, "
                                  "so their lora_A matrices are equal copies",
         **({"weight_qtype": weight_qtype,
             "qlora_note": f"trained on a {weight_qtype}-quantised base; PEFT applies it to the "
                           "full-precision base (differences of the order of the quantisation error)"}
            if weight_qtype else {})}, indent=2))


def write_merged(model, s: Setup, target: Path) -> None:
    """final/merged/. After QLoRA the factors are merged into the full-precision base of
    model_dir (not the quantised one they were trained on): the same model PEFT builds from
    final/adapter/ (see export_adapter)."""
    lora = s.cfg.lora_alpha / s.cfg.lora_rank if s.cfg.method == "lora" else None
    export_merged(model, s.family, s.model_dir, target, lora)


def export_merged(model, family: str, model_dir: Path, target: Path, lora_scale: float | None = None) -> None:
    """HF-layout safetensors transformers loads: base + scale * B @ A for a LoRA model
    (lora_scale = alpha / r), or every trained weight after full fine-tuning; config.json
    and the tokenizer files are copied from the model directory."""
    from safetensors.numpy import save_file

    from tunix_rt.models.jax_loader import hf_state

    model_dir = Path(model_dir)
    if lora_scale is not None:
        tensors = merge_lora(model_dir, lora_tensors(model), lora_scale)
    else:
        tensors = hf_state(model, family)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, target / name)


def merge_lora(model_dir: Path, lora: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    """The directory's HF tensors with W += scale * B @ A for every adapted projection."""
    from safetensors.numpy import load_file

    base: dict[str, np.ndarray] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        base.update({k: v.astype(np.float32) for k, v in load_file(str(f)).items()})
    for key in [k for k in lora if k.endswith("lora_A.weight")]:
        name = key[len("base_model.model."):-len(".lora_A.weight")] + ".weight"
        A, B = lora[key], lora[key.replace("lora_A", "lora_B")]
        base[name] = base[name] + scale * (B @ A)
    return base


def write_final(model, s: Setup, run_dir: Path) -> dict[str, str]:
    from tunix_rt.train.common import atomic_dir

    final = run_dir / "final"
    final.mkdir(exist_ok=True)
    out = {}
    if s.cfg.method == "lora":
        out["adapter"] = str(atomic_dir(final / "adapter", lambda d: write_adapter(model, s, d)))
    if s.cfg.method == "full" or s.cfg.merge:
        out["merged"] = str(atomic_dir(final / "merged", lambda d: write_merged(model, s, d)))
    return out


# --------------------------------------------------------------------------- entry point

def check_dtype(cfg: TrainConfig, platform: str) -> None:
    if platform == "cpu" and cfg.dtype == "bf16" and not cfg.force_bf16_cpu:
        raise BadInput("dtype bf16 on a CPU is refused: these CPUs have no bf16 matmul units and bf16 "
                       "runs ~300x slower than fp32 here; use dtype=fp32, or force_bf16_cpu=true")


def check_plan(cfg: TrainConfig, platform: str, n: int) -> dict[str, Any]:
    import importlib.util

    if importlib.util.find_spec("tunix_rt.plan") is None:
        return {"predicted_peak": "memory plan not available (tunix_rt.plan missing)"}
    from tunix_rt.plan import plan_train

    plan = plan_train(cfg, platform, n, engine="jax")  # cfg.engine auto would plan as torch on one device
    if not plan.fits and not cfg.force:
        raise BadInput(f"the memory plan predicts this run does not fit:\n{plan.render()}\n"
                       "change the config as suggested, or pass --force to run anyway")
    return {"predicted_peak_bytes": int(plan.peak_bytes_per_device), "capacity_bytes": int(plan.capacity_bytes),
            "plan_fits": bool(plan.fits)}



def train(cfg: TrainConfig, home: Home, resume: str | None = None, should_stop=None) -> Path:
    """Train with JAX / google-tunix; returns the run directory (the torch engine's layout).
    `should_stop` is polled before every optimizer step (the job worker's cancel hook)."""
    import jax
    from rich.console import Console

    from tunix_rt.train.progress import TrainProgress
    from tunix_rt.train.run import MetricsLog, plot_loss

    console = Console(stderr=True)
    maybe_init_distributed()
    devices = select_devices(cfg.device)
    facts = device_facts(devices)
    check_dtype(cfg, facts["platform"])
    predicted = check_plan(cfg, facts["platform"], len(devices))
    if facts["platform"] == "cpu":
        from tunix_rt.train.common import tune_cpu_allocator

        tune_cpu_allocator()  # before the weights are loaded (see its doc)
    from tunix_rt.train.run import open_run

    run = open_run(cfg, home, resume, "jax")
    console.print(f"[bold]jax[/bold] {facts['platform']} x{facts['count']} "
                  f"(processes: {facts['process_count']}): " + ", ".join(facts["names"]))
    with run.recording():
        s = setup(cfg, home, devices)
        sink = MetricsSink(cfg, s.total_steps, s.feed, devices)
        with jax.set_mesh(s.mesh):
            trainer = build_trainer(s, run.path, sink)
            start = restore_position(trainer, s)
            trainer.first_step = start
            s.feed.should_stop = should_stop
            log = MetricsLog(run.path, start)  # cuts lines a killed run wrote past its checkpoint
            sink.out = s.feed.log = log
            run.update(device=facts, dataset=s.facts["dataset"], model=s.facts["model"],
                       summary={"total_steps": s.total_steps, "batch_width": s.feed.width,
                                "mesh": dict(s.mesh.shape), **param_counts(trainer.model, cfg.method),
                                "method": cfg.method, "dtype": cfg.dtype, "loss_impl": cfg.loss_impl,
                                "train_examples": len(s.feed.stream.examples),
                                "max_tokens_per_step": cfg.tokens_per_step, **predicted},
                       **({"resumed_from_step": start} if start else {}))
            console.print(f"run {run.run_id}" + (f" (resuming after step {start})" if start else "")
                          + f": {s.total_steps} steps, mesh {dict(s.mesh.shape)}, batch width {s.feed.width}")
            try:
                with TrainProgress(s.total_steps, start) as bar:
                    sink.bar = bar
                    sink._t = time.perf_counter()
                    trainer.train(train_ds=[], eval_ds=[0] if s.feed.eval_batches else None)
                if s.feed.stopped_at is not None:
                    from tunix_rt.train.run import RunStopped

                    raise RunStopped(f"stopped at step {s.feed.stopped_at} of {s.total_steps} on request; "
                                     f"checkpoint kept (continue with --resume {run.run_id})")
                if s.feed.eval_batches and (sink.last_eval is None or sink.last_eval[0] != s.total_steps):
                    trainer._run_eval([0], trainer.jit_train_and_eval_step()[1])
            finally:
                log.close()
            outputs = write_final(trainer.model, s, run.path)
        plot_loss(run.path)
        run.update(outputs=outputs, final=_final_metrics(run.path, sink))
    return run.path


def _final_metrics(run_dir: Path, sink: MetricsSink) -> dict[str, Any]:
    from tunix_rt.train.run import METRICS, read_jsonl

    rows = [r for r in read_jsonl(run_dir / METRICS) if "loss" in r]
    out: dict[str, Any] = {}
    if rows:
        out = {"steps": rows[-1]["step"], "first_loss": rows[0]["loss"], "last_loss": rows[-1]["loss"],
               "peak_mem_bytes": max(r["peak_mem_bytes"] for r in rows)}
    if sink.last_eval and math.isfinite(sink.last_eval[1]):
        out["eval_loss"] = sink.last_eval[1]
    return out
