"""Composite patterns: ops of a traced graph that an existing kernel computes as one op.

``PATTERNS`` is the one registry, and a pattern is one entry: a subclass of ``Pattern``
(defining it registers it), which holds
- ``graph()``: the ops it matches, written as a small function over placeholders, as a model
  writes them: ``op(LayerNorm, x, V("ln_1.weight"), V("ln_1.bias"), nd=1, eps=K("eps"))``.
  Ops are keyed on their Op classes. ``V("w")`` binds a graph value (or a missing optional
  input, None), and the same name must find the same value again; ``K("eps")`` binds a
  constant, equal wherever the name appears (a graph value, a mask read from a buffer say,
  does not bind); ``ANY`` takes any constant; ``Known("mask")`` binds a constant or a graph
  value that only buffers and constants make, whose value ``m.known("mask")`` folds when the
  plan is made (``Fold``: the plan is then pinned to those buffers' versions, and made again
  when one changes); any other value must equal the traced constant; ``commutative=True`` lets an op's two inputs come either way round (``a + x``);
  ``name="s"`` binds an op's value;
- ``inputs`` and ``outputs``: the names whose values the emitted op reads, in its argument
  order (or a constant, None), and writes, the root last;
- ``kernel`` (the kernel registry's op name), ``ref`` (the emitted step's reference Op, what
  it stands for; None: the kernel is the op) and ``fallback`` (whether ``ref`` runs where no
  kernel takes the arguments, or the ops stay as written);
- ``conditions(graph, m)``: the emitted op's keyword arguments where the matched values meet
  the pattern's own conditions (shapes, constants), else None.

Matching follows the data: from each step of the root's class (the block's last Add), each
input back to the step that made it, so statement order does not matter (nanoGPT reshapes k
before q and v). An op that returns its input's values (``TRANSPARENT``: ``contiguous()``) is
looked through wherever it stands, whether it recorded a copy or nothing (``contiguous()`` of
a contiguous tensor returns it as it is: n_head 1, T 1). A match becomes one step, in the
root's place, where it is closed: no value made inside it is read by a step outside it or
returned (its outputs excepted), no input of it is made inside it, no step outside it reads
one of its outputs before the root, and the kernel's predicate accepts the arguments. A step
that a pattern made is an op like any other to the patterns after it (the block reads the
attention op and the GELU op the first two make); the steps that only a match read (a folded
mask's slice and comparison) are dropped with it.

Five patterns today, tried in this order (the written GELU and attention first: the block
reads the ops they make; the block before the residual adds: it holds two):
- ``WrittenGelu``: the tanh GELU written out (minGPT's ``NewGELU``), one GELU op;
- ``CausalAttention``: causal attention written out, ``softmax((q @ k.transpose(-2, -1)) *
  scale`` with the causal mask filled by -inf ``) @ v`` (``gpt/model.py``'s, nanoGPT's
  non-flash path, minGPT's): one attention op with ``is_causal`` and that scale, so the flash
  kernel takes it where it applies and no (T, T) probabilities are kept for the backward.
  The mask must equal ``~causal_mask(L, S)`` with L <= S (no row fully masked, where the
  written softmax would give NaN and the op zeros), checked when the plan is made: a
  constant, or folded from a buffer (minGPT's ``bias[:, :, :T, :T] == 0``), the plan then
  pinned to the buffer;
- ``CausalAttentionDropout``: the same with a dropout between the softmax and ·v (training
  with dropout): the op's ``dropout_p``, which draws the same mask from the generator. A
  match whose random steps would move past a random step outside it is not made (``_closed``);
- ``GPT2Block``: the pre-LayerNorm GPT-2 block with the fused attention, as ``gpt/model.py``,
  nanoGPT's and build-nanogpt's models write it (minGPT's through the two above), tanh or
  exact GELU: the fused block kernel (``kernels/cpu_gpt2_block.py``). An edited block
  (another activation, another scale, a parallel attention and MLP, RMSNorm) traces other
  ops, does not match, and runs as written: the pattern is the graph's, never a module's type;
- ``AddLayerNormPattern``: a residual add and the LayerNorm of its sum (every pre-LN block
  that is not the stock one has two): one ``AddLayerNorm`` op with both outputs, which its
  kernel computes in one pass over the rows each way. The two addends have one shape.

Imports: functools, inspect, math, numpy, .trace, ..autograd, ..kernels, ..ops.
"""

