"""`tunix-rt chat` as a user drives it: a real process, lines on stdin, Ctrl-C (SIGINT)
in the middle of a long reply, on the tiny Gemma 3."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


class Chat:
    def __init__(self, home: Path, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "TUNIX_RT_HOME": str(home), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tunix_rt.cli", "chat", "tiny-gemma3", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env, text=True, bufsize=1,
                                     # as the full suite left it for its children once: SIGINT
                                     # ignored; the chat must take Ctrl-C all the same
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        self.out = ""
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while ch := self.proc.stdout.read(1):
            self.out += ch

    def wait_for(self, pattern: str, after: int = 0, timeout: float = 90) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.compile(pattern, re.S).search(self.out, after)
            if m:
                return m
            if self.proc.poll() is not None and not re.search(pattern, self.out[after:], re.S):
                raise AssertionError(f"chat exited ({self.proc.returncode}) without {pattern!r}:\n{self.out}")
            time.sleep(0.02)
        raise AssertionError(f"no {pattern!r} in:\n{self.out}")

    def say(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def leave(self, after: int) -> None:
        """The system prompt outlived what came before `after`; Ctrl-C at the prompt leaves."""
        self.say("/system")
        self.wait_for(r"system: Be brief\.\nyou> ", after)
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(timeout=60) == 0

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


@pytest.mark.serial
def test_chat_history_commands_and_ctrl_c(tmp_path):
    from tunix_rt.eval.generate import DecodeConfig, TorchGenerator
    from tunix_rt.eval.runner import load_model
    from tunix_rt.home import Home
    from tunix_rt.models.store import ensure_model, load_tokenizer
    from tunix_rt.render import prompt_ids

    home = Home.resolve(tmp_path / "home").ensure()
    model_dir = ensure_model("tiny-gemma3", home)
    tok = load_tokenizer("tiny-gemma3", home)
    expected = TorchGenerator(load_model(model_dir, None, "cpu"), tok).generate(
        [prompt_ids("What is 3+4?", tok)], DecodeConfig(max_new_tokens=300))[0]

    chat = Chat(home.root, "--max-tokens", "300")  # the random model never stops: replies are 300 tokens
    try:
        chat.wait_for(r"you> ")
        chat.say("What is 3+4?")
        first = chat.wait_for(r"model> (.*?)\n\[(\w+), (\d+) tokens, prompt (\d+) tokens\]")
        assert first.group(1) == expected.text and first.group(2) == expected.finish_reason
        assert int(first.group(4)) == len(prompt_ids("What is 3+4?", tok))
        chat.say("And 5+6?")  # the history is part of the prompt
        second = chat.wait_for(r"prompt (\d+) tokens\]", first.end())
        assert int(second.group(1)) > int(first.group(4)) + int(first.group(3))
        chat.say("/reset")
        chat.wait_for(r"\(conversation cleared\)", second.end())
        chat.say("What is 3+4?")
        again = chat.wait_for(r"model> (.*?)\n\[\w+, \d+ tokens, prompt (\d+) tokens\]", second.end())
        assert again.group(1) == expected.text and again.group(2) == first.group(4)
        chat.say("/system Be brief.")
        chat.wait_for(r"system prompt set", again.end())
        chat.leave(again.end())
    finally:
        chat.close()

    # Ctrl-C in the middle of a reply, in a chat whose replies may run to 2,000 tokens: a
    # 300-token reply of the tiny model can end before the signal lands on a loaded machine
    # (the reader above sees its first 20 characters late)
    chat = Chat(home.root, "--max-tokens", "2000")
    try:
        chat.wait_for(r"you> ")
        chat.say("/system Be brief.")
        mark = chat.wait_for(r"system prompt set").end()
        chat.say("Tell me a long story.")
        chat.wait_for(r"model> .{20}", mark)
        chat.proc.send_signal(signal.SIGINT)  # Ctrl-C stops the reply, not the chat
        stopped = chat.wait_for(r"\[stopped, (\d+) tokens, prompt \d+ tokens\]\nyou> ", mark)
        assert int(stopped.group(1)) < 2000
        chat.leave(stopped.end())
    finally:
        chat.close()
