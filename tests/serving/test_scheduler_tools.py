"""Serving with tools: in the scheduler's batched decode (the lean Gemma step, and the
transformers step), a row that closes a calculator call gets the result forced while the
other rows go on decoding, and every reply (streamed text, tokens, finish) equals the one
it gets alone and eval's generator's.

How a tiny random model writes a call, honestly: one prompt already holds the start of the
model turn, ending inside a call ("So <<3*4"), and the model's own greedy first token there
is made "=$" by swapping two rows of its tied embedding (that token and "=$"): the model
writes the closing "=" itself, inside a token whose text runs past it (the replacement rule
of tunix_rt.tools applies).
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from tunix_rt.eval.generate import DecodeConfig, TorchGenerator
from tunix_rt.render import prompt_ids
from tunix_rt.serving.scheduler import Event, Request, Scheduler

CALC = ("calculator",)
GREEDY = DecodeConfig(max_new_tokens=12, tools=CALC)


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def steered(tmp_path_factory):
    """(model, tok, prompts): prompt 0 starts a call the model closes with its first token."""
    from tunix_rt.eval.runner import load_model
    from tunix_rt.home import Home
    from tunix_rt.models.store import ensure_model, load_tokenizer

    home = Home.resolve(tmp_path_factory.mktemp("home")).ensure()
    tok = load_tokenizer("tiny-gemma3", home)
    model = load_model(ensure_model("tiny-gemma3", home), None, "cpu")
    prompts = [prompt_ids("What is 3 times 4?", tok, "") + tok.encode("So <<3*4"),
               prompt_ids("Tom has 12 apples and gives away 5. How many are left?", tok, "Be brief."),
               prompt_ids("Double 21.", tok, "")]
    first = TorchGenerator(model, tok).generate(prompts[:1], replace(GREEDY, tools=(), max_new_tokens=1))[0].ids[0]
    eq = tok.encode("=$")
    assert len(eq) == 1 and first not in {t for p in prompts for t in p}
    with torch.no_grad():
        w = model.get_input_embeddings().weight
        w[[first, eq[0]]] = w[[eq[0], first]]
    return model, tok, prompts


class Collect:
    """A request's sink: its events, and a flag once every choice is done."""

    def __init__(self, n: int) -> None:
        self.events: list[Event] = []
        self.n, self.done = n, threading.Event()

    def __call__(self, ev: Event) -> None:
        self.events.append(ev)
        if ev.kind == "error" or sum(e.kind == "done" for e in self.events) == self.n:
            self.done.set()

    def replies(self) -> list[tuple[str, str, int]]:
        assert not [e for e in self.events if e.kind == "error"], self.events
        out = []
        for i in range(self.n):
            text = "".join(e.text for e in self.events if e.kind == "delta" and e.index == i)
            done = next(e for e in self.events if e.kind == "done" and e.index == i)
            out.append((text, done.finish_reason, done.n_tokens))
        return out


def serve(gen, reqs: list[tuple[list[int], DecodeConfig, int]], together: bool):
    """Each (prompt, decoding, n) through one scheduler: all submitted at once, or one after
    the other finished. Returns the replies of each and the scheduler's peak of rows."""
    sched = Scheduler(gen, max_batch=8, max_queue=8)
    try:
        sinks = []
        for prompt, cfg, n in reqs:
            sinks.append(Collect(n))
            sched.submit(Request(prompt, cfg, sinks[-1], n=n))
            if not together:
                assert sinks[-1].done.wait(120)
        for s in sinks:
            assert s.done.wait(120)
        return [s.replies() for s in sinks], sched.peak_rows
    finally:
        sched.close()


