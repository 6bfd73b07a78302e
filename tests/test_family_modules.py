"""What a family brings stays in its module: read from the source (every import, function-local ones
too), no family module imports another family's module, and no family module calls the meter (the
ops it calls count; models/ops.py, mixture.py, mla.py, deltanet.py, blocks.py are where counting
lives). The families are the modules of the rows in checkpoints/families.py; what they share lives
in building blocks (models/decoder.py, mixture.py, blocks.py, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

from minillm.checkpoints.families import FAMILIES

METER = ("minillm.meter", "minillm.trace")
COUNT_KEYWORDS = {"weights", "activations", "other"}          # meter.count(name, weights=, activations=, other=)


def imported(tree: ast.AST, me: str) -> set[str]:
    """Every module name an import in `tree` names, resolved from module `me`: `from .x import y`
    gives me's package + .x and .x.y (y may be a module), `import a.b` gives a.b."""
    package = me.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.add(source)
            found |= {f"{source}.{a.name}" for a in node.names}
    return found


def meter_calls(tree: ast.AST) -> list[int]:
    """Lines that call the meter: `meter.<anything>(...)`, or a `.count(...)` given the meter's
    keywords (weights=, activations=, other=)."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        f = node.func
        if (isinstance(f.value, ast.Name) and f.value.id == "meter") or \
                (f.attr == "count" and COUNT_KEYWORDS & {k.arg for k in node.keywords}):
            lines.append(node.lineno)
    return lines


def problems(source: str, me: str, families: set[str]) -> list[str]:
    """What is wrong with family module `me` (source text): another family imported, the meter
    imported or called."""
    tree = ast.parse(source)
    names = imported(tree, me)
    found = [f"{me} imports the family module {f}" for f in sorted(families - {me})
             if any(n == f or n.startswith(f + ".") for n in names)]
    found += [f"{me} imports {m}" for m in METER if any(n == m or n.startswith(m + ".") for n in names)]
    found += [f"{me} calls the meter at line {line}" for line in meter_calls(tree)]
    return found


def family_modules() -> dict[str, Path]:
    return {f.module.__name__: Path(f.module.__file__) for f in FAMILIES}


def test_no_family_module_imports_another_or_calls_the_meter():
    modules = family_modules()
    assert len(modules) == len(FAMILIES) >= 2                        # one module a row, all of them read
    found = [p for name, path in modules.items()
             for p in problems(path.read_text(encoding="utf-8"), name, set(modules))]
    assert not found, "\n".join(found)


def test_the_reader_sees_each_way_in():
    """Each form an import or a meter call can take is found (so the test above can fail)."""
    fams = {"minillm.models.llama", "minillm.models.moe", "minillm.models.gemma3"}
    me = "minillm.models.gemma3"
    for source in ("from .llama import Block", "from . import llama", "import minillm.models.moe",
                   "from minillm.models.moe import MoE", "def f():\n    from .moe import MoE\n"):
        assert problems(source, me, fams), source
    for source in ("from .. import meter", "from ..meter import active", "import minillm.trace",
                   "m = active()\nm.count('x', weights=4)", "meter.active()"):
        assert problems(source, me, fams), source
    assert problems("from .decoder import Decoder\nfrom .mixture import experts_mlp\nn = [1].count(1)\n",
                    me, fams) == []
