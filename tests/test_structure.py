"""The layout rules, checked with ast over tensorgrad/ and gpt/: no function over 100 lines, no
module over 700, no import cycle (module-level and function-local imports, relative imports
resolved), and no private ``_name`` imported from another module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FUNCTION, MAX_MODULE = 100, 700


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package under root."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: dict) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import in the file, function-
    local ones included; relative imports are resolved, `from pkg import mod` names mod."""
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in known:  # `from . import mod`: the module itself
                    out.append((sub, [], node.lineno))
                else:
                    out.append((base, [a.name], node.lineno))
    return out


def problems(root: Path, package: str) -> list[str]:
    """Every breach of the layout rules in root/package, one line each."""
    mods = modules(root, package)
    found, graph = [], {}
    for name, path in mods.items():
        text = path.read_text("utf-8")
        rel = path.relative_to(root)
        n_lines = len(text.splitlines())
        if n_lines > MAX_MODULE:
            found.append(f"{rel}: module of {n_lines} lines (at most {MAX_MODULE})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION:
                    found.append(
                        f"{rel}:{node.lineno}: {node.name} has {n} lines (at most {MAX_FUNCTION})"
                    )
        graph[name] = set()
        for target, names, line in imports(name, path, mods):
            if target in mods and target != name:
                graph[name].add(target)
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    found.append(f"{rel}:{line}: imports the private name {n} from {target}")
    found += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path back to its start) per strongly connected component of size > 1."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm; the graphs here are small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(_path_in(graph, set(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _path_in(graph, comp: set[str]) -> list[str]:
    """A cycle through the component's first module, by breadth-first search."""
    start = min(comp)
    prev, queue = {start: None}, [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & comp):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return sorted(comp)


@pytest.mark.parametrize("package", ["tensorgrad", "gpt"])
def test_layout_rules(package):
    found = problems(ROOT, package)
    assert not found, f"{len(found)} layout problems in {package}/:\n" + "\n".join(found)


def test_the_checker_sees_each_kind_of_problem(tmp_path):
    """A package made to break every rule once: each breach is reported."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    body = "\n".join(f"    x{i} = {i}" for i in range(101))
    (pkg / "sub" / "b.py").write_text(f"def f():\n    from ..a import g\n{body}\n")
    (pkg / "c.py").write_text("from pkg.a import _hidden\n" + "x = 1\n" * 700)
    found = "\n".join(problems(tmp_path, "pkg"))
    assert "f has 103 lines" in found
    assert "module of 701 lines" in found
    assert "import cycle: pkg.a -> pkg.sub.b -> pkg.a" in found
    assert "private name _hidden from pkg.a" in found
