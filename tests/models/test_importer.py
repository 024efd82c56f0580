"""Model import: tiny presets, atomicity, and --from-dir checks on real tiny checkpoints."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from tunix_rt.errors import BadInput
from tunix_rt.models import importer
from tunix_rt.models.catalog import get_preset
from tunix_rt.models.hf import load_causal_lm, model_facts
from tunix_rt.models.store import MODEL_MANIFEST, ensure_model, installed_dir


def _model_entries(home):
    """What sits under <home>/models besides lock files."""
    return sorted(p.name for p in home.models.iterdir() if not p.name.endswith(".lock"))


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-gemma2"])
def test_tiny_import_builds_a_loadable_model_of_the_preset_size(home, name):
    path = importer.import_preset(name, home)
    assert path == installed_dir(name, home)
    model = load_causal_lm(path)
    assert not model.training
    assert sum(p.numel() for p in model.parameters()) == get_preset(name).param_count()
    manifest = json.loads((path / MODEL_MANIFEST).read_text())
    assert manifest["preset"] == name and manifest["family"] == get_preset(name).family
    assert manifest["source"]["kind"] == "tiny-random"
    assert manifest["param_count"] == get_preset(name).param_count()
    assert manifest["dtype"] == "float32"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(manifest["files"])


def test_manifest_sha256_match_the_files_and_detect_a_change(home):
    path = importer.import_preset("tiny-gemma3", home)
    manifest = importer.read_manifest(path)
    for fname, digest in manifest["files"].items():
        assert importer.sha256_file(path / fname) == digest
    assert importer.verify(path) == []
    with open(path / "config.json", "a") as f:
        f.write(" ")
    assert importer.verify(path) == ["config.json"]


def test_second_import_reuses_the_directory(home):
    first = importer.import_preset("tiny-gemma3", home)
    stamp = (first / MODEL_MANIFEST).stat().st_mtime_ns
    messages = []
    again = importer.import_preset("tiny-gemma3", home, say=messages.append)
    assert again == first and (first / MODEL_MANIFEST).stat().st_mtime_ns == stamp
    assert "already imported" in messages[0]
    assert ensure_model("tiny-gemma3", home) == first


def test_a_failure_midway_leaves_no_directory(home, monkeypatch):
    import tunix_rt.models.tiny as tiny

    real = tiny.build_tiny

    def build_then_fail(preset, out, seed=0):
        real(preset, out, seed)  # real files are written into the temp dir …
        raise RuntimeError("disk full")  # … and then the conversion dies

    monkeypatch.setattr(tiny, "build_tiny", build_then_fail)
    with pytest.raises(RuntimeError, match="disk full"):
        importer.import_preset("tiny-gemma3", home)
    assert _model_entries(home) == []
    monkeypatch.setattr(tiny, "build_tiny", real)
    assert (importer.import_preset("tiny-gemma3", home) / MODEL_MANIFEST).is_file()


def test_an_import_never_takes_a_directory_that_appeared_meanwhile(home, monkeypatch):
    """files.atomic_dir(replace=False): a plain rename would quietly take an empty directory
    made under the model's name while the import ran; the import refuses instead and leaves
    that directory as it was, with no temp dir behind."""
    import tunix_rt.models.tiny as tiny

    real = tiny.build_tiny
    target = installed_dir("tiny-gemma3", home)

    def build_then_someone_makes_the_dir(preset, out, seed=0):
        real(preset, out, seed)
        target.mkdir()

    monkeypatch.setattr(tiny, "build_tiny", build_then_someone_makes_the_dir)
    with pytest.raises(FileExistsError):
        importer.import_preset("tiny-gemma3", home)
    assert _model_entries(home) == ["tiny-gemma3"] and not any(target.iterdir())


def test_presets_without_an_offline_source_say_what_to_do(home):
    with pytest.raises(BadInput, match="--from-dir") as e:
        importer.import_preset("gemma3-1b", home)
    assert "--from-hub google/gemma-3-1b-pt" in str(e.value)
    with pytest.raises(BadInput, match="unknown model preset"):
        importer.import_preset("gemma7-9000", home)
    assert _model_entries(home) == []


@pytest.fixture
def tiny_src(home, tmp_path):
    """A tiny Gemma 3 checkpoint dir outside the home, as a user would download one."""
    src = tmp_path / "download"
    shutil.copytree(importer.import_preset("tiny-gemma3", home), src)
    (src / MODEL_MANIFEST).unlink()
    return src


def test_from_dir_accepts_a_matching_checkpoint(home, tiny_src):
    path = importer.import_from_dir(tiny_src, "tiny-gemma3", home, name="mine")
    assert path == installed_dir("mine", home)
    manifest = importer.read_manifest(path)
    assert manifest["source"] == {"kind": "local-dir", "path": str(tiny_src.resolve())}
    assert manifest["name"] == "mine" and manifest["preset"] == "tiny-gemma3"
    assert importer.verify(path) == []
    assert manifest["param_count"] == get_preset("tiny-gemma3").param_count()
    facts = model_facts(path)
    assert facts["family"] == "gemma3" and facts["param_count"] == manifest["param_count"]
    load_causal_lm(path)
    with pytest.raises(BadInput, match="already exists"):
        importer.import_from_dir(tiny_src, "tiny-gemma3", home, name="mine")


def _rewrite(src, change):
    tensors = load_file(src / "model.safetensors")
    change(tensors)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})


def test_from_dir_rejects_a_wrong_shape_naming_the_tensor(home, tiny_src):
    import torch

    def shrink(t):
        t["model.layers.1.mlp.up_proj.weight"] = torch.zeros(255, 128)

    _rewrite(tiny_src, shrink)
    with pytest.raises(BadInput) as e:
        importer.import_from_dir(tiny_src, "tiny-gemma3", home, name="bad")
    assert "model.layers.1.mlp.up_proj.weight: shape [255, 128]" in str(e.value)
    assert "expects [256, 128]" in str(e.value)
    assert not installed_dir("bad", home).exists()


def test_from_dir_rejects_a_missing_tensor(home, tiny_src):
    _rewrite(tiny_src, lambda t: t.pop("model.norm.weight"))
    with pytest.raises(BadInput, match="model.norm.weight: missing"):
        importer.import_from_dir(tiny_src, "tiny-gemma3", home, name="bad")
    assert not installed_dir("bad", home).exists()


def test_from_dir_rejects_another_architecture(home, tiny_src):
    with pytest.raises(BadInput, match="does not match preset tiny-gemma2"):
        importer.import_from_dir(tiny_src, "tiny-gemma2", home, name="bad")


def test_from_dir_accepts_an_untied_lm_head_only_with_the_right_shape(home, tiny_src):
    import torch

    def add_head(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()

    _rewrite(tiny_src, add_head)
    assert importer.import_from_dir(tiny_src, "tiny-gemma3", home, name="with-head").is_dir()
    _rewrite(tiny_src, lambda t: t.__setitem__("lm_head.weight", torch.zeros(1000, 128)))
    with pytest.raises(BadInput, match="lm_head.weight: shape"):
        importer.import_from_dir(tiny_src, "tiny-gemma3", home, name="bad-head")


def test_from_dir_refuses_pickles_and_non_model_dirs(home, tiny_src, tmp_path):
    (tiny_src / "model.safetensors").rename(tiny_src / "pytorch_model.bin")
    with pytest.raises(BadInput, match="pickled weights are refused"):
        importer.import_from_dir(tiny_src, "tiny-gemma3", home)
    with pytest.raises(BadInput, match="not a directory"):
        importer.import_from_dir(tmp_path / "nowhere", "tiny-gemma3", home)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInput, match="missing config.json, tokenizer.json"):
        importer.import_from_dir(tmp_path / "empty", "tiny-gemma3", home)
    with pytest.raises(BadInput, match="invalid model name"):
        importer.import_from_dir(tiny_src, "tiny-gemma3", home, name="../escape")


def test_from_dir_checks_the_tokenizer(home, tiny_src):
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(tiny_src / "tokenizer.json"))
    tk.add_tokens([f"<extra{i}>" for i in range(10)])
    tk.save(str(tiny_src / "tokenizer.json"))
    with pytest.raises(BadInput, match="tokenizer has 1034 tokens, preset tiny-gemma3 embeds only 1024"):
        importer.import_from_dir(tiny_src, "tiny-gemma3", home, name="bad")
    (tiny_src / "tokenizer.json").write_text(
        (tiny_src / "tokenizer.json").read_text().replace("<end_of_turn>", "<eot>"))
    with pytest.raises(BadInput, match="lacks control tokens"):
        importer.import_from_dir(tiny_src, "tiny-gemma3", home, name="bad")


def test_a_leftover_dir_without_manifest_is_not_overwritten(home):
    leftover = installed_dir("tiny-gemma2", home)
    leftover.mkdir()
    (leftover / "notes.txt").write_text("mine")
    with pytest.raises(BadInput, match="remove it first"):
        importer.import_preset("tiny-gemma2", home)
    assert (leftover / "notes.txt").read_text() == "mine"
