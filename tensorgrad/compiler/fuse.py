"""Fuse: runs of elementwise ops in a traced graph become one generated numba kernel.

A run of two or more elementwise steps of one output shape (bias adds, GELU/ReLU/SiLU parts,
tanh, exp, powers, scales, residual adds) makes one forward kernel, a single pass over memory
(``prange``, on the threads the CPU kernels use: ``TG_KERNEL_THREADS``), and one backward
kernel. The backward recomputes the run's
values from its inputs and walks the run in reverse; its derivatives come from ``RULES``,
one table of scalar rules (as tinygrad keeps its rules in one table). An input of the run is
a whole array of the output's shape, a trailing broadcast (a bias of shape (C,) against
(B, T, C): read at ``i % C``, its gradient summed over the rest), one value per row (a
keepdim reduction's (B, T, 1), as RMSNorm's x·rsqrt(mean(x²) + eps): read at ``i // C``,
its gradient summed over the row), or a Python scalar.

The pattern is the graph's, never a module's type: any forward whose ops form such a run is
fused, edited or not. Without numba, or with ``TG_KERNELS=0``, nothing is fused and the
traced ops replay as they are.

Imports: math, numpy, .patterns, .trace, ..autograd, ..kernels.
"""

from __future__ import annotations

import math

import numpy as np

from .. import kernels
from ..autograd.graph import Op
from .patterns import match_composites
from .trace import Graph, Step

S2PI, GC = math.sqrt(2.0 / math.pi), 0.044715  # the tanh GELU's constants (ops/nn.py)
R2, R2PI = 1.0 / math.sqrt(2.0), 1.0 / math.sqrt(2.0 * math.pi)  # the erf GELU's

# op: (forward, (derivative for input a, for input b)), on scalars: a, b the inputs, y the
# output, g the gradient arriving at y. Pow fuses only with a number as its exponent. In the
# generated code ``exp`` is numba_math's vectorisable exp32 for float32 (np.exp for float64)
# and every number literal is of the arrays' dtype, so float32 computes in float32.
RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "Add": ("a + b", ("g", "g")),
    "Sub": ("a - b", ("g", "-g")),
    "Mul": ("a * b", ("g * b", "g * a")),
    "Div": ("a / b", ("g / b", "-g * a / (b * b)")),
    "Pow": ("a ** b", ("g * b * a ** (b - 1)", "")),
    "Neg": ("-a", ("-g",)),
    "Exp": ("exp(a)", ("g * y",)),
    "Log": ("np.log(a)", ("g / a",)),
    "Sqrt": ("np.sqrt(a)", ("g / (2 * y)",)),
    "Tanh": ("np.tanh(a)", ("g * (1 - y * y)",)),
    "Sigmoid": ("1 / (1 + exp(-a))", ("g * y * (1 - y)",)),
    "Relu": ("max(a, 0)", ("g * (a > 0)",)),
    # the tanh GELU as a·σ(2u), u = √(2/π)(a + 0.044715a³), as the CPU kernel computes it:
    # σ through e = e^(-2u), capped (no inf·0); its derivative σ + 2a·e·σ²·u'
    "Gelu": (
        f"a / (1 + exp(min(-2 * {S2PI!r} * (a + {GC!r} * a * a * a), 80)))",
        (
            f"g * (1 / (1 + exp(min(-2 * {S2PI!r} * (a + {GC!r} * a * a * a), 80))) + 2 * a * "
            f"exp(min(-2 * {S2PI!r} * (a + {GC!r} * a * a * a), 80)) / "
            f"(1 + exp(min(-2 * {S2PI!r} * (a + {GC!r} * a * a * a), 80))) ** 2 * "
            f"{S2PI!r} * (1 + {3 * GC!r} * a * a))",
        ),
    ),
    "Gelu:none": (
        f"0.5 * a * (1 + math.erf(a * {R2!r}))",
        (f"g * (0.5 * (1 + math.erf(a * {R2!r})) + a * exp(-0.5 * a * a) * {R2PI!r})",),
    ),
}
PARALLEL_FROM = 1 << 15  # elements: below this the threads cost more than they save


