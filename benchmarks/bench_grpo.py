"""Our GRPO step against TRL's GRPOTrainer (and Tunix's GRPOLearner): same model, prompts, LoRA,
G, lengths, beta; fp32 CPU.

    .venv/bin/python benchmarks/bench_grpo.py [--prompts 2] [--steps 2] [--warmup 1] [--rounds 1]
        [--sides ours,trl,jax,tunix]

Gemma 3 270M (real weights, `ensure_model("gemma3-270m")`), GSM8K train prompts rendered as
SFT and eval render them, LoRA r=16 alpha=32 on all seven projections, G = 4 completions per
prompt of at most 128 new tokens (temperature 1), beta 0.04, one update per rollout batch,
lr 1e-6, fp32, CPU. Every side trains on the very same prompts in the same order: the prompt
order of our GRPO method (seeded), written once by the parent.

- ours: the PyTorch engine through our GRPO method (`GRPO.step`: rollouts on the engine's
  own generator with the int8-screened head and Gumbel-max sampling, rewards, advantages,
  reference log-probs with the adapter disabled, the fused chunked policy objective);
- trl: `trl.GRPOTrainer` with its defaults apart from fp32/CPU and the shared settings above
  (its reward: the same format + answer scoring as ours, `tunix_rt.eval.scoring`);
- jax: our JAX engine through the same method (optional side);
- tunix: Google Tunix's own GRPO (optional side): `tunix.rl.grpo.GRPOLearner.train` on an
  `RLCluster` (actor, reference and rollout on one 1-device CPU mesh, the default "vanilla"
  rollout engine, i.e. Tunix's `Sampler` with its KV cache). The model is Tunix's Gemma 3
  class with our loader's weights (`tunix_rt.models.jax_loader.load_model`, as
  bench_jax_loss builds its Tunix side), LoRA from qwix as the JAX engine applies it
  (`apply_lora`); the reference is the base model without LoRA, Tunix's usual setup (its
  CLI does the same): qwix's LoRA model is a clone that holds the very same base arrays, so
  RLCluster shares the backbone between actor, reference and rollout and no second copy of
  the weights exists (were there one, it would count in its peak RSS). Same prompts in the
  same order (the sampler re-tokenises the prompt text with the model's HF tokenizer, which
  gives back exactly the ids of the data file: checked in the worker), num_generations=G,
  num_iterations=1, beta 0.04, epsilon 0.2, temperature 1 (top_p 1, no top_k), <= 128 new
  tokens stopping at <end_of_turn> or <eos> (our stop ids), the same reward function,
  clip-by-norm 1.0 + AdamW at a constant lr 1e-6 (our engines' optimizer). Tunix's defaults
  otherwise, with what cannot match ours exactly:
  * KL estimator: Tunix's GRPOConfig defaults to kl_loss_mode="kl" (logp - ref_logp); set to
    "low_var_kl", the k3 estimator ours and TRL use (same cost either way);
  * shapes: the sampler left-pads every prompt batch to a fixed max_prompt_length (set to the
    longest prompt of the data file, so nothing recompiles; a shorter step pays the padding),
    the KV cache holds that + 128, and the completions are right-padded to 128 for the
    reference pass and the update; ours and TRL pad to the batch's own longest row;
  * its policy loss takes full [B, L, V] logits (log-softmax over the 262k vocabulary, plus
    an entropy of those logits for its metrics), its reference pass is a second full forward;
  * the stop token is not part of a Tunix completion (its sampler cuts before it), so its loss
    and KL skip that one token per completion, ours count it;
  * sampling seed: RolloutConfig.seed left at Tunix's default, the same PRNG key at every
    rollout call (ours seeds each step); this changes which completions, not the cost;
  * no gradient checkpointing and one update micro-batch (--remat and --micro-batch are ours).
  A step is timed from the moment Tunix's loop asks the data iterator for that step's batch to
  the moment it asks for the next one (the last: asks past the end), so it covers the
  rollout, rewards, advantages, reference pass, update and Tunix's bookkeeping. The worker
  also reports what shows the steps trained: the reward of each step, Tunix's logged actor
  loss, grad norm and KL per step, and the largest change of any LoRA parameter.

Each side runs in its own subprocess (its peak RSS is its own, model loading included); the
sides alternate over rounds. A step's time covers everything: generation, rewards, reference
pass and update. The first --warmup steps are run and not measured; the figures are those of
the --steps measured steps: s/step their median; completions/s, tokens/s and s/1k tokens the
totals of the measured steps over their summed wall time (`summarize`); then the median over
rounds. Every measured step's own time and tokens are printed too.

The sides sample different completions (different RNGs), and a step's cost grows with how long
they run, so each side also counts its completion tokens per step: every sampled token of each
completion up to and including its stop token, or up to the 128-token cap when none came:
- ours, jax: our GRPO method's `completion_tokens` row (the mean of `Generation.n_tokens` =
  len(ids), stop id included) times the step's P x G completions;
- trl: GRPOTrainer's logged `completions/mean_length` (the mean of len(completion_ids), which
  its mask keeps up to and including the first of its eos ids) times P x G (`trl_step_tokens`);
  TRL stops at its model's generation_config eos ids plus the tokenizer's eos (printed): on
  Gemma 3 270M these are ours, <eos> and <end_of_turn>, on the tiny test model only <eos>;
- tunix: the lengths of the completions Tunix's rollout returns (noted from the learner's own
  `RLCluster.generate` call), each plus 1 when shorter than the cap: its sampler cuts before
  the stop token, so the stop is added back (`tunix_step_tokens`). (Tunix's own logged
  completions/mean_length counts the non-pad tokens of those same completions, stop excluded.)
tokens/s = completion tokens of the measured steps / their summed step time (whole steps, not
generation alone); s/1k tokens its inverse x 1000.

The last line: `RESULT speed_ratio=<ours/TRL completions/s> mem_ratio=<ours/TRL peak RSS>
token_speed_ratio=<ours/TRL tokens/s> jax_vs_trl_speed=... jax_vs_trl_mem=...
jax_vs_trl_token_speed=... tunix_speed_ratio=<JAX engine/Tunix completions/s>
tunix_mem_ratio=<JAX engine/Tunix peak RSS> tunix_token_speed_ratio=<JAX engine/Tunix tokens/s>
ours_tokens=<completion tokens per measured step> trl_tokens=... jax_tokens=... tunix_tokens=...
ours_update_mm_fraction=... ours_rollout_bw_fraction=... jax_update_mm_fraction=...`
(medians over rounds; each pair only when both of its sides ran, each *_tokens for a side that
ran; *_tokens is the mean over the measured steps).

Each phase of our engines' steps is also given as a share of the bound it is under (issue
27.1; this machine's bounds from `roofline.bounds()`, measured in this invocation before the
sides run), the median over measured steps:
- update (matmul-bound): the update's model FLOPs (`update_flops`: the policy's forward and
  backward and the reference's forward over the update's real tokens, the head over the scored
  ones; attention's products left out, so a lower bound) over the method's `update_s`, as a
  share of the fp32 matmul throughput at the training shapes;
- rollouts (bandwidth-bound, ours only): the weight bytes the decode steps read (one step a
  token of the batch's longest completion, `completion_tokens_max`, each reading
  `decode_step_bytes`: the fp32 body with its live LoRA factors and the int8-screened head) over
  the method's `rollout_s` (prefill, sampling and rewards included: a lower bound), as a share
  of the copy bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from sides import alternate, print_result, run_worker  # benchmarks/ is sys.path[0]

G, NEW_TOKENS, BETA, LR, RANK = 4, 128, 0.04, 1e-6, 16


# --------------------------------------------------------------------------- counting

def trl_step_tokens(logs: list[dict], completions: int) -> list[int]:
    """The completion tokens of each step TRL's GRPOTrainer logged (logging_steps=1): its
    `completions/mean_length` (the mean over the step's completions of len(completion_ids),
    which runs up to and including the first eos id, or to max_completion_length) times the
    step's number of completions. Log records without that key (the end-of-training summary)
    are not steps."""
    return [round(x["completions/mean_length"] * completions) for x in logs if "completions/mean_length" in x]


def tunix_step_tokens(lengths: list[int], cap: int = NEW_TOKENS) -> int:
    """The completion tokens of one Tunix rollout batch, counted as ours and TRL count them:
    Tunix's sampler cuts each completion before its first stop id (`np_find_first_eos_idx`),
    so a completion shorter than the cap stopped and gets its stop token back; one of `cap`
    tokens ran to the cap (a stop sampled as the cap-th token leaves cap - 1, then + 1)."""
    return sum(n + (n < cap) for n in lengths)


def summarize(step_s: list[float], tokens: list[int], completions: int) -> dict:
    """One side's figures over its measured steps: `step_s` and `tokens` (completion tokens)
    per measured step, `completions` per step. Rates are totals over totals (all measured steps'
    completions or tokens / their summed wall time), so that a step that sampled long
    completions weighs what it cost; s/step is the median."""
    if len(step_s) != len(tokens) or not step_s:
        raise ValueError(f"{len(step_s)} step times for {len(tokens)} token counts")
    total_s, total_t = sum(step_s), sum(tokens)
    return {"s_per_step": statistics.median(step_s), "tokens_per_step": total_t / len(tokens),
            "completions_per_s": completions * len(step_s) / total_s, "tokens_per_s": total_t / total_s,
            "s_per_1k_tokens": 1000 * total_s / total_t if total_t else float("inf")}


def decode_step_bytes(hf: dict, lora_rank: int, head_bytes: int) -> float:
    """Weight bytes one decode step of the 270M's rollouts reads: every layer's seven fp32
    projections and its live LoRA factors (A and B, fp32), and the head at `head_bytes` a value
    (1: the int8-screened head ours decodes with, its fp32 rescored rows left out; 4: a full fp32
    head). Norms and biases are left out (a few KB)."""
    from bench_torch_vs_trl import projection_shapes  # benchmarks/ is sys.path[0]

    shapes = projection_shapes(hf).values()
    body = hf["num_hidden_layers"] * sum(4 * (k * n + lora_rank * (k + n)) for k, n in shapes)
    return body + head_bytes * hf["vocab_size"] * hf["hidden_size"]


def update_flops(hf: dict, lora_rank: int, tokens: int, completion_tokens: int, reference: bool) -> int:
    """Model FLOPs of one GRPO update of LoRA on the seven projections over `tokens` real tokens
    (prompts and completions), `completion_tokens` of them scored: the policy's forward and
    backward (bench_torch_vs_trl.sft_step_flops' per-token terms, no recompute), the reference's
    forward with the adapter off where `reference` (beta > 0), and the head over the scored
    positions (policy: logits and the gradient wrt the hidden states; reference: logits).
    Attention's score and value products are left out (~5% at these lengths): a lower bound."""
    from bench_torch_vs_trl import projection_shapes, sft_step_flops  # benchmarks/ is sys.path[0]

    policy = sft_step_flops(hf, rows=1, width=tokens, head_rows=completion_tokens, lora_rank=lora_rank, head_passes=2,
                            recompute=False, input_grad=True, causal=True, rope_rows=0)
    if not reference:
        return policy["projections"] + policy["head"]
    base = hf["num_hidden_layers"] * tokens * sum(2 * k * n for k, n in projection_shapes(hf).values())
    return policy["projections"] + policy["head"] * 3 // 2 + base


def base_cfg(args, model_dir: str, engine: str):
    from tunix_rt.train.config import TrainConfig

    return TrainConfig(model=model_dir, dataset="gsm8k", split="train", method="grpo", finetune="lora",
                       lora_rank=RANK, lora_alpha=2.0 * RANK, group_size=G, rl_prompts=args.prompts,
                       rollout_max_new_tokens=NEW_TOKENS, rollout_temperature=1.0, beta=BETA, rl_loss="grpo",
                       lr=LR, max_seq_len=512, batch_size=args.micro_batch or args.prompts * G,
                       gradient_checkpointing=args.remat, max_steps=args.warmup + args.steps,
                       rewards={"format": 0.5, "answer": 1.0}, engine=engine, device="cpu", seed=0)


# --------------------------------------------------------------------------- parent

def prepare(args) -> Path:
    """The prompts of every step, in our method's seeded order, as ids and text."""
    from tunix_rt.home import Home
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.train.grpo import GRPO

    home = Home.resolve()
    model_dir = str(ensure_model(args.model, home))
    tok = load_tokenizer(model_dir, home)
    method = GRPO(base_cfg(args, model_dir, "torch"), home, tok)
    steps = []
    for _ in range(args.warmup + args.steps):
        picked = [method.items[method.order.take()] for _ in range(args.prompts)]
        steps.append([{"id": r.id, "answer": r.answer, "ids": p, "text": tok.decode(p, skip_special_tokens=False).removeprefix("<bos>")}
                      for r, p in picked])
    out = Path(tempfile.mkdtemp(prefix="bench-grpo-")) / "prompts.json"
    out.write_text(json.dumps({"model_dir": model_dir, "home": str(home.root), "steps": steps}))
    return out


def run_side(side: str, data: Path, args) -> dict:
    """One side's worker in its own process, given this run's step counts and settings."""
    flags = ["--warmup", str(args.warmup), "--steps", str(args.steps), "--prompts", str(args.prompts),
             "--micro-batch", str(args.micro_batch)] + (["--remat"] if args.remat else [])
    return run_worker(__file__, side, data, flags)


# --------------------------------------------------------------------------- workers

def ours_worker(args, data: dict, engine_name: str) -> dict:
    """Our GRPO method on one of our engines, fed the parent's prompts in order."""
    from tunix_rt.home import Home
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.train import engines
    from tunix_rt.train.grpo import GRPO

    home = Home(Path(data["home"]))
    cfg = base_cfg(args, data["model_dir"], engine_name)
    tok = load_tokenizer(data["model_dir"], home)
    engine = engines.engine_class(engine_name)(cfg)
    engine.devices()
    engine.setup(Path(data["model_dir"]), tok)
    method = GRPO(cfg, home, tok)
    by_id = {r.id: (r, p) for r, p in method.items}
    queue = [by_id[e["id"]] for step in data["steps"] for e in step]

    class Fed:  # the parent's prompt order (our own order, written once)
        def take(self):
            return method.items.index(queue.pop(0))

    method.order = Fed()
    times, rows = [], []
    for step in range(len(data["steps"])):
        t0 = time.perf_counter()
        row, _ = method.step(engine, step, LR)
        dt = time.perf_counter() - t0
        rows.append({k: row[k] for k in ("reward", "completion_tokens", "completion_tokens_max", "tokens",
                                         "rollout_s", "update_s") if k in row})
        if step >= args.warmup:
            times.append(dt)
    # our GRPO method's completion_tokens: the mean over the step's P x G completions of their
    # Generation.n_tokens = len(ids), every sampled id up to and including the stop id
    tokens = [round(r["completion_tokens"] * args.prompts * G) for r in rows[args.warmup:]]
    return {"step_s": times, "tokens": tokens, "rows": rows}


def trl_worker(args, data: dict) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from tunix_rt.eval.scoring import score_completion
    from tunix_rt.models.hf import load_causal_lm

    torch.manual_seed(0)
    model = load_causal_lm(data["model_dir"], dtype="fp32", device="cpu", attn="sdpa")
    model.train()
    tok = AutoTokenizer.from_pretrained(data["model_dir"])
    tok.padding_side = "left"
    # the prompt text as our template renders it (TRL's tokenizer adds the BOS back)
    rows = [{"prompt": e["text"], "answer": e["answer"]} for step in data["steps"] for e in step]

    def reward(prompts, completions, answer, **_):  # the same format + answer scoring as ours
        out = []
        for text, ans in zip(completions, answer):
            s = score_completion(text, ans)
            out.append(0.5 * float(s.format_ok) + 1.0 * float(s.correct))
        return out

    per_step = args.prompts * G
    conf = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="bench-grpo-trl-"), per_device_train_batch_size=per_step,
                      num_generations=G, max_completion_length=NEW_TOKENS, beta=BETA, learning_rate=LR,
                      max_steps=len(data["steps"]), logging_steps=1, report_to=[], bf16=False, use_cpu=True,
                      temperature=1.0, save_strategy="no", seed=0, shuffle_dataset=False,
                      gradient_accumulation_steps=1, dataloader_num_workers=0)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                           "up_proj", "down_proj"], task_type="CAUSAL_LM")
    times: list[float] = []
    logs: list[dict] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.t0)

        def on_log(self, *a, **k):  # after each step's on_step_end (logging_steps=1)
            logs.append(dict(k.get("logs") or {}))

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=conf, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, peft_config=lora, callbacks=[Clock()])
    trainer.train()
    tokens = trl_step_tokens(logs, per_step)
    if len(tokens) != len(times):
        raise SystemExit(f"trl: {len(tokens)} logged steps with completion lengths for {len(times)} timed steps")
    return {"step_s": times[args.warmup:], "tokens": tokens[args.warmup:], "rows": [],
            "eos_token_ids": list(trainer.eos_token_ids)}