@pytest.mark.parametrize("lean", [True, False], ids=["lean-step", "transformers-step"])
def test_a_call_forces_its_result_while_other_rows_decode_and_batched_equals_alone(steered, lean):
    model, tok, prompts = steered
    gen = TorchGenerator(model, tok, lean=lean)
    assert (gen.lean is not None) == lean
    sampled = replace(GREEDY, temperature=1.0, top_k=40, seed=3)
    reqs = [(prompts[0], GREEDY, 1), (prompts[1], sampled, 2), (prompts[2], GREEDY, 1)]
    batched, peak = serve(gen, reqs, together=True)
    alone, _ = serve(gen, reqs, together=False)
    assert peak >= 3  # the rows shared decode steps
    assert batched == alone
    text, reason, n = batched[0][0]
    assert text.startswith("=12>>")  # the model wrote "=" (its "=$" cut at the marker), the tool "12>>"
    # the same replies as eval's generator (choice i of a request is key i there)
    want = gen.generate([prompts[0]], GREEDY)[0]
    assert (text, reason, n) == (want.text, want.finish_reason, want.n_tokens)
    assert want.tool_calls == [{"tool": "calculator", "call": "3*4", "result": "12>>", "error": False}]
    picks = gen.generate([prompts[1]] * 2, sampled)
    assert batched[1] == [(g.text, g.finish_reason, g.n_tokens) for g in picks]


def test_without_tools_the_call_is_not_answered(steered):
    model, tok, prompts = steered
    (reply,), _ = serve(TorchGenerator(model, tok), [(prompts[0], replace(GREEDY, tools=()), 1)], together=True)
    assert reply[0][0].startswith("=$") and "12>>" not in reply[0][0]


def test_a_run_is_served_with_its_tools_unless_turned_off(home):
    """A run whose config.yaml names tools is served with them (a catalog model has none);
    ServeConfig(tools=False) (`serve --no-tools`, `chat --no-tools`) and a request's
    use_tools=False decode without."""
    import shutil

    import yaml

    from tunix_rt.models.store import ensure_model
    from tunix_rt.serving.models import ServeConfig, load

    run = home.runs / "grpo-tiny-tools"
    shutil.copytree(ensure_model("tiny-gemma3", home), run / "final" / "merged")
    (run / "config.yaml").write_text(yaml.safe_dump({"model": "tiny-gemma3", "system_prompt": "", "tools": ["calculator"]}))
    served = load(run.name, home, ServeConfig(device="cpu"))
    try:
        assert served.tools == CALC
        assert served.decoding(DecodeConfig()).tools == CALC and served.decoding(DecodeConfig(), False).tools == ()
    finally:
        served.scheduler.close()
    for model, cfg in ((run.name, ServeConfig(device="cpu", tools=False)), ("tiny-gemma3", ServeConfig(device="cpu"))):
        other = load(model, home, cfg)
        other.scheduler.close()
        assert other.tools == () and other.decoding(DecodeConfig()).tools == ()


def test_int8_weights_batched_equal_alone_and_eval(steered):
    """`serve --weights int8`: the int8 step (its layers one call of the kernel library each,
    where it loads) gives every row the same reply batched as alone, and as eval's generator:
    no row's numbers depend on the others in its batch (per-row activation scales, the cache
    merge's extra left padding masked out exactly)."""
    import copy

    from tunix_rt.eval import int8_kernel
    from tunix_rt.eval.int8_weights import use_weights

    model, tok, prompts = steered
    gen = use_weights(TorchGenerator(copy.deepcopy(model), tok), "int8")
    assert gen.lean.fused == (int8_kernel.decode_library() is not None)
    sampled = replace(GREEDY, temperature=1.0, top_k=40, seed=3)
    reqs = [(prompts[0], GREEDY, 1), (prompts[1], sampled, 2), (prompts[2], GREEDY, 1)]
    batched, peak = serve(gen, reqs, together=True)
    alone, _ = serve(gen, reqs, together=False)
    assert peak >= 3 and batched == alone
    want = gen.generate([prompts[2]], GREEDY)[0]
    assert batched[2][0] == (want.text, want.finish_reason, want.n_tokens)
    picks = gen.generate([prompts[1]] * 2, sampled)
    assert batched[1] == [(g.text, g.finish_reason, g.n_tokens) for g in picks]
