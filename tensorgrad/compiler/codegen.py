"""Code generation: a fused run (schedule.py's ``Run``) as two numba kernels, each way one.

``RULES`` is one table of scalar rules (as tinygrad keeps its rules in one table): per op, its
forward and its derivative for each input, on scalars. ``kernel_class`` writes a run's
forward kernel, a single pass over memory (``prange``, on the threads the CPU kernels use:
``TG_KERNEL_THREADS``), and its backward kernel, which recomputes the run's values from its
inputs and walks the run in reverse through the rules; it compiles both with numba and
returns a ``FusedElementwise`` subclass (fused_op.py) that runs them.

How each input of a run is read against the run's shape (``read_kind``): a whole array of
that shape, a trailing broadcast (a bias of shape (C,) against (B, T, C): read at ``i % C``,
its gradient summed over the rest), one value per row (a keepdim reduction's (B, T, 1), as
RMSNorm's x·rsqrt(mean(x²) + eps): read once per row, its gradient summed over the row), or a
Python scalar. A run that holds a last-axis reduction is a row program (``_Source``): a few
passes over each row while the row is in cache.

Imports: numpy, .fused_op, .trace.
"""

from __future__ import annotations

import numpy as np

from .fused_op import FusedElementwise
from .trace import Graph, Step

# op: (forward, (derivative for input a, for input b)), on scalars: a, b the inputs, y the
# output, g the gradient arriving at y. Pow fuses only with a number as its exponent. In the
# generated code ``exp`` is numba_math.exp_of (the vectorisable exp32 for float32, libm's for
# float64) and every number literal is of the arrays' dtype, so float32 computes in float32.
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
    # GELU is kernels/formulas.py's (both forms, the derivative with one exp or one Φ): the
    # statement every CPU kernel inlines, not a second one here
    "Gelu": ("gelu_tanh(a)", ("g * gelu_tanh_deriv(a)",)),
    "Gelu:none": ("gelu_erf(a)", ("g * gelu_erf_deriv(a)",)),
}
PARALLEL_FROM = 1 << 15  # elements: below this the threads cost more than they save


def rule_name(st: Step) -> str:
    """The step's entry in RULES (the GELU's by its form); "" for a step with no reference Op
    (a composite whose kernel is the whole op), which no rule computes."""
    if st.ref is None:
        return ""
    name = st.ref.__name__
    if name == "Gelu" and st.kwargs.get("approximate", ("c", "tanh"))[1] == "none":
        return "Gelu:none"
    return name


def read_kind(graph: Graph, ref, shape):
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


PARTS = 16  # row blocks of a broadcast input's gradient sums: a fixed number, so that the sums
# are the same on any thread count (as the CPU kernels' column sums)


