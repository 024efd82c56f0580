"""Trace → Gemma chat text → token ids + loss mask; and model output → (reasoning, answer).

The turn format is ours (the GGUF tokenizer carries no chat template):

    <bos><start_of_turn>user
    {system prompt}

    {question}<end_of_turn>
    <start_of_turn>model
    <reasoning>
    step one
    </reasoning>
    <answer>42</answer><end_of_turn>

The prompt and the target are tokenized separately, so the prompt tokens seen in training
are exactly the ones generation starts from. Control tokens are inserted as ids, never
parsed out of user text. The loss covers the model turn, <end_of_turn> included.

With tools (TrainConfig.tools, tunix_rt.tools) the model turn is tokenized piece by piece
(tools.segments: each piece encoded on its own, ids concatenated), each tool result replaced
by what the tool writes now; the tool-written pieces get loss mask 0. Those are exactly the
ids decoding forces after the call, so training never teaches the model to write a result.

Every trace that passes the schema renders a target that parse_completion reads back as
format_ok with its own steps and answer: the schema refuses the format's tags and the turn
markers where they would break that (traces.schema.REFUSED_TAGS).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Iterable, NamedTuple, Sequence

from tunix_rt.errors import BadInput
from tunix_rt.models.tokenizer import ChatTokenizer
from tunix_rt.tools import segments
from tunix_rt.traces.schema import FORMAT_TAGS

DEFAULT_SYSTEM_PROMPT = (
    "Think step by step inside <reasoning></reasoning>, then give only the final answer "
    "inside <answer></answer>."
)
END_OF_TURN = "<end_of_turn>"


def target_body(steps: Iterable[str], answer: str) -> str:
    """The model turn's text, without the closing <end_of_turn>."""
    return "<reasoning>\n" + "\n".join(steps) + "\n</reasoning>\n<answer>" + answer + "</answer>"


