"""The shape of the house, read from the source (no imports run):

- no import circle among the modules of src/tunix_rt, counting every import: at the top,
  inside functions (lazy) and under TYPE_CHECKING, since each one ties two modules together;
- one run-directory vocabulary: the names of a run's and an evaluation's files are spelled
  in tunix_rt.rundir only; code elsewhere uses its names (prose may name the files);
- no private name crosses a file: nothing in src/ touches a private name of tunix, qwix, flax
  or optax, and no module reaches into another object's `_name` (one of ours, or a
  dependency's such as transformers' `config._attn_implementation`) unless the file itself
  defines that name (its own classes) or ALLOWED_PRIVATE says why there is no public way;
- methods are named in one table (train.methods): no module outside a method's own file
  compares a method name (`cfg.method == "grpo"`); it asks the table for the phases;
- the training path (driver, methods, the plan it checks) never imports Typer: CLIs only.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


# --------------------------------------------------------------------------- import circles

def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `root` (a package's is its __init__)."""
    mods = {}
    for p in root.rglob("*.py"):
        parts = p.relative_to(root).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


def imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name an import statement of the file can load, anywhere in it."""
    pkg = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import submodule`
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the modules of `root` it imports. A module importing its own package's
    __init__ is left out: Python runs that __init__ first whatever the module says."""
    mods = module_files(root)
    graph = {}
    for m, p in mods.items():
        graph[m] = {x for x in imported_names(m, p) & mods.keys()
                    if x != m and not (m.startswith(x + ".") and mods[x].name == "__init__.py")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_circle_finder_finds_a_circle_of_lazy_and_type_only_imports(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g\n    return g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n")
    (pkg / "d.py").write_text("import pkg.a\n")  # imports into the circle, is not part of it
    assert circles(import_graph(tmp_path)) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (pkg / "c.py").write_text("X = 1\n")
    assert circles(import_graph(tmp_path)) == []


def test_no_import_circle_in_src():
    graph = import_graph(SRC)
    assert len(graph) > 50 and "tunix_rt.train.driver" in graph
    assert circles(graph) == []


# --------------------------------------------------------------------------- run-directory names

#: file names of a run or an eval dir that code outside rundir.py must not spell
RUN_FILE_NAMES = ("run_manifest.json", "eval_summary.json", "config.yaml", "predictions.jsonl", "metrics.jsonl",
                  "environment.json", "final/adapter", "final/merged")
#: folder names that must not be joined onto a path under final/ by hand
FINAL_PARTS = ("final", "adapter", "merged")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (prose, not paths)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _is_final_join(node: ast.AST) -> bool:
    """`x / "final"`, or `<... / "final" or a name with final in it> / "adapter" | "merged"`."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant)):
        return False
    if node.right.value == "final":
        return True
    if node.right.value not in ("adapter", "merged"):
        return False
    left = node.left
    named_final = isinstance(left, ast.Name) and "final" in left.id
    return named_final or (isinstance(left, ast.BinOp) and isinstance(left.right, ast.Constant)
                           and left.right.value == "final")


def run_name_literals(path: Path) -> list[str]:
    """Where the file spells a run-dir name as code: a path-like string constant (no spaces:
    a message or help text is prose) holding one of RUN_FILE_NAMES, or a hand-made join
    under final/."""
    tree = ast.parse(path.read_text(), str(path))
    prose = _docstrings(tree)
    in_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose \
                and id(node) not in in_fstring and " " not in node.value \
                and any(name in node.value for name in RUN_FILE_NAMES):
            hits.append(f"{path.name}:{node.lineno}: {node.value!r}")
        elif _is_final_join(node):
            hits.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_the_run_name_scan_finds_spelled_names(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('''"""Reads run_manifest.json and final/adapter (prose: allowed)."""
from pathlib import Path

def f(run: Path, final_dir: Path):
    """config.yaml too."""
    print("no run_manifest.json here: a message")
    return (run / "run_manifest.json", run / "final" / "adapter", final_dir / "merged",
            "eval/eval_summary.json", run / "final")
''')
    hits = run_name_literals(bad)
    assert len(hits) == 6, hits  # two constants, the final/adapter join (and its final), final_dir/merged, run/final
    bad.write_text("from tunix_rt import rundir\n\ndef f(run):\n    return rundir.adapter_dir(run), run / rundir.MANIFEST\n")
    assert run_name_literals(bad) == []


def test_run_dir_names_are_spelled_in_rundir_only():
    found = [hit for f in sorted((SRC / "tunix_rt").rglob("*.py")) if f.name != "rundir.py"
             for hit in run_name_literals(f)]
    assert found == []


# --------------------------------------------------------------------------- private names

LIBS = ("tunix", "qwix", "flax", "optax", "orbax")
#: attributes of library objects the old engine reached into (by name, whatever the object)
KNOWN = {"_lora_enabled", "_run_eval", "_pbar", "_restored_custom_metadata", "_get_key_and_transform_mapping",
         "_make_preprocess_fn", "_model_class", "_jitted_train_step_fn", "_shard_optimizer"}


def private_uses(path: Path) -> list[str]:
    """`from lib... import _x`, `lib_alias._x`, and the known private attributes, in one file."""
    tree = ast.parse(path.read_text(), str(path))
    aliases, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in LIBS:
                    aliases.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBS:
            for a in node.names:
                if a.name.startswith("_"):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {a.name}")
                aliases.add(a.asname or a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            if (isinstance(base, ast.Name) and base.id in aliases) or node.attr in KNOWN:
                found.append(f"{path.name}:{node.lineno} .{node.attr}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr") \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                and str(node.args[1].value) in KNOWN:
            found.append(f"{path.name}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_the_scan_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from tunix.models.gemma3 import params_safetensors as ps\n"
                   "from qwix._src.providers import _x\n"
                   "k = ps._get_key_and_transform_mapping\n"
                   "trainer._lora_enabled = True\n")
    assert len(private_uses(bad)) == 3


def test_no_private_name_of_the_libraries_in_src():
    found = [hit for f in sorted((SRC / "tunix_rt").rglob("*.py")) for hit in private_uses(f)]
    assert not found, found


#: `x._name` uses with no public equivalent, and why
ALLOWED_PRIVATE = {
    "_exit": "os._exit: the documented way to end a process without cleanup (dist's broken group)",
    "_version": "torch.Tensor._version: the in-place version counter (fast_gemma's head cache); torch has no "
                "public accessor",
    "_int_mm": "torch._int_mm: the int8 matmul kernel (screened_head); torch has no public int8 matmul",
    "_linear_pointwise": "torch.ops.mkldnn._linear_pointwise: oneDNN's fp32 product (train.cpu_matmul); torch's "
                         "public fp32 CPU products always call MKL, whose AVX2 code is half of an AVX-512 AMD CPU",
    "_trial_id": "optuna FrozenTrial._trial_id: a worker reopens the running trial the sweep enqueued; optuna "
                 "has no public way to build a Trial of another process's trial",
}


def _own_private_names(tree: ast.AST) -> set[str]:
    """The private names the file itself defines: functions, classes, variables, attributes it
    assigns (self._x = ...), parameters."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return {n for n in out if n.startswith("_")}


def cross_file_private_uses(path: Path) -> list[str]:
    """`from x import _name`, and `obj._name` where obj is not self/cls and the file does not
    define _name itself: another module's private part."""
    tree = ast.parse(path.read_text(), str(path))
    own = _own_private_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += [f"{path.name}:{node.lineno} from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")) \
                and node.attr not in own and node.attr not in ALLOWED_PRIVATE:
            found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    return found


def test_the_cross_file_scan_finds_private_uses(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from tunix_rt.train.run import _append\n"
                   "class G:\n"
                   "    def _own(self):\n"
                   "        self._cache = 1\n"
                   "        return self._cache\n"
                   "def f(gen, config, other: G):\n"
                   "    other._own()\n"  # this file's own class: allowed
                   "    return gen._forward(1), config._attn_implementation\n")
    assert sorted(cross_file_private_uses(bad)) == ["bad.py:1 from tunix_rt.train.run import _append",
                                                    "bad.py:8 config._attn_implementation", "bad.py:8 gen._forward"]


def test_no_private_name_of_another_module_in_src():
    found = [hit for f in sorted((SRC / "tunix_rt").rglob("*.py")) for hit in cross_file_private_uses(f)]
    assert not found, found


# --------------------------------------------------------------------------- method names

def method_name_branches(path: Path, names: set[str]) -> list[str]:
    """Comparisons of something called `method` (cfg.method, cfg.get("method"), method) with
    a method's name, by ==, !=, in or not in."""
    def is_method(node: ast.AST) -> bool:
        if isinstance(node, ast.Attribute):
            return node.attr == "method"
        if isinstance(node, ast.Name):
            return node.id == "method"
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value == "method")

    def named(node: ast.AST) -> bool:
        consts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return any(isinstance(c, ast.Constant) and c.value in names for c in consts)

    hits = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_method(s) for s in sides) and any(named(s) for s in sides):
                hits.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return hits


