"""`tunix-rt chat MODEL_OR_RUN`: talk to a model in the terminal, on the same scheduler and
generator that /v1/chat/completions serves (so a reply here is the API's reply).

A run trained with tools (its config.yaml `tools`) chats with them: a calculator call in a
reply is answered by the tool, as in training and eval; `--no-tools` turns them off.

Each line you type is a user turn; the conversation so far is the prompt of the next one.
Commands: /reset (forget the conversation), /system [TEXT] (show or set the system prompt;
`/system -` clears it), /quit. Ctrl-C stops a reply and keeps what was said; Ctrl-C or
Ctrl-D at the prompt leaves.
"""

from __future__ import annotations

import queue
import signal
import sys
from typing import Annotated, Optional

import typer

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.eval.generate import DecodeConfig
from tunix_rt.home import Home
from tunix_rt.serving.models import ServeConfig, ServedModel, load
from tunix_rt.serving.scheduler import Event, Request
from tunix_rt.serving.template import Message, chat_prompt_ids

HELP = "/reset forgets the conversation · /system [TEXT|-] shows or sets the system prompt · /quit · Ctrl-C stops a reply"


class ChatSession:
    """The conversation and the decoding settings; `reply` streams one model turn."""

    def __init__(self, served: ServedModel, cfg: DecodeConfig) -> None:
        self.served, self.cfg = served, cfg
        self.system = served.system_prompt
        self.history: list[Message] = []

    def reply(self, text: str, write) -> tuple[str, str, int, int]:
        """Ask; `write(delta)` as the text arrives. Returns (text, finish reason, completion
        tokens, prompt tokens). Ctrl-C cancels the request and keeps the partial text."""
        self.history.append(Message("user", text))
        prompt = chat_prompt_ids([Message("system", self.system), *self.history], self.served.tok, self.system)
        ctx = self.served.max_context
        if ctx and len(prompt) + self.cfg.max_new_tokens > ctx:
            self.history.pop()
            raise BadInput(f"the conversation ({len(prompt)} tokens) + a reply of up to {self.cfg.max_new_tokens} "
                           f"tokens would exceed the model's context of {ctx}: /reset to start over")
        events: queue.Queue[Event] = queue.Queue()
        req = Request(prompt, self.cfg, events.put)
        self.served.scheduler.submit(req)
        out, reason, n = [], "stopped", 0
        try:
            while True:
                try:
                    ev = events.get(timeout=0.1)  # a timed wait lets Ctrl-C through
                except queue.Empty:
                    continue
                if ev.kind == "error":
                    raise TunixRtError(f"generation failed: {ev.error}")
                if ev.kind == "done":
                    reason, n = ev.finish_reason, ev.n_tokens
                    break
                out.append(ev.text)
                write(ev.text)
        except KeyboardInterrupt:
            req.cancel()
            n = req.generated
        self.history.append(Message("assistant", "".join(out)))
        return "".join(out), reason, n, len(prompt)

    def command(self, line: str) -> str | None:
        """Handle a /command; returns what to print, or None to quit."""
        name, _, arg = line.partition(" ")
        if name == "/quit":
            return None
        if name == "/reset":
            self.history = []
            return "(conversation cleared)"
        if name == "/system":
            if arg.strip():
                self.system = "" if arg.strip() == "-" else arg.strip()
                self.history = []
                return "(system prompt set; conversation cleared)"
            return f"system: {self.system or '(none)'}"
        return HELP


def chat_cmd(
    model: Annotated[str, typer.Argument(help="A catalog name (e.g. gemma3-270m) or a run id.")],
    max_tokens: Annotated[Optional[int], typer.Option(help="Most tokens per reply (default: DecodeConfig's).")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="0 is greedy (the default).")] = None,
    top_p: Annotated[Optional[float], typer.Option(help="Nucleus sampling mass.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Sampling seed.")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda.")] = "auto",
    tools: Annotated[bool, typer.Option("--tools/--no-tools", help="Use the run's tools (its config.yaml `tools`).")] = True,
    weights: Annotated[str, typer.Option(help="fp32 | int8 | int4: decode on weight-only int8 or int4 weights (Gemma 3/2; faster, not bit-exact).")] = "fp32",
) -> None:
    """Chat with a model or a trained run in the terminal (history, /reset, /system)."""
    given = {"max_new_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "seed": seed}
    served = load(model, Home.resolve().ensure(),
                  ServeConfig(device=device, max_models=1, max_batch=1, max_queue=1, tools=tools,
                              weights=weights))
    session = ChatSession(served, served.decoding(DecodeConfig(**{k: v for k, v in given.items() if v is not None})))
    # Ctrl-C is how a reply is stopped and the chat left: take it even where the parent
    # started us with SIGINT ignored (a background job, some test runners), which Python keeps
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with_tools = f", tools: {', '.join(served.tools)}" if served.tools else ""
    print(f"chatting with {model}{' (run)' if served.run_id else ''}{with_tools}; {HELP}", flush=True)
    try:
        _loop(session)
    except KeyboardInterrupt:  # Ctrl-C between the prompt and a reply (printing, a command) leaves too
        print()
    finally:
        served.scheduler.close()


def _loop(session: ChatSession) -> None:
    while True:
        try:
            line = input("you> ").strip()
        except (EOFError, KeyboardInterrupt):
            print()
            return
        if not line:
            continue
        if line.startswith("/"):
            said = session.command(line)
            if said is None:
                return
            print(said, flush=True)
            continue
        sys.stdout.write("model> ")
        try:
            _, reason, n, n_prompt = session.reply(line, lambda t: (sys.stdout.write(t), sys.stdout.flush()))
        except BadInput as e:
            print(f"\n({e})", flush=True)
            continue
        print(f"\n[{reason}, {n} tokens, prompt {n_prompt} tokens]", flush=True)