from __future__ import annotations

import functools
import inspect
import math

import numpy as np

from .. import kernels
from ..autograd import xp_of
from ..ops.elementwise import Add, MaskedFill, Mul, Pow, Tanh
from ..ops.linalg import Linear, MatMul
from ..ops.nn import Attention, Dropout, Gelu, LayerNorm, Softmax, causal_mask
from ..ops.shape import Contiguous, Permute, Reshape, Split
from .trace import RANDOM_OPS, Graph, Step, same_value

PATTERNS: list = []  # the registry: every Pattern subclass, in the order defined
TRANSPARENT = (Contiguous,)  # ops whose output is their input's values: looked through
MAX_TRIES = 16  # matches tried per root (a commutative op's inputs: two ways round)

# ----------------------------------------------------------------------------- the language


class V:
    """A graph value the pattern reads (or a missing optional input, None), bound by name."""

    def __init__(self, name: str):
        self.name = name


class K:
    """A constant, bound by name: equal wherever the name appears."""

    def __init__(self, name: str):
        self.name = name


ANY = K("")  # any constant, bound to nothing


class Known:
    """A value known when the plan is made, bound by name: a constant, or a graph value that
    only buffers and constants make (a mask read from a buffer, ``bias[:, :, :T, :T] == 0``).
    ``m.known(name)`` gives its value (folded from the buffers as they are now); the plan is
    then pinned to those buffers, and made again when one changes."""

    def __init__(self, name: str):
        self.name = name


class Node:
    """One op of a pattern: output ``out`` of an op of class ``cls`` on ``ins`` and
    ``kwargs`` (``group``: the op, shared by the outputs of a multi-output one)."""

    def __init__(self, cls, ins, kwargs, *, out=0, group=None, name=None, commutative=False):
        self.cls, self.ins, self.kwargs, self.out = cls, tuple(ins), kwargs, out
        self.group = group if group is not None else self
        self.name, self.commutative = name, commutative


def op(cls, *ins, name=None, commutative=False, n_out=1, **kwargs):
    """The pattern's op ``cls(*ins, **kwargs)``: a Node, or a tuple of n_out of them (the
    outputs of one op, as Split's q, k, v); ``name`` binds its value."""
    if n_out == 1:
        return Node(cls, ins, kwargs, name=name, commutative=commutative)
    first = Node(cls, ins, kwargs, name=name)
    return (first, *(Node(cls, ins, kwargs, out=i, group=first) for i in range(1, n_out)))


class Pattern:
    """One entry of the registry: subclass it to add a pattern (the subclass registers
    itself). See the module docstring for what each attribute means."""

    label: str = ""  # what it stands for, in summary()["patterns"] and gpt-train's first lines
    inputs: tuple = ()  # the emitted op's inputs: bound names, or constants (None)
    outputs: tuple = ()  # the bound names of the values it writes, the root last
    kernel: str = ""  # the kernels registry's op the emitted step runs
    ref: type | None = None  # the emitted step's reference Op (None: the kernel is the op)
    fallback: bool = False  # where no kernel applies: ref runs (True) or the ops stay
    root: Node  # graph(), built once when the class is defined

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.root = cls.graph()
        _check_names(cls)
        PATTERNS.append(cls)

    @staticmethod
    def graph() -> Node:
        """The ops it matches; returns the root op."""
        raise NotImplementedError

    @staticmethod
    def conditions(graph: Graph, m: Match) -> dict | None:
        """The emitted op's keyword arguments, or None where the match does not qualify."""
        return {}


class Match(dict):
    """A match's bindings: name -> ("v", slot) / ("c", None) for a value or a named op, the
    constant for a K name, ("v", slot) / ("c", constant) for a Known one; ``steps``: the
    matched steps' indices; ``fold``: what Known values are folded from (None: constants)."""

    def __init__(self, graph: Graph, fold: Fold | None = None):
        super().__init__()
        self.graph, self.fold = graph, fold
        self.steps: dict = {}  # id(node.group) -> step index
        self.taken: set = set()  # step indices matched

    def shape(self, name: str) -> tuple:
        return tuple(self.graph.meta[self[name][1]][0])

    def dtype(self, name: str):
        return self.graph.meta[self[name][1]][1]

    def known(self, name: str):
        """A Known name's value: the constant, or the graph value folded from the buffers
        (None where it cannot be: it depends on an input, a parameter or a random op)."""
        kind, v = self[name]
        if kind == "c":
            return v
        return None if self.fold is None else self.fold.value(v)

    def copy(self) -> Match:
        m = Match(self.graph, self.fold)
        m.update(self)
        m.steps, m.taken = dict(self.steps), set(self.taken)
        return m