class _Source:
    """The generated source of one run. An array of the run's shape is walked as R rows of C
    (its last axis), ``i = r·C + c``: a (C,) broadcast is read at ``c`` and a (rows, 1) value
    once per row, so that the inner loop has no integer division and vectorises. A run of
    whole arrays and numbers only is walked flat, ``i`` over all of it.

    A run with a reduction is a row program, per row: one pass over the row sums the
    reduction's input, the steps on the row's value follow, then a pass computes the steps
    after it. Its backward, per row: the same passes again (values are recomputed, never
    stored), then a pass that sums over the row the gradient reaching each row value from
    the steps after the reduction, the row steps' rules in reverse, and a last pass through
    every element step in reverse, where the reduction hands each element its share.

    ``run``: a schedule.Run (its shape, dtype and (level, index, step) entries); ``ins`` and
    ``outs``: the refs the fused step reads and the slots it writes."""

    def __init__(self, run, ins: list, outs: list, graph: Graph):
        self.graph, self.ins, self.outs = graph, ins, outs
        self.C = run.shape[-1] if run.shape else 1
        self.kinds = [read_kind(graph, ref, run.shape) for ref in ins]
        self.red = next((st for lv, _, st in run.steps if lv == "red"), None)
        self.flat = self.red is None and all(k[0] in ("full", "scalar") for k in self.kinds)
        self.names, self.level = {}, {}  # slot -> variable; slot -> "e" (element) / "r" (row)
        for j, (ref, kd) in enumerate(zip(ins, self.kinds)):
            if ref[0] == "v":
                self.names[ref[1]] = f"x{j}"
                self.level[ref[1]] = "r" if kd[0] == "lead" else "e"
        for lv, _, st in run.steps:
            self.names[st.outs[0]] = f"v{st.outs[0]}"
            self.level[st.outs[0]] = "e" if lv == "e" else "r"
        self.elems = [st for lv, _, st in run.steps if lv in ("e", "red")]  # in order
        at = self.elems.index(self.red) if self.red is not None else len(self.elems)
        self.before = self.elems[:at]
        self.after = self.elems[at + 1 :]
        self.row_steps = [st for lv, _, st in run.steps if lv == "r"]
        self.wanted = [j for j, r in enumerate(ins) if r[0] == "v" and graph.needs_grad[r[1]]]

    def grad_kind(self, j: int) -> str:
        """Where input j's gradient is written: "full" (per element), "parts" ((P, C) partial
        sums of a (C,) broadcast), "row" (per row), "rows" (per row, summed by the caller
        over the rows that share the value) or "tail" (per element, summed by the caller)."""
        kd = self.kinds[j]
        if kd[0] == "full" or self.flat:
            return "full"
        if kd[0] == "lead":
            return "row" if kd[1] == self.C else "rows"
        return "parts" if kd[1] == self.C else "tail"

    def row_loads(self, fwd: bool) -> list:
        """Per row: the row's views (numba vectorises a loop over a view, not one over
        ``A[base + c]`` inside ``prange``), the values read once per row, the numbers."""
        lines = ["base = r * C", "end = base + C"]
        for j, (ref, kd) in enumerate(zip(self.ins, self.kinds)):
            if kd[0] == "scalar":
                lines.append(f"x{j} = F({float(ref[1])!r})")
            elif kd[0] == "full":
                lines.append(f"a{j} = A{j}[base:end]")
            elif kd[0] == "lead":
                q = kd[1] // self.C
                lines.append(f"x{j} = A{j}[r]" if q == 1 else f"x{j} = A{j}[r // {q}]")
            elif kd[0] == "tail" and kd[1] != self.C and kd[1] % self.C == 0:
                lines.append(f"t{j} = (r % {kd[1] // self.C}) * C")
                lines.append(f"a{j} = A{j}[t{j}:t{j} + C]")
        for k, s in enumerate(self.outs):
            if self.level[s] == "e":
                lines.append(f"o{k} = O{k}[base:end]" if fwd else f"h{k} = G{k}[base:end]")
        if not fwd:
            for j in self.wanted:
                kind = self.grad_kind(j)
                if kind in ("full", "tail"):
                    lines.append(f"gx{j} = GX{j}[base:end]")
                elif kind == "parts":
                    lines.append(f"gx{j} = GX{j}[p]")
        return lines

    def loads(self) -> list:
        lines = [] if self.flat else ["i = base + c"]
        for j, kd in enumerate(self.kinds):
            if kd[0] == "full":
                lines.append(f"x{j} = A{j}[i]" if self.flat else f"x{j} = a{j}[c]")
            elif kd[0] == "scalar" and self.flat:
                lines.append(f"x{j} = F({float(self.ins[j][1])!r})")
            elif kd[0] == "tail" and (self.flat or kd[1] % self.C):
                lines.append(f"x{j} = A{j}[i % {kd[1]}]")
            elif kd[0] == "tail":
                lines.append(f"x{j} = A{j}[c]" if kd[1] == self.C else f"x{j} = a{j}[c]")
        return lines

    def arg(self, ref) -> str:
        if ref[0] == "v":
            return self.names[ref[1]]
        j = next(j for j, r in enumerate(self.ins) if r is ref or (r[0] == "c" and r[1] is ref[1]))
        return f"x{j}"

    def exprs(self, steps) -> list:
        """The steps' values (the reduction's is made after its pass, not here)."""
        lines = []
        for st in steps:
            if st is not self.red:
                fwd = RULES[rule_name(st)][0]
                lines.append(
                    f"v{st.outs[0]} = " + _subst(fwd, [self.arg(r) for r in st.ins], None, None)
                )
        return lines

    def row_sum(self, stores=()) -> list:
        """The pass that sums the reduction's input over the row, then the row's values."""
        red, mean = self.red.outs[0], self.red.ref.__name__ == "Mean"
        body = [*self.loads(), *self.exprs(self.before), f"acc += {self.arg(self.red.ins[0])}"]
        value = f"acc / F({float(self.C)!r})" if mean else "acc"
        return ["acc = F(0)", *_loop(body + list(stores)), f"v{red} = {value}"] + self.exprs(
            self.row_steps
        )

    def forward(self) -> str:
        store = {s: f"O{k}" if self.flat else f"o{k}" for k, s in enumerate(self.outs)}

        def stores(steps):
            at = "[i]" if self.flat else "[c]"
            return [f"{store[s]}{at} = v{s}" for st in steps if (s := st.outs[0]) in store]

        if self.flat:
            body = self.loads() + self.exprs(self.elems) + stores(self.elems)
            return _function("forward", self.params(fwd=True), body, "flat")
        body = self.row_loads(fwd=True)
        if self.red is None:
            body += _loop(self.loads() + self.exprs(self.elems) + stores(self.elems))
        else:
            body += self.row_sum(stores(self.before))
            body += [f"O{k}[r] = v{s}" for k, s in enumerate(self.outs) if self.level[s] == "r"]
            if self.after:
                body += _loop(self.loads() + self.exprs(self.elems) + stores(self.after))
        return _function("forward", self.params(fwd=True), body, "rows")

    def params(self, fwd: bool) -> list:
        arrays = [f"A{j}" for j, kd in enumerate(self.kinds) if kd[0] != "scalar"]
        if fwd:
            return arrays + [f"O{k}" for k in range(len(self.outs))]
        return arrays + [f"G{k}" for k in range(len(self.outs))] + [f"GX{j}" for j in self.wanted]

    def back(self, steps, declared: set, into: str, sums: set) -> list:
        """The rules of ``steps`` in reverse. A gradient reaching a row value from an element
        step adds up over the row in ``{into}{slot}`` when the slot is in ``sums``; else
        another pass takes it. In a row step (into ""), it reaches the row value itself."""
        lines = []
        for st in reversed(steps):
            if st is self.red:  # each element of the row gets its share of the row's gradient
                src = st.ins[0]
                if "gr" in declared and src[0] == "v" and self.graph.needs_grad[src[1]]:
                    s = src[1]
                    lines.append(f"g{s} = g{s} + gr" if s in declared else f"g{s} = gr")
                    declared.add(s)
                continue
            y = st.outs[0]
            if y not in declared:
                continue  # no gradient reaches it
            for r, rule in zip(st.ins, RULES[rule_name(st)][1]):
                if r[0] != "v" or not rule or not self.graph.needs_grad[r[1]]:
                    continue
                term = _subst(rule, [self.arg(x) for x in st.ins], self.names[y], f"g{y}")
                s = r[1]
                if into and self.level[s] == "r":
                    if s in sums:
                        lines.append(f"{into}{s} += {term}")
                    continue
                lines.append(f"g{s} = g{s} + {term}" if s in declared else f"g{s} = {term}")
                declared.add(s)
        return lines

    def backward(self) -> str:
        G = {s: f"G{k}" for k, s in enumerate(self.outs)}
        e_outs = [s for s in self.outs if self.level[s] == "e"]
        kinds = {j: self.grad_kind(j) for j in self.wanted}
        slot = {j: self.ins[j][1] for j in self.wanted}

        def stores(declared):
            lines = []
            for j in self.wanted:
                s, k = slot[j], kinds[j]
                if k in ("full", "tail"):
                    to = f"GX{j}[i]" if self.flat else f"gx{j}[c]"
                    lines.append(f"{to} = g{s}" if s in declared else f"{to} = F(0)")
                elif k == "parts" and s in declared:
                    lines.append(f"gx{j}[c] += g{s}")
            return lines

        def grads_in(slots):
            if self.flat:
                return [f"g{s} = {G[s]}[i]" for s in slots]
            return [f"g{s} = h{self.outs.index(s)}[c]" for s in slots]

        if self.flat:
            declared = set(e_outs)
            body = self.loads() + self.exprs(self.elems) + grads_in(e_outs)
            body += self.back(self.elems, declared, "", set()) + stores(declared)
            return _function("backward", self.params(fwd=False), body, "flat")
        body, rowdecl = self.row_loads(fwd=False), set()
        if self.red is not None:
            body += self.row_sum()
            r_outs = [s for s in self.outs if self.level[s] == "r"]
            body += [f"g{s} = {G[s]}[r]" for s in r_outs]
            rowdecl |= set(r_outs)
            # the row values' gradients from the element steps after the reduction
            made = {st.outs[0] for st in self.after}
            row_values = {st.outs[0] for st in [self.red, *self.row_steps]}
            sums = sorted({r[1] for st in self.after for r in st.ins if r[0] == "v"} & row_values)
            if sums and self.after:
                declared = {s for s in e_outs if s in made}
                lines = self.loads() + self.exprs(self.elems) + grads_in(sorted(declared))
                lines += self.back(self.after, declared, "a", set(sums))
                body += [f"a{s} = F(0)" for s in sums] + _loop(lines)
                for s in sums:
                    body.append(f"g{s} = g{s} + a{s}" if s in rowdecl else f"g{s} = a{s}")
                    rowdecl.add(s)
            body += self.back(self.row_steps, rowdecl, "", set())
            red = self.red.outs[0]
            if red in rowdecl:
                mean = self.red.ref.__name__ == "Mean"
                body.append(f"gr = g{red} / F({float(self.C)!r})" if mean else f"gr = g{red}")
        # every element step in reverse; the inputs read once per row sum their gradient
        leads = [j for j in self.wanted if kinds[j] in ("row", "rows")]
        body += [f"b{slot[j]} = F(0)" for j in leads]
        declared = set(e_outs) | (
            {"gr"} if self.red is not None and self.red.outs[0] in rowdecl else set()
        )
        lines = self.loads() + self.exprs(self.elems) + grads_in(e_outs)
        lines += self.back(self.elems, declared, "b", {slot[j] for j in leads}) + stores(declared)
        body += _loop(lines)
        for j in leads:
            s = slot[j]
            body.append(f"GX{j}[r] = g{s} + b{s}" if s in rowdecl else f"GX{j}[r] = b{s}")
        return _function("backward", self.params(fwd=False), body, "parts")


