"""The PyTorch engine: LoRA (PEFT) or full fine-tuning, CPU or CUDA.

It implements train.engine.Engine; the driver decides the order of things. Three choices
carry the step:
- the loss never builds [B, L, V] logits: the decoder returns hidden states and
  `loss.token_objective` applies the head chunk by chunk over positions with a target;
- gradient accumulation sums micro-batch losses whose per-token coefficients were normalised
  over the whole window (by the method), so the gradient is the same however it is split;
- everything that decides the next step (weights, optimizer, RNG) goes into the checkpoint
  (with the driver's data position), so a killed run resumes bit-exactly.

Under torchrun (train.dist) every process receives the same global micro-batches and trains
on its block of rows (data.process_rows): LoRA through DDP, full fine-tuning through FSDP2
(`fully_shard` on every decoder layer and on the whole). The coefficients are normalised over
the global window, so the loss is a global *sum*: gradients are summed across processes, not
averaged, and N processes equal one at the same global batch. Checkpoints and exports hold
full (gathered) tensors written by process 0, the same files whatever the process count;
each process's RNG stream goes into state.json.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tunix_rt.devices import torch_device
from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.rundir import ADAPTER, MERGED
from tunix_rt.train import dist
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.engine import NLL, Objective, StepResult
from tunix_rt.train.faults import fault_point


class TorchEngine:
    name: ClassVar[str] = "torch"

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.device = None
        self.model = None
        self.module = None  # loss.ObjectiveModule: the model and its objective (FSDP2: sharded)
        self.step_module = None  # what a training step calls: the module, or DDP around it
        self.trainable: dict[str, Any] = {}
        self.optimizer = None
        self.model_dir: Path | None = None
        self.tok = None
        self._reference = None  # finetune=full: the frozen starting weights (loaded at the first reference pass)

    def check_model(self, model_dir: Path) -> None:
        """Nothing to refuse here: PEFT targets any subset of the projections, and the plan
        has checked the LoRA rank."""

    # ------------------------------------------------------------------ devices
    def devices(self) -> dict[str, Any]:
        import torch

        from tunix_rt.evidence import cpu_facts
        from tunix_rt.heap import allocator, tune_cpu_allocator
        from tunix_rt.train import cpu_kernels
        from tunix_rt.train.common import check_dtype
        from tunix_rt.train.cpu_matmul import backend as matmul_backend
        from tunix_rt.train.tree_attention import enabled as tree_attention

        self.device = torch_device(self.cfg.device, dist.local_rank())  # torchrun: one GPU per process
        check_dtype(self.cfg, self.device.type)
        if self.device.type == "cpu":
            tune_cpu_allocator()  # before the weights are loaded
            import psutil

            return {"platform": "cpu", "count": 1, "names": [cpu_facts()["model"]],
                    "memory_bytes": [int(psutil.virtual_memory().total)], "threads": torch.get_num_threads(),
                    "processes": dist.world(), "allocator": allocator(), "matmul": matmul_backend(),
                    # where Gemma's norms, RoPE and gelu*up ran: one C pass each (train.cpu_kernels), or torch's ops
                    "elementwise": "c" if cpu_kernels.library() is not None else "torch",
                    # how shared-prompt rows attend (train.tree_attention): as a tree, or under a dense mask
                    "shared_attention": "tree" if tree_attention() else "dense"}
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        return {"platform": "cuda", "count": len(props), "names": [p.name for p in props],
                "memory_bytes": [int(p.total_memory) for p in props], "used_index": self.device.index or 0,
                "processes": dist.world(), "shared_attention": "tree" if tree_attention() else "dense"}

    # ------------------------------------------------------------------ setup
    def setup(self, model_dir: Path, tok) -> dict[str, Any]:
        import torch

        from tunix_rt.train.loss import ObjectiveModule

        self.model_dir, self.tok = Path(model_dir), tok
        attn = attention_of(self.model_dir)
        self.model = load_model(self.cfg, self.model_dir, self.device, attn)
        self.module = ObjectiveModule(self.model, self.cfg.loss_impl, self.cfg.loss_chunk_bytes, attn=attn)
        self.step_module = parallelize(self.module, self.cfg, self.device)
        self.trainable = {n: p for n, p in self.model.named_parameters() if p.requires_grad}  # FSDP2: shards
        params = list(self.trainable.values())
        if self.cfg.optimizer == "adafactor":
            self.optimizer = torch.optim.Adafactor(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        else:
            self.optimizer = torch.optim.AdamW(params, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)
        return {"params": sum(p.numel() for p in self.model.parameters()),
                "trainable_params": sum(p.numel() for p in params)}

    def load_teacher(self, model_dir: Path):
        """A frozen model beside the trained one, on its device in its dtype, no gradient
        (a distillation objective's teacher: train.kd_loss.Teacher)."""
        from tunix_rt.models.hf import load_causal_lm
        from tunix_rt.train.kd_loss import Teacher

        model = load_causal_lm(model_dir, dtype=self.cfg.dtype, device="cpu", attn=attention_of(Path(model_dir)))
        return Teacher(model.to(self.device))

    def shares_prefix(self) -> bool:
        """One process only: a process's share of a batch is whole rows (data.process_rows),
        and a shared-prefix row holds a whole group, so several processes would idle."""
        from tunix_rt.train.loss import SHARED_PREFIX_ATTENTION

        return dist.world() == 1 and self.module.attn in SHARED_PREFIX_ATTENTION

    def sequence_objective(self) -> bool:
        """One process (a micro-batch's pairs whole here) and the chunked loss."""
        return dist.world() == 1 and self.cfg.loss_impl == "chunked"

    @property
    def head_weight(self):
        return self.module.head()

    @property
    def softcap(self) -> float | None:
        return self.module.softcap()

    # ------------------------------------------------------------------ the step
    def train_step(self, batches: list, objective: Objective, lr: float) -> StepResult:
        import torch

        from tunix_rt.train.data import process_rows, window_digest
        from tunix_rt.train.loss import STAT_NAMES

        dist.check_same(lambda: window_digest(batches), "the step's global batches")
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total, stats = 0.0, torch.zeros(len(STAT_NAMES))
        for i, b in enumerate(batches):
            with self._gradient_sync(i + 1 == len(batches)):
                loss, st = self.step_module(tensors(process_rows(b, dist.rank(), dist.world()), self.device),
                                            objective)
                loss.backward()
            total += float(loss.detach())
            stats += st.detach().cpu()
            if i + 1 < len(batches):
                fault_point("accum")
        total, *summed = dist.all_sum([total, *stats.tolist()], "the step's loss")
        params = list(self.trainable.values())
        clip = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, clip)  # of the summed gradients
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        # a distillation objective (train.distill) names its own statistics
        names = getattr(objective, "stat_names", STAT_NAMES if objective.kind == "policy" else ())
        named = dict(zip(names, summed))
        return StepResult(total, float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm), named)

    def _gradient_sync(self, sync: bool):
        """Let DDP / FSDP2 reduce the gradients on the last micro-batch of a step only."""
        if dist.world() == 1:
            return contextlib.nullcontext()
        if hasattr(self.step_module, "no_sync"):  # DDP
            return contextlib.nullcontext() if sync else self.step_module.no_sync()
        self.step_module.set_requires_gradient_sync(sync)  # FSDP2
        return contextlib.nullcontext()

    def objective_sum(self, batch, objective: Objective):
        """sum_t coef_t * phi_t of one whole micro-batch (and its statistics), with autograd."""
        return self.module(tensors(batch, self.device), objective)

    def loss_sum(self, batch) -> float:
        import torch

        from tunix_rt.train.data import process_rows

        with torch.no_grad(), self._eval_mode():
            loss, _ = self.module(tensors(process_rows(batch, dist.rank(), dist.world()), self.device), NLL)
        return dist.all_sum([float(loss)], "held-out loss")[0]

    def token_logprobs(self, batch, adapter: bool = True) -> np.ndarray:
        """The whole batch on every process (no gather; under FSDP2 each gathers the weights)."""
        import torch

        from tunix_rt.train.data import IGNORE

        t = tensors(batch, self.device)
        module = self.module
        if not adapter and self.cfg.finetune == "full":  # the reference policy: the starting weights
            module = self.reference_module()
        off = self.model.disable_adapter() if (not adapter and hasattr(self.model, "disable_adapter")) \
            else contextlib.nullcontext()
        with torch.no_grad(), self._eval_mode(), off:
            lp = module(t, logprobs=True)
        out = np.zeros(batch.labels.shape, np.float32)
        out[np.asarray(batch.labels) != IGNORE] = lp.cpu().numpy()
        return out

    def reference_module(self):
        """finetune=full's reference policy: the model the run started from (model_dir: the base,
        or the `init` run's merged model; a resumed run reads it there too, never a checkpoint),
        frozen, built as the trained one is (the fused MLPs, the products' library: at step 0 its
        log-probs are the policy's to the bit), on every process whole; loaded once, at the first
        reference pass, without touching the RNG streams a checkpoint holds."""
        if self._reference is None:
            from tunix_rt.models.hf import load_causal_lm
            from tunix_rt.train.cpu_matmul import route_linears
            from tunix_rt.train.fused_mlp import fuse_gated_mlps
            from tunix_rt.train.fused_norm import fuse_norms
            from tunix_rt.train.loss import ObjectiveModule

            model = load_causal_lm(self.model_dir, dtype=self.cfg.dtype, device=str(self.device.type),
                                   attn=self.module.attn)
            fuse_gated_mlps(model)
            fuse_norms(model)
            route_linears(model)
            model.requires_grad_(False).eval()
            self._reference = ObjectiveModule(model, self.cfg.loss_impl, self.cfg.loss_chunk_bytes,
                                              attn=self.module.attn)
        return self._reference

    @contextlib.contextmanager
    def _eval_mode(self):
        was = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was)

    def generator(self):
        """The eval generator on the current weights. A LoRA model decodes with its adapters
        live (`decode_model`): the lean decode step and its int8-screened head apply, nothing
        is merged or copied, and the trained parameters are never modified."""
        return _LiveGenerator(self)

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: Path) -> dict[str, Any]:
        """Every process calls it: the full weights and optimizer state (gathered from the
        shards under FSDP2) are written by process 0; each process's RNG goes to state.json."""
        from safetensors.torch import save_file

        weights, optim = self._full_state()
        rngs = [json.loads(r) for r in dist.gather_texts(json.dumps(torch_rng()), "RNG streams")]
        if dist.is_main():
            save_file(weights, str(directory / "weights.safetensors"))
            tensors_, meta = flatten_optimizer(optim, list(self.trainable))
            save_file(tensors_, str(directory / "optimizer.safetensors"))
            (directory / "optimizer.json").write_text(json.dumps(meta))
        rng = {"torch": rngs[0], **({"torch_processes": rngs} if len(rngs) > 1 else {})}
        return {"rng": rng, "files": ["weights.safetensors", "optimizer.safetensors", "optimizer.json"]}

    def _full_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(trainable weights as CPU tensors, optimizer state dict keyed by parameter index);
        under FSDP2 gathered onto process 0 (empty elsewhere)."""
        if not is_sharded(self.module):
            return ({k: v.detach().contiguous().cpu() for k, v in self.trainable.items()},
                    self.optimizer.state_dict())
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)

        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(self.model, options=full)
        optim = get_optimizer_state_dict(self.model, self.optimizer, options=full)
        if not dist.is_main():
            return {}, {}
        return {k: weights[k].contiguous() for k in self.trainable}, by_index(optim, list(self.trainable))

    def restore(self, directory: Path, state: dict[str, Any]) -> None:
        """Every process reads the checkpoint (the run directory is on a filesystem they all
        see) and takes its shard under FSDP2."""
        import torch
        from safetensors.torch import load_file

        weights = load_file(str(directory / "weights.safetensors"))
        if set(weights) != set(self.trainable):
            missing, extra = sorted(set(self.trainable) - set(weights)), sorted(set(weights) - set(self.trainable))
            raise TunixRtError(f"{directory}: weights do not match the model (missing {missing[:3]}, extra {extra[:3]})")
        meta = json.loads((directory / "optimizer.json").read_text())
        if meta["param_names"] != list(self.trainable):
            raise TunixRtError(f"{directory}: optimizer parameter order differs from the model's")
        optim = unflatten_optimizer(load_file(str(directory / "optimizer.safetensors")), meta)
        rngs = state["rng"].get("torch_processes", [state["rng"]["torch"]])
        if len(rngs) != dist.world():
            raise BadInput(f"{directory} was written by {len(rngs)} process(es) and this run has {dist.world()}: "
                           "resume with as many (each process's RNG stream is in the checkpoint)")
        if is_sharded(self.module):
            from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                                 set_optimizer_state_dict)

            full = StateDictOptions(full_state_dict=True, strict=False)
            set_model_state_dict(self.model, weights, options=full)
            set_optimizer_state_dict(self.model, self.optimizer, by_name(optim, list(self.trainable)), options=full)
        else:
            with torch.no_grad():
                for name, p in self.trainable.items():
                    p.copy_(weights[name])
            self.optimizer.load_state_dict(optim)
        restore_torch_rng(rngs[dist.rank()])

    # ------------------------------------------------------------------ outputs
    def export(self, final_dir: Path) -> dict[str, str]:
        """Process 0 writes final/ (every process calls it: FSDP2 gathers the weights)."""
        from tunix_rt.train import export

        if is_sharded(self.module):
            return self._export_sharded(final_dir)
        out: dict[str, str] = {}
        if not dist.is_main():
            return out
        if self.cfg.finetune == "lora":
            out[ADAPTER] = str(export.publish(final_dir / ADAPTER,
                                              lambda d: self.model.save_pretrained(d, safe_serialization=True)))
        if self.cfg.finetune == "full" or self.cfg.merge:
            model = self.model.merge_and_unload() if self.cfg.finetune == "lora" else self.model
            out[MERGED] = str(export.publish(final_dir / MERGED,
                                             lambda d: export.save_hf(model, self.model_dir, d)))
        return out

    def _export_sharded(self, final_dir: Path) -> dict[str, str]:
        """final/merged of an FSDP2 (full fine-tuning) run: the full state dict gathered onto
        process 0, saved there in HF layout."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from tunix_rt.train import export

        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not dist.is_main():
            return {}
        tied = ({n for n, _ in self.model.named_parameters(remove_duplicate=False)}
                - {n for n, _ in self.model.named_parameters()})  # the head, when tied to the embedding
        full = {k: v for k, v in full.items() if k not in tied}
        return {MERGED: str(export.publish(final_dir / MERGED,
                                           lambda d: export.save_hf(self.model, self.model_dir, d, full)))}

    def peak_memory_bytes(self) -> int:
        import torch

        from tunix_rt.files import peak_rss_bytes

        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return peak_rss_bytes()