# ----------------------------------------------------------------------------- the matcher


def match_composites(graph: Graph, steps: list, patterns=None, fold=None) -> list:
    """``steps`` with every closed match of a pattern replaced by one step of its kernel
    (``fold``: a ``Fold`` of the live values, for Known names; None: only constants are
    known). The steps that only a match read (the ops making a folded mask) go too."""
    before = _dead(graph, steps)
    for pattern in PATTERNS if patterns is None else patterns:
        steps = _replace_all(graph, steps, pattern, fold)
    gone = _dead(graph, steps) - before
    return [st for st in steps if id(st) not in gone]


def _dead(graph: Graph, steps: list) -> set:
    """ids of the steps whose values no later step reads, nor the result (random ops stay:
    they advance the generator)."""
    needed, dead = set(graph.output_slots()), set()
    for st in reversed(steps):
        if not any(s in needed for s in st.outs) and not _random(st):
            dead.add(id(st))
            continue
        needed.update(v for kind, v in [*st.ins, *st.kwargs.values()] if kind == "v")
    return dead


def _random(st: Step) -> bool:
    """Whether the step draws from the generator: a random op, or an op with a dropout."""
    op = (st.ref or st.impl).op  # (a composite whose kernel is the whole op: the kernel's)
    return op in RANDOM_OPS or bool(st.kwargs.get("dropout_p", ("c", 0))[1])


class Fold:
    """Values of a graph known when its plan is made: the live values of the slots in
    ``foldable`` (the module's buffers), and what deterministic steps make from them and from
    constants. ``pins``: (slot, version, array) of each buffer read, which the plan holds
    for (compiler/__init__.py makes the plan again when one changes)."""

    MAX_STEPS = 16  # steps folded per value (a mask: a slice and a comparison)

    def __init__(self, graph: Graph, live: list, foldable: set):
        self.graph, self.live, self.foldable = graph, live, foldable
        self.made = {s: (st, j) for st in graph.steps for j, s in enumerate(st.outs)}
        self.values: dict = {}
        self.pins: dict = {}

    def value(self, slot: int):
        """The value of ``slot`` now, or None where it depends on anything but buffers and
        constants (or takes more than MAX_STEPS steps)."""
        budget = [self.MAX_STEPS]
        try:
            return self._value(slot, budget)
        except Exception:  # an op that refuses the values now (a buffer cut short)
            return None

    def _value(self, slot: int, budget: list):
        if slot in self.values:
            return self.values[slot]
        if slot < self.graph.n_inputs:
            if slot not in self.foldable:
                return None
            t = self.live[slot]
            a = t.array
            self.pins[slot] = (slot, t.version, a)
            self.values[slot] = a
            return a
        st, j = self.made[slot]
        budget[0] -= 1
        if budget[0] < 0 or _random(st):
            return None
        args, kwargs = [], {}
        for kind, v in st.ins:
            args.append(self._value(v, budget) if kind == "v" else v)
            if args[-1] is None and kind == "v":
                return None
        for name, (kind, v) in st.kwargs.items():
            kwargs[name] = self._value(v, budget) if kind == "v" else v
            if kwargs[name] is None and kind == "v":
                return None
        fn = st.ref()  # (a traced step: its reference Op, run on the values known now)
        fn.reference, fn.needs_input_grad = st.ref, (False,) * len(args)
        out = fn.forward(*args, **kwargs)
        outs = out if st.ref.multi_output else (out,)
        for s, o in zip(st.outs, outs):
            self.values[s] = np.asarray(o) if isinstance(o, np.generic) else o
        return self.values[slot]


class _Flow:
    """Who makes and who reads each value of a list of steps."""

    def __init__(self, graph: Graph, steps: list):
        self.made: dict = {}  # slot -> (step index, output index)
        self.readers: dict = {}  # slot -> step indices that read it
        for k, st in enumerate(steps):
            for j, s in enumerate(st.outs):
                self.made[s] = (k, j)
            for kind, v in [*st.ins, *st.kwargs.values()]:
                if kind == "v":
                    self.readers.setdefault(v, []).append(k)
        self.returned = set(graph.output_slots())