def plan(graph: Graph) -> list:
    """The steps replay runs: composites as their kernels, then elementwise runs fused."""
    steps = list(graph.steps)
    if not kernels.is_enabled() or graph.device != "cpu":
        return steps
    steps = match_composites(graph, steps, _last_reads(graph, steps))
    return fuse_runs(graph, steps) if _have_numba() else steps


def fuse_runs(graph: Graph, steps: list) -> list:
    """``steps`` with each run of two or more elementwise steps as one generated kernel."""
    used_after = _last_reads(graph, steps)
    out, run = [], []
    for k, st in enumerate(steps):
        if run and not _joins(graph, run, st):
            out += _close(graph, run, used_after)
            run = []
        if _fusable(graph, st):
            run.append((k, st))
        else:
            out.append(st)
    return out + _close(graph, run, used_after)


def _have_numba() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _rule(st: Step) -> str:
    """The step's entry in RULES (the GELU's by its form)."""
    name = st.cls.__name__
    if name == "Gelu" and st.kwargs.get("approximate", ("c", "tanh"))[1] == "none":
        return "Gelu:none"
    return name


def _fusable(graph: Graph, st: Step) -> bool:
    name = _rule(st)
    if name not in RULES or st.impl.multi_output or len(st.outs) != 1:
        return False
    if name == "Gelu" and st.kwargs.get("approximate", ("c", "tanh"))[1] != "tanh":
        return False
    if name == "Pow" and not (st.ins[1][0] == "c" and isinstance(st.ins[1][1], (int, float))):
        return False
    shape, dtype = st.meta[0]
    if dtype not in (np.float32, np.float64) or any(k != "approximate" for k in st.kwargs):
        return False
    return all(_kind(graph, ref, shape) is not None for ref in st.ins)


def _joins(graph: Graph, run: list, st: Step) -> bool:
    return _fusable(graph, st) and st.meta[0] == run[0][1].meta[0]


def _kind(graph: Graph, ref, shape):
    """How input ``ref`` is read against the output ``shape``: ("full",), ("tail", m): a
    trailing broadcast, read at i % m; ("lead", m): one value per row of the last m
    elements (a keepdim reduction's (B, T, 1) against (B, T, C)), read at i // m;
    ("scalar",); or None when it cannot be fused."""
    kind, v = ref
    if kind == "c" and isinstance(v, (int, float)) and not isinstance(v, bool):
        return ("scalar",)
    s = graph.meta[v][0] if kind == "v" else getattr(v, "shape", None)
    if s is None:
        return None
    s = tuple(s)
    if s == tuple(shape):
        return ("full",)
    k = len(s)
    while k and s[k - 1] == 1:
        k -= 1
    if len(s) == len(shape) and k < len(s) and s[:k] == tuple(shape[:k]):
        return ("lead", int(np.prod(shape[k:], dtype=np.int64)))
    while s and s[0] == 1:
        s = s[1:]
    if len(s) <= len(shape) and tuple(shape[len(shape) - len(s) :]) == s:
        return ("tail", int(np.prod(s, dtype=np.int64)))
    return None


def _last_reads(graph: Graph, steps: list) -> dict:
    """slot -> index of the last step that reads it (len(steps) for the graph's outputs)."""
    last = {}
    for k, st in enumerate(steps):
        for kind, v in list(st.ins) + list(st.kwargs.values()):
            if kind == "v":
                last[v] = k
    for s in graph.output_slots():
        last[s] = len(steps)
    return last