def tunix_worker(args, data: dict) -> dict:
    """Tunix's GRPOLearner as shipped (RLCluster, vanilla rollout, its GRPO loss), fed the
    parent's prompts in order, one step per entry of data["steps"]."""
    import jax
    import numpy as np
    import optax
    from flax import nnx
    from transformers import AutoTokenizer
    from tunix.generate.tokenizer_adapter import TokenizerAdapter
    from tunix.rl import rl_cluster as rl
    from tunix.rl import utils as rl_utils
    from tunix.rl.grpo.grpo_learner import GRPOConfig, GRPOLearner
    from tunix.rl.rollout.base_rollout import RolloutConfig
    from tunix.sft.metrics_logger import Mode

    from tunix_rt.eval.scoring import score_completion
    from tunix_rt.home import Home
    from tunix_rt.models.jax_loader import load_model, make_mesh
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.heap import tune_cpu_allocator
    from tunix_rt.train.jax_engine import apply_lora

    tune_cpu_allocator()  # as the JAX engine does on a CPU
    steps = data["steps"]
    cfg = base_cfg(args, data["model_dir"], "jax")  # the JAX side's LoRA, seed, clip, epsilon
    tok = AutoTokenizer.from_pretrained(data["model_dir"])
    stop = list(load_tokenizer(data["model_dir"], Home(Path(data["home"]))).stop_ids)
    ta = TokenizerAdapter(tok)  # Tunix's sampler tokenises the prompt text itself, so:
    for e in (e for step in steps for e in step):
        if ta.dedup_bos_ids([ta.bos_id()] + ta.encode(e["text"])) != e["ids"]:  # = Sampler.tokenize
            raise SystemExit(f"tunix: prompt {e['id']} re-tokenises to other ids than the data file's")
    longest = max(len(e["ids"]) for step in steps for e in step)

    rewards: list[float] = []

    def reward(prompts, completions, answer, **_):  # the same format + answer scoring as ours
        out = []
        for text, ans in zip(completions, answer):
            s = score_completion(text, str(ans))
            out.append(0.5 * float(s.format_ok) + 1.0 * float(s.correct))
        rewards.append(float(np.mean(out)))
        return out

    marks: list[float] = []  # when Tunix's loop asks for each step's batch, then past the end

    def batches():
        for step in steps:
            marks.append(time.perf_counter())
            yield {"prompts": np.array([e["text"] for e in step]), "answer": np.array([str(e["answer"]) for e in step])}
        marks.append(time.perf_counter())

    mesh = make_mesh({"fsdp": 1, "tp": 1})
    with jax.set_mesh(mesh):
        base, tcfg = load_model(data["model_dir"], mesh, "fp32")
        actor = apply_lora(base, cfg, tcfg)
        rollout = RolloutConfig(max_tokens_to_generate=NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=None,
                                max_prompt_length=longest, kv_cache_size=longest + NEW_TOKENS, eos_tokens=stop)
        opt = optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                          optax.adamw(LR, b1=0.9, b2=0.999, eps=1e-8, weight_decay=cfg.weight_decay))
        # max_steps one past the data: the loop then ends on the exhausted iterator, asking for
        # a batch as it does at the end of every other step
        training = rl.RLTrainingConfig(actor_optimizer=opt, eval_every_n_steps=10**9, max_steps=len(steps) + 1)
        cluster = rl.RLCluster(
            actor=actor, reference=base, tokenizer=tok,
            cluster_config=rl.ClusterConfig(role_to_mesh={r: mesh for r in (rl.Role.ACTOR, rl.Role.REFERENCE,
                                                                           rl.Role.ROLLOUT)},
                                            rollout_engine="vanilla", offload_to_cpu=False,
                                            training_config=training, rollout_config=rollout))
        del base, actor
        lengths: list[list[int]] = []  # per rollout call: the length of each completion's tokens
        generate = cluster.generate

        def recorded(*a, **k):  # the learner's own call, its output's token lengths noted
            out = generate(*a, **k)
            lengths.append([len(t) for t in out.tokens])
            return out

        cluster.generate = recorded
        learner = GRPOLearner(cluster, GRPOConfig(num_generations=G, num_iterations=1, beta=BETA,
                                                  epsilon=cfg.epsilon, kl_loss_mode="low_var_kl"), reward)
        model = cluster.actor_trainer.model
        shared = bool(rl_utils.is_sharing_backbone(model, cluster.inference_worker.get_model("reference")))
        lora0 = [np.array(x) for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))]
        learner.train(batches())
        lora1 = [np.array(x) for x in jax.tree.leaves(nnx.state(model, nnx.LoRAParam))]
    if len(marks) != len(steps) + 1:
        raise SystemExit(f"tunix: the loop asked for {len(marks) - 1} batches, {len(steps)} expected")
    if len(lengths) != len(steps) or any(len(x) != len(s) * G for x, s in zip(lengths, steps)):
        raise SystemExit(f"tunix: {[len(x) for x in lengths]} completions per rollout, {len(steps[0]) * G} "
                         f"expected in each of {len(steps)}")
    times = [b - a for a, b in zip(marks, marks[1:])]
    logged = cluster.actor_trainer.metrics_logger

    def history(name):
        try:
            return [float(x) for x in logged.get_metric_history("actor", name, Mode.TRAIN)]
        except ValueError:
            return []

    check = {"reward": rewards, "loss": history("loss"), "grad_norm": history("grad_norm"), "kl": history("kl"),
             "lora_max_abs_change": max(float(np.abs(b - a).max()) for a, b in zip(lora0, lora1)),
             "shared_backbone": shared, "max_prompt_length": longest}
    return {"step_s": times[args.warmup:], "tokens": [tunix_step_tokens(x) for x in lengths][args.warmup:],
            "rows": [], "tunix": check}


