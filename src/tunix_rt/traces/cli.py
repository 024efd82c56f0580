"""`tunix-rt data …`: import, validate, list, show and render trace datasets.

Thin on purpose: each command parses, calls traces.dataset / traces.reader / render, and
prints. Bad input raises BadInput (exit 2) and leaves nothing on disk.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from tunix_rt.errors import BadInput
from tunix_rt.home import Home
from tunix_rt.traces.dataset import (
    DEFAULT_DEV_FRACTION,
    DEFAULT_MAX_REJECT_RATE,
    ImportRequest,
    import_dataset,
    list_datasets,
    load_dataset,
    split_counts,
)
from tunix_rt.traces.importers import FORMATS

RG_FORMAT = "reasoning-gym"
from tunix_rt.traces.reader import DEFAULT_MAX_LINE_BYTES, scan

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

MaxLineBytes = Annotated[int, typer.Option("--max-line-bytes", help="Reject lines longer than this many bytes.")]


class _Progress:
    """A byte progress bar on a terminal; silent elsewhere (pipes, tests)."""

    def __init__(self, path: Path | None, label: str):
        self.bar = None
        if path is not None and path.is_file() and err.is_terminal:
            from rich.progress import Progress

            self.bar = Progress(console=err, transient=True)
            self.task = self.bar.add_task(label, total=path.stat().st_size)

    def __enter__(self) -> "_Progress":
        if self.bar:
            self.bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar:
            self.bar.stop()

    def update(self, done: int) -> None:
        if self.bar:
            self.bar.update(self.task, completed=done)


@app.command("import")
def import_(
    fmt: Annotated[str, typer.Argument(metavar="FORMAT", help=f"Input format: {' | '.join(FORMATS)} | {RG_FORMAT}.")],
    source: Annotated[str, typer.Argument(metavar="SRC", help="A JSONL file, or hf:OWNER/NAME\\[/CONFIG]\\[@SPLIT] with --allow-network; for reasoning-gym: TASK\\[,TASK…].")],
    name: Annotated[Optional[str], typer.Option("--name", help="Dataset name (reasoning-gym: default rg-TASK).")] = None,
    version: Annotated[Optional[str], typer.Option("--version", help="Version (default: reuse identical content, else the next vN).")] = None,
    dev_fraction: Annotated[float, typer.Option("--dev-fraction", help="Share of records in the dev split (by id hash).")] = DEFAULT_DEV_FRACTION,
    quarantine: Annotated[bool, typer.Option("--quarantine", help="Keep going past bad lines; write them to rejects.jsonl.")] = False,
    max_reject_rate: Annotated[float, typer.Option("--max-reject-rate", help="With --quarantine: fail above this share of bad lines.")] = DEFAULT_MAX_REJECT_RATE,
    allow_network: Annotated[bool, typer.Option("--allow-network", help="Allow hf: sources to download from the Hugging Face hub.")] = False,
    max_line_bytes: MaxLineBytes = DEFAULT_MAX_LINE_BYTES,
    tools: Annotated[Optional[str], typer.Option("--tools", help="gsm8k: 'calculator' keeps the <<48/2=24>> notes as tool calls; 'python' makes them python calls (<python>print(48/2)</python>).")] = None,
    n: Annotated[Optional[int], typer.Option("--n", help="reasoning-gym: records in train.")] = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="reasoning-gym: the seed train/dev/test seeds derive from.")] = None,
    config: Annotated[Optional[str], typer.Option("--config", help="reasoning-gym: the task's difficulty config as JSON ({task: {...}} for several).")] = None,
    weights: Annotated[Optional[str], typer.Option("--weights", help="reasoning-gym: the mixture's weights, one per task (e.g. 3,1).")] = None,
    dev_n: Annotated[Optional[int], typer.Option("--dev-n", help="reasoning-gym: records in dev (default n // 4).")] = None,
    test_n: Annotated[Optional[int], typer.Option("--test-n", help="reasoning-gym: records in test (default n // 4).")] = None,
) -> None:
    """Import a JSONL source as a dataset version under <home>/datasets/NAME/VERSION, or draw
    reasoning-gym tasks (`data import reasoning-gym TASK[,TASK…] --n N --seed S`): train, dev
    and test from seeds derived from S, no question in two splits, offline."""
    rg_opts = {"--n": n, "--seed": seed, "--config": config, "--weights": weights, "--dev-n": dev_n, "--test-n": test_n}
    if fmt == RG_FORMAT:
        return _import_reasoning_gym(source, name, version, n, seed, config, weights, dev_n, test_n)
    if given := [k for k, v in rg_opts.items() if v is not None]:
        raise BadInput(f"{given[0]} is for `data import {RG_FORMAT}` only")
    if name is None:
        raise BadInput("--name is required (the dataset's name)")
    req = ImportRequest(fmt, source, name, version, dev_fraction, quarantine, max_reject_rate, allow_network, max_line_bytes,
                        tools=_tool_names(tools))
    local = None if source.startswith("hf:") else Path(source)
    with _Progress(local, f"importing {source}") as bar:
        result = import_dataset(req, Home.resolve(), on_progress=bar.update)
    ds = result.dataset
    from tunix_rt.registry.record import record_dataset

    record_dataset(ds.path)  # the files stay the source of truth; the registry points at them
    if result.rejected_lines:
        err.print(f"quarantined {result.rejected_lines} bad line(s) to {ds.path / 'rejects.jsonl'}", markup=False)
    verb = "already imported as" if result.reused else "imported"
    splits = ds.manifest["splits"]
    print(f"{verb} {ds.ref}: {len(ds.records)} records (train {splits['train']}, dev {splits['dev']}), "
          f"sha256 {ds.sha256}, at {ds.path}")


def _tool_names(value: str | None) -> tuple[str, ...]:
    """'calculator' or 'calculator,python' → a tuple of names (checked by their user)."""
    return tuple(t.strip() for t in value.split(",") if t.strip()) if value else ()


def _import_reasoning_gym(tasks: str, name: str | None, version: str | None, n: int | None, seed: int | None,
                          config: str | None, weights: str | None, dev_n: int | None, test_n: int | None) -> None:
    from tunix_rt.traces.reasoning_gym import TaskImport, import_tasks

    if n is None or seed is None:
        raise BadInput(f"data import {RG_FORMAT} needs --n and --seed")
    try:
        cfg = json.loads(config) if config is not None else {}
    except ValueError as e:
        raise BadInput(f"--config: not JSON ({e})") from None
    try:
        w = tuple(float(x) for x in weights.split(",")) if weights is not None else None
    except ValueError:
        raise BadInput(f"--weights {weights!r}: comma-separated numbers, one per task") from None
    req = TaskImport(tuple(t.strip() for t in tasks.split(",")), n, seed, cfg, w, dev_n, test_n, name, version)
    result = import_tasks(req, Home.resolve())
    ds = result.dataset
    from tunix_rt.registry.record import record_dataset

    record_dataset(ds.path)
    splits = ds.manifest["splits"]
    verb = "already imported as" if result.reused else "imported"
    print(f"{verb} {ds.ref}: {len(ds.records)} records (train {splits['train']}, dev {splits['dev']}, "
          f"test {splits['test']}), sha256 {ds.sha256}, at {ds.path}")


@app.command()
def validate(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="The JSONL file to check.")],
    fmt: Annotated[str, typer.Option("--format", help=f"auto | {' | '.join(FORMATS)} | pairs.")] = "auto",
    max_line_bytes: MaxLineBytes = DEFAULT_MAX_LINE_BYTES,
) -> None:
    """Check a JSONL file (traces, or prompt/chosen/rejected pairs for method=dpo); write nothing.

    Prints one FILE:LINE: FIELD: reason per problem and exits 2, or "OK: N records"."""
    from tunix_rt.traces.pairs import PairImporter, looks_like_pairs

    if fmt != "auto" and fmt not in (*FORMATS, "pairs"):
        raise BadInput(f"--format {fmt!r}: use auto, pairs or one of {', '.join(FORMATS)}")
    importer = PairImporter() if fmt == "pairs" or (fmt == "auto" and looks_like_pairs(file)) else fmt
    result = scan(file, importer, label=str(file), max_line_bytes=max_line_bytes)
    if result.errors:
        for e in result.errors:
            print(e)
        err.print(f"{file}: {result.summary} (format {result.format})", markup=False)
        raise typer.Exit(2)
    counts = split_counts(result.records, DEFAULT_DEV_FRACTION)
    print(f"OK: {len(result.records)} records (format {result.format}; at dev fraction "
          f"{DEFAULT_DEV_FRACTION}: train {counts['train']}, dev {counts['dev']})")


@app.command("list")
def list_(json_out: Annotated[bool, typer.Option("--json", help="Print the manifests as JSON.")] = False) -> None:
    """Every dataset version under <home>/datasets."""
    manifests = list_datasets(Home.resolve())
    if json_out:
        print(json.dumps(manifests, indent=2, ensure_ascii=False))
        return
    if not manifests:
        print("no datasets (import one with `tunix-rt data import`)")
        return
    rows = [("DATASET", "RECORDS", "TRAIN", "DEV", "SHA256", "CREATED", "SOURCE")]
    rows += [(f"{m['name']}@{m['version']}", str(m["count"]), str(m["splits"]["train"]), str(m["splits"]["dev"]),
              m["sha256"][:12], str(m.get("created_at")), str(m["source"])) for m in manifests]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])


@app.command()
def show(
    dataset: Annotated[str, typer.Argument(metavar="DATASET", help="NAME, NAME@VERSION or a JSONL path.")],
    split: Annotated[str, typer.Option("--split", help="train | dev | all.")] = "all",
    limit: Annotated[int, typer.Option("--limit", help="How many sample records to show.")] = 3,
    json_out: Annotated[bool, typer.Option("--json", help="Print {manifest, sample} as JSON.")] = False,
) -> None:
    """A dataset's manifest and its first records."""
    ds = load_dataset(dataset, Home.resolve())
    sample = [t.to_record() for t in ds.split(split)[: max(limit, 0)]]
    if json_out:
        print(json.dumps({"manifest": ds.manifest, "sample": sample}, indent=2, ensure_ascii=False))
        return
    print(json.dumps(ds.manifest, indent=2, ensure_ascii=False))
    print(f"\nfirst {len(sample)} record(s) of {ds.ref} ({split}):")
    for rec in sample:
        print(json.dumps(rec, ensure_ascii=False))


