"""The python tool's sandbox against hostile code: each attack is refused or cut off with a
result the model sees, the caller goes on, and nothing of the user's is read or touched.
The sandboxed tests need bubblewrap (tests/requires.py: a skip here, a failure under CI);
the refusal tests run everywhere."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from proc_testlib import processes_with
from requires import missing, require_bwrap

from tunix_rt.tools import Call, respond
from tunix_rt.tools import python as tool

pytestmark = pytest.mark.serial  # it times itself or races a lease: `make test` runs it alone (Makefile)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sandbox() -> str:
    path = require_bwrap()
    problem = tool.sandbox_problem(path)
    if problem:
        missing(f"bubblewrap cannot build the sandbox here: {problem}")
    return path


@pytest.fixture
def planted(tmp_path, home) -> dict[Path, str]:
    """The user's files the code goes after: one outside in a tmp dir, one in TUNIX_RT_HOME,
    one in a run dir. Returns path -> content."""
    files = {tmp_path / "outside" / "secret.txt": f"outside-{uuid.uuid4()}",
             home.root / "secret.txt": f"home-{uuid.uuid4()}",
             home.runs / "r1" / "config.yaml": f"run-{uuid.uuid4()}"}
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return files


def tree(*roots: Path) -> dict[str, bytes | None]:
    """Every file and folder under the roots, with the files' bytes (a snapshot to compare)."""
    out: dict[str, bytes | None] = {}
    for root in roots:
        for p in [root, *root.rglob("*")]:
            out[str(p)] = p.read_bytes() if p.is_file() else None
    return out


def timed(code: str) -> tuple[tool.ToolResult, float]:
    start = time.monotonic()
    result = tool.run(code)
    return result, time.monotonic() - start


def closes_once(text: str) -> bool:
    return text.startswith("<output>") and text.endswith("</output>") and text.count("</output>") == 1


# --------------------------------------------------------------------------- what works

def test_normal_code_writes_its_output(sandbox):
    assert tool.run("print(2+2)") == tool.ToolResult("<output>4\n</output>", False)
    code = "\n    from fractions import Fraction\n    for k in (2, 3):\n        print(Fraction(48, k))\n"
    assert tool.run(code) == tool.ToolResult("<output>24\n16\n</output>", False)  # dedented
    assert tool.run("") == tool.ToolResult("<output></output>", False)
    # the contract's entry point runs the same tool
    assert respond(Call("python", "print(6*7)")) == tool.ToolResult("<output>42\n</output>", False)


def test_errors_are_results(sandbox):
    r = tool.run("1/0")
    assert r.error and closes_once(r.text) and "ZeroDivisionError: division by zero\n</output>" in r.text
    assert tool.run("raise SystemExit(3)") == tool.ToolResult("<output>[error: exit status 3]</output>", True)
    assert tool.run("print('a'); raise SystemExit(3)") == tool.ToolResult("<output>a\n</output>", True)
    r = tool.run("import os, signal; print('hi', flush=True); os.kill(os.getpid(), signal.SIGSEGV)")
    assert r == tool.ToolResult("<output>hi\n[error: killed by SIGSEGV]</output>", True)
    r = tool.run("x = input()")  # stdin held the code: input() meets EOF
    assert r.error and "EOFError" in r.text


def test_print_arithmetic_writes_what_the_sandbox_prints(sandbox):
    """The in-process OUT of `print(EXPR)` (what `data import gsm8k --tools python` stores, and
    rendering then replaces with the sandbox's own) equals the sandbox's, byte for byte: the
    edge cases below and every 10th of the vendored GSM8K split's 23,716 notes."""
    import json
    import re

    from tunix_rt.traces.dataset import VENDORED_GSM8K

    edge = ["48/2", "0.1+0.2", "1e16", "2**-1", "(-8)**0.5", "7//2", "-7%3", "1_000*2", "10/4", "-0.0", "2**64",
            "123456789*987654321", " 5 + 7 ", "1e308*10", "3/7"]
    assert [tool.print_arithmetic(e) for e in ("1/0", "x+1", "05", "2**65", "True+1", "1j", "print(1)", "9" * 201)] \
        == [None] * 8
    notes = [m.group(1) for row in VENDORED_GSM8K.read_text().splitlines()
             for m in re.finditer(r"<<([^=]*)=", json.loads(row)["answer"])]
    assert len(notes) == 23_716
    exprs = edge + notes[::10]
    for i in range(0, len(exprs), 30):
        chunk = exprs[i:i + 30]
        expected = "".join(tool.print_arithmetic(e) for e in chunk)
        assert tool.run("".join(f"print({e.strip()})\n" for e in chunk)) == tool.ToolResult(f"<output>{expected}</output>", False)


