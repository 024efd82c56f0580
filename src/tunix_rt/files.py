"""Low-level file helpers every stage shares: hashes, crash-safe writes, atomic directories,
the one model identity, and the process's peak memory.

Nothing here imports torch, JAX or the registry: datasets, models, both engines and the
evidence writer import it, and so does a torch-free JAX install.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

MODEL_MANIFEST = "tunix_rt_model.json"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, streamed (model weights are GBs)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_file(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under root (before the rename that publishes it)."""
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            fsync_file(Path(dirpath) / name)
        fsync_dir(dirpath)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write via a temp file in the same directory, fsync, rename: a reader sees the old
    file or the new one, never half of one, even after a crash."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def write_json_atomic(path: str | os.PathLike, obj: Any) -> Path:
    """JSON (indented, UTF-8, NaN refused: it is not JSON) written atomically."""
    text = json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_text_synced(path: Path, text: str) -> None:
    """A new file written and fsynced (inside a temp dir that is renamed later)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def atomic_dir(target: Path, write: Callable[[Path], Any], tmp_name: str | None = None,
               before_publish: Callable[[], None] | None = None, replace: bool = True,
               tmp_parent: Path | None = None) -> Path:
    """Build a directory with write(tmp) in a sibling temp dir (or in `tmp_parent`, on the same
    filesystem, where a killed writer's leftovers must not sit beside the target), fsync it,
    then rename it to target. An older target is replaced only after the new one is complete (renamed aside,
    then removed), so a crash leaves the old or the new directory, never neither; with
    `replace=False` an existing target (even an empty one, which a plain rename would take)
    is refused with FileExistsError instead. `before_publish()` runs between the two and may
    refuse (the fence). Whatever fails before the rename removes the temp dir: nothing is
    published and nothing is left behind."""
    target = Path(target)
    tmp = Path(tmp_parent or target.parent) / (tmp_name or f".tmp-{target.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        write(tmp)
        fsync_tree(tmp)
        if before_publish is not None:
            before_publish()
        if not replace:
            _rename_new(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = _rename_over(tmp, target) if replace else None
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def _rename_new(tmp: Path, target: Path) -> None:
    """Rename tmp to a target that must not exist yet (a writer that lost a race is told so)."""
    if target.exists():
        raise FileExistsError(errno.EEXIST, "already exists", str(target))
    try:
        os.rename(tmp, target)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise FileExistsError(errno.EEXIST, "already exists", str(target)) from None
        raise


def _rename_over(tmp: Path, target: Path) -> Path | None:
    """Rename tmp to target; an older target is moved aside first (returned: the caller
    removes it once the rename is durable)."""
    old = None
    if target.exists():
        old = target.parent / f".old-{target.name}-{os.getpid()}"
        os.rename(target, old)
    os.rename(tmp, target)
    return old


def weight_files(model_dir: Path) -> list[Path]:
    return sorted(Path(model_dir).glob("*.safetensors"))


def weights_sha256(model_dir: str | os.PathLike) -> str:
    """The one identity of a model: sha256 of its weight file, or of the sorted
    "name:sha256" lines when the weights are sharded. Runs, checkpoints, the registry and the
    demo all use it. The hashes listed in the model manifest (written at import) are used
    when present, so a 1 GB file is not read again for every run."""
    model_dir = Path(model_dir)
    files = weight_files(model_dir)
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors weights")
    listed: dict[str, str] = {}
    manifest = model_dir / MODEL_MANIFEST
    if manifest.is_file():
        listed = json.loads(manifest.read_text()).get("files", {}) or {}
    digests = [(f.name, listed.get(f.name) or sha256_file(f)) for f in files]
    if len(digests) == 1:
        return digests[0][1]
    return hashlib.sha256("\n".join(f"{n}:{d}" for n, d in digests).encode()).hexdigest()


def peak_rss_bytes() -> int:
    """This process's peak resident set size. On Linux, VmHWM from /proc/self/status: the
    high-water mark of this process's own memory map. getrusage's ru_maxrss is not used
    there because Linux carries it across fork and exec, so a child started by a large
    parent (a pytest process holding models, a benchmark driver) reports the parent's size."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024