def _loop(body: list) -> list:
    return ["for c in range(C):"] + ["    " + line for line in body]


def kernel_class(run, ins: list, outs: list, graph: Graph) -> type:
    """A FusedElementwise subclass whose forward and backward run the generated kernels of
    ``run`` (a schedule.Run), reading ``ins`` and writing the slots ``outs``."""
    src = _Source(run, ins, outs, graph)
    shape, dtype = run.shape, run.dtype
    n = int(np.prod(shape, dtype=np.int64))
    R = n // src.C if src.C else 0
    kinds = [src.grad_kind(j) for j in src.wanted]
    sums = src.red is not None or any(k in ("row", "rows") for k in kinds)
    fwd_src, bwd_src = src.forward(), src.backward()
    # a sum over a row is a chain of adds: reassociating it (as NumPy's pairwise sums do)
    # lets it vectorise
    fwd_fn = _compile(fwd_src, n, dtype, src.red is not None)
    bwd_fn = _compile(bwd_src, n, dtype, sums)
    label = "+".join(st.ref.__name__.lower() for _, _, st in run.steps)
    return type(
        f"Fused[{label}]",
        (FusedElementwise,),
        {
            "kinds": src.kinds,
            "shape": tuple(shape),
            "rows_shape": (R, src.C, min(R, PARTS)),
            "out_rows": [src.level[s] == "r" for s in outs],
            "wanted": src.wanted,
            "grad_kinds": kinds,
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


def _function(name: str, params: list, body: list, loop: str) -> str:
    """forward(R, C, ...) / backward(R, C, P, ...): a flat loop over R·C elements, a loop over
    R rows, or over P blocks of rows (the backward's partial sums of a broadcast input)."""
    head = f"def {name}(R, C, {'P, ' if name == 'backward' else ''}{', '.join(params)}):"
    if loop == "flat":
        return "\n".join([head, "    for i in prange(R * C):"] + ["        " + x for x in body])
    if loop == "rows":
        return "\n".join([head, "    for r in prange(R):"] + ["        " + x for x in body])
    rows = "        for r in range(p * R // P, (p + 1) * R // P):"
    return "\n".join([head, "    for p in prange(P):", rows] + ["            " + x for x in body])


def _compile(src: str, n: int, dtype, reassoc: bool):
    import numba

    from ..kernels import formulas
    from ..kernels.numba_math import exp_of, jit

    f32 = np.dtype(dtype) == np.float32
    scope = {"np": np, "prange": numba.prange, "exp": exp_of}
    scope["F"] = np.float32 if f32 else np.float64
    for name in ("gelu_tanh", "gelu_tanh_deriv", "gelu_erf", "gelu_erf_deriv"):
        scope[name] = getattr(formulas, name)
    exec(src, scope)  # noqa: S102  (the source is generated above from RULES, not user input)
    fn = next(v for k, v in scope.items() if k in ("forward", "backward"))
    # NumPy's error model, as the CPU kernels: IEEE division, and loops that vectorise
    flags = {"contract", "reassoc"} if reassoc else {"contract"}
    return jit(cache=False, parallel=n >= PARALLEL_FROM, fastmath=flags)(fn)
