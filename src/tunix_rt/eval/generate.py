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
- Tools (`cfg.tools`, names from `tunix_rt.tools.NAMES`; empty: none, and decoding is what it
  was without them, bit for bit): each row runs the decoding rule of `tunix_rt.tools` through
  its own `ToolRow`. When the model's newest token closes a call in the row's model turn (the
  part of the turn the prompt already holds, then the completion), a token whose text runs
  past the closing marker is replaced by the encoding of its text up to the marker, the tool
  runs, and its result's ids are fed to that row one per step instead of its own picks, while
  the other rows go on sampling; then the model resumes. Forced ids count toward
  `max_new_tokens`; the row's noise stays keyed by (seed, key, step), so a row decodes the same
  in any batch. `Generation.tool_mask` marks the tool-written ids (1) among `ids`;
  `Generation.tool_calls` lists each call as {"tool", "call", "result", "error"}.

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

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.eval.int8_kernel import argmax
from tunix_rt.eval.sampling import Key, Noise, check_keys, row_seed, sample_full
from tunix_rt.ranges import AT_LEAST_0, AT_LEAST_1, Range, number_problem
from tunix_rt.tools import check_tools, closed_call, respond

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
    tools: tuple[str, ...] = ()
    """Tools the model may call while it decodes (tunix_rt.tools.NAMES; empty: none). A list
    is taken as the tuple of its names."""

    def __post_init__(self) -> None:
        problem = self.problem({name: getattr(self, name) for name in DECODE_RANGES})
        if problem:
            raise BadInput(problem)
        object.__setattr__(self, "tools", tuple(check_tools(self.tools, "tools")))

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
            **({"tools": list(self.tools)} if self.tools else {}),  # no key without tools: as before
        }


@dataclass(frozen=True)
class Generation:
    """One prompt's output."""

    ids: list[int]
    text: str
    n_tokens: int
    finish_reason: str  # "stop" | "length"
    tool_mask: list[int] = field(default_factory=list)
    """0/1 per id of `ids` (1: written by a tool, forced; 0: the model's); `finish` fills it."""
    tool_calls: list[dict] = field(default_factory=list)
    """Each call in order: {"tool", "call" (its body), "result" (what the tool wrote), "error"}."""


class Generator(Protocol):
    """What an engine's generator offers to the eval stage."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        cfg: DecodeConfig,
        on_tokens: Callable[[int], None] | None = None,
    ) -> list[Generation]: ...


def finish(ids: list[int], stop_ids: Sequence[int], tok: "ChatTokenizer", max_new_tokens: int,
           tools: "ToolRow | None" = None) -> Generation:
    """Build a Generation from the ids one prompt produced (shared by both engines); `tools`:
    the row's ToolRow when it decoded with tools (its mask and calls)."""
    stopped = bool(ids) and ids[-1] in stop_ids
    body = ids[:-1] if stopped else ids
    reason = FINISH_STOP if stopped else FINISH_LENGTH
    if not stopped and len(ids) < max_new_tokens:
        raise TunixRtError(f"generation ended after {len(ids)} < {max_new_tokens} tokens without a stop token")
    if tools is not None and tools.ids != list(ids):
        raise TunixRtError("a row's tool record does not hold the ids it generated")
    mask = list(tools.mask) if tools is not None else [0] * len(ids)
    calls = [dict(c) for c in tools.calls] if tools is not None else []
    return Generation(ids=list(ids), text=tok.decode(body), n_tokens=len(ids), finish_reason=reason,
                      tool_mask=mask, tool_calls=calls)


def turn_ids(prompt: Sequence[int], tok: "ChatTokenizer") -> list[int]:
    """The part of the model turn a prompt already holds: its ids after the last
    "<start_of_turn>model\n" (none when the prompt ends with exactly that, as
    render.prompt_ids makes it; none when its last turn is not the model's)."""
    prompt = list(prompt)
    head = [tok.sot_id] + tok.encode("model\n")
    at = max((i for i, t in enumerate(prompt) if t == tok.sot_id), default=-1)
    return prompt[at + len(head):] if at >= 0 and prompt[at: at + len(head)] == head else []