@app.command()
def render(
    dataset: Annotated[str, typer.Argument(metavar="DATASET", help="NAME, NAME@VERSION or a JSONL path.")],
    model: Annotated[str, typer.Option("--model", help="Model whose tokenizer renders (e.g. gemma3-270m, tiny-gemma3).")],
    limit: Annotated[int, typer.Option("--limit", help="How many examples.")] = 3,
    split: Annotated[str, typer.Option("--split", help="train | dev | all.")] = "train",
    max_seq_len: Annotated[Optional[int], typer.Option("--max-seq-len", help="Drop (and count) longer examples.")] = None,
    system_prompt: Annotated[Optional[str], typer.Option("--system-prompt", help="Override the default system prompt.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON array, one object per example.")] = False,
    tools: Annotated[Optional[str], typer.Option("--tools", help="Tools of the run, e.g. 'calculator': their results get loss mask 0.")] = None,
) -> None:
    """Show what training sees: token ids, loss mask, prompt and target text.

    supervised_text is the decode of the masked-in tokens and must equal target_text
    (with --tools: model_text, the target without what the tools wrote)."""
    from tunix_rt.models.store import load_tokenizer
    from tunix_rt.render import DEFAULT_SYSTEM_PROMPT, render_dataset, supervised_text
    from tunix_rt.tools import check_tools

    if limit < 1:
        raise BadInput("--limit must be at least 1")
    home = Home.resolve()
    ds = load_dataset(dataset, home)
    tok = load_tokenizer(model, home)
    traces = ds.split(split)[:limit]
    rendered, stats = render_dataset(traces, tok, max_seq_len or sys.maxsize,
                                     DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt,
                                     tools=check_tools(_tool_names(tools), "--tools"))
    if stats.dropped_overlong:
        err.print(f"dropped {stats.dropped_overlong} example(s) over --max-seq-len {max_seq_len}: "
                  f"{', '.join(stats.dropped_ids)}", markup=False)
    out = [
        {"id": r.id, "n_tokens": len(r.ids), "prompt_len": r.prompt_len, "ids": r.ids, "loss_mask": r.loss_mask,
         "prompt_text": r.prompt_text, "target_text": r.target_text, "supervised_text": supervised_text(r, tok),
         **({"model_text": r.model_text} if r.model_text is not None else {})}
        for r in rendered
    ]
    if json_out:
        print(json.dumps(out, ensure_ascii=False))
        return
    for ex in out:
        print(f"── {ex['id']}: {ex['n_tokens']} tokens, {sum(ex['loss_mask'])} supervised ──")
        print(ex["prompt_text"] + ex["target_text"])
        what = "model_text" if "model_text" in ex else "target"
        print(f"supervised == {what}: {ex['supervised_text'] == ex.get('model_text', ex['target_text'])}\n")