def test_the_output_closes_once(sandbox):
    r = tool.run("print('</output><output>')")
    assert r == tool.ToolResult("<output><\\/output><output>\n</output>", False)


def test_code_over_the_limit_is_not_run(sandbox, tmp_path):
    canary = tmp_path / "canary"
    r = tool.run(f"open({str(canary)!r}, 'w')\n" + "#" * tool.CODE_CHARS)
    assert r == tool.ToolResult(f"<output>[error: code over {tool.CODE_CHARS} characters, not run]</output>", True)
    assert not canary.exists()


def test_the_sandbox_is_the_system_python_as_nobody(sandbox):
    code = ("import os, sys\nprint(sys.executable, os.getuid(), os.getgid(), os.getcwd(), sys.flags.isolated,"
            " sorted(os.environ), 'site' in sys.modules)")
    assert tool.run(code).text == (f"<output>{tool.PYTHON} {tool.NOBODY} {tool.NOBODY} /tmp 1 "
                                   "['HOME', 'LANG', 'PATH', 'PWD'] False\n</output>")


# --------------------------------------------------------------------------- hostile code

def test_no_network(sandbox):
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]
    code = f"""
import socket
print(sorted(name for _, name in socket.if_nameindex()))
for host, port in (("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)):
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect((host, port))
        print("CONNECTED", host)
    except OSError as e:
        print("refused", host, e.errno)
try:
    socket.getaddrinfo("example.com", 80)
    print("RESOLVED")
except OSError:
    print("no dns")
"""
    r, took = timed(code)
    with listener:
        with pytest.raises(BlockingIOError):
            listener.accept()  # the host's listener saw nobody
    assert not r.error and "CONNECTED" not in r.text and "RESOLVED" not in r.text, r.text
    assert r.text.startswith("<output>['lo']\nrefused 127.0.0.1 ") and "no dns" in r.text
    assert took < 2.5


def test_the_users_files_are_out_of_reach(sandbox, planted, home):
    targets = [*planted, home.root, REPO / "pyproject.toml", REPO, Path.home(), Path("/root"), Path("/home"),
               Path("/work")]
    code = f"""
import os
for p in {[str(t) for t in targets]!r}:
    try:
        print("READ", p, open(p).read()[:80] if os.path.isfile(p) else os.listdir(p))
    except OSError as e:
        print(e.errno)
print("tmp holds", os.listdir("/tmp"))
"""
    r = tool.run(code)
    assert not r.error and "READ" not in r.text, r.text
    assert all(secret not in r.text for secret in planted.values())
    assert "tmp holds []" in r.text  # its /tmp is its own, empty


def test_writes_stay_inside_and_vanish(sandbox, planted, home, tmp_path):
    name = f"tunix-sandbox-{uuid.uuid4().hex}"
    before = tree(tmp_path, home.root)
    repo_before = sorted(os.listdir(REPO))
    targets = [*planted, home.root / name, home.runs / "r1" / name, tmp_path / name, REPO / name,
               Path("/usr") / name, Path("/etc") / name, Path("/") / name, Path("/proc") / name,
               Path("/dev") / name]
    code = f"""
import os
for i, p in enumerate({[str(t) for t in targets]!r}):
    try:
        with open(p, "w") as f:
            f.write("pwned")
        print("WROTE", p)
    except OSError as e:
        print(i, e.errno)
open("/tmp/{name}", "w").write("mine")  # its own temp dir works
print(open("/tmp/{name}").read())
"""
    r = tool.run(code)
    assert not r.error and "WROTE" not in r.text and "mine\n</output>" in r.text, r.text
    assert tree(tmp_path, home.root) == before  # the planted files intact, nothing new
    assert sorted(os.listdir(REPO)) == repo_before
    assert not (Path("/tmp") / name).exists()
    # the temp dir is thrown away: the next run starts empty
    assert tool.run(f"import os; print(os.path.exists('/tmp/{name}'))").text == "<output>False\n</output>"


