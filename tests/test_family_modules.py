"""What a family brings stays in its module: read from the source (every import, function-local ones
too), no family module imports another family's module, and no family module calls the meter (the
ops it calls count; models/ops.py, mixture.py, mla.py, deltanet.py, blocks.py are where counting
lives). The families are the modules of the rows in checkpoints/families.py; what they share lives
in building blocks (models/decoder.py, mixture.py, blocks.py, ...)."""

from __future__ import annotations

import ast
from pathlib import Path

from minillm.checkpoints.families import FAMILIES
from test_layers import PACKAGE, imports      # the one import reader (function-local, relative imports)

METER = ("minillm.meter", "minillm.trace")
COUNT_KEYWORDS = {"weights", "activations", "other"}          # meter.count(name, weights=, activations=, other=)


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


def problems(path: Path, families: set[str], root: Path = PACKAGE) -> list[str]:
    """What is wrong with a family module: another family imported, the meter imported or called."""
    me, names = ".".join(path.relative_to(root.parent).with_suffix("").parts), imports(path, root)
    found = [f"{me} imports the family module {f}" for f in sorted(families & names - {me})]
    found += [f"{me} imports {m}" for m in METER if m in names]
    found += [f"{me} calls the meter at line {line}" for line in meter_calls(ast.parse(path.read_text("utf-8")))]
    return found


def test_no_family_module_imports_another_or_calls_the_meter():
    modules = {f.module.__name__: PACKAGE.joinpath(*f.module.__name__.split(".")[1:]).with_suffix(".py")
               for f in FAMILIES}
    assert len(modules) == len(FAMILIES) >= 2                        # one module a row, all of them read
    found = [p for path in modules.values() for p in problems(path, set(modules))]
    assert not found, "\n".join(found)


def test_the_reader_sees_each_way_in(tmp_path):
    """Each form an import or a meter call can take is found (so the test above can fail)."""
    pkg = tmp_path / "minillm"
    (pkg / "models").mkdir(parents=True)
    for f in ("__init__.py", "meter.py", "trace.py", "models/__init__.py", "models/llama.py", "models/moe.py",
              "models/decoder.py", "models/mixture.py"):
        (pkg / f).write_text("")
    fams = {"minillm.models.llama", "minillm.models.moe", "minillm.models.gemma3"}
    me = pkg / "models" / "gemma3.py"
    for source in ("from .llama import Block", "from . import llama", "import minillm.models.moe",
                   "from minillm.models.moe import MoE", "def f():\n    from .moe import MoE\n",
                   "from .. import meter", "from ..meter import active", "import minillm.trace",
                   "m = active()\nm.count('x', weights=4)", "meter.active()"):
        me.write_text(source)
        assert problems(me, fams, pkg), source
    me.write_text("from .decoder import Decoder\nfrom .mixture import experts_mlp\nn = [1].count(1)\n")
    assert problems(me, fams, pkg) == []
