"""The package's layers point one way. Read from the source (every import, function-local ones too):
no package imports one above it, and no group of packages imports itself round a cycle.

    errors, config, paths, backend, cuda_graph -> kernels -> meter -> cache -> models -> engine
        -> checkpoints, bpe, model_tokenizer, chat -> serving -> training -> measure -> ui -> the public API -> cli

The model computes, the engine schedules, the tools (`measure`) sit above what they time, and the
commands sit on top. A new package must be given its place in LAYERS, or this test fails."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "minillm"

# Lowest first. A module belongs to the longest entry that is its name or a parent of it; an import
# may point to its own layer or a lower one.
LAYERS: list[tuple[str, ...]] = [
    ("minillm.errors", "minillm.config", "minillm.paths", "minillm.data", "minillm._checkout", "minillm.weights",
     "minillm.threads", "minillm.closeness",        # closeness: the one rule every ranking goes through
     "minillm.backend",                             # backend: the array seam (NumPy or CuPy), below everything
     "minillm.cuda_graph"),                         # capture and replay on a GPU, beside the seam
    ("minillm.kernels",),                           # compiled kernels: functions over arrays, nothing of a model
    ("minillm.meter", "minillm.trace"),             # trace: the meter's reports as a Chrome trace
    ("minillm.cache",),
    ("minillm.models",),
    ("minillm.engine",),
    ("minillm.checkpoints", "minillm.bpe", "minillm.model_tokenizer", "minillm.chat", "minillm.chat_pool",
     "minillm.chat_worker"),
    ("minillm.serving",),
    ("minillm.training",),
    ("minillm.measure",),
    ("minillm.ui",),
    ("minillm",),                                   # the public API, minillm/__init__.py only
    ("minillm.cli", "minillm.lessons", "minillm.__main__"),
]
RANK = {unit: i for i, units in enumerate(LAYERS) for unit in units}


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str, root: Path = PACKAGE) -> bool:
    """Is `minillm.a.b` a module or package of the source tree (not a name defined in one)?"""
    base = root.parent / Path(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() or name in RANK


def imports(path: Path, root: Path = PACKAGE) -> set[str]:
    """Every minillm module `path` imports, anywhere in the file: `from . import x` counts as x when x
    is a module, else as the package it comes from."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "minillm"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "minillm":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if is_module(sub, root) else source)
    found.discard(me)
    return found


def unit(module: str) -> str | None:
    """The LAYERS entry a module belongs to (the root package only as itself)."""
    best = None
    for name in RANK:
        if module == name or (name != "minillm" and module.startswith(name + ".")):
            if best is None or len(name) > len(best):
                best = name
    return best


def graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """unit -> the units it imports (itself left out), over every .py file of the package."""
    edges: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        src = unit(module_name(path, root))
        if src is None:                      # unplaced: test_every_module_has_a_layer says so
            continue
        edges.setdefault(src, set())
        for target in imports(path, root):
            dst = unit(target)
            if dst is not None and dst != src:
                edges[src].add(dst)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one unit (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def wrong_way(root: Path = PACKAGE) -> list[str]:
    """'a imports b (why)' for every import of a module in a higher layer."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        me = module_name(path, root)
        for target in sorted(imports(path, root)):
            src, dst = unit(me), unit(target)
            if src is not None and dst is not None and RANK[dst] > RANK[src]:
                bad.append(f"{me} imports {target} ({src} is below {dst})")
    return bad


def test_every_module_has_a_layer():
    unplaced = sorted({m for path in PACKAGE.rglob("*.py")
                       for m in [module_name(path), *imports(path)] if unit(m) is None})
    assert not unplaced, f"give these a place in LAYERS: {unplaced}"


def test_no_import_points_up():
    bad = wrong_way()
    assert not bad, "imports that point up the layers:\n  " + "\n  ".join(bad)


def test_no_package_cycle():
    found = cycles(graph())
    assert not found, "package import cycles: " + "; ".join(" <-> ".join(g) for g in found)


def file_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of the package it imports (function-local imports counted)."""
    mods = {module_name(p, root): p for p in root.rglob("*.py")}
    return {m: {t for t in imports(p, root) if t in mods and t != m} for m, p in mods.items()}


def test_no_file_cycle_counting_function_local_imports():
    found = cycles(file_graph())
    assert not found, "file import cycles: " + "; ".join(" <-> ".join(g) for g in found)


def test_the_reader_sees_function_local_and_relative_imports(tmp_path):
    """The reader itself: a relative import inside a function counts, as a module or as its package."""
    pkg = tmp_path / "minillm"
    (pkg / "measure").mkdir(parents=True)
    (pkg / "ui").mkdir()
    for f in ("__init__.py", "measure/__init__.py", "ui/__init__.py", "ui/report.py", "meter.py"):
        (pkg / f).write_text("")
    (pkg / "measure" / "bench.py").write_text(
        "from .. import meter\n"
        "def run():\n    from ..ui.report import console\n    import minillm.ui\n")
    assert imports(pkg / "measure" / "bench.py", pkg) == {"minillm.meter", "minillm.ui.report", "minillm.ui"}
    assert wrong_way(pkg) == [
        "minillm.measure.bench imports minillm.ui (minillm.measure is below minillm.ui)",
        "minillm.measure.bench imports minillm.ui.report (minillm.measure is below minillm.ui)"]
    assert cycles(graph(pkg)) == []
    (pkg / "ui" / "report.py").write_text("from ..measure import bench\n")
    assert cycles(graph(pkg)) == [["minillm.measure", "minillm.ui"]]
    assert cycles(file_graph(pkg)) == [["minillm.measure.bench", "minillm.ui.report"]]
