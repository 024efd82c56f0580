"""Batched generation: the interface both engines implement, and the PyTorch one.

The contract (the JAX engine's `tunix_rt.eval.jax_generate` implements the same):

    gen = SomeGenerator(...)
    outs = gen.generate(prompts, cfg, on_tokens=None)   # prompts: list[list[int]]
    outs[i] -> Generation(ids, text, n_tokens, finish_reason)  # same order as prompts

- `prompts` are full prompt token ids (BOS included, as `tunix_rt.render.prompt_ids` makes
  them); the generator adds nothing.
- `ids` are the generated ids, the stop token included when there is one; `n_tokens ==
  len(ids)`; `text` decodes `ids` without the final stop token; `finish_reason` is "stop"
  (hit <end_of_turn> or <eos>) or "length" (hit `max_new_tokens`).
- Greedy when `cfg.temperature == 0`; otherwise temperature, then top-k, then top-p, drawn
  as Gumbel-max (`tunix_rt.eval.sampling`) with noise seeded per row and decode step by
  (cfg.seed, the prompt's key, step): the key is the prompt's index unless the caller passes
  `keys=` (one int or tuple of ints per prompt), so a prompt's sample does not depend on
  which other prompts share its batch or when they stop.
- `on_tokens(n)` is called as tokens are produced (for progress bars and tokens/s).

The PyTorch generator is a lean loop over a transformers model (plain, PEFT-wrapped, or
merged): one prefill that computes logits for the last position only (the 262K-vocabulary
head over every prompt position would be [B, L, 262144] floats), then one forward per
token against a KV cache. Prompts are sorted by length so a batch carries little padding;
padding is on the left, with an attention mask and position ids that count real tokens
only, so a row decodes exactly as it would alone. Finished rows leave the batch and the
cache is compacted, so the tail of a batch does not pay for rows that already stopped.

For Gemma 3 and Gemma 2 the decode steps after that prefill run through
`tunix_rt.eval.fast_gemma.LeanGemma` (same arithmetic on the same weights, a preallocated
cache written in place, none of transformers' per-step mask/cache/RoPE work) and pick their
token through the int8-screened head (`tunix_rt.eval.screened_head`), greedy or sampled,
with the same ids as full logits; any other model, or `lean=False`, steps through the
transformers forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.eval.sampling import Key, check_keys, gumbel, row_seed, sample_full
from tunix_rt.ranges import AT_LEAST_0, AT_LEAST_1, Range, number_problem

if TYPE_CHECKING:  # torch stays out of `tunix-rt --help`
    import torch

    from tunix_rt.models.tokenizer import ChatTokenizer

FINISH_STOP = "stop"
FINISH_LENGTH = "length"
#: every decoding number's range, checked by DecodeConfig (the seed takes any integer)
DECODE_RANGES: dict[str, Range] = {"max_new_tokens": AT_LEAST_1, "temperature": AT_LEAST_0,
                                   "top_p": Range(0, 1, low_open=True), "top_k": AT_LEAST_0,
                                   "batch_size": AT_LEAST_1}


@dataclass(frozen=True)
class DecodeConfig:
    """How to decode; written verbatim into eval_summary.json's `decoding`."""

    max_new_tokens: int = 256
    """Most tokens generated per prompt (the stop token counts)."""
    temperature: float = 0.0
    """0: greedy (argmax). Above 0: sample from softmax(logits / temperature)."""
    top_p: float = 1.0
    """Sampling only: keep the smallest set of tokens whose probability reaches top_p."""
    top_k: int = 0
    """Sampling only: keep the k most likely tokens (0: all)."""
    seed: int = 0
    """Sampling only: seeds one RNG per prompt, (seed, prompt index)."""
    batch_size: int = 8
    """Prompts decoded together."""

    def __post_init__(self) -> None:
        problem = self.problem({name: getattr(self, name) for name in DECODE_RANGES})
        if problem:
            raise BadInput(problem)

    @classmethod
    def problem(cls, values: Mapping[str, Any], prefix: str = "") -> str | None:
        """The first of `values` (field name -> value) that is not a finite number of its
        field's type inside its DECODE_RANGES, named `prefix` + field (None: all fine). The
        training config checks its rollout_* settings here, with prefix "rollout_"."""
        for name, value in values.items():
            integer = str(cls.__dataclass_fields__[name].type) == "int"
            problem = number_problem(prefix + name, value, DECODE_RANGES[name], integer)
            if problem:
                return problem
        return None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        return {
            "strategy": "greedy" if self.greedy else "sample",
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "batch_size": self.batch_size,
        }


@dataclass(frozen=True)
class Generation:
    """One prompt's output."""

    ids: list[int]
    text: str
    n_tokens: int
    finish_reason: str  # "stop" | "length"


