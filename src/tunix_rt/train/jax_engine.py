"""The JAX engine: the same runs as the PyTorch engine, on google-tunix's model code (CPU, GPU,
TPU, sharded over a mesh).

It implements train.engine.Engine; the driver decides the order of things. What it uses of
its libraries is public: Tunix's Gemma modules (loaded from the HF-layout directory by
`models.jax_loader`, through our own weight table), qwix (Q)LoRA, optax, flax.nnx's
split/merge. The step is ours:

- the model is split once into trainable parameters (LoRA factors, or every weight), the
  frozen rest and the RNG state; a jitted gradient function takes them with one micro-batch
  and returns the loss, the objective's statistics and the gradients (`train.jax_loss`: the
  fused chunked objective, never [B, L, V] logits); a jitted update clips, applies the
  optimizer and returns the new parameters and optimizer state. The update donates its
  inputs, and the frozen weights are never an output, so no step holds a second copy of
  the model (the 28.59 GiB failure of the system we replace was exactly that copy);
- gradient accumulation sums the micro-batch gradients of coefficients normalised over the
  whole window (by the method), so 8 x 1 equals 1 x 8, as in the torch engine;
- every batch is right-padded to a width bucket (one compilation per bucket) and sharded
  over the mesh's fsdp axis by rows when they divide;
- checkpoints (train.checkpoint's contract) hold the trainable weights, the optimizer state
  and the RNG state as safetensors, by tree path: a killed run resumes bit-exactly.

Several processes (train.dist: JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID):
the mesh spans every process's devices and the arrays are global. Every process builds the
same global micro-batches and puts its devices' shards of them on the mesh
(make_array_from_callback), so the step, its normaliser and the data order are the one-process
run's. Checkpoints and exports gather the state (every process joins) and process 0 writes
the same files as one process. Methods that sample (GRPO, rft, dpo on rollouts, on-policy distill)
run in one process only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.jax_devices import (check_mesh_spans_processes, device_facts, maybe_init_distributed,
                                  peak_memory_bytes, select_devices)
from tunix_rt.models.jax_loader import place
from tunix_rt.rundir import ADAPTER, MERGED
from tunix_rt.train import dist
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.engine import NLL, Objective, StepResult
from tunix_rt.train.methods import sampling

#: batch widths are rounded up to a multiple of this (one compilation per width)
WIDTH_BUCKET = 64


def width_bucket(n: int) -> int:
    """The width a batch of n tokens a row is padded to: the next multiple of WIDTH_BUCKET
    (one compiled step per bucket)."""
    return -(-n // WIDTH_BUCKET) * WIDTH_BUCKET


WEIGHTS, OPTIMIZER, RNG = "weights.safetensors", "optimizer.safetensors", "rng.safetensors"


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


#: folded into the run seed's key for LoRA dropout's RNG stream (b"drop")
DROPOUT_STREAM = 0x64726F70


def apply_lora(model, cfg: TrainConfig, tcfg, dropout: float | None = None):
    """qwix LoRA (QLoRA when lora_weight_qtype is set) on the targeted projections."""
    import qwix
    from flax import nnx

    extra = {}
    if cfg.lora_weight_qtype:
        extra = {"weight_qtype": cfg.lora_weight_qtype,
                 "tile_size": _tile(tcfg.embed_dim, tcfg.hidden_dim, tcfg.head_dim)}
    provider = qwix.LoraProvider(
        module_path=lora_module_path(cfg, tcfg.num_heads, tcfg.num_kv_heads),
        rank=cfg.lora_rank, alpha=cfg.lora_alpha, dropout=cfg.lora_dropout if dropout is None else dropout,
        **extra,
    )
    # qwix makes the factors in one eager call of the model: stopped at the hidden states
    # (jax_loader's return_hidden), that call never forms the head's logits from the [V, D]
    # embedding's transposed copy (the load's peak RSS on Gemma 3 270M: 2.15 -> 1.52 GiB)
    model = qwix.apply_lora_to_model(model, provider, rngs=nnx.Rngs(cfg.seed), **model.get_model_input(),
                                     return_hidden=True)
    if cfg.lora_dropout > 0:
        # qwix unsets the modules' rngs once the LoRA weights exist ("set it yourself for LoRA
        # dropout"): without them every dropout call raises. Set whenever the config has dropout,
        # also on the dropout-free structure (dropout=0.0), so both hold the same state.
        import jax

        # a stream of its own: nnx.Rngs(cfg.seed) drew the LoRA factors from fold_in(key(seed), i)
        model.set_attributes(qwix_rngs=nnx.Rngs(dropout=jax.random.fold_in(jax.random.key(cfg.seed), DROPOUT_STREAM)))
    return model


def _tile(*dims: int) -> int:
    """Quantisation tile along contracting axes (width, MLP width, head_dim): the largest
    power of two up to 256 that divides them all."""
    return next(t for t in (256, 128, 64, 32, 16, 8, 4, 2, 1) if all(d % t == 0 for d in dims))


def make_optimizer(cfg: TrainConfig):
    """optax at unit learning rate (the step scales the update by the driver's lr, as torch's
    optimizers do: AdamW's decoupled decay and Adafactor's update are both lr * (...)),
    after clipping the global gradient norm to cfg.grad_clip."""
    import optax

    if cfg.optimizer == "adafactor":
        opt = optax.adafactor(learning_rate=1.0, weight_decay_rate=cfg.weight_decay or None)
    else:
        opt = optax.adamw(1.0, b1=0.9, b2=0.999, eps=1e-8, weight_decay=cfg.weight_decay)
    if cfg.grad_clip > 0:
        opt = optax.chain(optax.clip_by_global_norm(cfg.grad_clip), opt)
    return opt


def param_counts(model, finetune: str) -> dict[str, int]:
    """Parameters of the model and how many of them train (LoRA factors, or all)."""
    import jax
    from flax import nnx

    def count(kind) -> int:  # a QLoRA weight counts once (its qvalue), not its quantisation scales
        return sum(x.size for path, var in nnx.to_flat_state(nnx.state(model, kind))
                   if tuple(map(str, path[-2:])) not in (("array", "scale"), ("array", "zero_point"))
                   for x in jax.tree.leaves(var))
    lora = count(nnx.LoRAParam)
    total = count(nnx.Param)
    return {"params": total - lora, "trainable_params": lora if finetune == "lora" else total}


def make_grad_fn(graph, cfg: TrainConfig, objective: Objective):
    """The step's jitted gradient of one micro-batch: (params, rngs, rest, batch) -> (loss,
    statistics, rngs, gradients). The engine's, and what plan.xla lowers with abstract shapes."""
    import jax
    from flax import nnx

    from tunix_rt.train.jax_loss import hidden_states, head_of, plain_objective, token_objective
    from tunix_rt.train.chunking import chunk_tokens

    impl, chunk_bytes = cfg.loss_impl, cfg.loss_chunk_bytes

    def loss_of(params, rngs, rest, b):
        # value_and_grad passes the undifferentiated rngs through as the jit level's Variables,
        # which nnx refuses to advance inside its trace (LoRA dropout draws): fresh ones here
        rngs = jax.tree.map(lambda x: x, rngs)
        model = nnx.merge(graph, params, rngs, rest)
        h = hidden_states(model, b["ids"], b["pos"], b["attn"])
        emb, softcap = head_of(model)
        if objective.kind == "distill":  # the teacher's whole distribution: train.jax_kd_loss
            from tunix_rt.train.jax_kd_loss import distill_loss

            loss, stats = distill_loss(h, emb, softcap, b, objective, impl, chunk_tokens(chunk_bytes, emb.shape[0]))
        elif impl == "plain":
            loss = plain_objective(h, emb, b["targets"], b["coef"], b["mask"], b["aux"], softcap, objective)
            stats = jax.numpy.zeros(4, jax.numpy.float32)
        else:
            loss, stats = token_objective(h, emb, b["targets"], b["coef"], b["mask"], b["aux"],
                                          chunk_tokens(chunk_bytes, emb.shape[0]), softcap, objective)
        return loss, (stats, nnx.state(model, nnx.RngState))

    def grad(params, rngs, rest, b):
        (loss, (stats, rngs)), g = jax.value_and_grad(loss_of, has_aux=True)(params, rngs, rest, b)
        return loss, stats, rngs, g

    return jax.jit(grad)