def worker(args) -> None:
    data = json.loads(Path(args.data).read_text())
    if args.worker == "trl":
        res = trl_worker(args, data)
    elif args.worker == "tunix":
        res = tunix_worker(args, data)
    else:
        res = ours_worker(args, data, "torch" if args.worker == "ours" else "jax")
    res.update(summarize(res["step_s"], res["tokens"], args.prompts * G))
    print_result(args.worker, res)


# --------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", help="TUNIX_RT_HOME holding (or to receive) gemma3-270m")
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per step (each gets G = 4 completions)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--remat", action="store_true", help="our engines: gradient checkpointing in the update "
                    "(TRL's GRPOConfig has it on by default)")
    ap.add_argument("--micro-batch", type=int, default=0, help="our engines: update micro-batch rows "
                    "(default: all P x G rollouts in one)")
    ap.add_argument("--sides", default="ours,trl", help="ours (torch engine), trl (GRPOTrainer), jax (JAX engine), "
                    "tunix (Tunix's GRPOLearner)")
    ap.add_argument("--worker", choices=("ours", "trl", "jax", "tunix"), help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.home:
        os.environ["TUNIX_RT_HOME"] = os.path.abspath(args.home)
    from roofline import bounds, fraction  # here, not at the top: it imports torch, which a JAX worker must not hold

    data = prepare(args)
    sides = [x for x in args.sides.split(",") if x]
    bound = bounds()  # before the sides run: the machine as quiet as it gets here
    hf = json.loads((Path(json.loads(Path(data).read_text())["model_dir"]) / "config.json").read_text())
    step_bytes = decode_step_bytes(hf, RANK, 1)

    def show(r: int, side: str, res: dict) -> None:
        print(f"round {r + 1} {side:5s}: {res['s_per_step']:.1f} s/step, {res['completions_per_s']:.3f} "
              f"completions/s, {res['tokens_per_step']:.0f} completion tokens/step, {res['tokens_per_s']:.1f} "
              f"tokens/s, peak RSS {res['peak_rss'] / 2**30:.2f} GiB ({res.get('allocator')} malloc, {res.get('matmul')} products)", flush=True)

    results = alternate(sides, args.rounds, lambda side: run_side(side, data, args), show)
    keys = ("completions_per_s", "s_per_step", "tokens_per_step", "tokens_per_s", "s_per_1k_tokens", "peak_rss")
    med = {s: {k: statistics.median(x[k] for x in v) for k in keys} for s, v in results.items()}
    print(f"\n{args.model} LoRA r16, fp32 CPU, {args.prompts} prompts x G={G} per step, <= {NEW_TOKENS} new tokens, "
          f"beta {BETA}, {args.steps} measured steps after {args.warmup} warm-up, {args.rounds} round(s); ours: "
          f"update micro-batch {args.micro_batch or args.prompts * G}, gradient checkpointing {'on' if args.remat else 'off'}")
    names = {"ours": "torch eng.", "trl": "TRL GRPO", "jax": "JAX eng.", "tunix": "Tunix GRPO"}
    print(f"{'side':11s} {'s/step':>8s} {'completions/s':>14s} {'tokens/step':>12s} {'tokens/s':>9s} "
          f"{'s/1k tokens':>12s} {'peak RSS GiB':>13s}")
    for s in sides:
        m = med[s]
        print(f"{names[s]:11s} {m['s_per_step']:8.1f} {m['completions_per_s']:14.3f} {m['tokens_per_step']:12.1f} "
              f"{m['tokens_per_s']:9.2f} {m['s_per_1k_tokens']:12.2f} {m['peak_rss'] / 2**30:13.2f}")
    print("(s/step: median over the measured steps; completions/s, tokens/s and s/1k tokens: totals of the "
          "measured steps over their summed time; tokens: completion tokens, stop token included; each then "
          "the median over rounds)")
    for s in sides:  # every measured step's own figures
        for r, x in enumerate(results[s]):
            print(f"{names[s]} round {r + 1}: " + ", ".join(
                f"step {args.warmup + i + 1}: {t:.1f} s {n} tok ({n / t:.1f} tok/s)"
                for i, (t, n) in enumerate(zip(x["step_s"], x["tokens"]))))
    for x in results.get("trl", [])[:1]:
        print(f"{names['trl']}: stops at eos ids {x['eos_token_ids']} (its model's generation_config + tokenizer)")
    for s in sides:  # our method's own phase timings of the measured steps
        rows = [r for x in results[s] for r in x["rows"][args.warmup:]]
        if rows:
            print(f"{names[s]}: rollout {statistics.median(r['rollout_s'] for r in rows):.1f} s, update "
                  f"{statistics.median(r['update_s'] for r in rows):.1f} s, mean reward "
                  f"{statistics.mean(r['reward'] for r in rows):.3f} (median over measured steps)")
    shares = {}
    for s in ("ours", "jax"):  # each phase as a share of the bound it is under (issue 27.1)
        rows = [r for x in results.get(s, []) for r in x["rows"][args.warmup:]]
        if not rows or "tokens" not in rows[0]:
            continue
        upd = statistics.median(update_flops(hf, RANK, r["tokens"], round(r["completion_tokens"] * args.prompts * G),
                                             BETA > 0) / r["update_s"] for r in rows)
        shares[f"{s}_update_mm_fraction"] = upd / (bound["fp32_gflops"] * 1e9)
        line = f"{names[s]}: update {upd / 1e12:.3f} model TFLOP/s, {fraction(upd, bound['fp32_gflops'] * 1e9)} of the fp32 matmul bound"
        if s == "ours":  # ours decodes with the int8-screened head (the JAX generator's own head: not counted here)
            roll = statistics.median(r["completion_tokens_max"] * step_bytes / r["rollout_s"] for r in rows)
            shares["ours_rollout_bw_fraction"] = roll / (bound["copy_gbs"] * 1e9)
            line += (f"; rollouts {roll / 1e9:.1f} GB/s of weights read ({step_bytes / 1e9:.2f} GB a decode step x the "
                     f"longest completion, over the whole rollout phase), {fraction(roll, bound['copy_gbs'] * 1e9)} of "
                     f"the copy bandwidth")
        print(line)
    print(f"bounds measured here before the sides ran (roofline.bounds): fp32 matmul {bound['fp32_gflops']:.0f} GFLOP/s, "
          f"copy {bound['copy_gbs']:.1f} GB/s")
    for x in results.get("tunix", []):  # what shows Tunix's steps trained (every step, warm-up included)
        c, fmt = x["tunix"], lambda v: "[" + ", ".join(f"{a:.4g}" for a in v) + "]"  # noqa: E731
        print(f"{names['tunix']}: step rewards {fmt(c['reward'])}, actor loss {fmt(c['loss'])}, grad norm "
              f"{fmt(c['grad_norm'])}, KL {fmt(c['kl'])}, LoRA max |change| {c['lora_max_abs_change']:.3g}, "
              f"backbone shared with the reference: {c['shared_backbone']}, prompts padded to {c['max_prompt_length']}")
    out = []

    def tok(a: str, b: str) -> float:
        return med[a]["tokens_per_s"] / med[b]["tokens_per_s"]

    if "ours" in med and "trl" in med:
        out += [f"speed_ratio={med['ours']['completions_per_s'] / med['trl']['completions_per_s']:.3f}",
                f"mem_ratio={med['ours']['peak_rss'] / med['trl']['peak_rss']:.3f}",
                f"token_speed_ratio={tok('ours', 'trl'):.3f}"]
    if "jax" in med and "trl" in med:
        out += [f"jax_vs_trl_speed={med['jax']['completions_per_s'] / med['trl']['completions_per_s']:.3f}",
                f"jax_vs_trl_mem={med['jax']['peak_rss'] / med['trl']['peak_rss']:.3f}",
                f"jax_vs_trl_token_speed={tok('jax', 'trl'):.3f}"]
    if "jax" in med and "tunix" in med:
        out += [f"tunix_speed_ratio={med['jax']['completions_per_s'] / med['tunix']['completions_per_s']:.3f}",
                f"tunix_mem_ratio={med['jax']['peak_rss'] / med['tunix']['peak_rss']:.3f}",
                f"tunix_token_speed_ratio={tok('jax', 'tunix'):.3f}"]
    out += [f"{s}_tokens={med[s]['tokens_per_step']:.1f}" for s in sides]
    out += [f"{k}={v:.2f}" for k, v in shares.items()]
    print("RESULT " + " ".join(out))


if __name__ == "__main__":
    main()
