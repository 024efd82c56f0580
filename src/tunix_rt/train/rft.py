"""Rejection-sampling fine-tuning (method=rft): expert iteration, STaR's loop without
rationalisation. The run goes in rounds; a round

  1. samples: group_size completions for each of rl_prompts prompts with the engine's own
     generator (the GRPO method's rollouts, train.grpo: the same prompt order, seeds per
     (seed, round, draw) and row, rendering, tools and rewards; curriculum and
     filter_pass_rate apply as there);
  2. accepts: a completion is kept when every reward named in `rft_accept` gives it at least
     its threshold ({answer: 1, format: 1}: the answer right and the strict format; add
     `arith: 1` to ask that every claim `a op b = c` holds), each reward's unweighted value
     as the rollout scored it; the kept ones are deduplicated (one per prompt and token
     sequence);
  3. trains SFT on them for `rft_round_steps` optimizer steps: prompt + completion with the
     loss on the completion's tokens (tool-written ones masked, as GRPO's update masks them),
     micro-batches from the kept set in a seeded order (epochs over it as needed), the NLL
     objective normalised per supervised token of each step as SFT's.

A round that keeps nothing trains nothing: its step logs the sampling (kept_share 0) and the
next step samples the next round. The step that samples logs the round: rft_round,
rft_samples, rft_accepted, rft_kept, kept_share (kept / samples), the rewards, rollout
accuracy, format rate and pass@G, and GRPO's draw metrics (groups drawn, the share the
pass-rate band skipped, the curriculum's levels and moves: a round is the curriculum's step);
every step logs loss, grad_norm and tokens.

Resume is exact: the checkpoint's state holds the prompt order (and curriculum), the round,
the steps left in it, its kept examples (token ids and loss masks) and the position of the
stream over them, so a run stopped mid-round trains on the same batches after a resume.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any

import numpy as np

from tunix_rt.errors import BadInput
from tunix_rt.home import Home
from tunix_rt.render import Rendered
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import BatchStream, position_of, position_state, weighted
from tunix_rt.train.engine import NLL, Engine


def round_seed(seed: int, rnd: int) -> int:
    """The seed of round `rnd`'s order over its kept examples."""
    return int.from_bytes(hashlib.sha256(f"rft:{seed}:{rnd}".encode()).digest()[:4], "little")


def accepted(parts: dict[str, np.ndarray], rule: dict[str, float]) -> np.ndarray:
    """[n] bool: the completions whose every named reward reaches its threshold."""
    ok = np.ones(len(next(iter(parts.values()))), dtype=bool)
    for name, threshold in rule.items():
        ok &= np.asarray(parts[name]) >= threshold
    return ok