def test_the_method_branch_scan_finds_a_branch(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(cfg, method):\n"
                   "    a = cfg.method == 'grpo'\n"
                   "    b = cfg.get('method') != 'sft'\n"
                   "    c = method in ('sft', 'grpo')\n"
                   "    d = cfg.method in ('lora', 'full')\n"  # not method names: the legacy spelling
                   "    return a, b, c, d\n")
    assert [h.split(":")[1] for h in method_name_branches(bad, {"sft", "grpo"})] == ["2", "3", "4"]


def test_nothing_outside_a_method_branches_on_its_name():
    from tunix_rt.train.methods import METHODS

    own = {spec.path.split(":")[0].rsplit(".", 1)[1] + ".py" for spec in METHODS.values()}
    found = [hit for f in sorted((SRC / "tunix_rt").rglob("*.py")) if f.name not in own
             for hit in method_name_branches(f, set(METHODS))]
    assert found == []


# --------------------------------------------------------------------------- the training path

def test_the_training_path_imports_no_typer():
    code = ("import sys, tunix_rt.train.driver, tunix_rt.train.sft, tunix_rt.train.grpo, tunix_rt.plan; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'click')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- training below the registry

TRAIN_ENTRY_POINTS = {"cli.py"}
"""train/cli.py is `tunix-rt train`, a command above both: it hands training the registry's
live index (registry.live.LiveIndex) as the on_update hook and records the finished run."""


def registry_imports(train_dir: Path) -> list[str]:
    """Imports of tunix_rt.registry (lazy ones included) by the modules under train_dir
    (the tunix_rt/train package), entry points aside."""
    found = []
    for p in sorted(train_dir.rglob("*.py")):
        if p.relative_to(train_dir).as_posix() in TRAIN_ENTRY_POINTS:
            continue
        module = ".".join(("tunix_rt", "train", *p.relative_to(train_dir).with_suffix("").parts))
        found += [f"{p.name}: {n}" for n in sorted(imported_names(module, p))
                  if n == "tunix_rt.registry" or n.startswith("tunix_rt.registry.")]
    return found


def test_the_registry_import_scan_finds_lazy_and_package_imports(tmp_path):
    train = tmp_path / "tunix_rt" / "train"
    train.mkdir(parents=True)
    (train / "run.py").write_text("def index(run_dir):\n"
                                  "    from tunix_rt.registry.record import record_run\n"
                                  "    record_run(run_dir)\n")
    (train / "other.py").write_text("from tunix_rt import registry\nfrom ..registry import liveness\n")
    (train / "cli.py").write_text("from tunix_rt.registry.live import LiveIndex\n")  # the entry point may
    assert registry_imports(train) == ["other.py: tunix_rt.registry", "other.py: tunix_rt.registry.liveness",
                                       "run.py: tunix_rt.registry.record", "run.py: tunix_rt.registry.record.record_run"]


def test_training_does_not_import_the_registry():
    """The registry is told about a live run through the on_update hook its entry points
    pass in (train.metrics.OnUpdate), never imported by training."""
    assert registry_imports(SRC / "tunix_rt" / "train") == []


def test_evidence_imports_no_training():
    """evidence.py keeps the evidence (environment, placeholder check, schemas); REPORT.md's
    writer, which needs the method table, lives in train.report beside its callers."""
    names = imported_names("tunix_rt.evidence", SRC / "tunix_rt" / "evidence.py")
    assert sorted(n for n in names if n == "tunix_rt.train" or n.startswith("tunix_rt.train.")) == []