def _close(graph: Graph, run: list, used_after: dict) -> list:
    """The steps of a finished run: as they were when too short, else one fused step."""
    if len(run) < 2:
        return [st for _, st in run]
    end = run[-1][0]
    made = {st.outs[0] for _, st in run}
    outs = [st.outs[0] for _, st in run if used_after.get(st.outs[0], -1) > end]
    ins, seen = [], {}
    for _, st in run:
        for ref in st.ins:
            key = (ref[0], ref[1] if ref[0] == "v" else id(ref[1]))
            if ref[0] == "v" and ref[1] in made:
                continue
            if key not in seen:
                seen[key] = len(ins)
                ins.append(ref)
    shape, dtype = run[0][1].meta[0]
    impl = _kernel_class([st for _, st in run], ins, outs, graph, shape, dtype)
    needs = tuple(ref[0] == "v" and graph.needs_grad[ref[1]] for ref in ins)
    return [Step(impl, impl, ins, {}, outs, needs, [(shape, dtype)] * len(outs))]


# ----------------------------------------------------------------------------- code generation


def _kernel_class(run: list, ins: list, outs: list, graph: Graph, shape, dtype) -> type:
    """An Op class whose forward and backward run the generated kernels of ``run``."""
    kinds = [_kind(graph, ref, shape) for ref in ins]
    names = {}  # slot -> scalar variable in the generated code
    for j, ref in enumerate(ins):
        if ref[0] == "v":
            names[ref[1]] = f"x{j}"
    body, consts = [], []
    for j, (ref, kd) in enumerate(zip(ins, kinds)):
        if kd[0] == "full":
            body.append(f"x{j} = A{j}[i]")
        elif kd[0] == "tail":
            body.append(f"x{j} = A{j}[i % {kd[1]}]")
        elif kd[0] == "lead":
            body.append(f"x{j} = A{j}[i // {kd[1]}]")
        else:
            body.append(f"x{j} = F({float(ref[1])!r})")
            consts.append(j)

    def arg(ref):
        if ref[0] == "v":
            return names[ref[1]]
        return (
            f"x{next(j for j, r in enumerate(ins) if r is ref or (r[0] == 'c' and r[1] is ref[1]))}"
        )

    for st in run:
        a = [arg(r) for r in st.ins]
        fwd = RULES[_rule(st)][0]
        body.append(f"v{st.outs[0]} = " + _subst(fwd, a, None, None))
        names[st.outs[0]] = f"v{st.outs[0]}"
    arrays = [f"A{j}" for j, kd in enumerate(kinds) if kd[0] != "scalar"]
    fwd_src = _function(
        "forward",
        arrays + [f"O{k}" for k in range(len(outs))],
        body + [f"O{k}[i] = v{s}" for k, s in enumerate(outs)],
    )
    # backward: recompute, then the rules in reverse
    grads = [f"g{s} = G{k}[i]" for k, s in enumerate(outs)]
    declared = set(outs)
    back = []
    for st in reversed(run):
        y = st.outs[0]
        if y not in declared:
            continue  # no gradient reaches it
        rules = RULES[_rule(st)][1]
        for r, rule in zip(st.ins, rules):
            if r[0] != "v" or not rule or not graph.needs_grad[r[1]]:
                continue
            term = _subst(rule, [arg(x) for x in st.ins], names[y], f"g{y}")
            src = r[1]
            back.append(f"g{src} = g{src} + {term}" if src in declared else f"g{src} = {term}")
            declared.add(src)
    wanted = [j for j, ref in enumerate(ins) if ref[0] == "v" and graph.needs_grad[ref[1]]]
    stores = [
        f"GX{j}[i] = g{ins[j][1]}" if ins[j][1] in declared else f"GX{j}[i] = 0.0" for j in wanted
    ]
    bwd_src = _function(
        "backward",
        arrays + [f"G{k}" for k in range(len(outs))] + [f"GX{j}" for j in wanted],
        body + grads + back + stores,
    )
    n = int(np.prod(shape, dtype=np.int64))
    fwd_fn, bwd_fn = _compile(fwd_src, n, dtype), _compile(bwd_src, n, dtype)
    label = "+".join(st.cls.__name__.lower() for st in run)
    return type(
        f"Fused[{label}]",
        (FusedElementwise,),
        {
            "kinds": kinds,
            "shape": tuple(shape),
            "n_outs": len(outs),
            "wanted": wanted,
            "kernel_forward": staticmethod(fwd_fn),
            "kernel_backward": staticmethod(bwd_fn),
            "source": fwd_src + "\n" + bwd_src,
        },
    )