class RFT:
    objective = NLL

    def __init__(self, cfg: TrainConfig, home: Home, tok):
        from tunix_rt.train.grpo import GRPO

        self.cfg, self.tok = cfg, tok
        self.rl = GRPO(cfg, home, tok)  # its rollouts, rewards, prompt order and eval
        self.dataset = self.rl.dataset
        missing = sorted(set(cfg.rft_accept) - set(self.rl.rewards.names))
        if missing:
            raise BadInput(f"config: rft_accept names {missing}, which are not rewards of this run "
                           f"(rewards: {self.rl.rewards.names}); add them to rewards or drop them from rft_accept")
        rounds = math.ceil(len(self.rl.items) / cfg.rl_prompts)
        self.total_steps = (cfg.max_steps if cfg.max_steps is not None
                            else max(1, math.ceil(cfg.epochs * rounds) * cfg.rft_round_steps))
        self.round, self.left = 0, 0
        self.kept: list[Rendered] = []
        self.stream: BatchStream | None = None

    # ------------------------------------------------------------------ the step
    def step(self, engine: Engine, step: int, lr: float) -> tuple[dict[str, Any], list[str]]:
        row: dict[str, Any] = {}
        if self.left == 0:
            row, prompts = self.sample(engine)
            if not self.kept:  # nothing to learn from: the next step samples the next round
                return {"loss": 0.0, "grad_norm": 0.0, "tokens": 0, **row}, prompts
        t1 = time.perf_counter()
        batches = weighted([self.stream.next_batch() for _ in range(self.cfg.grad_accum)])
        res = engine.train_step(batches, NLL, lr)
        self.left -= 1
        row = {"loss": res.loss, "grad_norm": res.grad_norm, "tokens": sum(b.n_tokens for b in batches),
               "rft_round": self.round, **row, "update_s": time.perf_counter() - t1}
        return row, [i for b in batches for i in b.example_ids]

    def sample(self, engine: Engine) -> tuple[dict[str, Any], list[str]]:
        """The next round: its rollouts, the accepted and deduplicated completions as SFT
        examples (self.kept, self.stream, self.left), and its metrics."""
        from tunix_rt.train.grpo import tool_written

        t0 = time.perf_counter()
        groups, drawn = self.rl.rollouts(engine, self.round)
        self.round += 1
        kept, seen, n_ok = [], set(), 0
        for g in groups:
            ok = accepted(g.parts, self.cfg.rft_accept)
            n_ok += int(ok.sum())
            for j in np.flatnonzero(ok):
                o = g.completions[j]
                key = (g.record.id, tuple(o.ids))
                if key in seen:
                    continue
                seen.add(key)
                mask = [0] * len(g.prompt) + [int(x) for x in 1 - tool_written(o)]
                kept.append(Rendered(f"{g.record.id}~r{self.round}s{j}", list(g.prompt) + list(o.ids), mask,
                                     len(g.prompt), "", ""))
        self.kept = kept
        self.stream = (BatchStream(kept, self.cfg.batch_size, self.cfg.max_seq_len, self.cfg.packing,
                                   round_seed(self.cfg.seed, self.round), self.tok.pad_id) if kept else None)
        self.left = self.cfg.rft_round_steps if kept else 0
        n = sum(len(g.completions) for g in groups)
        rewards = np.concatenate([g.rewards for g in groups]) if groups else np.zeros(0)
        lengths = [o.n_tokens for g in groups for o in g.completions]
        row = {"rft_round": self.round, "rft_samples": n, "rft_accepted": n_ok, "rft_kept": len(kept),
               "kept_share": len(kept) / n if n else 0.0,
               "reward": float(rewards.mean()) if rewards.size else 0.0,
               **{f"reward_{k}": float(np.concatenate([g.parts[k] for g in groups]).mean()) if groups else 0.0
                  for k in self.rl.rewards.names},
               "rollout_accuracy": float(np.mean([c for g in groups for c in g.correct])) if groups else 0.0,
               "rollout_format_rate": float(np.mean([f for g in groups for f in g.format_ok])) if groups else 0.0,
               "rollout_pass_at_g": float(np.mean([g.correct.any() for g in groups])) if groups else 0.0,
               "completion_tokens": float(np.mean(lengths)) if lengths else 0.0,
               **self.rl.draw_metrics(groups, drawn), "rollout_s": time.perf_counter() - t0}
        return row, [g.record.id for g in groups]

    # ------------------------------------------------------------------ eval, state
    def evaluate(self, engine: Engine) -> dict[str, float]:
        """GRPO's greedy eval of the held-out prompts: mean reward, accuracy, format rate."""
        return self.rl.evaluate(engine)

    def state(self) -> dict[str, Any]:
        return {**self.rl.state(),
                "rft": {"round": self.round, "left": self.left,
                        "kept": [[ex.id, list(ex.ids), list(ex.loss_mask), ex.prompt_len] for ex in self.kept],
                        "stream": position_state(self.stream.position) if self.stream is not None else None}}

    def load_state(self, state: dict[str, Any]) -> None:
        self.rl.load_state(state)
        mine = state["rft"]
        self.round, self.left = int(mine["round"]), int(mine["left"])
        self.kept = [Rendered(i, list(ids), list(mask), int(p), "", "") for i, ids, mask, p in mine["kept"]]
        self.stream = None
        if self.kept:
            self.stream = BatchStream(self.kept, self.cfg.batch_size, self.cfg.max_seq_len, self.cfg.packing,
                                      round_seed(self.cfg.seed, self.round), self.tok.pad_id,
                                      position_of(mine["stream"]))

    def summary(self) -> dict[str, Any]:
        cfg = self.cfg
        return {"train_examples": len(self.rl.items), "dropped_overlong": self.dataset["dropped_overlong"],
                "samples_per_round": cfg.rl_prompts * cfg.group_size, "round_steps": cfg.rft_round_steps,
                "rft_accept": dict(cfg.rft_accept), "rewards": self.rl.rewards.names,
                "max_tokens_per_step": cfg.tokens_per_step,
                **(self.rl.curriculum.summary() if self.rl.curriculum is not None else {})}

    @staticmethod
    def report_line(cfg: dict[str, Any]) -> str | None:
        """REPORT.md's line on what this method did, with which settings (train.report adds the
        run it started from); `cfg` is the run's resolved config as its manifest holds it."""
        steps = cfg["rft_round_steps"]
        return (f"- rejection sampling (RFT): {cfg['rl_prompts']} prompts x {cfg['group_size']} samples a round, "
                f"kept when {json.dumps(cfg['rft_accept'], sort_keys=True)} (each reward at least its threshold; "
                f"one of each distinct completion), {steps} SFT step{'s' if steps != 1 else ''} a round, "
                f"rewards {json.dumps(cfg['rewards'], sort_keys=True)}")
