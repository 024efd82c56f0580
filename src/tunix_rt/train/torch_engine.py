"""The PyTorch engine: LoRA (PEFT) or full fine-tuning with our own loop.

    train(cfg, home, resume) = plan check → setup → (restore) → fit → validate → finish

The loop is short on purpose. Three choices carry it:
- the loss never builds [B, L, V] logits: the decoder returns hidden states and
  `loss.chunked_linear_ce` applies the head chunk by chunk over supervised positions only;
- gradient accumulation divides every micro-batch's summed loss by the supervised tokens of
  the whole window, so the gradient is the same however the window is split;
- everything that decides the next step (weights, optimizer, RNG, data position) is in the
  checkpoint, so a killed run resumes bit-exactly and performs exactly the steps asked for.
"""

from __future__ import annotations

import dataclasses
import math
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tunix_rt.errors import BadInput
from tunix_rt.evidence import peak_rss_bytes
from tunix_rt.home import Home
from tunix_rt.train import checkpoint
from tunix_rt.train.common import atomic_dir, load_data, model_sha256, steps_for
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import Batch, BatchStream
from tunix_rt.train.run import MetricsLog, RunDir, RunStopped, fault_point, never, open_run, plot_loss
from tunix_rt.train.schedule import lr_at



# --------------------------------------------------------------------------- devices

def require_torch() -> None:
    """A clear BadInput where torch is not installed (a JAX-only install, `tunix-rt[jax]`)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise BadInput("the PyTorch engine needs torch, which is not installed here: pip install "
                       "'tunix-rt[torch]', or train with the JAX engine (--engine jax)") from None


def resolve_device(cfg: TrainConfig):
    """The torch device for cfg.device; a clear error naming what was asked and what exists."""
    import torch

    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    have = "cpu" + (f", cuda ({n_cuda} device{'s' if n_cuda > 1 else ''})" if n_cuda else "")
    if cfg.device in ("gpu", "tpu"):
        raise BadInput(f"device {cfg.device!r} is a JAX device name; the torch engine runs on cpu or cuda "
                       f"(available here: {have}); use --engine jax for {cfg.device}")
    if cfg.device == "cuda" and not n_cuda:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise BadInput(f"device 'cuda' was asked, but torch {torch.__version__} ({build}) sees no CUDA "
                       f"device; available here: {have}")
    device = torch.device("cuda" if cfg.device == "cuda" or (cfg.device == "auto" and n_cuda) else "cpu")
    if device.type == "cpu" and cfg.dtype == "bf16" and not cfg.force_bf16_cpu:
        raise BadInput("dtype bf16 on a CPU is refused: these CPUs have no bf16 matmul units and bf16 "
                       "runs ~300x slower than fp32 here; use dtype=fp32, or force_bf16_cpu=true")
    return device


def device_facts(device) -> dict[str, Any]:
    """Platform, count, names and memory of the device a run uses (for the log and manifest)."""
    import psutil
    import torch

    from tunix_rt.evidence import cpu_facts

    if device.type == "cuda":
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        return {"platform": "cuda", "count": len(props), "names": [p.name for p in props],
                "memory_bytes": [int(p.total_memory) for p in props], "used_index": device.index or 0}
    return {"platform": "cpu", "count": 1, "names": [cpu_facts()["model"]],
            "memory_bytes": [int(psutil.virtual_memory().total)], "threads": torch.get_num_threads()}


def tune_cpu_allocator(device) -> bool:
    """glibc's mmap threshold at 1 MiB on CPU (see common.tune_cpu_allocator)."""
    from tunix_rt.train.common import tune_cpu_allocator as tune

    return device.type == "cpu" and tune()


def peak_memory_bytes(device) -> int:
    """CUDA: max allocated by torch; CPU: the process's peak RSS."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


# --------------------------------------------------------------------------- setup

@dataclass
class Head:
    """The output projection the fused loss applies itself, and Gemma 2's logit cap."""

    weight: Any
    softcap: float | None


@dataclass
class Setup:
    """Everything a run holds while it trains."""

    cfg: TrainConfig
    device: Any
    model: Any
    head: Head
    trainable: dict[str, Any]
    optimizer: Any
    stream: BatchStream
    eval_examples: list
    total_steps: int
    model_dir: Path
    facts: dict[str, Any] = field(default_factory=dict)


