"""The python tool: the model writes `<python>CODE</python>`, the tool writes `<output>OUT</output>`.

CODE (dedented, so an indented block runs) runs in a separate process under a real sandbox,
Debian's bubblewrap (`bwrap`), and nowhere else: where bwrap is missing, or cannot build the
sandbox here (user namespaces off, say: a trial run decides once per process), the tool
refuses with an error result and runs nothing.

The sandbox: the system Python (`/usr/bin/python3 -I -S`: isolated, the standard library
only: no site-packages, no venv, no PYTHON* variables) reading CODE from stdin (so `input()`
meets EOF), in new user, pid, network, ipc, uts and cgroup namespaces (no network: only a
loopback of its own), as uid/gid NOBODY with no capabilities and no further namespaces; a
throwaway root holding /usr read-only (with the /bin, /lib* links or binds the system has),
/etc/ld.so.cache, a fresh /proc, a minimal /dev and an empty tmpfs /tmp of TMP_BYTES (its
working directory and home); nothing else of the host (no /work, /home, /root, the host's
/tmp, the TUNIX_RT_HOME or run dirs); a clean environment; its own session; killed with the
caller (--die-with-parent). A caller running as root starts bwrap as NOBODY. The limits
below are set inside the sandbox before the code runs (hard = soft, but for the CPU's), and
bwrap's process group is killed at WALL_SECONDS or once the output passes OUTPUT_BYTES;
killing bwrap ends its pid namespace, so nothing the code started survives.

OUT is the code's stdout and stderr, interleaved as written, decoded as UTF-8 (bad bytes
replaced), at most OUTPUT_BYTES of it, then a note in brackets when the run went wrong
(on a line of its own unless OUT is empty):

    print(2+2)                  <output>4\n</output>                                   error=False
    1/0                         <output>Traceback (...)\nZeroDivisionError: ...\n</output> error=True
    raise SystemExit(3)         <output>[error: exit status 3]</output>                error=True
    print("x" * 10**6)          <output>xxx...x\n[output cut at 1000 bytes]</output>   error=True
    while True: pass            <output>[error: CPU time limit of 2 s]</output>        error=True
    import time; time.sleep(9)  <output>[error: timed out after 3 s]</output>          error=True
    (a death by signal N)       <output>...[error: killed by SIGSEGV]</output>         error=True
    (no sandbox)                <output>[error: python refused: no sandbox: ...]</output> error=True

("[error: exit status N]" only when the code wrote nothing: a traceback already says what
failed.) A run has error=True unless it ended by itself with status 0. The code's own
"</output>" is written "<\\/output>", so a result holds exactly one, at its end.
"""

from __future__ import annotations

import ast
import codecs
import functools
import operator
import os
import selectors
import shutil
import signal
import subprocess
import textwrap
import time

from tunix_rt.tools import OUT_CLOSE, OUT_OPEN, ToolResult

#: the bubblewrap executable: a name looked up on PATH at each call, or a path; None refuses
BWRAP: str | None = "bwrap"
#: the interpreter inside the sandbox (the system one, never the venv's)
PYTHON = "/usr/bin/python3"
#: uid and gid of the code ("nobody"); a caller running as root starts bwrap as this user too,
#: since the kernel never applies RLIMIT_NPROC to processes of the host's uid 0
NOBODY = 65534

#: wall clock for one call, sandbox start included; then the process group is killed
WALL_SECONDS = 3.0
#: CPU seconds per process (RLIMIT_CPU, soft: SIGXCPU; the hard limit one second later kills)
CPU_SECONDS = 2
#: address space per process (RLIMIT_AS): a 1 GB allocation fails with MemoryError
MEMORY_BYTES = 256 * 2**20
#: processes and threads in the sandbox (RLIMIT_NPROC, counted in its own user namespace; bwrap
#: takes one): with MEMORY_BYTES each, at most PROCESSES * MEMORY_BYTES of memory in all
PROCESSES = 8
#: largest file the code may write (RLIMIT_FSIZE)
FILE_BYTES = 1 * 2**20
#: open files per process (RLIMIT_NOFILE)
OPEN_FILES = 64
#: size of the sandbox's /tmp (tmpfs), all files together
TMP_BYTES = 8 * 2**20
#: bytes of stdout+stderr kept; past it the output is cut (with a note) and the run killed
OUTPUT_BYTES = 1000
#: longer code is refused without running
CODE_CHARS = 20_000


