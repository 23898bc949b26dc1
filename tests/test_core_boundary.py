"""The core's boundary: no module outside the core touches Tensor's private fields or methods.

The compatibility surface (compile, viz, distributed, nn.init, ...) builds on the core's public
API (Function, the kernel registry, Tensor's public attributes). This test parses every module of
tensorgrad/ that is not in ``CORE`` and fails on ``x._name``, on ``getattr/setattr/hasattr/
delattr(x, "_name")`` and on any other string ``"_name"`` (a name spelled as a string serves only
such calls, ``vars()`` or a table of names to patch), where ``_name`` is a private name of
Tensor: its ``__slots__`` and what Tensor and its base classes in tensorgrad define, dunders
excluded. The set is read from the class at test time, so a new private field is covered
without editing this file. A class outside the core that wants such a name for an attribute of
its own takes another name, so that the rule stays simple to check.
"""

from __future__ import annotations

import ast
import inspect
from fnmatch import fnmatch
from pathlib import Path

import pytest
from test_reading import core_table

import tensorgrad as tg
from tensorgrad.compiler import CompileWarning
from tensorgrad.compiler import trace as compile_trace
from tensorgrad.tensor import Tensor

ROOT = Path(__file__).resolve().parents[1]

# The modules that may touch Tensor's private names: the core as docs/reading.md lists it,
# Tensor's own base classes (they are Tensor, written in three files) and the tape's layers in
# autograd/ (fnmatch patterns, relative to the repository root; ``*`` also crosses ``/``).
TENSOR_ITSELF = (
    "tensorgrad/tensor_extras.py",
    "tensorgrad/tensor_select.py",
    "tensorgrad/tensor_inplace.py",
    "tensorgrad/autograd/*",
)
CORE = tuple(path for path, _, _ in core_table()) + TENSOR_ITSELF


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names() -> set[str]:
    """Tensor's private names: its slots and those of the tensorgrad classes it is built from,
    and every private attribute those classes define (methods, properties, constants)."""
    names = set()
    for cls in Tensor.__mro__:
        if not cls.__module__.startswith("tensorgrad"):
            continue
        slots = vars(cls).get("__slots__", ())
        names.update((slots,) if isinstance(slots, str) else slots)
        names.update(vars(cls))
    return {n for n in names if _private(n)}


def is_core(rel: str) -> bool:
    return any(fnmatch(rel, pattern) for pattern in CORE)


def touches(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, expression) for every ``x.name`` and every string ``"name"`` in the source, for
    the names in ``names`` (``getattr(x, "name")`` shows as the call)."""
    found, shown = [], set()  # shown: the strings already reported as part of their call
    nodes = list(ast.walk(ast.parse(source)))
    for node in nodes:
        if isinstance(node, ast.Attribute) and node.attr in names:
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and any(_is_name(a, names) for a in node.args):
            found.append((node.lineno, ast.unparse(node)))
            shown.update(id(a) for a in node.args)
    for node in nodes:
        if _is_name(node, names) and id(node) not in shown:
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def _is_name(node, names: set[str]) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names


def test_private_names_are_read_from_the_class():
    names = private_names()
    # a field, a method of Tensor and one of each base class: the derivation sees all three
    assert {"_array", "_version", "_node", "_make", "_compare", "_written"} <= names
    assert not any(n.startswith("__") and n.endswith("__") for n in names)


def test_the_scan_finds_each_kind_of_touch():
    src = 'a = t._array\nt._version[0] += 1\nhasattr(k, "_node")\nsetattr(T, "_make", f)\n'
    src += 'PATCH = ("_compare", "argmax")\n'
    src += 'ok = t.array + getattr(t, "array") + t._other + "_compare is private"\n'
    found = touches(src, private_names())
    assert [line for line, _ in found] == [1, 2, 3, 4, 5]
    assert found[2][1] == "hasattr(k, '_node')" and found[4][1] == "'_compare'"


def test_no_module_outside_the_core_touches_tensor_private_names():
    names = private_names()
    bad = []
    for path in sorted((ROOT / "tensorgrad").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if is_core(rel):
            continue
        for line, expr in touches(path.read_text("utf-8"), names):
            bad.append(f"{rel}:{line}: {expr}")
    assert not bad, "Tensor's private names used outside the core (use its public API):\n" + (
        "\n".join(bad)
    )


def _calls(name: str) -> set[str]:
    """The names the code of Tensor's attribute ``name`` reads (empty for a non-function)."""
    f = inspect.getattr_static(Tensor, name)
    code = getattr(getattr(f, "__func__", f), "__code__", None)
    return set(code.co_names) if code else set()