def load_model(cfg: TrainConfig, model_dir: Path, device):
    """The HF causal LM, with a LoRA adapter (PEFT) or every weight trainable."""
    import torch
    from transformers import AutoConfig

    from tunix_rt.models.hf import load_causal_lm

    hf_cfg = AutoConfig.from_pretrained(model_dir)
    # sdpa cannot soft-cap attention logits (Gemma 2): eager there, sdpa otherwise.
    attn = "eager" if getattr(hf_cfg, "attn_logit_softcapping", None) else "sdpa"
    model = load_causal_lm(model_dir, dtype=cfg.dtype, device=str(device.type), attn=attn)
    torch.manual_seed(cfg.seed)  # LoRA initialisation is seeded
    if cfg.method == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=list(cfg.lora_targets), bias="none", task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    else:
        model.requires_grad_(True)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = Head(base.get_output_embeddings().weight, getattr(base.config, "final_logit_softcapping", None))
    return model, head


def make_optimizer(cfg: TrainConfig, params: list):
    import torch

    if cfg.optimizer == "adafactor":
        return torch.optim.Adafactor(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def setup(cfg: TrainConfig, home: Home, device) -> Setup:
    from tunix_rt.models.store import ensure_model, load_tokenizer

    _seed_everything(cfg.seed)
    tok = load_tokenizer(cfg.model, home)
    train_ex, eval_ex, data_facts = load_data(cfg, home, tok)
    model_dir = ensure_model(cfg.model, home)
    model, head = load_model(cfg, model_dir, device)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    stream = BatchStream(train_ex, cfg.batch_size, cfg.max_seq_len, cfg.packing, cfg.seed, tok.pad_id)
    facts = {"dataset": data_facts, "model": {"name": cfg.model, "dir": str(model_dir), "sha256": model_sha256(model_dir)}}
    return Setup(cfg, device, model, head, trainable, make_optimizer(cfg, list(trainable.values())), stream,
                 eval_ex, steps_for(cfg, train_ex, tok.pad_id), model_dir, facts)


def _seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- the step

def decoder(model):
    """The decoder stack that returns normed hidden states (no logits), through PEFT."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model


def on_device(batch: Batch, device=None) -> Batch:
    """The batch with torch tensors (on `device`) in place of collate's numpy arrays; the
    tensors share the arrays' memory on the CPU. A batch of tensors is moved, or kept."""
    import torch

    def tensor(a):
        return torch.as_tensor(a, device=device)

    return dataclasses.replace(batch, input_ids=tensor(batch.input_ids), labels=tensor(batch.labels),
                               position_ids=tensor(batch.position_ids))


def batch_loss_sum(model, head: Head, batch: Batch, cfg: TrainConfig):
    """Summed cross-entropy of a micro-batch's supervised tokens (numpy arrays or tensors)."""
    from tunix_rt.train.loss import chunked_linear_ce, plain_ce, supervised_rows

    batch = on_device(batch)
    if cfg.loss_impl == "plain":
        logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False).logits
        return plain_ce(logits, batch.labels)
    out = decoder(model)(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    h, y = supervised_rows(out.last_hidden_state, batch.labels)
    return chunked_linear_ce(h, head.weight, y, cfg.loss_chunk_tokens, head.softcap)


def backward_window(model, head: Head, batches: list[Batch], cfg: TrainConfig, device) -> float:
    """Backward over one accumulation window; the loss is per supervised token of the window.
    Returns that mean loss."""
    n_sup = sum(b.n_supervised for b in batches)
    total = 0.0
    for i, b in enumerate(batches):
        loss = batch_loss_sum(model, head, on_device(b, device), cfg) / n_sup
        loss.backward()
        total += float(loss.detach())
        if i + 1 < len(batches):
            fault_point("accum")
    return total


def optimizer_step(s: Setup, step: int) -> tuple[float, float, list[Batch]]:
    """One optimizer step: lr, window backward, clip, update. Returns loss, grad norm, batches."""
    import torch

    lr = lr_at(step, s.cfg, s.total_steps)
    for group in s.optimizer.param_groups:
        group["lr"] = lr
    batches = [s.stream.next_batch() for _ in range(s.cfg.grad_accum)]
    loss = backward_window(s.model, s.head, batches, s.cfg, s.device)
    params = list(s.trainable.values())
    norm = torch.nn.utils.clip_grad_norm_(params, s.cfg.grad_clip if s.cfg.grad_clip > 0 else math.inf)
    s.optimizer.step()
    s.optimizer.zero_grad(set_to_none=True)
    return loss, float(norm), batches


# --------------------------------------------------------------------------- fit / validate

def fit(s: Setup, run: RunDir, log: MetricsLog, start: int,
        should_stop: Callable[[], bool] = never) -> dict[str, float]:
    """Steps start+1 .. total_steps, with logging, eval and checkpoints at their intervals.
    When should_stop() turns true, the step just done is checkpointed and RunStopped raised."""
    from tunix_rt.train.progress import TrainProgress

    cfg, last = s.cfg, {}
    with TrainProgress(s.total_steps, start) as bar:
        for step in range(start, s.total_steps):
            t0 = time.perf_counter()
            loss, norm, batches = optimizer_step(s, step)
            done, dt = step + 1, time.perf_counter() - t0
            tokens = sum(b.n_tokens for b in batches)
            log.log_order(done, [i for b in batches for i in b.example_ids])
            last = {"step": done, "loss": loss, "lr": s.optimizer.param_groups[0]["lr"], "grad_norm": norm,
                    "tokens": tokens, "tokens_per_s": tokens / dt, "step_s": dt,
                    "peak_mem_bytes": peak_memory_bytes(s.device)}
            if done % cfg.log_interval == 0 or done == s.total_steps:
                log.log(last)
            bar.update(done, loss, tokens / dt)
            fault_point("step")
            if cfg.eval_interval and done % cfg.eval_interval == 0 and done < s.total_steps:
                log.log({"step": done, "eval_loss": validate(s)})
            saved = cfg.save_interval and done % cfg.save_interval == 0 and done < s.total_steps
            if saved:
                save_checkpoint(s, run, done)
            if done < s.total_steps and should_stop():
                if not saved:
                    save_checkpoint(s, run, done)
                raise RunStopped(f"stopped at step {done} of {s.total_steps} on request; "
                                 f"checkpoint step-{done:06d} kept (continue with --resume {run.run_id})")
    return last


def validate(s: Setup) -> float:
    """Mean held-out loss per supervised token, in fixed order (no shuffling, no packing)."""
    import torch

    from tunix_rt.train.data import collate

    if not s.eval_examples:
        return float("nan")
    s.model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(s.eval_examples), s.cfg.batch_size):
            b = collate([[ex] for ex in s.eval_examples[i:i + s.cfg.batch_size]], s.stream.pad_id)
            total += float(batch_loss_sum(s.model, s.head, on_device(b, s.device), s.cfg))
            n += b.n_supervised
    s.model.train()
    return total / n


