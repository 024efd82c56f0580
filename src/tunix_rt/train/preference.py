"""Preference optimisation on chosen/rejected pairs (method=dpo): DPO, IPO, SimPO, ORPO.

    pref_loss  per pair (S = the completion's summed token log-prob, n its tokens, R = S under
               the reference: the adapter-off model, or full FT's frozen copy; beta = pref_beta, ls = label_smoothing)
    dpo        -(1-ls) log sig(beta d) - ls log sig(-beta d),  d = (S_c - R_c) - (S_r - R_r)
    ipo        (d' - 1 / (2 beta))^2,  d' = (S_c - R_c) / n_c - (S_r - R_r) / n_r   (TRL's normalised IPO)
    simpo      -(1-ls) log sig(beta m) - ls log sig(-beta m),  m = S_c / n_c - S_r / n_r - gamma / beta
    orpo       NLL of the chosen completions (per token over the window)
               - lambda log sig(log odds(S_c / n_c) - log odds(S_r / n_r)),  odds(a) = e^a / (1 - e^a)

averaged over the pairs of the optimizer step. The numbers are TRL's: DPOTrainer (sigmoid,
ipo), CPOTrainer with loss_type=simpo and cpo_alpha=0, ORPOTrainer's odds-ratio term
(tests/train/test_preference.py); ORPO's NLL here covers the chosen model turn only, as the
paper's L_SFT and our SFT do (TRL's ORPOTrainer also counts the prompt's tokens).

How a step runs, with no [B, L, V] logits anywhere. A pair loss is not elementwise in the
token log-probs l_t, but its gradient with respect to each l_t is a per-sequence scalar:
dL/dl_t = dL/dS of the token's sequence (or dL/dS / n for the length-normalised losses).
So a step is
  1. no-gradient passes through the engine's chunked path (`Engine.token_logprobs`): each
     sequence's S and n under the policy, and R under the reference (dpo and ipo only);
  2. the pair loss and dL/dS per sequence, in float64 over the whole window (so gradient
     accumulation 8 x 1 equals 1 x 8: nothing depends on how the window is split);
  3. one optimizer step of the engine's fused objective with the linear phi of SFT (NLL:
     phi = -l), each token's coefficient set to -dL/dS of its sequence: its gradient is
     sum_t dL/dS * dl_t/dtheta = dL/dtheta exactly, the value of that surrogate is not the
     loss, so the row logs the loss of step 2.
The head's [tokens, vocabulary] logits never exist (Gemma's 262K vocabulary is TRL's memory
wall). Where the engine takes an engine.SequenceObjective (the torch engine in one process),
steps 1-3 share one forward pass per micro-batch: the trunk runs once with autograd, the
chunked head once (LoRA: each token's log-prob and its gradient wrt the hidden state formed in
the same chunk, loss.sequence_logprobs; a training head: once without gradient for S, then
again with the coefficients), then (the window's normalisation known up front: its pairs and
chosen tokens) the micro-batch's pair losses and coefficients scale those gradients; the
window's loss is the sum of its micro-batches' shares. Elsewhere (the JAX
engine, several processes) step 1 is a no-gradient pass of its own, in eval mode: with
lora_dropout > 0 its S is dropout-free while the fused path's S shares the gradient pass's
dropout, as autograd through S (TRL) has it.

The reference of dpo and ipo is the model the run started from: with LoRA, the model with the
adapter off; with finetune=full, a frozen copy of the starting weights that the engine loads
at the first reference pass (the plan counts it). simpo and orpo need no reference.

Pairs (`pairs`):
  dataset   a prompt/chosen/rejected JSONL (traces.pairs) as `dataset`, split by id like
            traces; the prompt rendered as SFT and eval render it, each completion the model
            turn's text + <end_of_turn>; pairs too long for max_seq_len are dropped and counted;
  rollouts  on-policy: the GRPO method's own rollouts (train.grpo: the same prompt order,
            seeds, rewards and their names, curriculum and filter_pass_rate), and from each group of
            group_size completions the best against the worst by total reward, where they
            differ (a group whose rewards are all equal gives no pair).
A micro-batch holds batch_size sequences: batch_size / 2 pairs, chosen rows then rejected;
where the engine takes shared-prefix rows (the torch engine in one process), a row per pair
holds its prompt once and both completions as branches (fewer tokens, the same log-probs).
"""