def _replace_all(graph: Graph, steps: list, pattern: Pattern, fold=None) -> list:
    """``steps`` with each closed match of ``pattern`` (roots in order) as one step."""
    root = pattern.root
    flow, k = _Flow(graph, steps), 0
    while k < len(steps):
        st = steps[k]
        found = None
        if st.ref is root.cls and not st.pattern:
            found = _emit_at(graph, steps, flow, k, root, pattern, fold)
        if found is not None:  # the match's steps go; its step stands in the root's place
            m, step = found
            at = sum(i not in m.taken for i in range(k))
            steps = [s for i, s in enumerate(steps) if i not in m.taken or i == k]
            steps[at] = step
            flow, k = _Flow(graph, steps), at
        k += 1
    return steps


def _emit_at(graph, steps, flow, k, root, pattern, fold=None):
    """(match, its step) for the pattern rooted at step k, or None."""
    st = steps[k]
    if not root.out < len(st.outs):
        return None
    start = Match(graph, fold)
    for n, m in enumerate(_solve([(root, ("v", st.outs[root.out]))], start, steps, flow)):
        if n >= MAX_TRIES:
            return None
        if max(m.taken) != k or not _closed(pattern, m, steps, flow, k):
            continue
        step = _step(graph, pattern, m)
        if step is not None:
            return m, step
    return None


def _solve(todo: list, m: Match, steps: list, flow: _Flow):
    """Every binding under which each (pattern item, traced ref) pair of ``todo`` matches."""
    if not todo:
        yield m
        return
    (want, got), rest = todo[0], todo[1:]
    if isinstance(want, Node):
        for m2, more in _node(want, got, m, steps, flow):
            yield from _solve(more + rest, m2, steps, flow)
    elif _bind(m, want, got):
        yield from _solve(rest, m, steps, flow)


def _node(want: Node, got, m: Match, steps: list, flow: _Flow):
    """(match, the pairs still to match) for each way op ``want`` can be the step that made
    ``got``."""
    through, ref = set(), got
    while ref[0] == "v" and ref[1] in flow.made:
        k, j = flow.made[ref[1]]
        st = steps[k]
        if st.ref not in TRANSPARENT or st.ref is want.cls or st.pattern:
            break
        through.add(k)
        ref = st.ins[0]
    else:
        return  # an input of the graph, or a constant: no op made it
    # (a composite step, the attention op that CausalAttention made, matches as its op)
    if st.ref is not want.cls or j != want.out or len(st.ins) != len(want.ins):
        return
    key = id(want.group)
    if key in m.steps:  # another output of an op matched already (Split's q, k, v)
        if m.steps[key] == k:
            m = m.copy()
            m.taken |= through
            if want.name is None or _bind(m, V(want.name), got):
                yield m, []
        return
    if k in m.taken:
        return
    kwargs = st.kwargs
    if set(kwargs) - set(want.kwargs):
        return
    orders = [want.ins]
    if want.commutative and len(want.ins) == 2:
        orders.append(want.ins[::-1])
    for ins in orders:
        m2 = m.copy()
        m2.steps[key], m2.taken = k, m2.taken | through | {k}
        if want.name is not None and not _bind(m2, V(want.name), got):
            continue
        pairs = list(zip(ins, st.ins))
        pairs += [(w, kwargs.get(name, _default(st.ref, name))) for name, w in want.kwargs.items()]
        yield m2, pairs


_NO_DEFAULT = ("c", inspect.Parameter.empty)


@functools.cache
def _default(cls, name):
    """A keyword argument the step did not pass: the op's default, as a constant."""
    p = inspect.signature(cls.forward).parameters.get(name)
    return _NO_DEFAULT if p is None or p.default is p.empty else ("c", p.default)


def _bind(m: Match, want, got) -> bool:
    kind, value = got
    if isinstance(want, V):  # a value (or a missing input)
        if kind == "c" and value is not None:
            return False
        key = (kind, value if kind == "v" else None)
        return m.setdefault(want.name, key) == key
    if isinstance(want, Known):  # a constant or a graph value (folded when asked)
        if value is inspect.Parameter.empty:
            return False
        return m.setdefault(want.name, got) is got or same_value(m[want.name], got)
    if isinstance(want, K):  # a constant, equal wherever the name appears
        if kind != "c" or value is inspect.Parameter.empty:
            return False
        if not want.name:
            return True
        if want.name in m:
            return same_value(m[want.name], value)
        m[want.name] = value
        return True
    if kind != "c":
        return False
    return same_value(want, tuple(value) if isinstance(value, list) else value)