class Generator(Protocol):
    """What an engine's generator offers to the eval stage."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        cfg: DecodeConfig,
        on_tokens: Callable[[int], None] | None = None,
    ) -> list[Generation]: ...


def finish(ids: list[int], stop_ids: Sequence[int], tok: "ChatTokenizer", max_new_tokens: int) -> Generation:
    """Build a Generation from the ids one prompt produced (shared by both engines)."""
    stopped = bool(ids) and ids[-1] in stop_ids
    body = ids[:-1] if stopped else ids
    reason = FINISH_STOP if stopped else FINISH_LENGTH
    if not stopped and len(ids) < max_new_tokens:
        raise TunixRtError(f"generation ended after {len(ids)} < {max_new_tokens} tokens without a stop token")
    return Generation(ids=list(ids), text=tok.decode(body), n_tokens=len(ids), finish_reason=reason)


def length_sorted_batches(prompts: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """Prompt indices grouped into batches of similar length (longest first: the first batch
    is the most expensive, so a memory problem shows at once, not at the end)."""
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class TorchGenerator:
    """Batched greedy/sampling decode with a KV cache on a transformers causal LM."""

    def __init__(self, model, tok: "ChatTokenizer", device: str = "cpu", lean: bool = True):
        from tunix_rt.eval.fast_gemma import LeanGemma

        self.model = model.eval()
        self.tok = tok
        self.device = device
        self.stop_ids = tuple(tok.stop_ids)
        self.lean = LeanGemma.for_model(self.model) if lean else None
        """The lean decode step (Gemma 3/2), or None: every step through transformers."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        cfg: DecodeConfig,
        on_tokens: Callable[[int], None] | None = None,
        *,
        keys: Sequence[Key] | None = None,
    ) -> list[Generation]:
        """`keys`: one sampling-noise key per prompt (default: its index), see the module doc."""
        import torch

        if any(len(p) == 0 for p in prompts):
            raise BadInput("cannot generate from an empty prompt")
        keys = check_keys(keys, len(prompts)) if keys is not None else list(range(len(prompts)))
        out: list[Generation | None] = [None] * len(prompts)
        with torch.inference_mode():
            for batch in length_sorted_batches(prompts, cfg.batch_size):
                rows = self._decode_batch([list(prompts[i]) for i in batch], cfg,
                                          [keys[i] for i in batch], on_tokens)
                for i, ids in zip(batch, rows):
                    out[i] = finish(ids, self.stop_ids, self.tok, cfg.max_new_tokens)
        return out  # type: ignore[return-value]

    def _decode_batch(self, prompts, cfg: DecodeConfig, keys, on_tokens) -> list[list[int]]:
        """Decode one batch; returns each row's generated ids (stop token included)."""
        import torch
        from transformers import DynamicCache

        dev = self.device
        # Each distinct prompt is prefilled once (GRPO's G samples of a prompt share it), its
        # cache rows, logits and mask then repeated for the rows that hold it.
        first: dict[tuple[int, ...], int] = {}
        src = [first.setdefault(tuple(p), len(first)) for p in prompts]
        ids, mask = left_pad([list(p) for p in first], self.tok.pad_id, dev)
        pos = position_ids(mask)
        cache = DynamicCache(config=self.model.config)
        logits = self.last_logits(ids, mask, pos, cache)
        if len(first) < len(prompts):
            rows = torch.tensor(src, device=dev)
            cache.batch_select_indices(rows)
            logits, mask, pos = logits[rows], mask[rows], pos[rows]
        next_pos = pos[:, -1] + 1
        state = self.lean.start(cache, mask, next_pos, cfg.max_new_tokens) if self.lean else None
        if state is not None:
            cache = None  # its contents now live in the preallocated buffers
        alive = list(range(len(prompts)))  # original row of each batch row
        outs: list[list[int]] = [[] for _ in prompts]
        stop = torch.tensor(self.stop_ids, device=dev)
        vocab = logits.shape[-1]

        def noise(step: int):  # the rows alive now, each from its own (seed, key, step)
            return None if cfg.greedy else gumbel([row_seed(cfg.seed, keys[r], step) for r in alive], vocab)

        nxt = pick(logits, cfg, noise(0))
        for step in range(cfg.max_new_tokens):
            for row, t in zip(alive, nxt.tolist()):
                outs[row].append(t)
            if on_tokens:
                on_tokens(len(alive))
            done = torch.isin(nxt, stop)
            if step == cfg.max_new_tokens - 1 or bool(done.all()):
                break
            if bool(done.any()):
                keep = (~done).nonzero().squeeze(1)
                nxt, alive = nxt[keep], [alive[k] for k in keep.tolist()]
                if state is not None:
                    state.select(keep)
                else:
                    cache.batch_select_indices(keep)
                    mask, next_pos = mask[keep], next_pos[keep]
            if state is not None:
                nxt = self.lean.step_pick(nxt, state, cfg, noise(step + 1))  # int8-screened head, same ids
                continue
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            logits = self.last_logits(nxt[:, None], mask, next_pos[:, None], cache)
            next_pos = next_pos + 1
            nxt = pick(logits, cfg, noise(step + 1))
        return outs

    def last_logits(self, ids, mask, pos, cache):
        """Last-position logits only, fp32 (the decode step the serving scheduler runs too)."""
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos,
            past_key_values=cache, use_cache=True, logits_to_keep=1,
        )
        return out.logits[:, -1, :].float()


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple["torch.Tensor", "torch.Tensor"]:
    """[B, L] ids padded on the left with pad_id, and the 0/1 attention mask."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[r, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def position_ids(mask: "torch.Tensor") -> "torch.Tensor":
    """Positions that count real tokens only (pads get 0), as HF generate makes them."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def pick(logits: "torch.Tensor", cfg: DecodeConfig, noise: "torch.Tensor | None") -> "torch.Tensor":
    """Next token of each row from full logits: argmax, or the Gumbel-max draw with `noise`."""
    if cfg.greedy:
        return logits.argmax(dim=-1)
    return sample_full(logits, noise, cfg)