class ToolRow:
    """One row's side of decoding with tools (the rule of `tunix_rt.tools`): the ids it
    emitted, which of them a tool wrote, the calls it made, and the ids still to force.

    Every decode step the generator hands the row's pick to `take` and feeds the model the id
    it returns: the next forced id while any is pending (the pick is ignored), else the pick,
    unless the pick closes a call: then the pick, or, when its text runs past the call's
    closing marker, the encoding of its text up to the marker (the model's ids, the rest of
    them forced next), then the ids of the tool's result (tool-written). Stop ids are left to
    the generator. Serving and chat decode one row at a time through the same class."""

    def __init__(self, tok: "ChatTokenizer", tools: Sequence[str], prompt: Sequence[int] = ()):
        self.tok = tok
        self.tools = tuple(check_tools(tools))
        self.turn = turn_ids(prompt, tok)
        """The model turn's ids the prompt holds (its text counts for the calls)."""
        self.stop_ids = frozenset(tok.stop_ids)
        self.ids: list[int] = []
        self.mask: list[int] = []
        self.calls: list[dict] = []
        self.pending: deque[tuple[int, int]] = deque()
        """(id, tool-written 0/1) still to force, in order."""
        self._text = (0, tok.decode(self.turn))  # (len(ids) it decodes, the turn's text)

    @property
    def forcing(self) -> bool:
        """Whether the next `take` ignores the pick (a forced id is pending)."""
        return bool(self.pending)

    def text(self) -> str:
        """The model turn so far (the prompt's part, then every id taken), decoded."""
        n, text = self._text
        if n != len(self.ids):
            text = self.tok.decode(self.turn + self.ids)
            self._text = (len(self.ids), text)
        return text

    def take(self, picked: int) -> int:
        """The id this row emits this step, given the model's pick; recorded."""
        if self.pending:
            token, written = self.pending.popleft()
            self.ids.append(token)
            self.mask.append(written)
            return token
        token = int(picked)
        if token not in self.stop_ids:
            token = self._model_token(token)
        self.ids.append(token)
        self.mask.append(0)
        return token

    def _model_token(self, token: int) -> int:
        since = len(self.text())
        text = self.tok.decode(self.turn + self.ids + [token])
        found = closed_call(text, self.tools, since)
        if found is None:
            self._text = (len(self.ids) + 1, text)
            return token
        end, call = found
        own = self.tok.encode(text[since:end]) if end < len(text) else [token]
        result = respond(call)
        self.calls.append({"tool": call.tool, "call": call.body, "result": result.text, "error": result.error})
        self.pending.extend((t, 0) for t in own[1:])
        self.pending.extend((t, 1) for t in self.tok.encode(result.text))
        return own[0]


def tool_rows(prompts: Sequence[Sequence[int]], cfg: DecodeConfig, tok: "ChatTokenizer") -> "list[ToolRow] | None":
    """One ToolRow per prompt when `cfg` names tools, else None (decoding as without tools)."""
    return [ToolRow(tok, cfg.tools, p) for p in prompts] if cfg.tools else None