def test_the_tracer_patches_every_public_name_of_floor_mod():
    """compile's tracer flags // or % of a traced tensor (no op records them) by patching the
    public methods, not the private helper behind them: every Tensor attribute whose code calls
    the helper, aliases such as ``floor_divide`` included, must be patched, or a new alias would
    slip past the trace."""
    for name in dir(Tensor):
        if "_no_grad_binary" in _calls(name):
            assert name in compile_trace._OFF_TAPE, name
            assert compile_trace._WHAT.get(name) == "// or %", name


BITWISE = ("__and__", "__or__", "__xor__", "__invert__")


def test_every_public_name_of_a_comparison_records_an_op():
    """Comparisons and logic are ops (Compare, Predicate) that a compile trace records and
    replays: every Tensor attribute whose code reaches them, aliases such as ``eq`` included,
    records its op while a trace watches (none is patched by the tracer), with no gradient."""
    found = 0
    for name in dir(Tensor):
        calls = _calls(name)
        if not ({"_compare", "_predicate"} & calls) or name.startswith(("_compare", "_pred")):
            continue
        found += 1
        assert name not in compile_trace._OFF_TAPE, name
        x = tg.randn(4, requires_grad=True)
        this = x > 0 if name in BITWISE else x  # (&, |, ^ and ~ of floats raise, as in torch)
        args = () if "_predicate" in calls else ((x < 0.5) if name in BITWISE else x * 2,)
        tracer = compile_trace.Tracer([this, *args])
        with compile_trace.tracing(tracer):
            out = getattr(this, name)(*args)
        step = tracer.graph.steps[-1]
        assert step.ref.__name__ in ("Compare", "Predicate"), (name, step)
        assert [kind for kind, _ in step.ins] == ["v"] * (1 + len(args)), (name, step.ins)
        assert not out.requires_grad and out.grad_fn is None, name
    assert found >= 20, found  # ==, !=, <, <=, >, >=, &, |, ^, ~, their aliases, logical_*, isnan


@pytest.mark.parametrize(
    "fn, reason",
    [
        (lambda x: x * (x // 1), "// or %"),
        (lambda x: x * (2 % x), "// or %"),
        (lambda x: x * x.floor_divide(2), "// or %"),
    ],
)
def test_a_compiled_forward_still_sees_what_no_op_records(fn, reason):
    f = tg.compile(fn)
    x = tg.randn(5)
    with pytest.warns(CompileWarning, match=reason):
        f(x), f(x)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: x.masked_fill(x.eq(x * 0.5), 0.0),
        lambda x: x.masked_fill(x.logical_and(x > 0.5), 0.0),
        lambda x: x.masked_fill(~(x < 0), 1.0),
        lambda x: x.masked_fill(x.isnan() | (x >= 0.2), 0.0),
    ],
    ids=["eq", "logical_and", "invert", "isnan-or"],
)
def test_a_comparison_of_a_traced_tensor_replays(fn):
    """Comparisons record an op: the compiled forward replays them on each call's values (the
    first two calls see one input, the third another) and does not fall back."""
    f = tg.compile(fn)
    x = tg.randn(5)
    f(x), f(x)
    y = tg.randn(5)
    assert (f(y).numpy() == fn(y).numpy()).all()
    assert f.summary()["compiled"] == 1 and f.summary()["eager"] == []