def make_update_fn(tx, donate: tuple[int, ...] = (0, 1)):
    """The step's jitted update: (params, opt_state, grads, lr) -> (params, opt_state, grad
    norm), donating the parameters and the optimizer state (plan.xla also lowers it donating
    only the optimizer state, as Tunix's own PeftTrainer does)."""
    import jax
    import optax

    def update(params, opt_state, grads, lr):
        norm = optax.tree.norm(grads)
        updates, opt_state = tx.update(grads, opt_state, params)
        updates = jax.tree.map(lambda u: (u * lr).astype(u.dtype), updates)
        return optax.apply_updates(params, updates), opt_state, norm

    return jax.jit(update, donate_argnums=donate)


# --------------------------------------------------------------------------- the engine

class JaxEngine:
    name: ClassVar[str] = "jax"

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.devs: list = []
        self.mesh = None
        self.model_dir: Path | None = None
        self.tok = None
        self.family = ""
        self.graph = None  # the model's structure, as trained
        self.eval_graph = None  # the same with LoRA dropout off (evaluation, rollouts)
        self.params = None  # trainable (nnx.State)
        self.rngs = None  # RNG state (LoRA dropout)
        self.rest = None  # frozen weights and everything else
        self.tx = None
        self.opt_state = None
        self._fns: dict[Any, Any] = {}
        self._reference = None  # finetune=full: the frozen starting weights (loaded at the first reference pass)
        self._generator = None  # eval.jax_generate.JaxGenerator, made on first use

    # ------------------------------------------------------------------ devices
    def devices(self) -> dict[str, Any]:
        from tunix_rt.heap import allocator, tune_cpu_allocator
        from tunix_rt.train.common import check_dtype

        maybe_init_distributed()
        if dist.world() > 1 and sampling(self.cfg) is not None:  # GRPO, rft, dpo on rollouts, on-policy distill
            raise BadInput(f"method={self.cfg.method} samples from the model it trains, and on the JAX engine runs in "
                           "one process; multi-process JAX training supports method=sft (or use --engine torch under "
                           "torchrun)")
        self.devs = select_devices(self.cfg.device)
        if dist.world() > 1:
            check_mesh_spans_processes(self.cfg.mesh, self.devs)
        facts = device_facts(self.devs)
        check_dtype(self.cfg, facts["platform"])
        if facts["platform"] == "cpu":
            tune_cpu_allocator()  # before the weights are loaded
            facts["allocator"] = allocator()
        return facts

    # ------------------------------------------------------------------ setup
    def check_model(self, model_dir: Path) -> None:
        """LoRA targets that Tunix's Gemma fuses (k and v, or q, k and v) go together."""
        from tunix_rt.models.jax_loader import read_hf_config

        if self.cfg.finetune == "lora":
            hf = read_hf_config(model_dir)
            lora_module_path(self.cfg, int(hf["num_attention_heads"]), int(hf["num_key_value_heads"]))

    def setup(self, model_dir: Path, tok) -> dict[str, Any]:
        import jax
        from flax import nnx

        from tunix_rt.models.jax_loader import family_of, load_model, make_mesh, read_hf_config

        cfg = self.cfg
        self.model_dir, self.tok = Path(model_dir), tok
        self.family = family_of(read_hf_config(model_dir))
        self.mesh = make_mesh(cfg.mesh, self.devs)
        with jax.set_mesh(self.mesh):
            model, tcfg = load_model(model_dir, self.mesh, cfg.dtype, remat=cfg.gradient_checkpointing)
            if cfg.finetune == "lora":
                model = apply_lora(model, cfg, tcfg)
                # qwix creates the LoRA weights in one eager call of the model: the executables
                # of its eager ops stay cached (0.2 GB of RSS on Gemma 3 270M) and are not used again
                jax.clear_caches()
            counts = param_counts(model, cfg.finetune)
            kind = nnx.LoRAParam if cfg.finetune == "lora" else nnx.Param
            self.graph, self.params, self.rngs, self.rest = nnx.split(model, kind, nnx.RngState, ...)
            self.eval_graph = self.graph
            if cfg.finetune == "lora" and cfg.lora_dropout > 0:
                self.eval_graph = self._graph_without_dropout(model_dir, tcfg)
            self.tx = make_optimizer(cfg)
            self.opt_state = jax.jit(self.tx.init)(self.params)
        return {**counts, "mesh": dict(self.mesh.shape)}

    def _graph_without_dropout(self, model_dir: Path, tcfg):
        """qwix applies LoRA dropout on every call (it has no eval mode): evaluation and
        rollouts run through the same parameters in a structure built with dropout 0."""
        import jax
        from flax import nnx

        from tunix_rt.models.jax_loader import layer_types, model_class, read_hf_config

        cls = model_class(self.family, layer_types(read_hf_config(model_dir)))
        abstract = nnx.eval_shape(lambda: apply_lora(cls(tcfg, rngs=nnx.Rngs(params=0)), self.cfg, tcfg, dropout=0.0))
        graph, params, rngs, rest = nnx.split(abstract, nnx.LoRAParam, nnx.RngState, ...)
        if [jax.tree.structure(x) for x in (params, rngs, rest)] != \
                [jax.tree.structure(x) for x in (self.params, self.rngs, self.rest)]:
            raise TunixRtError("the dropout-free LoRA model has another state structure")
        return graph

    def model(self):
        """The model (nnx) on the current weights, LoRA dropout off: shares their buffers."""
        from flax import nnx

        return nnx.merge(self.eval_graph, self.params, self.rngs, self.rest)

    # ------------------------------------------------------------------ the step
    def _fn(self, key, build):
        if key not in self._fns:
            self._fns[key] = build()
        return self._fns[key]

    def gradients(self, batches: list, objective: Objective):
        """(summed loss, summed statistics [4], summed gradients) of a window of micro-batches,
        nothing applied (train_step's first half; the accumulation tests compare it)."""
        import jax
        import jax.numpy as jnp

        from tunix_rt.train.faults import fault_point

        grad_fn = self._fn(("grad", objective), lambda: make_grad_fn(self.graph, self.cfg, objective))
        add = self._fn("add", lambda: jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b), donate_argnums=(0,)))
        total, stats, acc = 0.0, np.zeros(4), None
        if dist.world() > 1:
            from tunix_rt.train.data import window_digest

            dist.check_same(lambda: window_digest(batches), "the step's global batches")
        with jax.set_mesh(self.mesh), dist.peer_failures("train step"):
            for i, b in enumerate(batches):
                db = self._device_batch(b)
                if objective.kind == "distill":  # the teacher's hidden states, once per micro-batch
                    db.update(objective.teacher.inputs(db))
                loss, st, self.rngs, g = grad_fn(self.params, self.rngs, self.rest, db)
                acc = g if acc is None else add(acc, g)
                total += float(host(loss))
                stats += np.asarray(host(st), np.float64)
                if i + 1 < len(batches):
                    fault_point("accum")
        return total, stats, acc

    def load_teacher(self, model_dir: Path):
        """A frozen model beside the trained one, sharded over the same mesh, in cfg.dtype (a
        distillation objective's teacher: train.jax_kd_loss.JaxTeacher)."""
        import jax

        from tunix_rt.models.jax_loader import load_model
        from tunix_rt.train.jax_kd_loss import JaxTeacher

        with jax.set_mesh(self.mesh):
            model, _ = load_model(model_dir, self.mesh, self.cfg.dtype)
            return JaxTeacher(model)

    def shares_prefix(self) -> bool:
        """No: its masks come from positions and padding (jax_loss.attention_mask); a prompt
        shared by G completions is not built here yet."""
        return False

    def sequence_objective(self) -> bool:
        """No: a preference step takes its no-gradient log-prob passes, then the gradient pass."""
        return False

    def train_step(self, batches: list, objective: Objective, lr: float) -> StepResult:
        import jax
        import jax.numpy as jnp

        from tunix_rt.train.jax_loss import STAT_NAMES

        total, stats, grads = self.gradients(batches, objective)
        with jax.set_mesh(self.mesh), dist.peer_failures("optimizer update"):
            update = self._fn("update", lambda: make_update_fn(self.tx))
            self.params, self.opt_state, norm = update(self.params, self.opt_state, grads, jnp.float32(lr))
            norm = float(host(norm))
        # a distillation objective (train.distill) names its own statistics
        names = getattr(objective, "stat_names", STAT_NAMES if objective.kind == "policy" else ())
        named = dict(zip(names, stats.tolist()))
        return StepResult(total, norm, named)

    def _device_batch(self, batch) -> dict[str, Any]:
        """A data.Batch as device arrays, right-padded to a width bucket, rows over fsdp."""
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding, PartitionSpec

        from tunix_rt.train.data import IGNORE, coef_of
        from tunix_rt.train.engine import POLICY_AUX
        from tunix_rt.train.jax_loss import attention_mask

        if batch.segments is not None:
            raise ValueError("the JAX engine takes no shared-prefix rows (shares_prefix() is False)")
        ids, labels, pos = (np.asarray(a) for a in (batch.input_ids, batch.labels, batch.position_ids))
        b, n = ids.shape
        width = width_bucket(n)
        pad = width - n
        coef = coef_of(batch).astype(np.float32)
        aux = np.stack([np.asarray(batch.aux[k], np.float32) if k in batch.aux else np.zeros((b, n), np.float32)
                        for k in POLICY_AUX], axis=-1)
        if pad:
            ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=self.tok.pad_id)
            labels = np.pad(labels, ((0, 0), (0, pad)), constant_values=IGNORE)
            pos = np.concatenate([pos, pos[:, -1:] + 1 + np.arange(pad)[None]], axis=1)
            coef = np.pad(coef, ((0, 0), (0, pad)))
            aux = np.pad(aux, ((0, 0), (0, pad), (0, 0)))
        mask, real = labels != IGNORE, ids != self.tok.pad_id
        arrays = {"ids": ids.astype(np.int32), "pos": pos.astype(np.int32),
                  "targets": np.where(mask, labels, 0).astype(np.int32),
                  "coef": np.where(mask, coef, 0.0).astype(np.float32), "mask": mask, "aux": aux, "real": real}
        fsdp = int(self.mesh.shape.get("fsdp", 1))
        spec = PartitionSpec("fsdp") if fsdp > 1 and b % fsdp == 0 else PartitionSpec()
        out = {k: place(v, NamedSharding(self.mesh, spec)) for k, v in arrays.items()}
        out["attn"] = attention_mask(out.pop("real"), out["pos"])
        return out

    def loss_sum(self, batch) -> float:
        import jax

        fn = self._fn("loss", lambda: self._forward_fn(logprobs=False))
        with jax.set_mesh(self.mesh), dist.peer_failures("held-out loss"):
            return float(host(fn(self.params, self.rngs, self.rest, self._device_batch(batch))))

    def token_logprobs(self, batch, adapter: bool = True) -> np.ndarray:
        """log p(target) [B, L] (0 where labels are IGNORE), no gradient. adapter=False: the
        reference policy, the model the run started from: with LoRA the factors zeroed (B = 0:
        the base model's own output, no second copy of it); with finetune=full a frozen copy
        of the starting weights (reference_state)."""
        import jax

        fn = self._fn("logprobs", lambda: self._forward_fn(logprobs=True))
        params, rngs, rest = self.params, self.rngs, self.rest
        if not adapter and self.cfg.finetune == "lora":
            params = jax.tree.map(jax.numpy.zeros_like, params)
        elif not adapter:
            params, rngs, rest = self.reference_state()
        with jax.set_mesh(self.mesh), dist.peer_failures("token log-probabilities"):
            out = np.asarray(host(fn(params, rngs, rest, self._device_batch(batch))), np.float32)
        labels = np.asarray(batch.labels)
        from tunix_rt.train.data import IGNORE

        out = out[:, :labels.shape[1]]
        return np.where(labels != IGNORE, out, 0.0).astype(np.float32)

    def reference_state(self):
        """finetune=full's reference policy: (params, rngs, rest) of the model the run started
        from (model_dir: the base, or the `init` run's merged model; a resumed run reads it there
        too, never a checkpoint), loaded and sharded as the trained one was, the same structure
        (the engine's jitted forward takes it); loaded once, at the first reference pass."""
        if self._reference is None:
            import jax
            from flax import nnx

            from tunix_rt.models.jax_loader import load_model

            with jax.set_mesh(self.mesh):
                model, _ = load_model(self.model_dir, self.mesh, self.cfg.dtype,
                                      remat=self.cfg.gradient_checkpointing)
                _graph, params, rngs, rest = nnx.split(model, nnx.Param, nnx.RngState, ...)
            if [jax.tree.structure(x) for x in (params, rngs, rest)] != \
                    [jax.tree.structure(x) for x in (self.params, self.rngs, self.rest)]:
                raise TunixRtError("the reference model has another state structure than the trained one")
            self._reference = (params, rngs, rest)
        return self._reference

    def _forward_fn(self, logprobs: bool):
        import jax
        from flax import nnx

        from tunix_rt.train.chunking import chunk_tokens
        from tunix_rt.train.jax_loss import chunked_logprobs, head_of, hidden_states, token_objective

        graph, chunk_bytes = self.eval_graph, self.cfg.loss_chunk_bytes

        def forward(params, rngs, rest, b):
            model = nnx.merge(graph, params, rngs, rest)
            h = hidden_states(model, b["ids"], b["pos"], b["attn"])
            emb, softcap = head_of(model)
            chunk = chunk_tokens(chunk_bytes, emb.shape[0])
            if logprobs:
                return chunked_logprobs(h, emb, b["targets"], chunk, softcap)
            return token_objective(h, emb, b["targets"], b["coef"], b["mask"], None, chunk, softcap, NLL)[0]

        return jax.jit(forward)

    def generator(self):
        """The eval generator (eval.jax_generate) on the current weights, dropout off."""
        from tunix_rt.eval.jax_generate import JaxGenerator

        if dist.world() > 1:
            raise BadInput("generation (GRPO rollouts, generative eval) on the JAX engine runs in one process; "
                           "multi-process JAX training supports method=sft")
        if self._generator is None:  # one generator: its compiled decode outlives the step
            self._generator = JaxGenerator(self.model(), self.tok, self.mesh)
            return self._generator
        return self._generator.load(self.model())

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: Path) -> dict[str, Any]:
        """Every process calls it (the state is gathered from all of them); process 0 writes
        the files, the same as one process's."""
        from safetensors.numpy import save_file

        with dist.peer_failures("checkpoint gather"):
            parts = [(WEIGHTS, flat(self.params)), (OPTIMIZER, flat(self.opt_state)), (RNG, flat(self.rngs))]
        if dist.is_main():
            for name, arrays in parts:
                save_file(arrays, str(directory / name))
        return {"rng": {"jax": RNG}, "files": [WEIGHTS, OPTIMIZER, RNG]}

    def restore(self, directory: Path, state: dict[str, Any]) -> None:
        from safetensors.numpy import load_file

        self.params = unflat(self.params, load_file(str(directory / WEIGHTS)), directory / WEIGHTS)
        self.opt_state = unflat(self.opt_state, load_file(str(directory / OPTIMIZER)), directory / OPTIMIZER)
        self.rngs = unflat(self.rngs, load_file(str(directory / RNG)), directory / RNG)

    # ------------------------------------------------------------------ outputs
    def export(self, final_dir: Path) -> dict[str, str]:
        from flax import nnx

        from tunix_rt.train import export

        cfg, out = self.cfg, {}
        if dist.world() == 1:
            model = self.model()
        else:  # the trained weights gathered (every process joins), process 0 writes from host copies
            import jax

            with dist.peer_failures("export gather"):
                params = jax.tree.map(lambda x: host(x) if isinstance(x, jax.Array) else x, self.params)
            if not dist.is_main():
                return out
            model = nnx.merge(self.eval_graph, params, self.rngs, self.rest)  # export reads only the params
        if cfg.finetune == "lora":
            out[ADAPTER] = str(export.publish(final_dir / ADAPTER, lambda d: export.export_adapter(
                model, self.model_dir, d, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets,
                weight_qtype=cfg.lora_weight_qtype)))
        if cfg.finetune == "full" or cfg.merge:
            scale = cfg.lora_alpha / cfg.lora_rank if cfg.finetune == "lora" else None
            out[MERGED] = str(export.publish(final_dir / MERGED, lambda d: export.export_merged(
                model, self.family, self.model_dir, d, scale)))
        return out

    def peak_memory_bytes(self) -> int:
        return peak_memory_bytes(self.devs)


