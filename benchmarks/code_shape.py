"""The shape of the code, measured: lines of minillm/ and lessons/, the longest functions, the package
import graph (and any cycle in it), and the modules one served token passes through.

    python benchmarks/code_shape.py            # from the repository's root
"""

from __future__ import annotations

import ast
import sys
import threading
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def py_files(folder: str):
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def lines(folder: str) -> int:
    return sum(len(p.read_text().splitlines()) for p in py_files(folder))


def longest(n: int = 15):
    out = []
    for folder in ("minillm", "lessons"):
        for p in py_files(folder):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append((node.end_lineno - node.lineno + 1, f"{p.relative_to(ROOT)}:{node.lineno}", node.name))
    return sorted(out, reverse=True)[:n]


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "(top)"


def import_graph():
    """package -> packages it imports (relative and absolute imports of minillm, anywhere in a file)."""
    graph = defaultdict(set)
    for p in py_files("minillm"):
        rel = p.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(parts)
        pkg = package_of(module) if p.name != "__init__.py" else (parts[1] if len(parts) > 1 else "(top)")
        base = parts if p.name == "__init__.py" else parts[:-1]
        for node in ast.walk(ast.parse(p.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    head = base[:len(base) - node.level + 1]
                    target = ".".join(head + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                targets = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t.startswith("minillm."):
                    q = t.split(".")
                    if len(q) >= 2 and (ROOT / "minillm" / q[1]).is_dir():
                        other = q[1]
                    elif len(q) >= 2 and (ROOT / "minillm" / f"{q[1]}.py").is_file():
                        other = "(top)"
                    else:
                        continue
                    if other != pkg and pkg != "(top)":
                        graph[pkg].add(other)
    return graph


def cycles(graph):
    found = []
    for a in graph:
        for b in graph[a]:
            if a < b and a in graph.get(b, ()):
                found.append((a, b))
    return found


def served_token_modules():
    """Modules whose code runs on the engine thread from taking one request to its last token."""
    sys.path.insert(0, str(ROOT))
    import numpy as np
    import minillm
    from minillm.models.gpt2 import GPT2Config
    from minillm.engine.sequence import SamplingParams
    from minillm.serving.api import CompletionRequest
    from minillm.serving.loop import EngineLoop
    config = GPT2Config(n_layer=2, n_head=2, n_embd=16, n_ctx=64, vocab_size=100)
    rng = np.random.default_rng(0)
    params = {"wte.weight": rng.normal(0, .1, (100, 16)), "wpe.weight": rng.normal(0, .1, (64, 16)),
              "ln_f.weight": np.ones(16), "ln_f.bias": np.zeros(16)}
    for i in range(2):
        for k, shape in (("ln_1.weight", (16,)), ("ln_1.bias", (16,)), ("attn.c_attn.weight", (16, 48)),
                         ("attn.c_attn.bias", (48,)), ("attn.c_proj.weight", (16, 16)), ("attn.c_proj.bias", (16,)),
                         ("ln_2.weight", (16,)), ("ln_2.bias", (16,)), ("mlp.c_fc.weight", (16, 64)),
                         ("mlp.c_fc.bias", (64,)), ("mlp.c_proj.weight", (64, 16)), ("mlp.c_proj.bias", (16,))):
            params[f"h.{i}.{k}"] = rng.normal(0, .1, shape) + (1 if k.endswith("ln_1.weight") or k.endswith("ln_2.weight") else 0)
    model = minillm.GPT2(config, {k: v.astype(np.float32) for k, v in params.items()})
    mods = set()

    def prof(frame, event, arg):
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            if name.startswith("minillm"):
                mods.add(name)
        return None

    loop = EngineLoop(model, kv_memory=1 << 20, block_size=4)
    try:
        CompletionRequest.__init__  # noqa: B018
        req = CompletionRequest([1, 2, 3], 3, SamplingParams(), [], False, False)
    except TypeError:
        req = CompletionRequest(prompt_ids=[1, 2, 3], max_tokens=3, sampling=SamplingParams(), stop=[],
                                stream=False, include_usage=False)
    threading.setprofile(prof)
    sys.setprofile(prof)
    loop.start()
    r = loop.submit(req)
    while r.events.get(timeout=30)[0] != "done":
        pass
    sys.setprofile(None)
    threading.setprofile(None)
    loop.stop(grace=0)
    return sorted(mods)


def main() -> int:
    print(f"lines: minillm/ {lines('minillm')}, lessons/ {lines('lessons')}")
    print("\nthe 15 longest functions (lines, where, name):")
    for n, where, name in longest():
        print(f"  {n:4d}  {where}  {name}")
    g = import_graph()
    print("\npackage import graph:")
    for a in sorted(g):
        print(f"  {a:12s} -> {', '.join(sorted(g[a]))}")
    cyc = cycles(g)
    print(f"package cycles: {len(cyc)}" + ("".join(f"\n  {a} <-> {b}" for a, b in cyc)))
    mods = served_token_modules()
    print(f"\nmodules one served request runs through (engine thread, submit to last token): {len(mods)}")
    for m in mods:
        print(f"  {m}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