def length_sorted_batches(prompts: Sequence[Sequence[int]], batch_size: int) -> list[list[int]]:
    """Prompt indices grouped into batches of similar length (longest first: the first batch
    is the most expensive, so a memory problem shows at once, not at the end)."""
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class TorchGenerator:
    """Batched greedy/sampling decode with a KV cache on a transformers causal LM."""

    def __init__(self, model, tok: "ChatTokenizer", device: str = "cpu", lean: bool = True,
                 f32_kernel: bool = False):
        from tunix_rt.eval.fast_gemma import LeanGemma

        self.model = model.eval()
        self.tok = tok
        self.device = device
        self.stop_ids = tuple(tok.stop_ids)
        self.lean = LeanGemma.for_model(self.model, f32_kernel=f32_kernel) if lean else None
        """The lean decode step (Gemma 3/2), or None: every step through transformers.
        `f32_kernel`: its projections through the kernel library's fp32 product where it
        applies (LeanGemma.f32_kernel: faster, not transformers' bits)."""

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
                tools = tool_rows([prompts[i] for i in batch], cfg, self.tok)
                rows = self._decode_batch([list(prompts[i]) for i in batch], cfg,
                                          [keys[i] for i in batch], on_tokens, tools)
                for r, (i, ids) in enumerate(zip(batch, rows)):
                    out[i] = finish(ids, self.stop_ids, self.tok, cfg.max_new_tokens, tools and tools[r])
        return out  # type: ignore[return-value]

    def _decode_batch(self, prompts, cfg: DecodeConfig, keys, on_tokens,
                      tools: "list[ToolRow] | None" = None) -> list[list[int]]:
        """Decode one batch; returns each row's generated ids (stop token included). `tools`:
        one ToolRow per row, which turns each pick into the id the row emits (see ToolRow)."""
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
        # the lean step picks the first token too, from the prompt's last hidden state: its int8
        # screen (fp32: the same ids as full logits) or its quantised head, not a full fp32 head
        # (Gemma 3 270M's reads 671 MB a row, ~20 ms of a ~110 ms single-stream prefill)
        last = self.last_logits if self.lean is None else self.last_hidden
        head_in = last(ids, mask, pos, cache)  # [P, vocab] logits, or the lean step's [P, D] hidden states
        if len(first) < len(prompts):
            rows = torch.tensor(src, device=dev)
            cache.batch_select_indices(rows)
            head_in, mask, pos = head_in[rows], mask[rows], pos[rows]
        next_pos = pos[:, -1] + 1
        state = self.lean.start(cache, mask, next_pos, cfg.max_new_tokens) if self.lean else None
        if state is not None:
            cache = None  # its contents now live in the preallocated buffers
        alive = list(range(len(prompts)))  # original row of each batch row
        outs: list[list[int]] = [[] for _ in prompts]
        stop = torch.tensor(self.stop_ids, device=dev)
        vocab = head_in.shape[-1] if self.lean is None else self.lean.head.shape[0]

        def noise(step: int):  # the rows alive now, each from its own (seed, key, step), on dev;
            # drawn where a path looks (the screened head draws few or none of the full rows)
            return None if cfg.greedy else Noise([row_seed(cfg.seed, keys[r], step) for r in alive], vocab, dev)

        nxt = pick(head_in, cfg, noise(0)) if self.lean is None else self.lean.pick_next(head_in, cfg, noise(0))
        for step in range(cfg.max_new_tokens):
            if tools is not None:  # forced ids replace picks; the rows are fed what they emit
                nxt = torch.tensor([tools[r].take(t) for r, t in zip(alive, nxt.tolist())], device=dev)
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

    def last_hidden(self, ids, mask, pos, cache):
        """Last-position hidden states [B, D] after the final norm (the decoder without its head)."""
        out = self.model.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True,
        )
        return out.last_hidden_state[:, -1, :]

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


def pick(logits: "torch.Tensor", cfg: DecodeConfig, noise: "Noise | torch.Tensor | None") -> "torch.Tensor":
    """Next token of each row from full logits: argmax, or the Gumbel-max draw with `noise`."""
    if cfg.greedy:
        return argmax(logits)
    return sample_full(logits, noise, cfg)


def tool_spans(gen: Generation, tok: "ChatTokenizer") -> tuple[tuple[int, int], ...]:
    """The [start, end) character spans of `gen.text` that tools wrote: each run of
    tool-written ids (`gen.tool_mask`), located by decoding the prefixes, so the spans index
    the text exactly (the stop token is not in the text)."""
    import numpy as np

    if not any(gen.tool_mask):
        return ()
    mask = np.asarray(gen.tool_mask[:len(gen.ids) - (gen.finish_reason == FINISH_STOP)], np.int64)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))  # starts and ends of runs of 1s
    at = [len(tok.decode(gen.ids[:k])) for k in edges]
    return tuple(zip(at[::2], at[1::2]))