# --------------------------------------------------------------------------- state <-> files

def _leaves(tree) -> list[tuple[str, Any]]:
    import jax

    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        out.append((jax.tree_util.keystr(path), leaf))
    return out


def _is_key(x) -> bool:
    import jax

    return hasattr(x, "dtype") and jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key)


def flat(tree) -> dict[str, np.ndarray]:
    """A pytree of arrays as {tree path: numpy array} (typed PRNG keys as their key data)."""
    import jax

    out = {}
    for name, leaf in _leaves(tree):
        if _is_key(leaf):
            leaf = jax.random.key_data(leaf)
        out[name] = np.ascontiguousarray(host(leaf))
    return out


def host(x) -> np.ndarray:
    """A (global) array as one numpy array on every process: its own copy when every process
    holds all of it (one process; replicated), else gathered (a collective: every process
    must call it, in the same order)."""
    import jax

    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(jax.device_get(x))
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def unflat(like, arrays: dict[str, np.ndarray], source: Path):
    """`like` with every leaf replaced by the saved array of the same path (same shape,
    dtype and sharding); a clear error when the files do not match the model."""
    import jax

    leaves = _leaves(like)
    names = [n for n, _ in leaves]
    if set(names) != set(arrays):
        missing, extra = sorted(set(names) - set(arrays)), sorted(set(arrays) - set(names))
        raise TunixRtError(f"{source}: does not match the model (missing {missing[:3]}, extra {extra[:3]})")
    new = []
    for name, leaf in leaves:
        value = arrays[name]
        if tuple(getattr(leaf, "shape", ())) == () and value.shape == (1,):
            value = value.reshape(())  # safetensors keeps a scalar as [1]
        if _is_key(leaf):
            impl = jax.random.key_impl(leaf)
            placed = jax.random.wrap_key_data(place(value, leaf.sharding), impl=impl)
        else:
            if tuple(value.shape) != tuple(leaf.shape) or value.dtype != np.dtype(leaf.dtype):
                raise TunixRtError(f"{source}: {name} is {value.dtype}{list(value.shape)}, the model's "
                                   f"{np.dtype(leaf.dtype)}{list(leaf.shape)}")
            placed = place(value, leaf.sharding) if hasattr(leaf, "sharding") else value
        new.append(placed)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), new)
