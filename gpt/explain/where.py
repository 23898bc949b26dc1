"""Where each stage of gpt-explain's step is computed: the file, the line range and the code there.

Every place is ``(file, first line, last line, code)``, the file relative to the repository root
(or absolute, outside it). None is written down as a line number; each is found in the code:

- a forward stage's place is the statement of the model's code that ran it (``statement``: the
  frame that called the op or the module, found while the forward ran; see gpt.explain.record),
  and ``definition`` gives the op's own class (its formula and backward);
- what cannot be watched (the backward walk, a weight's gradient, AdamW, the float64 checks)
  is named in ``WHERE`` by file and definition, and ``where(key)`` finds its lines.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
from pathlib import Path

import tensorgrad

ROOT = Path(__file__).resolve().parents[2]  # the repository (gpt/explain/where.py)
PACKAGES = {"gpt": ROOT / "gpt", "tensorgrad": Path(tensorgrad.__file__).resolve().parent}

# what the forward hooks cannot see: (package path, definition's qualified name, code in it)
WHERE: dict[str, list[tuple[str, str, str]]] = {
    "backward": [("tensorgrad/autograd/walk.py", "walk", "def walk")],
    "wqkv_grad": [("tensorgrad/ops/linalg.py", "Linear.backward", "gw = matmul(_mT(g2), x2)")],
    "embedding_grad": [
        ("tensorgrad/ops/nn.py", "Embedding.backward", "gw = add_at(self.wshape, idx")
    ],
    "adamw": [("tensorgrad/optim/__init__.py", "adamw_update", "def adamw_update")],
    "finite_differences": [
        ("gpt/explain/checks.py", "finite_differences", "def finite_differences")
    ],
    "loss_change": [("gpt/explain/checks.py", "loss_change", "def loss_change")],
}


def where(key: str) -> list[tuple[str, int, int, str]]:
    """The places of WHERE entry ``key`` (e.g. 'adamw'), their lines found in the code; [] for
    another key or a definition that is gone."""
    out = []
    for file, qualname, code in WHERE.get(key, []):
        package, _, rest = file.partition("/")
        found = _definition(str(PACKAGES[package] / rest), qualname)
        if found is not None:
            out.append((display(PACKAGES[package] / rest), found[0], found[1], code))
    return out


def display(path) -> str:
    """A file as the pages name it: relative to the repository, or absolute outside it."""
    p = Path(path).resolve()
    try:
        return p.relative_to(ROOT).as_posix()
    except ValueError:
        return str(p)


def code_of(filename: str, a: int, b: int) -> str:
    """Lines a..b of a file as one line of code (each line stripped, joined by spaces)."""
    return " ".join(linecache.getline(filename, n).strip() for n in range(a, b + 1)).strip()


def statement(filename: str, lineno: int) -> tuple[str, int, int, str]:
    """The place of the statement that holds line ``lineno`` (of a compound statement, its
    header: ``for ...:``); the line alone where the file cannot be parsed."""
    a = b = lineno
    spans = _statements(filename)
    inside = [(s, e) for s, e in spans if s <= lineno <= e]
    if inside:
        a, b = max(inside, key=lambda se: (se[0], -se[1]))  # the innermost
    return display(filename), a, b, code_of(filename, a, b)


def definition(obj) -> tuple[str, int, int, str] | None:
    """The place of a class or function (an op's class: its forward and backward)."""
    try:
        filename = inspect.getsourcefile(obj)
    except TypeError:
        return None
    found = filename and _definition(filename, obj.__qualname__)
    if not found:
        return None
    kind = "class" if inspect.isclass(obj) else "def"
    return display(filename), found[0], found[1], f"{kind} {obj.__name__}"


@functools.lru_cache(maxsize=64)
def _tree(filename: str):
    try:
        return ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=64)
def _statements(filename: str) -> tuple:
    """(first, last) line of every statement; a compound one's header only."""
    tree = _tree(filename)
    if tree is None:
        return ()
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                spans.append((node.lineno, max(node.lineno, body[0].lineno - 1)))
            else:
                spans.append((node.lineno, node.end_lineno))
    return tuple(spans)


def _definition(filename: str, qualname: str) -> tuple[int, int] | None:
    """(first, last) line of the class or function ``qualname`` (``Linear.backward``)."""
    nodes = [_tree(filename)]
    for part in qualname.split("."):
        defs = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        found = [
            n for parent in nodes if parent is not None for n in getattr(parent, "body", [])
            if isinstance(n, defs) and n.name == part
        ]  # fmt: skip
        if not found:
            return None
        nodes = found
    node = nodes[-1]
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    return first, node.end_lineno
