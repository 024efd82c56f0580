"""GRPO family: reinforcement learning with verifiable rewards (grpo, dr_grpo, dapo, and
gspo and rloo, whose importance ratio is one per completion: train.sequence_ratio).

One step:
  1. rollouts: P prompts from the seeded prompt order, G completions each from the engine's
     own generator (sampling; seeded by (seed, step, draw) and the row, so a resumed run
     draws the same rollouts), prompts rendered exactly as SFT and eval render them (with a
     curriculum, each replaced by a fresh item of its task at the task's level: train.curriculum);
  2. rewards (train.rewards: weighted, named, each call within reward_timeout_s; a failing or
     overrunning reward fails the run) and group
     advantages (train.advantages); dapo drops zero-variance groups, filter_pass_rate the
     groups whose pass rate is outside its band, and more prompts are drawn
     (train.curriculum.keep_rule, within dapo_max_draws);
  3. the update: prompt + completion sequences, the loss on completion tokens only, per-token
     coefficients for the whole window (train.advantages.token_coefficients), advantages as
     aux, the reference log-probs from the adapter-off model (finetune=full: a frozen copy of the
     starting weights; beta > 0) and, for mu > 1, the
     rollout policy's log-probs; then mu optimizer steps of the engine's fused policy
     objective (train.engine: no [B, L, V] logits anywhere).

With tools (`tools: [calculator]`), rollouts and the held-out eval decode with them
(tunix_rt.tools: a row that closes a call gets the tool's result forced). Tool-written tokens
are observations, not actions: each completion's `tool_mask` takes them out of the update
(no label, coefficient 0: neither the policy term nor the KL sees them, and the per-token
normalisation counts the model's tokens only), rewards that ask get the completion's
`ToolUse` (`arith` skips the claims a tool wrote, `tool_error` counts the failed calls), and
each step logs tool_calls, tool_errors and tool_tokens over its rollouts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunix_rt.errors import BadInput
from tunix_rt.home import Home
from tunix_rt.render import Rendered, prompt_ids
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.common import dataset_facts
from tunix_rt.train.curriculum import keep_rule, make_curriculum
from tunix_rt.train.data import IGNORE, SeededOrder, collate, position_of, position_state, weighted_spans
from tunix_rt.train.engine import Engine, Objective
from tunix_rt.train.faults import fault_point


@dataclass
class Group:
    """One prompt's G rollouts and their scores."""

    record: Any
    prompt: list[int]
    completions: list  # eval.generate.Generation
    rewards: np.ndarray  # [G] weighted totals
    parts: dict[str, np.ndarray]  # reward name -> [G] unweighted
    correct: np.ndarray  # [G] bool, as eval scores it
    format_ok: np.ndarray  # [G] bool