def save_checkpoint(s: Setup, run: RunDir, step: int) -> Path:
    meta = {"engine": "torch", "model_sha256": s.facts["model"]["sha256"],
            "dataset_sha256": s.facts["dataset"]["sha256"], "method": s.cfg.method}
    return checkpoint.save(run.path, step, s.trainable, s.optimizer, s.stream.position, s.cfg, meta,
                           s.cfg.keep_checkpoints)


def restore(s: Setup, run: RunDir) -> int:
    """Continue from the newest committed checkpoint of the run (0 when there is none)."""
    ckpt = checkpoint.latest(run.path)
    if ckpt is None:
        return 0
    expect = {"model_sha256": s.facts["model"]["sha256"], "dataset_sha256": s.facts["dataset"]["sha256"]}
    r = checkpoint.load(ckpt, s.trainable, s.optimizer, expect)
    s.stream.position = r.position
    return r.step


# --------------------------------------------------------------------------- outputs

def write_final(s: Setup, run: RunDir) -> dict[str, str]:
    """final/adapter (LoRA, PEFT format) and final/merged (HF layout: merged LoRA on request,
    or the fully fine-tuned model), each written to a temp dir and renamed."""
    out: dict[str, str] = {}
    final = run.path / "final"
    final.mkdir(exist_ok=True)
    if s.cfg.method == "lora":
        out["adapter"] = str(atomic_dir(final / "adapter", lambda d: s.model.save_pretrained(d, safe_serialization=True)))
    if s.cfg.method == "full" or s.cfg.merge:
        model = s.model.merge_and_unload() if s.cfg.method == "lora" else s.model
        out["merged"] = str(atomic_dir(final / "merged", lambda d: _save_hf(model, s.model_dir, d)))
    return out


def _save_hf(model, model_dir: Path, target: Path) -> None:
    model.save_pretrained(target, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model_dir / name).is_file():
            shutil.copyfile(model_dir / name, target / name)


# --------------------------------------------------------------------------- summary