def run(code: str) -> ToolResult:
    """Run `code` in the sandbox; `ToolResult.text` is exactly `<output>OUT</output>`. Never
    raises for what the code does: every failure is a result the model sees."""
    if len(code) > CODE_CHARS:
        return _result("", f"[error: code over {CODE_CHARS} characters, not run]", True)
    bwrap = _bwrap()
    problem = "bubblewrap (bwrap) is not installed" if bwrap is None else sandbox_problem(bwrap)
    if problem:
        return _result("", f"[error: python refused: no sandbox: {problem}]", True)
    out, cut, status, timed_out = _execute(bwrap, textwrap.dedent(code))
    # a cut may split a character: its partial bytes are dropped, other bad bytes replaced
    text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(out, final=not cut)
    if cut:
        return _result(text, f"[output cut at {OUTPUT_BYTES} bytes]", True)
    if timed_out:
        return _result(text, f"[error: timed out after {WALL_SECONDS:g} s]", True)
    note = _status_note(status)
    if note is None and status != 0 and not text:
        note = f"[error: exit status {status}]"
    return _result(text, note, status != 0)


def sandbox_problem(bwrap: str) -> str | None:
    """Why `bwrap` cannot run code here (its own message), or None when a trial run works.
    Tried once per executable and process: the answer does not change while we run."""
    return _trial(os.path.realpath(bwrap))


@functools.lru_cache(maxsize=8)
def _trial(bwrap: str) -> str | None:
    try:
        proc = subprocess.run(_command(bwrap), input=b"print('ok')", capture_output=True, timeout=30,
                              **_as_user())
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{bwrap}: {e}"
    if proc.returncode != 0 or proc.stdout != b"ok\n":
        said = (proc.stderr or proc.stdout).decode("utf-8", errors="replace").strip()
        return f"{bwrap} exited with status {proc.returncode}: {said[:300] or 'no message'}"
    return None


def _bwrap() -> str | None:
    if BWRAP is None:
        return None
    return shutil.which(BWRAP)


def _as_user() -> dict:
    """Popen arguments: bwrap leads a new session (its group is what a timeout kills), as
    NOBODY when we are root."""
    if os.geteuid() != 0:
        return {"start_new_session": True}
    return {"start_new_session": True, "user": NOBODY, "group": NOBODY, "extra_groups": []}


def _command(bwrap: str) -> list[str]:
    """The bwrap command line that runs the code read from stdin under the limits."""
    root: list[str] = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        top = "/" + name
        if os.path.islink(top):
            root += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            root += ["--ro-bind", top, top]
    if os.path.exists("/etc/ld.so.cache"):
        root += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    limits = [("RLIMIT_CPU", CPU_SECONDS, CPU_SECONDS + 1), ("RLIMIT_AS", MEMORY_BYTES, MEMORY_BYTES),
              ("RLIMIT_NPROC", PROCESSES, PROCESSES), ("RLIMIT_FSIZE", FILE_BYTES, FILE_BYTES),
              ("RLIMIT_NOFILE", OPEN_FILES, OPEN_FILES), ("RLIMIT_CORE", 0, 0)]
    # the limits are set inside the sandbox (so RLIMIT_NPROC counts only its own processes), then
    # the interpreter is replaced by a fresh one that reads the code from stdin
    boot = ("import os, resource as r\n"
            + "".join(f"r.setrlimit(r.{name}, ({soft}, {hard}))\n" for name, soft, hard in limits)
            + f"os.execv({PYTHON!r}, [{PYTHON!r}, '-I', '-S', '-'])\n")
    return [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(NOBODY),
            "--gid", str(NOBODY), "--cap-drop", "ALL", "--die-with-parent", "--new-session",
            "--hostname", "sandbox", *root, "--proc", "/proc", "--dev", "/dev",
            "--size", str(TMP_BYTES), "--tmpfs", "/tmp", "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--", PYTHON, "-I", "-S", "-c", boot]


