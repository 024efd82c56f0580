"""SFT: supervised fine-tuning on rendered traces (the model turn only).

One step takes `grad_accum` micro-batches from the seeded, resumable stream, weights every
supervised position by 1 / (supervised positions of the whole window) and asks the engine
for one optimizer step of the NLL objective. The held-out loss is the mean per supervised
token over the eval examples, in fixed order.
"""

from __future__ import annotations

import math
from typing import Any

from tunix_rt.home import Home
from tunix_rt.train.config import TrainConfig
from tunix_rt.train.data import BatchStream, collate, position_of, position_state, weighted
from tunix_rt.train.engine import NLL, Engine


class SFT:
    objective = NLL

    def __init__(self, cfg: TrainConfig, home: Home, tok):
        from tunix_rt.train.common import load_data, steps_for

        self.cfg = cfg
        train, self.eval_examples, self.dataset = load_data(cfg, home, tok)
        self.pad_id = tok.pad_id
        self.stream = BatchStream(train, cfg.batch_size, cfg.max_seq_len, cfg.packing, cfg.seed, tok.pad_id)
        self.total_steps = steps_for(cfg, train, tok.pad_id)

    def step(self, engine: Engine, step: int, lr: float) -> tuple[dict[str, Any], list[str]]:
        """One optimizer step; returns its metrics row (without step/lr/timing) and the ids
        of the examples it trained on."""
        batches = weighted([self.stream.next_batch() for _ in range(self.cfg.grad_accum)])
        res = engine.train_step(batches, NLL, lr)
        row = {"loss": res.loss, "grad_norm": res.grad_norm, "tokens": sum(b.n_tokens for b in batches)}
        return row, [i for b in batches for i in b.example_ids]

    def evaluate(self, engine: Engine) -> dict[str, float]:
        """{"eval_loss": mean held-out loss per supervised token} ({} without eval examples)."""
        if not self.eval_examples:
            return {}
        groups = [[[ex] for ex in self.eval_examples[i:i + self.cfg.batch_size]]
                  for i in range(0, len(self.eval_examples), self.cfg.batch_size)]
        batches = [collate(rows, self.pad_id) for rows in groups]
        weighted(batches)  # one normaliser over the whole split
        loss = sum(engine.loss_sum(b) for b in batches)
        return {"eval_loss": loss} if math.isfinite(loss) else {}

    def state(self) -> dict[str, Any]:
        return position_state(self.stream.position)

    def load_state(self, state: dict[str, Any]) -> None:
        self.stream.position = position_of(state)

    def summary(self) -> dict[str, Any]:
        """The pre-run facts: first batch shape, examples, what was dropped."""
        first = BatchStream(self.stream.examples, self.cfg.batch_size, self.cfg.max_seq_len, self.cfg.packing,
                            self.cfg.seed, self.pad_id, self.stream.position).next_batch()
        return {"first_batch_shape": list(first.input_ids.shape),
                "first_batch_supervised_tokens": first.n_supervised,
                "max_tokens_per_step": self.cfg.tokens_per_step,
                "train_examples": len(self.stream.examples),
                "dropped_overlong": self.dataset["dropped_overlong"]}

    @staticmethod
    def report_line(cfg: dict[str, Any]) -> str | None:
        """REPORT.md's line on what this method did (train.report): none, the report's head says
        it all for SFT."""
        return None