def prompt_ids(question: str, tok: ChatTokenizer, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> list[int]:
    """Token ids of everything up to and including "<start_of_turn>model\\n"."""
    user = f"user\n{system_prompt}\n\n{question}" if system_prompt else f"user\n{question}"
    return (
        [tok.bos_id, tok.sot_id]
        + tok.encode(user)
        + [tok.eot_id]
        + tok.encode("\n")
        + [tok.sot_id]
        + tok.encode("model\n")
    )


def prompt_text(question: str, system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """The prompt as text, control tokens spelled out (for display and the --json dump)."""
    user = f"{system_prompt}\n\n{question}" if system_prompt else question
    return f"<bos><start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"


@dataclass(frozen=True)
class Rendered:
    """One training example: ids, a 0/1 loss mask over them, and where the target starts."""

    id: str
    ids: list[int]
    loss_mask: list[int]
    prompt_len: int
    prompt_text: str
    target_text: str  # the model turn as text, "<end_of_turn>" included
    model_text: str | None = None
    """The model-written part of target_text (tool results left out); None: all of it."""

    @property
    def n_trainable(self) -> int:
        return sum(self.loss_mask)


@dataclass
class RenderStats:
    """What rendering a dataset did: kept, dropped as too long, and the longest seen."""

    kept: int = 0
    dropped_overlong: int = 0
    dropped_ids: list[str] = field(default_factory=list)
    max_len: int = 0


def render_example(
    record_id: str,
    question: str,
    steps: list[str],
    answer: str,
    tok: ChatTokenizer,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    tools: Sequence[str] = (),
) -> Rendered:
    p = prompt_ids(question, tok, system_prompt)
    t, mask, body, model_text = _target(record_id, target_body(steps, answer), tok, tools)
    if sum(mask) <= 1:
        raise BadInput(f"{record_id}: the model turn has no trainable token")
    return Rendered(
        id=record_id,
        ids=p + t,
        loss_mask=[0] * len(p) + mask,
        prompt_len=len(p),
        prompt_text=prompt_text(question, system_prompt),
        target_text=body + END_OF_TURN,
        model_text=None if model_text == body else model_text + END_OF_TURN,
    )


def _target(record_id: str, body: str, tok: ChatTokenizer, tools: Sequence[str]) -> tuple[list[int], list[int], str, str]:
    """The model turn's ids and loss mask (0 on tool-written pieces), its text with each tool
    result as the tool writes it now, and the model-written part of that text."""
    if not tools:
        ids = tok.encode(body) + [tok.eot_id]
        return ids, [1] * len(ids), body, body
    try:
        pieces = segments(body, tools)
    except BadInput as e:
        raise BadInput(f"{record_id}: {e}") from None
    ids: list[int] = []
    mask: list[int] = []
    for text, by_tool in pieces:
        piece = tok.encode(text)
        ids += piece
        mask += [0 if by_tool else 1] * len(piece)
    text = "".join(t for t, _ in pieces)
    return ids + [tok.eot_id], mask + [1], text, "".join(t for t, by_tool in pieces if not by_tool)


def render_trace(trace, tok: ChatTokenizer, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 tools: Sequence[str] = ()) -> Rendered:
    """Render a trace record (anything with id, question, steps, answer)."""
    return render_example(trace.id, trace.question, list(trace.steps), trace.answer, tok, system_prompt, tools)


def render_dataset(
    traces: Iterable,
    tok: ChatTokenizer,
    max_seq_len: int,
    system_prompt: str = DEFAULT_SYSTEM_PROMPT,
    on_overlong: str = "drop",
    tools: Sequence[str] = (),
) -> tuple[list[Rendered], RenderStats]:
    """Render every trace; an example longer than max_seq_len is dropped and counted, or
    fails the call when on_overlong == "fail". Never truncated. `tools`: the model turn's
    tool results are tool-written (loss mask 0), see the module docstring."""
    if on_overlong not in ("drop", "fail"):
        raise BadInput(f"on_overlong must be 'drop' or 'fail', not {on_overlong!r}")
    out, stats = [], RenderStats()
    for tr in traces:
        r = render_trace(tr, tok, system_prompt, tools)
        stats.max_len = max(stats.max_len, len(r.ids))
        if len(r.ids) > max_seq_len:
            if on_overlong == "fail":
                raise BadInput(
                    f"{r.id}: {len(r.ids)} tokens exceed max_seq_len={max_seq_len} "
                    "(raise max_seq_len or set drop_overlong)"
                )
            stats.dropped_overlong += 1
            stats.dropped_ids.append(r.id)
            continue
        out.append(r)
        stats.kept += 1
    return out, stats


def supervised_text(r: Rendered, tok: ChatTokenizer) -> str:
    """Decode of the masked-in tokens: must equal r.model_text, or r.target_text without tools."""
    return tok.decode([i for i, m in zip(r.ids, r.loss_mask) if m])


# ---------------------------------------------------------------------------------------
# The inverse: completion text → (reasoning, answer, format_ok)

_REASONING = re.compile(r"<reasoning>(.*?)</reasoning>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_TAGS = FORMAT_TAGS  # the trace schema refuses them inside steps and answers (REFUSED_TAGS)
_STRICT = re.compile(r"\s*<reasoning>(.*?)</reasoning>\s*<answer>(.*?)</answer>\s*", re.S)
_NUMBER = re.compile(r"[-−–]?\$?\s?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")


class ParsedCompletion(NamedTuple):
    reasoning: str | None
    answer: str | None
    format_ok: bool


def parse_completion(text: str) -> ParsedCompletion:
    """Split a completion into reasoning and answer.

    format_ok: exactly one <reasoning>…</reasoning> followed by exactly one
    <answer>…</answer>, and nothing after but whitespace. A completion that breaks the
    format still yields the tags it has (the first answer tag), but never a fallback number:
    that is `fallback_answer`'s job and is counted apart.
    """
    text = text.replace(END_OF_TURN, "")
    reasonings = _REASONING.findall(text)
    answers = _ANSWER.findall(text)
    reasoning = reasonings[0].strip() if reasonings else None
    answer = answers[0].strip() if answers else None
    # Each tag exactly once (so nothing nests), in order, and a non-empty answer.
    once = all(text.count(tag) == 1 for tag in _TAGS)
    format_ok = once and bool(_STRICT.fullmatch(text)) and bool(answer)
    return ParsedCompletion(reasoning, answer, format_ok)


def fallback_answer(text: str) -> str | None:
    """The last number in a completion, for models that never learned the tags."""
    found = _NUMBER.findall(text.replace(END_OF_TURN, ""))
    return found[-1].strip() if found else None


# ---------------------------------------------------------------------------------------
# Answer normalisation

_UNITS = re.compile(
    r"\s*(?:dollars?|cents?|percent|%|units?|items?|people|hours?|minutes?|days?|weeks?|years?"
    r"|km|kg|g|m|cm|mm|miles?|feet|ft|inches|lbs?|pounds?|meters?)\.?\s*$",
    re.I,
)


def _clean(s: str) -> str:
    s = unicodedata.normalize("NFKC", s)
    s = s.replace("−", "-").replace("–", "-").replace("—", "-")
    s = s.strip().rstrip(".").strip()  # a sentence-final dot, not a leading decimal point
    return s


def parse_number(s: str | None) -> Fraction | None:
    """'$1,234.50' → 1234.5, '18.0' → 18, '3/4' → 3/4, '-3' → -3, '45%' → 45, '7 km' → 7."""
    if s is None:
        return None
    s = _clean(s)
    s = _UNITS.sub("", s)
    s = s.replace("$", "").replace("€", "").replace("£", "").replace(",", "").replace(" ", "")
    if not s:
        return None
    neg = s.startswith("-")
    if neg or s.startswith("+"):
        s = s[1:]
    try:
        if re.fullmatch(r"\d+/\d+", s):
            num, den = s.split("/")
            if int(den) == 0:
                return None
            value = Fraction(int(num), int(den))
        elif re.fullmatch(r"\d+(?:\.\d*)?|\.\d+", s):
            value = Fraction(s)
        else:
            return None
    except (ValueError, ZeroDivisionError):
        return None
    return -value if neg else value


def normalize_answer(s: str | None) -> str:
    """Canonical text of an answer: a number in lowest terms when it is one, else the
    lower-cased text with punctuation and extra spaces removed."""
    if s is None:
        return ""
    n = parse_number(s)
    if n is not None:
        return str(n.numerator) if n.denominator == 1 else f"{n.numerator}/{n.denominator}"
    s = _clean(s).lower()
    s = re.sub(r"[^\w\s/.-]", "", s)
    return re.sub(r"\s+", " ", s).strip()


def answers_match(pred: str | None, gold: str) -> bool:
    """Numeric comparison when both are numbers, else normalised text."""
    if pred is None:
        return False
    a, b = parse_number(pred), parse_number(gold)
    if a is not None and b is not None:
        return a == b or math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    return normalize_answer(pred) == normalize_answer(gold) != ""