def _execute(bwrap: str, code: str) -> tuple[bytes, bool, int, bool]:
    """(output, cut, exit status, timed out). The code goes in on stdin; stdout and stderr
    share one pipe read until EOF, OUTPUT_BYTES + 1 bytes or the wall clock, whichever first."""
    deadline = time.monotonic() + WALL_SECONDS
    proc = subprocess.Popen(_command(bwrap), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, **_as_user())
    out, pending = bytearray(), memoryview(code.encode("utf-8", errors="replace"))
    ended = False  # the pipe reached EOF: every process holding it is gone or closed it
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin, selectors.EVENT_WRITE)
            while not ended and len(out) <= OUTPUT_BYTES and (left := deadline - time.monotonic()) > 0:
                for key, _ in sel.select(left):
                    if key.fileobj is proc.stdin:
                        pending = pending[_write(proc.stdin.fileno(), pending):]
                        if not pending:
                            sel.unregister(proc.stdin)
                            proc.stdin.close()
                    elif chunk := os.read(proc.stdout.fileno(), 65536):
                        out += chunk
                    else:
                        ended = True
        cut = len(out) > OUTPUT_BYTES
        if cut or not ended:
            return bytes(out[:OUTPUT_BYTES]), cut, -signal.SIGKILL, not cut
        try:
            return bytes(out), False, proc.wait(timeout=max(0.0, deadline - time.monotonic())), False
        except subprocess.TimeoutExpired:
            return bytes(out), False, -signal.SIGKILL, True
    finally:
        _kill(proc)


def _write(fd: int, data: memoryview) -> int:
    """Bytes of `data` written (all of it when the reader is gone: nobody will read it)."""
    try:
        return os.write(fd, data[:65536])
    except BrokenPipeError:
        return len(data)
    except BlockingIOError:
        return 0


def _kill(proc: subprocess.Popen) -> None:
    """Kill the process group (bwrap and all it started) unless bwrap has ended (its pid
    namespace, all the code started, ended with it), and reap it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        pipe.close()


def _status_note(status: int) -> str | None:
    """The note for a death by signal (bwrap exits with 128 + the signal of the code's)."""
    if status <= 128:
        return None
    sig = status - 128
    if sig == signal.SIGXCPU:
        return f"[error: CPU time limit of {CPU_SECONDS} s]"
    if sig == signal.SIGXFSZ:
        return f"[error: file size limit of {FILE_BYTES} bytes]"
    try:
        name = signal.Signals(sig).name
    except ValueError:
        name = f"signal {sig}"
    return f"[error: killed by {name}]"


def _result(out: str, note: str | None, error: bool) -> ToolResult:
    out = out.replace(OUT_CLOSE, "<\\/output>")
    if note:
        out += ("" if not out or out.endswith("\n") else "\n") + note
    return ToolResult(text=f"{OUT_OPEN}{out}{OUT_CLOSE}", error=error)


# ---------------------------------------------------------------------------------------
# What `print(EXPR)` writes for plain arithmetic, without running anything

#: longest EXPR print_arithmetic evaluates
ARITH_CHARS = 200
#: a power's exponent and base, at most (larger: not evaluated here)
ARITH_POW_EXPONENT, ARITH_POW_BASE = 64, 10**6
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class _NotPlain(Exception):
    pass


def print_arithmetic(expr: str) -> str | None:
    """The OUT that `<python>print(EXPR)</python>` gets (`24.0\n` for `48/2`, as CPython's
    print writes it) when EXPR is plain arithmetic: int and float literals, + - * / // % **
    (a power's exponent at most ARITH_POW_EXPONENT, its base ARITH_POW_BASE), unary + -, and
    parentheses; computed here, nothing run. None for anything else, and where the code would
    fail (1/0), so a caller keeps only calls whose output it knows (GSM8K's `--tools python`)."""
    if len(expr) > ARITH_CHARS:
        return None
    try:
        tree = ast.parse(expr.strip(), mode="eval")
        return f"{_plain(tree.body)}\n"
    except (SyntaxError, ValueError, ArithmeticError, _NotPlain):
        return None


def _plain(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_plain(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _plain(node.left), _plain(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > ARITH_POW_EXPONENT or abs(left) > ARITH_POW_BASE):
            raise _NotPlain
        return _BINARY[type(node.op)](left, right)
    raise _NotPlain