def rollout_seed(seed: int, step: int, draw: int) -> int:
    """The sampling seed of one generate call: a function of (seed, step, draw) only; each
    row then seeds its own generator from (this, row index)."""
    digest = hashlib.sha256(f"grpo:{seed}:{step}:{draw}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def tool_written(gen) -> np.ndarray:
    """[len(ids)] 0/1: the completion's tokens a tool wrote (a Generation's tool_mask)."""
    mask = np.asarray(gen.tool_mask, np.int64)
    if mask.shape != (len(gen.ids),):
        raise ValueError(f"a completion of {len(gen.ids)} ids has a tool_mask of shape {mask.shape}")
    return mask


def unlabel_observations(batch, spans: list, written: list[np.ndarray]):
    """Tool-written tokens are not the policy's actions: their positions lose their label, so
    no loss, KL or statistic of the update sees them (their coefficient is already 0).
    spans[k] = (row, predicting positions, ...) of the sequence whose tool mask is written[k]."""
    for (row, at, *_), mask in zip(spans, written):
        batch.labels[row, at.start + np.flatnonzero(mask)] = IGNORE
    batch.n_supervised = int((batch.labels != IGNORE).sum())
    return batch


def tool_metrics(outs: list) -> dict[str, int]:
    """A step's tool use over its rollouts: calls closed, calls that erred, tool-written tokens."""
    return {"tool_calls": sum(len(o.tool_calls) for o in outs),
            "tool_errors": sum(bool(c["error"]) for o in outs for c in o.tool_calls),
            "tool_tokens": int(sum(sum(o.tool_mask) for o in outs))}


class GRPO:
    def __init__(self, cfg: TrainConfig, home: Home, tok):
        from tunix_rt.traces.dataset import load_dataset
        from tunix_rt.train.rewards import RewardSet

        self.cfg, self.tok = cfg, tok
        ds = load_dataset(cfg.dataset, home)
        self.items, dropped = self._prompts(list(ds.split(cfg.split))[: cfg.limit])
        if not self.items:
            raise BadInput(f"no prompts left: every prompt of {ds.ref} ({cfg.split}) is longer than max_seq_len - "
                           f"rollout_max_new_tokens = {cfg.max_seq_len - cfg.rollout_max_new_tokens}")
        self.eval_items, _ = self._prompts(list(ds.split(cfg.eval_split))[: cfg.eval_limit])
        self.order = SeededOrder(len(self.items), cfg.seed)
        self.rewards = RewardSet.from_config(cfg.rewards, timeout_s=cfg.reward_timeout_s)
        self.objective = Objective("policy", eps_low=cfg.epsilon, eps_high=cfg.clip_high, beta=cfg.beta,
                                   on_policy=cfg.mu == 1)
        per_epoch = math.ceil(len(self.items) / cfg.rl_prompts)
        self.total_steps = cfg.max_steps if cfg.max_steps is not None else max(1, math.ceil(cfg.epochs * per_epoch))
        self.dataset = dataset_facts(cfg, ds, len(self.items) + dropped, len(self.items), len(self.eval_items))
        self.curriculum = (make_curriculum(cfg, ds, [r for r, _ in self.items], self._prompt_of)
                           if cfg.curriculum is not None else None)
        self.keep = keep_rule(cfg.rl_loss, cfg.filter_pass_rate)
        from tunix_rt.train.sequence_ratio import sequence_update

        self.sequence = sequence_update(cfg, self.objective)  # gspo, rloo: a ratio per completion

    def _prompt_of(self, record) -> list[int] | None:
        kept, _ = self._prompts([record])
        return kept[0][1] if kept else None

    def _prompts(self, records: list) -> tuple[list[tuple[Any, list[int]]], int]:
        """(record, prompt ids) of the records whose prompt leaves room for a completion."""
        room = self.cfg.max_seq_len - self.cfg.rollout_max_new_tokens
        pairs = [(r, prompt_ids(r.question, self.tok, self.cfg.system_prompt)) for r in records]
        kept = [(r, p) for r, p in pairs if len(p) <= room]
        return kept, len(pairs) - len(kept)

    # ------------------------------------------------------------------ the step
    def step(self, engine: Engine, step: int, lr: float) -> tuple[dict[str, Any], list[str]]:
        t0 = time.perf_counter()
        groups, drawn = self.rollouts(engine, step)
        fault_point("rollout")
        t1 = time.perf_counter()
        batches = self.update_batches(groups, shared=engine.shares_prefix())
        for b in batches:
            b.aux["ref_logp"] = (engine.token_logprobs(b, adapter=False) if self.cfg.beta > 0
                                 else np.zeros(b.labels.shape, np.float32))
            b.aux["old_logp"] = (engine.token_logprobs(b) if not self.objective.on_policy
                                 else np.zeros(b.labels.shape, np.float32))
        if self.sequence is not None:
            rewards = np.stack([g.rewards for g in groups]) if groups else np.zeros((0, self.cfg.group_size))
            results = self.sequence.train(engine, batches, rewards, lr)
        else:
            results = [engine.train_step(batches, self.objective, lr) for _ in range(self.cfg.mu)]
        t2 = time.perf_counter()
        row = {**self.metrics(groups, drawn, results, batches), **self.draw_metrics(groups, drawn)}
        row.update({"rollout_s": t1 - t0, "update_s": t2 - t1,
                    "completions_per_s": sum(len(g.completions) for g in groups) / (t2 - t0)})
        return row, [g.record.id for g in groups]

    def rollouts(self, engine: Engine, step: int) -> tuple[list[Group], int]:
        """P groups (dapo, filter_pass_rate: P that curriculum.keep_rule keeps, drawing up to
        dapo_max_draws x P); returns the groups kept and how many were drawn."""
        cfg = self.cfg
        gen = engine.generator()
        if self.keep is None:
            groups = self._draw(gen, step, 0, cfg.rl_prompts)
            return groups, len(groups)
        from tunix_rt.train.advantages import select_informative

        def stream():
            for draw in range(cfg.dapo_max_draws):
                for g in self._draw(gen, step, draw, cfg.rl_prompts):
                    yield g, g.rewards

        kept = select_informative(stream(), cfg.rl_prompts, cfg.dapo_max_draws * cfg.rl_prompts, keep=self.keep)
        return kept.groups, kept.drawn

    def draw_metrics(self, groups: list[Group], drawn: int) -> dict[str, Any]:
        """What choosing a step's prompts did, for every method that samples these rollouts
        (grpo, rft, dpo with pairs=rollouts): the groups drawn, the share the filters skipped
        (only where one is configured: dapo's zero-variance test or filter_pass_rate), and the
        curriculum's levels after the windows move them (its end_step: call once a step, after
        the step's rollouts)."""
        row: dict[str, Any] = {"groups_drawn": drawn}
        if self.keep is not None:
            row["filter_skipped_share"] = (drawn - len(groups)) / drawn if drawn else 0.0
        if self.curriculum is not None:
            row.update(self.curriculum.end_step())
        return row

    def _draw(self, gen, step: int, draw: int, n: int) -> list[Group]:
        cfg, size = self.cfg, self.cfg.group_size
        picked = [self.items[self.order.take()] for _ in range(n)]
        if self.curriculum is not None:
            picked = self.curriculum.prompts(picked, step, draw)
        decode = self._with_tools(cfg.rollout_decode(seed=rollout_seed(cfg.seed, step, draw), batch_size=n * size))
        outs = gen.generate([p for _, p in picked for _ in range(size)], decode)
        groups = [self._score(rec, prompt, outs[i * size:(i + 1) * size]) for i, (rec, prompt) in enumerate(picked)]
        if self.curriculum is not None:
            self.curriculum.observe(groups, self.curriculum.online)
        return groups

    def _with_tools(self, decode):
        """The run's tools in a DecodeConfig (rollouts and the held-out eval decode alike)."""
        return dataclasses.replace(decode, tools=tuple(self.cfg.tools))

    def _score(self, record, prompt: list[int], outs: list) -> Group:
        from tunix_rt.eval.scoring import score_record
        from tunix_rt.train.rewards import tool_use

        texts = [o.text for o in outs]
        total, parts = self.rewards.score([record] * len(outs), texts, [tool_use(o, self.tok) for o in outs])
        scores = [score_record(t, record) for t in texts]
        return Group(record, prompt, outs, total, parts, np.array([s.correct for s in scores]),
                     np.array([s.format_ok for s in scores]))

    def update_batches(self, groups: list[Group], shared: bool = False) -> list:
        """Micro-batches of batch_size prompt+completion sequences: labels on completion
        tokens, coef for the whole window, the completion's advantage on its tokens. shared:
        the completions of one group in a micro-batch share one row that holds their prompt
        once (data.collate_shared; same log-probs, ~1/3 fewer tokens with GSM8K prompts)."""
        from tunix_rt.train.advantages import group_advantages, token_coefficients

        cfg = self.cfg
        if not groups:
            return []
        adv = group_advantages(np.stack([g.rewards for g in groups]), cfg.rl_loss)
        seqs = [(g.prompt, o.ids, adv[i, j], o.finish_reason == "length")
                for i, g in enumerate(groups) for j, o in enumerate(g.completions)]
        written = [tool_written(o) for g in groups for o in g.completions]
        owner = [i for i, g in enumerate(groups) for _ in g.completions]
        width = cfg.rollout_max_new_tokens
        mask = np.zeros((len(seqs), width), np.int64)
        for i, (_p, ids, _a, _t) in enumerate(seqs):
            mask[i, :len(ids)] = 1 - written[i]  # the model's own tokens carry the loss
        coef = token_coefficients(mask, cfg.rl_loss, width, truncated=[t for *_, t in seqs],
                                  drop_truncated=cfg.mask_truncated)
        batches = []
        for s in range(0, len(seqs), cfg.batch_size):
            part = seqs[s:s + cfg.batch_size]
            if shared:
                b, spans = self._shared_batch(part, owner[s:s + cfg.batch_size], coef[s:s + cfg.batch_size])
                b.example_ids = [f"r{s + k}" for k in range(len(part))]
            else:
                rows = [[Rendered(f"r{s + k}", list(p) + list(ids), [0] * len(p) + [1] * len(ids), len(p), "", "")]
                        for k, (p, ids, _a, _t) in enumerate(part)]
                # position t predicts token t + 1
                spans = [(k, slice(len(p) - 1, len(p) - 1 + len(ids)), coef[s + k, :len(ids)], a)
                         for k, (p, ids, a, _t) in enumerate(part)]
                b = weighted_spans(collate(rows, self.tok.pad_id), spans)
            batches.append(unlabel_observations(b, spans, written[s:s + cfg.batch_size]))
        return batches

    def _shared_batch(self, part: list, owner: list[int], coef: np.ndarray):
        """One micro-batch of `part`'s sequences, a row per group: its prompt, then its
        completions as branches; coef and advantage at each branch's predictions. Returns the
        batch and each sequence's (row, predicting positions, coef, advantage)."""
        from tunix_rt.train.data import collate_shared

        rows, where = [], []  # where: (row, branch) of each sequence of part
        for k, (p, ids, _a, _t) in enumerate(part):
            if not rows or owner[k] != owner[k - 1]:
                rows.append((p, []))
            rows[-1][1].append(ids)
            where.append((len(rows) - 1, len(rows[-1][1]) - 1))
        b, starts = collate_shared(rows, self.tok.pad_id)
        spans = [(r, slice(starts[r][j], starts[r][j] + len(ids)), coef[k, :len(ids)], a)
                 for k, ((_p, ids, a, _t), (r, j)) in enumerate(zip(part, where))]
        return weighted_spans(b, spans), spans

    def metrics(self, groups: list[Group], drawn: int, results: list, batches: list) -> dict[str, Any]:
        """The step's row: loss and gradient norm of the last update, rewards (total and each),
        rollout accuracy and format rate, zero-variance share, KL, clip fraction, lengths (the
        mean and the longest: a batch decodes in step until its longest completion ends)."""
        from tunix_rt.train.advantages import zero_variance_groups

        last = results[-1] if results else None
        rewards = np.concatenate([g.rewards for g in groups]) if groups else np.zeros(0)
        lengths = [o.n_tokens for g in groups for o in g.completions]
        stats = last.stats if last else {}
        tokens = max(stats.get("tokens", 0.0), 1.0)
        row = {"loss": last.loss if last else 0.0, "grad_norm": last.grad_norm if last else 0.0,
               "tokens": int(sum(b.n_tokens for b in batches)),
               "reward": float(rewards.mean()) if rewards.size else 0.0,
               **{f"reward_{k}": float(np.concatenate([g.parts[k] for g in groups]).mean()) if groups else 0.0
                  for k in self.rewards.names},
               "rollout_accuracy": float(np.mean([c for g in groups for c in g.correct])) if groups else 0.0,
               "rollout_format_rate": float(np.mean([f for g in groups for f in g.format_ok])) if groups else 0.0,
               "rollout_pass_at_g": float(np.mean([g.correct.any() for g in groups])) if groups else 0.0,
               "zero_variance_share": (drawn - len(groups)) / drawn if self.cfg.rl_loss == "dapo" and drawn else
               float(zero_variance_groups(np.stack([g.rewards for g in groups])).mean()) if groups else 0.0,
               "kl": stats.get("kl", 0.0) / tokens, "clip_fraction": stats.get("clipped", 0.0) / tokens,
               **(tool_metrics([o for g in groups for o in g.completions]) if self.cfg.tools else {}),
               "completion_tokens": float(np.mean(lengths)) if lengths else 0.0,
               "completion_tokens_max": float(max(lengths)) if lengths else 0.0,
               "truncated_rate": float(np.mean([o.finish_reason == "length" for g in groups
                                                for o in g.completions])) if groups else 0.0}
        return row

    # ------------------------------------------------------------------ eval, state
    def evaluate(self, engine: Engine) -> dict[str, float]:
        """Greedy completions of the held-out prompts: mean reward, accuracy, format rate."""
        from tunix_rt.eval.generate import DecodeConfig

        if not self.eval_items:
            return {}
        outs = engine.generator().generate([p for _, p in self.eval_items],
                                           self._with_tools(DecodeConfig(max_new_tokens=self.cfg.rollout_max_new_tokens)))
        groups = [self._score(rec, p, [o]) for (rec, p), o in zip(self.eval_items, outs)]
        return {"eval_reward": float(np.mean([g.rewards[0] for g in groups])),
                "eval_accuracy": float(np.mean([g.correct[0] for g in groups])),
                "eval_format_rate": float(np.mean([g.format_ok[0] for g in groups]))}

    def state(self) -> dict[str, Any]:
        extra = {"curriculum": self.curriculum.state()} if self.curriculum is not None else {}
        return {**position_state(self.order.position), **extra}

    def load_state(self, state: dict[str, Any]) -> None:
        self.order.position = position_of(state)
        if self.curriculum is not None:
            self.curriculum.load_state(state["curriculum"])

    def summary(self) -> dict[str, Any]:
        cfg = self.cfg
        return {"train_examples": len(self.items), "dropped_overlong": self.dataset["dropped_overlong"],
                "completions_per_step": cfg.rl_prompts * cfg.group_size,
                "max_tokens_per_step": cfg.rl_prompts * cfg.group_size * cfg.max_seq_len,
                "rl_loss": cfg.rl_loss, "rewards": self.rewards.names,
                **(self.curriculum.summary() if self.curriculum is not None else {})}

    @staticmethod
    def report_line(cfg: dict[str, Any]) -> str | None:
        """REPORT.md's line on what this method did, with which settings (train.report adds the
        run it started from); `cfg` is the run's resolved config as its manifest holds it."""
        return (f"- RL: {cfg['rl_loss']}, {cfg['rl_prompts']} prompts x {cfg['group_size']} samples a step, "
                f"beta {cfg['beta']}, rewards {json.dumps(cfg['rewards'], sort_keys=True)}")
