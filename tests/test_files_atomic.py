"""files.atomic_dir, the one atomic publish (models, evals, datasets, final/ outputs, the
init model): a directory appears complete or not at all, a failure leaves nothing behind,
and `replace=False` never takes a directory that is already there."""

from __future__ import annotations

import pytest

from tunix_rt.files import atomic_dir


def _write(files: dict[str, str]):
    def write(tmp):
        for name, text in files.items():
            (tmp / name).write_text(text)
    return write


def test_replace_swaps_a_complete_directory_for_another(tmp_path):
    target = tmp_path / "out"
    atomic_dir(target, _write({"a": "1", "b": "2"}))
    atomic_dir(target, _write({"a": "3"}))
    assert {p.name: p.read_text() for p in target.iterdir()} == {"a": "3"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("existing", ["empty", "full"])
def test_without_replace_an_existing_directory_is_refused_and_kept(tmp_path, existing):
    target = tmp_path / "out"
    target.mkdir()
    if existing == "full":
        (target / "mine").write_text("keep")
    with pytest.raises(FileExistsError):
        atomic_dir(target, _write({"a": "1"}), replace=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert [p.name for p in target.iterdir()] == (["mine"] if existing == "full" else [])


@pytest.mark.parametrize("replace", [True, False])
def test_a_failing_writer_or_a_refusing_fence_leaves_nothing(tmp_path, replace):
    def half_then_fail(tmp):
        (tmp / "half").write_text("x")
        raise OSError("disk full")

    def refuse():
        raise PermissionError("lease lost")

    with pytest.raises(OSError, match="disk full"):
        atomic_dir(tmp_path / "out", half_then_fail, replace=replace)
    with pytest.raises(PermissionError, match="lease lost"):
        atomic_dir(tmp_path / "out", _write({"a": "1"}), before_publish=refuse, replace=replace)
    assert list(tmp_path.iterdir()) == []


def test_a_writer_killed_mid_write_leaves_nothing_beside_the_target_with_tmp_parent(tmp_path):
    """The temp dir is built in tmp_parent (a dataset import's staging dir), which is where a
    writer killed before the rename (SIGKILL: no cleanup runs) leaves it, never beside the
    target's siblings (a dataset's versions)."""
    staging, target = tmp_path / ".tmp-stage", tmp_path / "ds" / "v1"
    staging.mkdir()
    seen = []
    atomic_dir(target, lambda tmp: seen.append(tmp) or (tmp / "data.jsonl").write_text("{}\n"),
               tmp_name="version", tmp_parent=staging, replace=False)
    assert seen == [staging / "version"] and (target / "data.jsonl").read_text() == "{}\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["v1"] and not any(staging.iterdir())
