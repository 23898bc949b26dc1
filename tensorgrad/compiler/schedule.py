"""Schedule: which steps of a plan form one fused run, and each run as one step.

A run is two or more elementwise steps of one output shape (bias adds, GELU/ReLU/SiLU parts,
tanh, exp, powers, scales, residual adds: the ops codegen.py's ``RULES`` has a rule for),
consecutive in the plan, whose inputs codegen can read (``read_kind``: whole arrays of the
output's shape, trailing broadcasts such as a bias, one value per row, Python scalars).

A run may also hold one reduction: a Sum or Mean over the last axis with keepdim=True, the
steps on its (B, T, 1) value, and the steps after it that read that value per row (a row
program): RMSNorm as written, ``x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w``,
with the residual add before it, is one run.

``fuse_runs`` walks the plan once, growing a ``Run`` while each step can join it; where one
cannot, the run closes: as it was when shorter than two steps, else as one step whose
implementation is the generated ``FusedElementwise`` subclass (codegen.kernel_class) and
whose outputs are the run's values that a later step or the result reads
(``trace.last_reads``). The pattern is the graph's, never a module's type: any forward whose
ops form such a run is fused, edited or not.

Imports: numpy, .codegen, .trace.
"""

from __future__ import annotations

import numpy as np

from .codegen import RULES, kernel_class, read_kind, rule_name
from .trace import Graph, Step, last_reads


def fuse_runs(graph: Graph, steps: list) -> list:
    """``steps`` with each run of two or more elementwise steps (and at most one row
    reduction among them) as one generated kernel."""
    used_after = last_reads(graph, steps)
    out, run = [], Run()
    for k, st in enumerate(steps):
        level = run.level(graph, st)
        if level is None and run.steps:  # the run ends here; st may start the next one
            out += _close(graph, run, used_after)
            run = Run()
            level = run.level(graph, st)
        if level is None:
            out.append(st)
        else:
            run.add(graph, k, st, level)
    return out + _close(graph, run, used_after)


class Run:
    """The steps of one fused kernel as they are collected: elementwise steps of one shape
    (the elements), and optionally one last-axis reduction followed by elementwise steps on
    its (rows, 1) shape (the rows), whose values the element steps after it read per row."""

    def __init__(self):
        self.steps: list = []  # (level, index, step): level "e" (elements), "r" (rows), "red"
        self.shape = self.dtype = None
        self.rows: set = set()  # slots of the run's row values

    def level(self, graph: Graph, st: Step) -> str | None:
        """Where st would join the run: "red" (its reduction), "e" (a step on the elements),
        "r" (a step on the rows, after the reduction, reading row values and numbers only),
        or None (it cannot)."""
        if _reduces_rows(graph, st):
            shape, dtype = graph.meta[st.ins[0][1]]
            if self.rows or (
                self.shape is not None and (tuple(shape), dtype) != (self.shape, self.dtype)
            ):
                return None
            return "red"
        if not _fusable(graph, st):
            return None
        shape, dtype = tuple(st.meta[0][0]), st.meta[0][1]
        if self.shape is None or (shape, dtype) == (self.shape, self.dtype):
            return "e"
        on_rows = (
            bool(self.rows)
            and (shape, dtype) == (_row_shape(self.shape), self.dtype)
            and all(
                read_kind(graph, r, shape) == ("scalar",)
                if r[0] == "c"
                else tuple(graph.meta[r[1]][0]) == shape
                for r in st.ins
            )
        )
        return "r" if on_rows else None

    def add(self, graph: Graph, k: int, st: Step, level: str) -> None:
        if self.shape is None:  # the run's elements: a reduction's input, else st's output
            shape, self.dtype = graph.meta[st.ins[0][1]] if level == "red" else st.meta[0]
            self.shape = tuple(shape)
        self.steps.append((level, k, st))
        if level != "e":
            self.rows.add(st.outs[0])


def _close(graph: Graph, run: Run, used_after: dict) -> list:
    """The steps of a finished run: as they were when too short, else one fused step."""
    steps = [st for _, _, st in run.steps]
    if len(steps) < 2:
        return steps
    end = run.steps[-1][1]
    made = {st.outs[0] for st in steps}
    outs = [st.outs[0] for st in steps if used_after.get(st.outs[0], -1) > end]
    ins, seen = [], {}
    for st in steps:
        for ref in st.ins:
            key = (ref[0], ref[1] if ref[0] == "v" else id(ref[1]))
            if ref[0] == "v" and ref[1] in made:
                continue
            if key not in seen:
                seen[key] = len(ins)
                ins.append(ref)
    impl = kernel_class(run, ins, outs, graph)
    needs = tuple(ref[0] == "v" and graph.needs_grad[ref[1]] for ref in ins)
    meta = [graph.meta[s] for s in outs]
    return [Step(None, impl, ins, {}, outs, needs, meta)]  # no one reference Op: a run


def _fusable(graph: Graph, st: Step) -> bool:
    """An elementwise step that RULES computes, of a float output, every input of which the
    generated code can read."""
    name = rule_name(st)
    if name not in RULES or st.impl.multi_output or len(st.outs) != 1:
        return False
    if name == "Gelu" and st.kwargs.get("approximate", ("c", "tanh"))[1] != "tanh":
        return False
    if name == "Pow" and not (st.ins[1][0] == "c" and isinstance(st.ins[1][1], (int, float))):
        return False
    shape, dtype = st.meta[0]
    if dtype not in (np.float32, np.float64) or any(k != "approximate" for k in st.kwargs):
        return False
    return all(read_kind(graph, ref, shape) is not None for ref in st.ins)


def _reduces_rows(graph: Graph, st: Step) -> bool:
    """A Sum or Mean over the last axis with keepdim=True, of a float array whose rows hold
    more than one element: a row program's one reduction."""
    if (
        st.ref is None
        or st.ref.__name__ not in ("Sum", "Mean")
        or st.impl.multi_output
        or len(st.outs) != 1
    ):
        return False
    if set(st.kwargs) - {"dim", "keepdim"} or st.ins[0][0] != "v":
        return False
    dim = st.kwargs.get("dim", ("c", None))[1]
    if isinstance(dim, (tuple, list)) and len(dim) == 1:
        dim = dim[0]
    shape, dtype = graph.meta[st.ins[0][1]]
    shape = tuple(shape)
    return (
        st.kwargs.get("keepdim", ("c", False))[1] is True
        and isinstance(dim, int)
        and not isinstance(dim, bool)
        and len(shape) >= 1
        and shape[-1] > 1
        and dim in (-1, len(shape) - 1)
        and dtype in (np.float32, np.float64)
        and tuple(st.meta[0][0]) == _row_shape(shape)
    )


def _row_shape(shape) -> tuple:
    return (*tuple(shape)[:-1], 1)