from __future__ import annotations

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
from tunix_rt.train.data import SeededOrder, collate, position_of, position_state
from tunix_rt.train.engine import NLL, Engine, SequenceObjective
from tunix_rt.train.methods import REFERENCE_LOSSES, uses_reference

def check_config(cfg: TrainConfig) -> None:
    """What method=dpo refuses, called by TrainConfig's validation (train.methods: the
    MethodSpec's check), so the CLI and the job API refuse it before anything runs."""
    if cfg.batch_size < 2 or cfg.batch_size % 2:
        raise BadInput(f"config: batch_size counts sequences, and a pair is two (chosen, rejected): method=dpo "
                       f"needs an even batch_size >= 2, got {cfg.batch_size}")
    if cfg.tools:
        raise BadInput("config: method=dpo takes no tools (tool-written tokens are not masked out of its pairs)")
    if cfg.packing:
        raise BadInput("config: method=dpo does not pack its pairs; set packing=false")
    if cfg.pairs == "rollouts" and cfg.group_size < 2:
        raise BadInput(f"config: pairs=rollouts pairs the best and worst of group_size completions: "
                       f"group_size must be >= 2, got {cfg.group_size}")

@dataclass(frozen=True)
class TokenPair:
    """One pair as token ids: the rendered prompt and the two completions (model turns)."""

    id: str
    prompt: list[int]
    chosen: list[int]
    rejected: list[int]


@dataclass
class PairLoss:
    """The loss of a window of P pairs and its gradient with respect to each sequence's
    summed log-prob (float64)."""

    loss: float
    d_chosen: np.ndarray  # [P] dL/dS_c
    d_rejected: np.ndarray  # [P] dL/dS_r
    chosen_rewards: np.ndarray  # [P] the implicit rewards
    rejected_rewards: np.ndarray


def _logsig(x):
    return -np.logaddexp(0.0, -x)


def _sig(x):
    return np.exp(_logsig(x))


def pair_loss(kind: str, s_c, s_r, n_c, n_r, ref_c=None, ref_r=None, *, beta: float, label_smoothing: float = 0.0,
              gamma: float = 0.0, lam: float = 0.0, window_pairs: int | None = None,
              window_tokens: float | None = None) -> PairLoss:
    """The pref_loss `kind` of P pairs (the module docstring), mean over pairs, and dL/dS.
    window_pairs / window_tokens: these pairs are a part of a window of that many pairs (and
    chosen tokens, ORPO's NLL): the part's share of the window's loss and its gradient, so the
    parts' losses sum to the window's."""
    s_c, s_r, n_c, n_r = (np.asarray(x, np.float64) for x in (s_c, s_r, n_c, n_r))
    p, ls = window_pairs or len(s_c), label_smoothing
    if kind in REFERENCE_LOSSES:
        lr_c, lr_r = s_c - np.asarray(ref_c, np.float64), s_r - np.asarray(ref_r, np.float64)
    if kind == "dpo":
        z = beta * (lr_c - lr_r)
        losses = -(1 - ls) * _logsig(z) - ls * _logsig(-z)
        dd = beta * (-(1 - ls) * _sig(-z) + ls * _sig(z)) / p
        return PairLoss(float(losses.sum() / p), dd, -dd, beta * lr_c, beta * lr_r)
    if kind == "ipo":
        delta = lr_c / n_c - lr_r / n_r - 1.0 / (2.0 * beta)
        dd = 2.0 * delta / p
        return PairLoss(float((delta ** 2).sum() / p), dd / n_c, -dd / n_r, beta * lr_c, beta * lr_r)
    a_c, a_r = s_c / n_c, s_r / n_r
    if kind == "simpo":
        z = beta * (a_c - a_r - gamma / beta)
        losses = -(1 - ls) * _logsig(z) - ls * _logsig(-z)
        dd = beta * (-(1 - ls) * _sig(-z) + ls * _sig(z)) / p
        return PairLoss(float(losses.sum() / p), dd / n_c, -dd / n_r, beta * a_c, beta * a_r)
    if kind == "orpo":
        one_minus_c, one_minus_r = -np.expm1(a_c), -np.expm1(a_r)  # 1 - e^a: a mean log-prob is < 0
        log_odds = (a_c - a_r) - (np.log(one_minus_c) - np.log(one_minus_r))
        n_tokens = window_tokens or n_c.sum()
        loss = -s_c.sum() / n_tokens - lam * _logsig(log_odds).sum() / p
        dlo = -lam * _sig(-log_odds) / p
        return PairLoss(float(loss), dlo / one_minus_c / n_c - 1.0 / n_tokens, -dlo / one_minus_r / n_r,
                        lam * a_c, lam * a_r)
    raise ValueError(f"pref_loss must be one of dpo, ipo, simpo, orpo, got {kind!r}")