def test_a_fork_bomb_is_bounded_and_nothing_survives(sandbox, monkeypatch):
    monkeypatch.setattr(tool, "WALL_SECONDS", 1.5)
    counted = tool.run("""
import os, time
n = 0
for _ in range(100):
    try:
        if os.fork() == 0:
            time.sleep(0.5)
            os._exit(0)
        n += 1
    except OSError:
        break
print(n)
""")
    assert not counted.error and 0 < int(counted.text[len("<output>"):-len("</output>")]) < tool.PROCESSES
    r, took = timed("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert r.error and closes_once(r.text) and took < 3.5, (r, took)
    # a daemon the code leaves behind (double fork, new session) dies with the sandbox
    marker = f"tunix-sandbox-{uuid.uuid4().hex}"
    r = tool.run(f"""
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/usr/bin/python3", ["python3", "-c", "import time  # {marker}\\ntime.sleep(60)"])
    os._exit(0)
os.wait()
print("left")
""")
    assert r == tool.ToolResult("<output>left\n</output>", False)
    assert not processes_with(marker, wait=1.0)


def test_an_infinite_loop_meets_the_cpu_limit(sandbox, monkeypatch):
    monkeypatch.setattr(tool, "CPU_SECONDS", 1)
    monkeypatch.setattr(tool, "WALL_SECONDS", 10.0)  # a busy machine gives it 1 s of CPU late
    r, took = timed("while True:\n    pass\n")
    assert r == tool.ToolResult("<output>[error: CPU time limit of 1 s]</output>", True)
    assert took < tool.WALL_SECONDS


def test_a_sleeper_meets_the_wall_clock(sandbox, monkeypatch):
    monkeypatch.setattr(tool, "WALL_SECONDS", 1.0)
    r, took = timed("import time\nprint('start', flush=True)\ntime.sleep(60)\n")
    assert r == tool.ToolResult("<output>start\n[error: timed out after 1 s]</output>", True)
    assert took < 2.0
    assert tool.run("print('next')").text == "<output>next\n</output>"  # the caller goes on


def test_a_gigabyte_is_refused(sandbox):
    r, took = timed("b = bytearray(1 << 30)\nprint('GOT IT')")
    assert r.error and "MemoryError" in r.text and "GOT IT" not in r.text and took < 2, r
    r = tool.run("chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))")
    assert r.error and "MemoryError" in r.text


def test_huge_output_is_cut(sandbox):
    note = f"\n[output cut at {tool.OUTPUT_BYTES} bytes]</output>"
    for code in ("while True:\n    print('x' * 1000)", "import sys\nsys.stdout.write('y' * 10**7)",
                 "import sys\nwhile True:\n    sys.stderr.write('z' * 100)"):
        r, took = timed(code)
        assert r.error and r.text.endswith(note) and took < 2, (code, took)
        assert len(r.text) == len("<output>") + tool.OUTPUT_BYTES + len(note)
    r = tool.run(f"print('é' * {tool.OUTPUT_BYTES})")  # a cut inside a character drops its half
    assert r.text == "<output>" + "é" * (tool.OUTPUT_BYTES // 2) + note


def test_files_are_bounded(sandbox):
    r = tool.run(f"open('/tmp/big', 'wb').write(b'x' * {2 * tool.FILE_BYTES})")
    assert r.error and "File too large" in r.text
    r = tool.run("for i in range(20):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * 1000000)")
    assert r.error and "No space left on device" in r.text  # the tmpfs is TMP_BYTES


# --------------------------------------------------------------------------- no sandbox: refused

def refusal(tmp_path) -> tuple[str, Path]:
    canary = tmp_path / "ran-unsandboxed"
    return f"open({str(canary)!r}, 'w').write('x')\nprint('ran')", canary


def test_refused_without_bwrap(tmp_path, monkeypatch):
    code, canary = refusal(tmp_path)
    refused = tool.ToolResult("<output>[error: python refused: no sandbox: bubblewrap (bwrap) is not installed]"
                              "</output>", True)
    monkeypatch.setattr(tool, "BWRAP", None)
    assert tool.run(code) == refused
    monkeypatch.setattr(tool, "BWRAP", "bwrap")
    monkeypatch.setenv("PATH", str(tmp_path))  # bwrap is looked up on PATH, and is not there
    assert tool.run(code) == refused
    assert respond(Call("python", code)) == refused
    assert not canary.exists()


def test_refused_when_bwrap_cannot_build_the_sandbox(tmp_path, monkeypatch, request):
    code, canary = refusal(tmp_path)
    # a folder anyone may enter: a root caller starts bwrap as nobody, who cannot enter tmp_path
    bin_dir = Path(tempfile.mkdtemp(prefix="tunix-fake-bwrap-"))
    bin_dir.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(bin_dir))
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(tool, "BWRAP", str(fake))
    r = tool.run(code)
    assert r.error and closes_once(r.text), r
    assert r.text.startswith("<output>[error: python refused: no sandbox: ") and \
        "exited with status 1: bwrap: No permissions to create new namespace]" in r.text
    assert not canary.exists()
