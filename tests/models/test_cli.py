"""`tunix-rt model …` through the real entry point: output and exit codes."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from tunix_rt.models.store import MODEL_MANIFEST


def run(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run `tunix-rt ARGS` in-process through cli.main (which maps errors to exit codes)."""
    from tunix_rt.cli import main

    monkeypatch.setattr(sys, "argv", ["tunix-rt", *args])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    return e.value.code or 0, out.out, out.err


def test_import_list_and_reuse(home, monkeypatch, capsys, tmp_path):
    code, out, _ = run(monkeypatch, capsys, "model", "import", "tiny-gemma3")
    assert code == 0 and "ready tiny-gemma3" in out and "410,880 params" in out

    code, out, _ = run(monkeypatch, capsys, "model", "import", "tiny-gemma3")
    assert code == 0 and "already imported" in out

    src = tmp_path / "ckpt"
    shutil.copytree(home.models / "tiny-gemma3", src)
    (src / MODEL_MANIFEST).unlink()
    code, out, _ = run(monkeypatch, capsys, "model", "import", "--from-dir", str(src),
                       "--preset", "tiny-gemma3", "--name", "local-tiny")
    assert code == 0 and "ready local-tiny" in out

    code, out, _ = run(monkeypatch, capsys, "model", "list")
    assert code == 0
    assert "tiny-gemma3" in out and "local-tiny" in out and "tiny-random" in out and "local-dir" in out

    code, out, _ = run(monkeypatch, capsys, "model", "list", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert {r["name"] for r in rows} == {"tiny-gemma3", "local-tiny"}
    assert all(r["param_count"] == 410_880 for r in rows)


@pytest.mark.parametrize("args, message", [
    (["model", "import", "gemma7-9000"], "unknown model preset"),
    (["model", "import", "gemma2-2b"], "--from-dir"),
    (["model", "import"], "exactly one of"),
    (["model", "import", "--from-dir", "/nonexistent"], "--preset is required"),
    (["model", "import", "--from-dir", "/nonexistent", "--preset", "tiny-gemma3"], "not a directory"),
    (["model", "import", "tiny-gemma3", "--name", "x"], "--name/--preset go with"),
])
def test_bad_input_exits_2(home, monkeypatch, capsys, args, message):
    code, _, err = run(monkeypatch, capsys, *args)
    assert code == 2
    assert message in err
    assert not [p for p in home.models.iterdir() if not p.name.endswith(".lock")]


def test_a_mismatched_checkpoint_exits_2_and_names_the_tensor(home, monkeypatch, capsys, tmp_path):
    code, _, _ = run(monkeypatch, capsys, "model", "import", "tiny-gemma2")
    assert code == 0
    src = tmp_path / "ckpt"
    shutil.copytree(home.models / "tiny-gemma2", src)
    code, _, err = run(monkeypatch, capsys, "model", "import", "--from-dir", str(src), "--preset", "tiny-gemma3")
    assert code == 2 and "k_proj.weight: shape [64, 128], preset tiny-gemma3 expects [32, 128]" in err


def test_list_on_an_empty_home(home, monkeypatch, capsys):
    code, out, _ = run(monkeypatch, capsys, "model", "list")
    assert code == 0 and "no models" in out