def _subst(expr: str, args: list, y, g) -> str:
    """A rule with its names (a, b, y, g) replaced by the generated code's variables, and its
    numbers as the arrays' dtype (``F(2)``: a bare literal would make numba compute float32
    in float64)."""
    import re

    names = {"a": args[0], "b": args[1] if len(args) > 1 else "b", "y": y, "g": g}
    expr = re.sub(r"(?<![\w.])(\d+(?:\.\d*)?(?:e[-+]?\d+)?)(?![\w.])", r"F(\1)", expr)
    return "(" + re.sub(r"\b([abyg])\b", lambda m: names[m.group(1)], expr) + ")"


def _function(name: str, params: list, body: list) -> str:
    lines = [f"def {name}(N, {', '.join(params)}):", "    for i in prange(N):"]
    return "\n".join(lines + ["        " + line for line in body])


def _compile(src: str, n: int, dtype):
    import numba

    from ..kernels.numba_math import exp32, jit

    f32 = np.dtype(dtype) == np.float32
    scope = {"np": np, "math": math, "prange": numba.prange}
    scope.update(F=np.float32 if f32 else np.float64, exp=exp32 if f32 else np.exp)
    exec(src, scope)  # noqa: S102  (the source is generated above from RULES, not user input)
    fn = next(v for k, v in scope.items() if k in ("forward", "backward"))
    # NumPy's error model, as the CPU kernels: IEEE division, and loops that vectorise
    return jit(cache=False, parallel=n >= PARALLEL_FROM, fastmath={"contract"})(fn)


class FusedElementwise(Op):
    """One fused run: forward and backward by generated kernels over the flattened arrays."""

    multi_output = True
    kinds: list = []
    shape: tuple = ()
    n_outs = 1
    wanted: list = []

    def forward(self, *inputs):
        self.inputs = inputs  # the backward recomputes the run's values from them
        arrays = [_flat(a) for a, k in zip(inputs, self.kinds) if k[0] != "scalar"]
        dtype = next(a.dtype for a in arrays)
        n = int(np.prod(self.shape, dtype=np.int64))
        outs = [np.empty(n, dtype) for _ in range(self.n_outs)]
        with _threads(n):
            self.kernel_forward(n, *arrays, *outs)
        return tuple(o.reshape(self.shape) for o in outs)

    def backward(self, *gys):
        inputs = self.inputs
        arrays = [_flat(a) for a, k in zip(inputs, self.kinds) if k[0] != "scalar"]
        n = int(np.prod(self.shape, dtype=np.int64))
        dtype = gys[0].dtype
        gs = [_flat(g) for g in gys]
        gx = [np.empty(n, dtype) for _ in self.wanted]
        with _threads(n):
            self.kernel_backward(n, *arrays, *gs, *gx)
        out = [None] * len(inputs)
        for j, g in zip(self.wanted, gx):
            if self.kinds[j][0] == "tail":
                g = g.reshape(-1, self.kinds[j][1]).sum(0)
            elif self.kinds[j][0] == "lead":
                g = g.reshape(-1, self.kinds[j][1]).sum(1)
            out[j] = g.reshape(np.shape(inputs[j]))
        return tuple(out)


def _threads(n: int):
    """The CPU kernels' thread policy (kernels.cpu_numba.threads_for: TG_KERNEL_THREADS)."""
    from ..kernels.cpu_numba import threads_for

    return threads_for(n)


def _flat(a):
    return np.ascontiguousarray(a).reshape(-1)