def _closed(pattern: Pattern, m: Match, steps: list, flow: _Flow, root: int) -> bool:
    """Whether the match can be one step in the root's place: nothing outside it reads a
    value made inside it (its outputs excepted, read after the root), no input of it is
    made inside it (``p @ s`` for ``p @ v``), and its draws from the generator keep their
    order (no random step outside it between one inside it and the root)."""
    first = min((i for i in m.taken if _random(steps[i])), default=root)
    if any(_random(steps[i]) and i not in m.taken for i in range(first + 1, root)):
        return False
    outs = {m[n][1] for n in pattern.outputs}
    made = {s for s, (k, _) in flow.made.items() if k in m.taken}
    for name in pattern.inputs:
        if isinstance(name, str) and m[name][0] == "v" and m[name][1] in made:
            return False
    for s in made:
        outside = [k for k in flow.readers.get(s, ()) if k not in m.taken]
        if s in outs:
            if any(k < root for k in outside):
                return False
        elif outside or s in flow.returned:
            return False
    return True


def _step(graph: Graph, pattern: Pattern, m: Match) -> Step | None:
    """The emitted step, or None where its conditions or the kernel's predicate say no."""
    kw = pattern.conditions(graph, m)
    if kw is None:
        return None
    ins = [m[n] if isinstance(n, str) else ("c", n) for n in pattern.inputs]
    impl = kernels.pick(pattern.kernel, "cpu", *[_dummy(graph, r) for r in ins], **kw)
    if impl is None:
        if not pattern.fallback:
            return None
        impl = pattern.ref
    needs = tuple(r[0] == "v" and graph.needs_grad[r[1]] for r in ins)
    outs = [m[n][1] for n in pattern.outputs]
    kwargs = {k: ("c", v) for k, v in kw.items()}
    meta = [graph.meta[o] for o in outs]
    return Step(pattern.ref, impl, ins, kwargs, outs, needs, meta, pattern.label)


def _dummy(graph: Graph, ref):
    """The value as the kernel's condition sees it: its shape and dtype (a kernels.Spec)."""
    if ref[0] != "v":
        return ref[1]
    shape, dtype = graph.meta[ref[1]]
    return kernels.Spec(shape, dtype) if graph.device == "cpu" else None


def _check_names(pattern) -> None:
    """A name means one thing in a pattern; its inputs and outputs are names it binds."""
    kinds: dict = {}
    seen, stack = set(), [pattern.root]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        items = []
        if isinstance(x, Node):
            items = [x.ins, x.kwargs.values()]
            if x.name:
                items.append([V(x.name)])
            stack += [i for part in items[:2] for i in part if isinstance(i, Node)]
        for part in items:
            for i in part:
                if isinstance(i, (V, K, Known)) and i.name:
                    kind = type(i).__name__
                    if kinds.setdefault(i.name, kind) != kind:
                        raise ValueError(f"{pattern.label}: {i.name!r} is a value and a constant")
    for n in [*pattern.inputs, *pattern.outputs]:
        if isinstance(n, str) and kinds.get(n) != "V":
            raise ValueError(f"{pattern.label}: {n!r} is not a value the pattern binds")
    if not pattern.outputs or pattern.outputs[-1] != pattern.root.name:
        raise ValueError(f"{pattern.label}: the last output must name the root op")


# ----------------------------------------------------------------------------- the patterns
HEADS = (0, 2, 1, 3)  # (B, T, nh, hs) <-> (B, nh, T, hs)
# the fused block's inputs after x, in its order (kernels.cpu_gpt2_block.GPT2_BLOCK_PARAMS,
# written out: that module needs numba)
BLOCK_PARAMS = (
    *("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias"),
    *("attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias"),
    *("mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"),
)