def summary(s: Setup, predicted: dict[str, Any]) -> dict[str, Any]:
    """The pre-run summary: sizes, dtype, first batch shapes, tokens per step, predicted peak."""
    first = BatchStream(s.stream.examples, s.cfg.batch_size, s.cfg.max_seq_len, s.cfg.packing,
                        s.cfg.seed, s.stream.pad_id, s.stream.position).next_batch()
    return {
        "params": sum(p.numel() for p in s.model.parameters()),
        "trainable_params": sum(p.numel() for p in s.trainable.values()),
        "method": s.cfg.method, "dtype": s.cfg.dtype, "loss_impl": s.cfg.loss_impl,
        "first_batch_shape": list(first.input_ids.shape),
        "first_batch_supervised_tokens": first.n_supervised,
        "max_tokens_per_step": s.cfg.tokens_per_step,
        "total_steps": s.total_steps,
        "train_examples": len(s.stream.examples),
        "dropped_overlong": s.facts["dataset"]["dropped_overlong"],
        **predicted,
    }


def check_plan(cfg: TrainConfig, device) -> dict[str, Any]:
    """Ask the memory plan (tunix_rt.plan, when present) and refuse a run predicted not to fit."""
    import importlib.util

    if importlib.util.find_spec("tunix_rt.plan") is None:
        return {"predicted_peak": "memory plan not available (tunix_rt.plan missing)"}
    from tunix_rt.plan import plan_train

    plan = plan_train(cfg, device.type, 1)
    if not plan.fits and not cfg.force:
        raise BadInput(f"the memory plan predicts this run does not fit:\n{plan.render()}\n"
                       "change the config as suggested, or pass --force to run anyway")
    return {"predicted_peak_bytes": int(plan.peak_bytes_per_device), "capacity_bytes": int(plan.capacity_bytes),
            "plan_fits": bool(plan.fits)}


# --------------------------------------------------------------------------- entry point

def train(cfg: TrainConfig, home: Home, resume: str | None = None,
          should_stop: Callable[[], bool] = never) -> Path:
    """Train with PyTorch; returns the run directory. `resume` is a run id or directory;
    `should_stop` is polled after every step (the job worker's cancel hook)."""
    from rich.console import Console

    console = Console(stderr=True)
    require_torch()
    device = resolve_device(cfg)
    predicted = check_plan(cfg, device)
    tune_cpu_allocator(device)
    run = open_run(cfg, home, resume, "torch")
    with run.recording():
        s = setup(cfg, home, device)
        start = restore(s, run)
        facts = device_facts(device)
        info = summary(s, predicted)
        _print_summary(console, run, facts, info, start)
        run.update(device=facts, summary=info, dataset=s.facts["dataset"], model=s.facts["model"],
                   **({"resumed_from_step": start} if start else {}))
        log = MetricsLog(run.path, start)
        try:
            last = fit(s, run, log, start, should_stop) if start < s.total_steps else {}
            eval_loss = validate(s)
            if math.isfinite(eval_loss):
                log.log({"step": s.total_steps, "eval_loss": eval_loss})
        finally:
            log.close()
        if start < s.total_steps:
            save_checkpoint(s, run, s.total_steps)
        outputs = write_final(s, run)
        plot_loss(run.path)
        run.update(outputs=outputs, final=_final_metrics(run.path, last, eval_loss))
    return run.path


def _final_metrics(run_dir: Path, last: dict, eval_loss: float) -> dict[str, Any]:
    from tunix_rt.train.run import METRICS, read_jsonl

    rows = [r for r in read_jsonl(run_dir / METRICS) if "loss" in r]
    out = {"steps": rows[-1]["step"], "first_loss": rows[0]["loss"], "last_loss": rows[-1]["loss"],
           "peak_mem_bytes": max(r["peak_mem_bytes"] for r in rows)}
    if math.isfinite(eval_loss):
        out["eval_loss"] = eval_loss
    return out



def _print_summary(console, run: RunDir, facts: dict, info: dict, start: int) -> None:
    gib = 2 ** 30
    mem = ", ".join(f"{m / gib:.1f} GiB" for m in facts["memory_bytes"])
    console.print(f"[bold]run[/bold] {run.run_id}" + (f" (resuming after step {start})" if start else ""))
    console.print(f"device: {facts['platform']} x{facts['count']} ({', '.join(facts['names'])}; {mem})")
    console.print(f"params {info['params']:,}, trainable {info['trainable_params']:,} ({info['method']}, "
                  f"{info['dtype']}, loss {info['loss_impl']})")
    console.print(f"examples {info['train_examples']} (dropped as too long: {info['dropped_overlong']}), "
                  f"first batch {info['first_batch_shape']}, <= {info['max_tokens_per_step']} tokens/step, "
                  f"{info['total_steps']} steps")
    peak = info.get("predicted_peak_bytes")
    console.print(f"predicted peak memory: {peak / gib:.2f} GiB" if peak else info["predicted_peak"])