# --------------------------------------------------------------------------- helpers

class _LiveGenerator:
    """eval.generate.Generator over the engine's model as it is now: rollouts and in-run
    evals, the projections through the kernel library's fp32 product where it applies
    (eval.fast_gemma.LeanGemma.f32_kernel: about twice torch's speed at a decode step's few
    rows; the same policy to float rounding, the update's log-probabilities computed anew
    by its own forward)."""

    def __init__(self, engine: TorchEngine):
        self.engine = engine

    def generate(self, prompts, cfg, on_tokens=None):
        from tunix_rt.eval.generate import TorchGenerator

        e = self.engine
        with e._eval_mode(), gathered(e.module):
            return TorchGenerator(decode_model(e.model), e.tok, str(e.device.type),
                                  f32_kernel=True).generate(prompts, cfg, on_tokens)


def decode_model(model):
    """The transformers model a generator decodes with: a PEFT model's base model, whose
    projections still carry the live LoRA layers (the lean decode step applies each adapter
    as PEFT's forward does, eval.fast_gemma.LoraWeight: no merged copy of the weights);
    any other model as it is."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def parallelize(module, cfg: TrainConfig, device):
    """What a training step calls: the module itself in one process; under torchrun, DDP
    around it (LoRA: the adapter is small, every process keeps all of it) or the module
    sharded with FSDP2 (full fine-tuning: each decoder layer, then the rest). Either way the
    gradients are summed across processes (the coefficients already hold the global
    normaliser)."""
    if dist.world() == 1:
        return module
    dist.check_same(lambda: weights_digest(module), "the initial trainable weights")
    if cfg.finetune == "full":
        from torch.distributed.fsdp import FSDPModule, fully_shard

        for layer in module.base().model.layers:
            fully_shard(layer)
        fully_shard(module)
        for m in module.modules():
            if isinstance(m, FSDPModule):
                m.set_gradient_divide_factor(1.0)
                m.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
        _first_forward(module, device)
        return module
    from torch.nn.parallel import DistributedDataParallel

    # Every process built the same weights (checked above), so DDP's broadcast of module
    # state is not needed, and it would be wrong: it matches buffers by position, and
    # transformers' Gemma 3 registers its two RoPE inv_freq buffers in set order, which
    # differs between processes (string hash seeds): measured, it swapped them on rank 1.
    ddp = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                  init_sync=False, forward_sync_buffers=False)
    ddp.register_comm_hook(None, _sum_gradients)
    return ddp


def _first_forward(module, device) -> None:
    """One no-grad forward of a 2-token row without labels: FSDP2 sets up its root on the
    first forward, and generation (GRPO's rollouts) unshards the layers before any step.
    The root keeps its weights gathered after a forward: resharded here, so that the
    optimizer is built on the sharded parameters."""
    import torch

    t = {"input_ids": torch.zeros((1, 2), dtype=torch.long, device=device),
         "labels": torch.full((1, 2), -100, dtype=torch.long, device=device),
         "position_ids": torch.arange(2, device=device)[None], "coef": torch.zeros((1, 2), device=device)}
    with torch.no_grad():
        module(t, NLL)
    module.reshard()


def _sum_gradients(_state, bucket):
    """DDP communication hook: all-reduce SUM (DDP's default divides by the process count)."""
    import torch.distributed as td

    fut = td.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def weights_digest(module) -> str:
    """sha256 of the trainable parameters, by name."""
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, p in sorted(module.named_parameters()):
        if p.requires_grad:
            h.update(name.encode())
            h.update(p.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def is_sharded(module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


@contextlib.contextmanager
def gathered(module):
    """Under FSDP2: every layer's full weights in place for the duration (generation runs
    outside the module's forward, and its prefill through the layers must not free them
    again); nothing to do otherwise."""
    if not is_sharded(module):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    parts = [m for m in module.modules() if isinstance(m, FSDPModule)]
    layers = [m for m in parts if m is not module]  # the root keeps its own rule
    for m in parts:
        m.unshard()
    for m in layers:
        m.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for m in layers:
            m.set_reshard_after_forward(True, recurse=False)
        for m in parts:
            m.reshard()


def attention_of(model_dir: Path) -> str:
    """The attention implementation the model is trained with: sdpa cannot soft-cap attention
    logits (Gemma 2), so eager there, sdpa otherwise."""
    from transformers import AutoConfig

    hf_cfg = AutoConfig.from_pretrained(model_dir)
    return "eager" if getattr(hf_cfg, "attn_logit_softcapping", None) else "sdpa"


def load_model(cfg: TrainConfig, model_dir: Path, device, attn: str):
    """The HF causal LM, with a LoRA adapter (PEFT) or every weight trainable, loaded with
    the attention implementation `attn` (attention_of)."""
    import torch

    from tunix_rt.models.hf import load_causal_lm
    from tunix_rt.train.cpu_matmul import route_linears
    from tunix_rt.train.fused_mlp import fuse_gated_mlps
    from tunix_rt.train.fused_norm import fuse_norms
    from tunix_rt.train.recompute import keep_recipes, patch_modules

    model = load_causal_lm(model_dir, dtype=cfg.dtype, device=str(device.type), attn=attn)
    fuse_gated_mlps(model)  # Gemma's MLP keeps one [tokens, intermediate] tensor fewer for backward
    fuse_norms(model)  # Gemma's RMSNorm as one op each way on the CPU (train.cpu_kernels)
    torch.manual_seed(cfg.seed)  # LoRA initialisation is seeded
    if cfg.finetune == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=list(cfg.lora_targets), bias="none", task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    else:
        model.requires_grad_(True)
    route_linears(model)  # fp32 on an AVX-512 AMD CPU: oneDNN's products (train.cpu_matmul)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        patch_modules()  # nothing to remake, but RoPE as one op on the CPU (train.fused_rope)
    else:  # the projections' inputs remade in backward (gradient checkpointing remakes everything)
        keep_recipes(model)
    model.train()
    return model


def tensors(batch, device) -> dict[str, Any]:
    """The batch's arrays as torch tensors on `device` (sharing memory on the CPU)."""
    import torch

    from tunix_rt.train.data import coef_of

    out = {k: torch.as_tensor(getattr(batch, k), device=device) for k in ("input_ids", "labels", "position_ids")}
    out["coef"] = torch.as_tensor(coef_of(batch), device=device)
    out.update({k: torch.as_tensor(v, device=device) for k, v in batch.aux.items()})
    if batch.segments is not None:
        out["segments"] = torch.as_tensor(batch.segments, device=device)
    return out


def flatten_optimizer(sd: dict, names: list[str]) -> tuple[dict, dict]:
    """torch optimizer state dict → (tensors for safetensors, JSON for the rest)."""
    import torch

    tensors_, scalars = {}, {}
    for idx, st in sd["state"].items():
        for key, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors_[f"state.{idx}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(idx), {})[key] = value
    return tensors_, {"param_groups": sd["param_groups"], "scalars": scalars, "param_names": names}


def by_index(sd: dict, names: list[str]) -> dict:
    """An optimizer state dict keyed by parameter name (torch.distributed.checkpoint's) →
    keyed by index in `names` (torch's own, what the checkpoint files hold)."""
    index = {n: i for i, n in enumerate(names)}
    groups = [{**g, "params": [index[p] for p in g["params"]]} for g in sd["param_groups"]]
    return {"state": {index[n]: st for n, st in sd["state"].items()}, "param_groups": groups}


def by_name(sd: dict, names: list[str]) -> dict:
    """The inverse of by_index."""
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]]
    return {"state": {names[int(i)]: st for i, st in sd["state"].items()}, "param_groups": groups}


def unflatten_optimizer(tensors_: dict, meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, value in tensors_.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    for idx, st in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(st)
    return {"state": state, "param_groups": meta["param_groups"]}


def torch_rng() -> dict[str, Any]:
    """torch's CPU and CUDA generator states, base64 (they go into state.json)."""
    import torch

    def b64(t) -> str:
        return base64.b64encode(t.numpy().tobytes()).decode()

    out = {"cpu": b64(torch.get_rng_state())}
    if torch.cuda.is_available():
        out["cuda"] = [b64(s) for s in torch.cuda.get_rng_state_all()]
    return out


def restore_torch_rng(state: dict[str, Any]) -> None:
    import torch

    def tensor(s: str):
        return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)

    torch.set_rng_state(tensor(state["cpu"]))
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensor(s) for s in state["cuda"]])