class WrittenGelu(Pattern):
    """The tanh GELU written out, as minGPT's ``NewGELU`` and the GELU paper write it:
    ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``, one GELU op."""

    label = "GELUs written out as one GELU op"
    inputs, outputs = ("x",), ("y",)
    kernel, ref, fallback = "gelu", Gelu, True

    @staticmethod
    def graph():
        x = V("x")
        cube = op(Mul, op(Pow, x, K("three")), K("c"), commutative=True)
        u = op(Mul, op(Add, x, cube, commutative=True), K("k"), commutative=True)
        t = op(Add, op(Tanh, u), K("one"), commutative=True)
        return op(Mul, op(Mul, x, K("half"), commutative=True), t, commutative=True, name="y")

    @staticmethod
    def conditions(graph, m):
        """The GELU's constants (to float64 rounding: ``math.sqrt(2 / math.pi)`` or
        ``(2 / math.pi) ** 0.5``), a float x and y of its shape and dtype."""
        want = {"three": 3, "c": 0.044715, "k": math.sqrt(2 / math.pi), "one": 1, "half": 0.5}
        for n, v in want.items():
            c = m[n]
            if isinstance(c, bool) or not isinstance(c, (int, float)):
                return None
            if not math.isclose(c, v, rel_tol=1e-12):
                return None
        if (m.shape("y"), m.dtype("y")) != (m.shape("x"), m.dtype("x")):
            return None
        if m.dtype("x").kind != "f":
            return None
        return {"approximate": "tanh"}


def causal_probs():
    """softmax of the scaled scores q·kᵀ with the masked ones -inf: the attention's weights."""
    s = op(Mul, op(MatMul, V("q"), op(Permute, V("k"), (0, 1, 3, 2))), K("scale"), commutative=True)
    return op(Softmax, op(MaskedFill, s, Known("masked"), float("-inf")), dim=K("dim"))


class CausalAttention(Pattern):
    label = "causal attentions as one attention op"
    inputs = ("q", "k", "v", None)
    outputs = ("y",)
    kernel = "attention"
    ref, fallback = Attention, True

    @staticmethod
    def graph():
        return op(MatMul, causal_probs(), V("v"), name="y")

    @staticmethod
    def conditions(graph, m):
        """The mask is the causal (L, S) one, L <= S: a constant, or a value folded from a
        buffer when the plan is made (minGPT's ``bias[:, :, :T, :T] == 0``); shapes as the op
        takes them: attention with is_causal and that scale."""
        scale, dim = m["scale"], m["dim"]
        (qs, qd), (ks, kd), (vs, vd) = ((m.shape(n), m.dtype(n)) for n in ("q", "k", "v"))
        if (m.shape("y"), m.dtype("y")) != ((*qs[:3], vs[3]), qd):
            return None
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or dim not in (-1, 3):
            return None
        if not (len(qs) == len(ks) == len(vs) == 4 and qs[:2] == ks[:2] == vs[:2]):
            return None
        (L, E), (S, Ek) = qs[2:], ks[2:]
        if E != Ek or vs[2] != S or not (qd == kd == vd) or L > S:
            return None
        want = ~causal_mask(np, L, S)
        masked = m.known("masked")  # (last: folding runs ops)
        if not (hasattr(masked, "shape") and masked.dtype == bool and masked.size == want.size):
            return None
        if masked.shape != want.shape[-masked.ndim :] and masked.shape[-2:] != want.shape:
            return None
        if not np.array_equal(np.asarray(masked).reshape(L, S), want):
            return None
        p = m.get("dropout_p", 0.0)
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            return None
        return {"dropout_p": float(p), "is_causal": True, "scale": float(scale)}


class CausalAttentionDropout(CausalAttention):
    label = "causal attentions with dropout as one attention op"

    @staticmethod
    def graph():
        p = op(Dropout, causal_probs(), p=K("dropout_p"))
        return op(MatMul, p, V("v"), name="y")