def join(parts: list[PairLoss]) -> PairLoss:
    """The window's PairLoss from its parts' (pair_loss with window_pairs / window_tokens)."""
    cat = lambda name: np.concatenate([getattr(x, name) for x in parts])  # noqa: E731
    return PairLoss(float(sum(x.loss for x in parts)), cat("d_chosen"), cat("d_rejected"), cat("chosen_rewards"),
                    cat("rejected_rewards"))


class _Window:
    """A window's coefficients as a function of each micro-batch's own log-probs, the micro-
    batches in order (engine.SequenceObjective.coef_of), and its PairLoss once all are seen."""

    def __init__(self, cfg: TrainConfig, parts: list, refs: list, pairs: int, chosen_tokens: float):
        self.cfg, self.parts, self.refs, self.pairs, self.chosen_tokens = cfg, parts, refs, pairs, chosen_tokens
        self.losses: list[PairLoss] = []

    def __call__(self, lp: np.ndarray) -> np.ndarray:
        from tunix_rt.train.data import IGNORE

        (b, spans), ref = self.parts[len(self.losses)], self.refs[len(self.losses)]
        seq = np.full(b.labels.size, -1)
        width = b.labels.shape[1]
        for k, (row, at) in enumerate(spans):
            seq[row * width + at.start:row * width + at.stop] = k
        seq = seq[np.asarray(b.labels).reshape(-1) != IGNORE]  # the labelled positions, row-major: lp's order
        on = seq >= 0
        s = np.bincount(seq[on], weights=lp[on].astype(np.float64), minlength=len(spans))
        n = np.array([float(at.stop - at.start) for _row, at in spans])
        k, cfg = len(spans) // 2, self.cfg
        part = pair_loss(cfg.pref_loss, s[:k], s[k:], n[:k], n[k:], *((ref[:k], ref[k:]) if ref is not None else ()),
                         beta=cfg.pref_beta, label_smoothing=cfg.label_smoothing, gamma=cfg.simpo_gamma,
                         lam=cfg.orpo_lambda, window_pairs=self.pairs, window_tokens=self.chosen_tokens)
        self.losses.append(part)
        d = -np.concatenate([part.d_chosen, part.d_rejected])
        return np.where(on, d[np.maximum(seq, 0)], 0.0).astype(np.float32)

    def loss(self) -> PairLoss:
        if len(self.losses) != len(self.parts):
            raise RuntimeError(f"the engine computed {len(self.losses)} of the window's {len(self.parts)} micro-batches")
        return join(self.losses)


def pair_batch(pairs: list[TokenPair], pad_id: int, shared: bool = False):
    """One micro-batch of the pairs and each sequence's (row, predicting positions), chosen
    sequences first, then rejected ones, in pair order. Plain: a row per sequence (prompt +
    completion; position t predicts token t + 1). shared: a row per pair, its prompt written
    once and the two completions as branches (data.collate_shared, as GRPO's groups: the same
    log-probs from fewer tokens)."""
    from tunix_rt.train.data import collate_shared

    if shared:
        batch, starts = collate_shared([(p.prompt, [p.chosen, p.rejected]) for p in pairs], pad_id)
        spans = [(i, slice(starts[i][side], starts[i][side] + len(ids)))
                 for side, key in ((0, "chosen"), (1, "rejected")) for i, p in enumerate(pairs) for ids in [getattr(p, key)]]
        return batch, spans
    seqs = [(p, getattr(p, key)) for key in ("chosen", "rejected") for p in pairs]
    rows = [[Rendered(f"{p.id}:{k}", p.prompt + ids, [0] * len(p.prompt) + [1] * len(ids), len(p.prompt), "", "")]
            for k, (p, ids) in enumerate(seqs)]
    spans = [(k, slice(len(p.prompt) - 1, len(p.prompt) - 1 + len(ids))) for k, (p, ids) in enumerate(seqs)]
    return collate(rows, pad_id), spans


