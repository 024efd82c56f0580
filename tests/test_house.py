"""The shape of the house, read from the source (no imports run):

- no import circle among the modules of src/tunix_rt, counting every import: at the top,
  inside functions (lazy) and under TYPE_CHECKING, since each one ties two modules together;
- one run-directory vocabulary: the names of a run's and an evaluation's files are spelled
  in tunix_rt.rundir only; code elsewhere uses its names (prose may name the files).
"""

from __future__ import annotations

import ast
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