class GPT2Block(Pattern):
    label = "GPT-2 blocks as the fused block kernel"
    inputs = ("x", *BLOCK_PARAMS)
    outputs = ("out",)
    kernel = "gpt2_block"

    @staticmethod
    def graph():
        x, p = V("x"), {n: V(n) for n in BLOCK_PARAMS}
        h1 = op(LayerNorm, x, p["ln_1.weight"], p["ln_1.bias"], nd=1, eps=K("eps"))
        qkv = op(Linear, h1, p["attn.c_attn.weight"], p["attn.c_attn.bias"])
        q, k, v = op(Split, qkv, K("sizes"), K("dim"), n_out=3)
        heads = [op(Permute, op(Reshape, t, ANY, name=n), HEADS) for t, n in zip((q, k, v), "qkv")]
        y = op(Attention, *heads, None, dropout_p=K("dropout_p"), is_causal=True, scale=K("scale"))
        ym = op(Reshape, op(Permute, y, HEADS), ANY, name="ym")  # (.contiguous(): looked through)
        x1 = op(
            Add, x, op(Linear, ym, p["attn.c_proj.weight"], p["attn.c_proj.bias"]), commutative=True
        )
        h2 = op(LayerNorm, x1, p["ln_2.weight"], p["ln_2.bias"], nd=1, eps=K("eps"))
        f = op(Linear, h2, p["mlp.c_fc.weight"], p["mlp.c_fc.bias"])
        a = op(Gelu, f, approximate=K("approximate"))
        mlp = op(Linear, a, p["mlp.c_proj.weight"], p["mlp.c_proj.bias"])
        return op(Add, x1, mlp, commutative=True, name="out")

    @staticmethod
    def conditions(graph, m):
        """Heads split off C and merged again (the three head reshapes alike), the qkv split
        into three of C, no dropout: the fused block's kwargs."""
        xs = m.shape("x")
        if len(xs) != 3:
            return None
        B, T, C = xs
        heads = m.shape("q")
        if len(heads) != 4 or heads[:2] != (B, T) or heads[2] * heads[3] != C:
            return None
        if m.shape("k") != heads or m.shape("v") != heads or m.shape("ym") != xs:
            return None
        sizes, dim, p, scale = m["sizes"], m["dim"], m["dropout_p"], m["scale"]
        if not isinstance(sizes, (list, tuple)) or list(sizes) != [C] * 3 or dim not in (2, -1):
            return None
        if isinstance(p, bool) or not isinstance(p, (int, float)) or p != 0:  # (eval: an int 0)
            return None
        if scale is not None and not (  # the default, or written as 1 / sqrt(head size)
            isinstance(scale, float) and math.isclose(scale, 1 / math.sqrt(heads[3]), rel_tol=1e-12)
        ):
            return None
        return {"n_head": heads[2], "eps": m["eps"], "approximate": m["approximate"]}


class AddLayerNorm(LayerNorm):
    """s = x + a and y = LayerNorm(s): a residual add and the LayerNorm after it, as one op
    with both outputs (the residual stream goes on to the next add). ``tensorgrad.compile``
    makes it from the two ops where it finds them (``AddLayerNormPattern``), so that a kernel
    can do both in one pass over the rows; x and a have one shape.

    ∂L/∂x = ∂L/∂a = g_s + LayerNorm's ∂L/∂s for g_y."""

    op = "add_layer_norm"
    multi_output = True
    takes_none = True  # an output no gradient reached adds nothing

    def forward(self, x, a, w, b, nd=1, eps=1e-5):
        s = x + a
        return s, super().forward(s, w, b, nd=nd, eps=eps)

    def backward(self, gs, gy):
        if gy is None:  # (w and b still get their gradients: zeros)
            gy = xp_of(gs, self.saved[0]).zeros_like(self.saved[0])
        gx, gw, gb = super().backward(gy)
        gx = gx if gs is None else gs + gx
        return gx, gx, gw, gb


class AddLayerNormPattern(Pattern):
    label = "residual adds with their LayerNorm as one kernel"
    inputs = ("x", "a", "w", "b")
    outputs = ("s", "y")
    kernel = "add_layer_norm"
    ref = AddLayerNorm

    @staticmethod
    def graph():
        s = op(Add, V("x"), V("a"), name="s")
        return op(LayerNorm, s, V("w"), V("b"), nd=K("nd"), eps=K("eps"), name="y")

    @staticmethod
    def conditions(graph, m):
        """x and a graph values of one shape: no broadcasting (an embedding's (T, C)
        positions added to (B, T, C) run as written)."""
        if m["x"][0] != "v" or m["a"][0] != "v" or m.shape("x") != m.shape("a"):
            return None
        if m.dtype("x") != m.dtype("a"):
            return None
        return {"nd": m["nd"], "eps": m["eps"]}


__all__ = ["ANY", "PATTERNS", "AddLayerNorm", "K", "Pattern", "V", "match_composites", "op"]