def sequence_sums(engine: Engine, batch, spans, adapter: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Each sequence's summed completion log-prob (float64) and its token count, no gradient."""
    lp = engine.token_logprobs(batch, adapter=adapter).astype(np.float64)
    return (np.array([lp[row, at].sum() for row, at in spans]),
            np.array([float(at.stop - at.start) for _row, at in spans]))


class Preference:
    objective = NLL  # the linear surrogate: coefficients carry dL/dS (module docstring)

    def __init__(self, cfg: TrainConfig, home: Home, tok):
        self.cfg, self.tok = cfg, tok
        self.rl = None
        self.per_batch = cfg.batch_size // 2
        self.reference = uses_reference(cfg)
        if cfg.pairs == "rollouts":
            from tunix_rt.train.grpo import GRPO

            self.rl = GRPO(cfg, home, tok)  # its rollouts, rewards, prompt order and eval
            self.total_steps, self.dataset = self.rl.total_steps, self.rl.dataset
            self.train_pairs, self.eval_pairs, self.dropped = [], [], 0
            return
        from tunix_rt.traces.dataset import load_dataset
        from tunix_rt.traces.pairs import Pair
        from tunix_rt.train.common import dataset_facts

        ds = load_dataset(cfg.dataset, home)
        if ds.records and not isinstance(ds.records[0], Pair):
            raise BadInput(f"method=dpo with pairs=dataset needs a prompt/chosen/rejected JSONL as dataset "
                           f"(traces.pairs); {ds.ref} holds traces: use pairs=rollouts to make pairs from "
                           "the model's own samples of its prompts")
        records = list(ds.split(cfg.split))[: cfg.limit]
        self.train_pairs, self.dropped = self._tokenize(records)
        self.eval_pairs, _ = self._tokenize(list(ds.split(cfg.eval_split))[: cfg.eval_limit])
        if not self.train_pairs:
            raise BadInput(f"no pairs left in {ds.ref} ({cfg.split}): empty split, or every pair longer than "
                           f"max_seq_len={cfg.max_seq_len}")
        self.order = SeededOrder(len(self.train_pairs), cfg.seed)
        per_epoch = math.ceil(len(self.train_pairs) / (self.per_batch * cfg.grad_accum))
        self.total_steps = cfg.max_steps if cfg.max_steps is not None else max(1, math.ceil(cfg.epochs * per_epoch))
        self.dataset = dataset_facts(cfg, ds, len(records), len(self.train_pairs), len(self.eval_pairs))

    def _tokenize(self, records: list) -> tuple[list[TokenPair], int]:
        out = []
        for r in records:
            p = prompt_ids(r.prompt, self.tok, self.cfg.system_prompt)
            c, j = self.tok.encode(r.chosen) + [self.tok.eot_id], self.tok.encode(r.rejected) + [self.tok.eot_id]
            if len(p) + max(len(c), len(j)) <= self.cfg.max_seq_len:
                out.append(TokenPair(r.id, p, c, j))
        return out, len(records) - len(out)

    # ------------------------------------------------------------------ the step
    def step(self, engine: Engine, step: int, lr: float) -> tuple[dict[str, Any], list[str]]:
        t0 = time.perf_counter()
        extra: dict[str, Any] = {}
        if self.rl is not None:
            pairs, extra = self.rollout_pairs(engine, step)
        else:
            pairs = [self.train_pairs[self.order.take()] for _ in range(self.per_batch * self.cfg.grad_accum)]
        t1 = time.perf_counter()
        if pairs and engine.sequence_objective():
            batches, window = self.window_objective(engine, pairs)
            grad_norm = engine.train_step(batches, SequenceObjective(window), lr).grad_norm
            loss = window.loss()
        else:
            batches, loss = self.weighted_batches(engine, pairs)
            grad_norm = engine.train_step(batches, NLL, lr).grad_norm if batches else 0.0
        row = {"loss": loss.loss if loss else 0.0, "grad_norm": grad_norm,
               "tokens": int(sum(b.n_tokens for b in batches)), **self.pair_metrics(loss, len(pairs)), **extra}
        if self.rl is not None:
            row.update(rollout_s=t1 - t0, update_s=time.perf_counter() - t1)
        return row, [p.id for p in pairs]

    def weighted_batches(self, engine: Engine, pairs: list[TokenPair]) -> tuple[list, PairLoss | None]:
        """The window's micro-batches, each token's coefficient -dL/dS of its sequence, and
        the window's PairLoss."""
        if not pairs:
            return [], None
        groups = [pairs[i:i + self.per_batch] for i in range(0, len(pairs), self.per_batch)]
        parts = [pair_batch(g, self.tok.pad_id, shared=engine.shares_prefix()) for g in groups]
        loss = self.window_loss(engine, parts)
        at = 0
        for g, (b, spans) in zip(groups, parts):
            k = len(g)
            per_seq = -np.concatenate([loss.d_chosen[at:at + k], loss.d_rejected[at:at + k]])
            b.coef = np.zeros(b.labels.shape, np.float32)
            for (row, span), c in zip(spans, per_seq):
                b.coef[row, span] = c
            at += k
        return [b for b, _ in parts], loss

    def window_objective(self, engine: Engine, pairs: list[TokenPair]) -> tuple[list, "_Window"]:
        """The window's micro-batches and the coefficients of each as a function of its own
        log-probs (engine.SequenceObjective): the policy's S comes from the gradient pass itself;
        the reference's R (dpo, ipo) from no-gradient reference passes, as before."""
        groups = [pairs[i:i + self.per_batch] for i in range(0, len(pairs), self.per_batch)]
        parts = [pair_batch(g, self.tok.pad_id, shared=engine.shares_prefix()) for g in groups]
        refs = [sequence_sums(engine, b, spans, adapter=False)[0] if self.reference else None for b, spans in parts]
        for b, _ in parts:
            b.coef = np.zeros(b.labels.shape, np.float32)  # set in the forward pass (_Window)
        return [b for b, _ in parts], _Window(self.cfg, parts, refs, len(pairs), float(sum(len(p.chosen) for p in pairs)))

    def window_loss(self, engine: Engine, parts: list) -> PairLoss:
        """The pair loss of the micro-batches' pairs ((batch, spans) of pair_batch; no
        gradient: policy and, for dpo and ipo, reference passes through the engine's chunked
        path)."""
        cols: dict[str, list] = {k: [] for k in ("s_c", "s_r", "n_c", "n_r", "ref_c", "ref_r")}
        for b, spans in parts:
            k = len(spans) // 2
            s, n = sequence_sums(engine, b, spans)
            cols["s_c"].append(s[:k]), cols["s_r"].append(s[k:]), cols["n_c"].append(n[:k]), cols["n_r"].append(n[k:])
            if self.reference:
                ref, _ = sequence_sums(engine, b, spans, adapter=False)
                cols["ref_c"].append(ref[:k]), cols["ref_r"].append(ref[k:])
        c = {k: np.concatenate(v) if v else None for k, v in cols.items()}
        cfg = self.cfg
        return pair_loss(cfg.pref_loss, c["s_c"], c["s_r"], c["n_c"], c["n_r"], c["ref_c"], c["ref_r"],
                         beta=cfg.pref_beta, label_smoothing=cfg.label_smoothing, gamma=cfg.simpo_gamma,
                         lam=cfg.orpo_lambda)

    @staticmethod
    def pair_metrics(loss: PairLoss | None, n_pairs: int, prefix: str = "") -> dict[str, float]:
        """Implicit rewards of the chosen and rejected completions, their margin and the
        share of pairs whose chosen reward is the higher one (accuracy)."""
        if loss is None:
            return {f"{prefix}pairs": 0}
        c, r = loss.chosen_rewards, loss.rejected_rewards
        return {f"{prefix}pairs": n_pairs, f"{prefix}rewards_chosen": float(c.mean()),
                f"{prefix}rewards_rejected": float(r.mean()), f"{prefix}rewards_margin": float((c - r).mean()),
                f"{prefix}rewards_accuracy": float((c > r).mean())}

    def rollout_pairs(self, engine: Engine, step: int) -> tuple[list[TokenPair], dict[str, Any]]:
        """GRPO's rollouts of this step, each group's best completion against its worst."""
        groups, drawn = self.rl.rollouts(engine, step)
        pairs = []
        for g in groups:
            best, worst = int(np.argmax(g.rewards)), int(np.argmin(g.rewards))
            if g.rewards[best] > g.rewards[worst]:
                pairs.append(TokenPair(g.record.id, list(g.prompt), list(g.completions[best].ids),
                                       list(g.completions[worst].ids)))
        rewards = np.concatenate([g.rewards for g in groups]) if groups else np.zeros(0)
        return pairs, {"reward": float(rewards.mean()) if rewards.size else 0.0,
                       "rollout_accuracy": float(np.mean([c for g in groups for c in g.correct])) if groups else 0.0,
                       "paired_share": len(pairs) / len(groups) if groups else 0.0,
                       **self.rl.draw_metrics(groups, drawn)}

    # ------------------------------------------------------------------ eval, state
    def evaluate(self, engine: Engine) -> dict[str, float]:
        """Dataset pairs: the held-out pairs' loss and implicit-reward accuracy and margin.
        Rollout pairs: GRPO's greedy eval of the held-out prompts (reward, accuracy, format)."""
        if self.rl is not None:
            return self.rl.evaluate(engine)
        if not self.eval_pairs:
            return {}
        k = self.per_batch
        parts = [pair_batch(self.eval_pairs[i:i + k], self.tok.pad_id, shared=engine.shares_prefix())
                 for i in range(0, len(self.eval_pairs), k)]
        loss = self.window_loss(engine, parts)
        m = self.pair_metrics(loss, len(self.eval_pairs), prefix="eval_")
        return {"eval_loss": loss.loss, **{key: v for key, v in m.items() if key != "eval_pairs"}}

    def state(self) -> dict[str, Any]:
        return self.rl.state() if self.rl is not None else position_state(self.order.position)

    def load_state(self, state: dict[str, Any]) -> None:
        if self.rl is not None:
            self.rl.load_state(state)
        else:
            self.order.position = position_of(state)

    def summary(self) -> dict[str, Any]:
        cfg = self.cfg
        facts = {"pref_loss": cfg.pref_loss, "pairs": cfg.pairs, "reference": self.reference,
                 "max_tokens_per_step": cfg.batch_size * cfg.grad_accum * cfg.max_seq_len}
        if self.rl is not None:
            return {**facts, **self.rl.summary()}
        return {**facts, "train_examples": len(self.train_pairs), "dropped_overlong": self.dropped,
                "eval_pairs": len(self.eval_pairs)}

    @staticmethod
    def report_line(cfg: dict[str, Any]) -> str | None:
        """REPORT.md's line on what this method did, with which settings (train.report adds the
        run it started from); `cfg` is the run's resolved config as its manifest holds it."""
        loss, beta = cfg["pref_loss"], cfg["pref_beta"]
        knobs = {"dpo": f"DPO (sigmoid), beta {beta}, label smoothing {cfg['label_smoothing']}",
                 "ipo": f"IPO, tau {beta}",
                 "simpo": f"SimPO, beta {beta}, gamma {cfg['simpo_gamma']}, label smoothing {cfg['label_smoothing']}",
                 "orpo": f"ORPO, lambda {cfg['orpo_lambda']}"}[loss]
        ref = ("no reference model" if loss not in REFERENCE_LOSSES else "reference: the adapter-off model"
               if cfg.get("finetune", "lora") == "lora" else "reference: a frozen copy of the starting weights")
        pairs = (f"pairs from `{cfg['dataset']}`" if cfg["pairs"] == "dataset" else
                 f"on-policy pairs: {cfg['rl_prompts']} prompts x {cfg['group_size']} samples a step ranked by "
                 f"rewards {json.dumps(cfg['rewards'], sort_keys=True)}, the best against the worst")
        return f"- preference optimisation: {knobs}; {ref}; {pairs}"
