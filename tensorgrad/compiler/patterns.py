"""Composite patterns: a window of traced ops that an existing kernel computes as one op.

A pattern is a list of ops written as a learner would read them: each line is an op's name,
its inputs and keyword arguments, and the names of its outputs. In a line, a plain name binds
to the traced value found there (the same name must find the same value again), ``"$name"``
binds to a constant (the same name must find an equal constant), and any other value must
equal the traced constant. A window of consecutive steps that matches, whose inner values no
later step reads and whose inputs are not made inside it, becomes one step of the kernel the
pattern names.

Three patterns today:
- the pre-LayerNorm GPT-2 block, as ``gpt/model.py``'s ``Block`` computes it with the fused
  attention: it runs as the fused block kernel (``kernels/cpu_gpt2_block.py``). An edited
  block (another activation, another scale, a parallel attention and MLP, RMSNorm) traces
  other ops, does not match, and runs as written: the pattern is the graph's, never a
  module's type;
- causal attention written out, ``softmax((q @ k.transpose(-2, -1)) * scale`` with the
  causal mask filled by -inf ``) @ v`` (the model's ``set_fused_attention(False)`` path, and
  an attention edit written that way): it runs as one attention op with ``is_causal`` and that
  scale, so the flash kernel (``kernels/cpu_numba_attention.py``) takes it where it applies,
  and no (T, T) probabilities are kept for the backward. The mask must be a constant equal to
  ``~causal_mask(L, S)`` with L <= S (no row fully masked, where the written softmax would give
  NaN and the op zeros), checked when the plan is made; a mask read from a buffer is a graph
  value, not a constant, and does not match;
- a residual add and the LayerNorm of its sum (every pre-LN block that is not the stock one
  has two): one ``AddLayerNorm`` op with both outputs, which its kernel computes in one pass
  over the rows each way. The two addends must have one shape (no broadcasting).

Imports: numpy, .trace, ..autograd, ..kernels, ..ops.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
from ..autograd import xp_of
from ..ops.nn import Attention, LayerNorm, causal_mask
from .trace import Graph, Step, same_value

HEADS = (0, 2, 1, 3)
GPT2_BLOCK = [
    ("LayerNorm", ["x", "ln_1.weight", "ln_1.bias"], {"nd": 1, "eps": "$eps"}, ["h1"]),
    ("Linear", ["h1", "attn.c_attn.weight", "attn.c_attn.bias"], {}, ["qkv"]),
    ("Split", ["qkv", "$sizes", 2], {}, ["q", "k", "v"]),
    ("Reshape", ["q", "$heads"], {}, ["q4"]),
    ("Permute", ["q4", HEADS], {}, ["qh"]),
    ("Reshape", ["k", "$heads"], {}, ["k4"]),
    ("Permute", ["k4", HEADS], {}, ["kh"]),
    ("Reshape", ["v", "$heads"], {}, ["v4"]),
    ("Permute", ["v4", HEADS], {}, ["vh"]),
    (
        "Attention",
        ["qh", "kh", "vh", None],
        {"dropout_p": 0.0, "is_causal": True, "scale": None},
        ["y"],
    ),
    ("Permute", ["y", HEADS], {}, ["yt"]),
    ("Contiguous", ["yt"], {}, ["yc"]),
    ("Reshape", ["yc", "$merged"], {}, ["ym"]),
    ("Linear", ["ym", "attn.c_proj.weight", "attn.c_proj.bias"], {}, ["a"]),
    ("Add", ["x", "a"], {}, ["x1"]),
    ("LayerNorm", ["x1", "ln_2.weight", "ln_2.bias"], {"nd": 1, "eps": "$eps"}, ["h2"]),
    ("Linear", ["h2", "mlp.c_fc.weight", "mlp.c_fc.bias"], {}, ["f"]),
    ("Gelu", ["f"], {"approximate": "$approximate"}, ["act"]),
    ("Linear", ["act", "mlp.c_proj.weight", "mlp.c_proj.bias"], {}, ["m"]),
    ("Add", ["x1", "m"], {}, ["out"]),
]
CAUSAL_ATTENTION = [
    ("Permute", ["k", (0, 1, 3, 2)], {}, ["kt"]),
    ("MatMul", ["q", "kt"], {}, ["s"]),
    ("Mul", ["s", "$scale"], {}, ["ss"]),
    ("MaskedFill", ["ss", "$masked", float("-inf")], {}, ["sm"]),
    ("Softmax", ["sm"], {"dim": "$dim"}, ["p"]),
    ("MatMul", ["p", "v"], {}, ["y"]),
]
ADD_LAYER_NORM = [
    ("Add", ["x", "a"], {}, ["s"]),
    ("LayerNorm", ["s", "w", "b"], {"nd": "$nd", "eps": "$eps"}, ["y"]),
]
BLOCK_PARAMS = [n for _, ins, _, _ in GPT2_BLOCK for n in ins if isinstance(n, str) and "." in n]
# (the fused kernel's inputs after x, in the kernel's order: kernels.cpu_gpt2_block)


class AddLayerNorm(LayerNorm):
    """s = x + a and y = LayerNorm(s): a residual add and the LayerNorm after it, as one op
    with both outputs (the residual stream goes on to the next add). ``tensorgrad.compile``
    makes it from the two ops where it finds them (below), so that a kernel
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


def match_composites(graph: Graph, steps: list, last_reads) -> list:
    """``steps`` with every window that matches a pattern replaced by one kernel step
    (``last_reads(graph, steps)``: slot -> index in ``steps`` of the last step that reads it,
    asked again after each pattern)."""
    steps = _replace(graph, steps, last_reads(graph, steps), GPT2_BLOCK, _gpt2_block_step)
    steps = _replace(graph, steps, last_reads(graph, steps), CAUSAL_ATTENTION, _attention_step)
    return _replace(graph, steps, last_reads(graph, steps), ADD_LAYER_NORM, _add_layer_norm_step)


def _replace(graph, steps, used_after, pattern, make) -> list:
    out, k, n = [], 0, len(pattern)
    while k < len(steps):
        found = _match(pattern, steps[k : k + n]) if k + n <= len(steps) else None
        step = found and make(graph, steps, k, k + n - 1, found, used_after)
        if step is not None:
            out.append(step)
            k += n
        else:
            out.append(steps[k])
            k += 1
    return out


def _not_closed(env, ins, outs, pattern, last, used_after) -> bool:
    """Whether the window leaks: a value made inside it (not in ``outs``) is read after step
    ``last``, or one of its inputs ``ins`` is a value made inside it (``p @ s`` for ``p @ v``),
    which the one step that replaces the window would read before it exists."""
    made = {n for _, _, _, names in pattern for n in names}
    inner = {env[n][1] for n in made - set(outs)}
    if any(env[n][0] == "v" and env[n][1] in inner | {env[o][1] for o in outs} for n in ins):
        return True
    return any(used_after.get(s, -1) > last for s in inner)


def _match(pattern: list, window: list) -> dict | None:
    """The names' bindings if ``window`` is ``pattern``, else None."""
    env: dict = {}
    for (name, ins, kwargs, outs), st in zip(pattern, window):
        if st.cls.__name__ != name or len(st.ins) != len(ins) or st.kwargs.keys() != kwargs.keys():
            return None
        pairs = list(zip(ins, st.ins)) + [(kwargs[k], st.kwargs[k]) for k in kwargs]
        pairs += [(o, ("v", s)) for o, s in zip(outs, st.outs)]
        for want, got in pairs:
            if not _bind(env, want, got):
                return None
    return env


def _bind(env: dict, want, got) -> bool:
    kind, value = got
    if isinstance(want, str) and not want.startswith("$"):  # a value (or a missing bias)
        if kind == "c" and value is not None:
            return False
        key = (kind, value if kind == "v" else None)
        return env.setdefault(want, key) == key
    if isinstance(want, str):  # "$name": a constant, equal wherever it appears
        if kind != "c":
            return False
        if want in env:
            return same_value(env[want], value)
        env[want] = value
        return True
    return kind == "c" and same_value(want, value if not isinstance(value, list) else tuple(value))


def _gpt2_block_step(graph, steps, first, last, env, used_after) -> Step | None:
    """The fused block's step for a matched window, or None where the kernel does not apply
    (its predicate says no) or a value inside the window is read after it."""
    if _not_closed(env, ["x", *BLOCK_PARAMS], ["out"], GPT2_BLOCK, last, used_after):
        return None
    heads, (B, T, C) = tuple(env["$heads"]), graph.meta[env["x"][1]][0]
    if len(heads) != 4 or heads[:2] != (B, T) or heads[2] * heads[3] != C:
        return None
    n_head = heads[2]
    ins = [env["x"]] + [("v", env[p][1]) if env[p][0] == "v" else ("c", None) for p in BLOCK_PARAMS]
    dummies = [_dummy(graph, r) for r in ins]
    kw = {"n_head": n_head, "eps": env["$eps"], "approximate": env["$approximate"]}
    impl = kernels.pick("gpt2_block", "cpu", *dummies, **kw)
    if impl is None:
        return None
    needs = tuple(r[0] == "v" and graph.needs_grad[r[1]] for r in ins)
    out = env["out"][1]
    kwargs = {k: ("c", v) for k, v in kw.items()}
    label = "GPT-2 blocks as the fused block kernel"
    return Step(impl, impl, ins, kwargs, [out], needs, [graph.meta[out]], label)


def _attention_step(graph, steps, first, last, env, used_after) -> Step | None:
    """One attention op (is_causal, the written scale) for a matched window, or None where
    the window is not causal attention exactly as the op computes it."""
    if _not_closed(env, ["q", "k", "v"], ["y"], CAUSAL_ATTENTION, last, used_after):
        return None
    scale, masked, dim = env["$scale"], env["$masked"], env["$dim"]
    (qs, qd), (ks, kd), (vs, vd) = (graph.meta[env[n][1]] for n in ("q", "k", "v"))
    if graph.meta[env["y"][1]] != ((*qs[:3], vs[3]), qd):
        return None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or dim not in (-1, 3):
        return None
    if not (len(qs) == len(ks) == len(vs) == 4 and qs[:2] == ks[:2] == vs[:2]):
        return None
    (L, E), (S, Ek) = qs[2:], ks[2:]
    if E != Ek or vs[2] != S or not (qd == kd == vd) or L > S:
        return None
    want = ~causal_mask(np, L, S)
    if not (hasattr(masked, "shape") and masked.dtype == bool and masked.size == want.size):
        return None
    if masked.shape != want.shape[-masked.ndim :] and masked.shape[-2:] != want.shape:
        return None
    if not np.array_equal(np.asarray(masked).reshape(L, S), want):
        return None
    ins = [env["q"], env["k"], env["v"], ("c", None)]
    kw = {"dropout_p": 0.0, "is_causal": True, "scale": float(scale)}
    dummies = [_dummy(graph, r) for r in ins[:3]]
    impl = kernels.pick("attention", "cpu", *dummies, None, **kw) or Attention
    needs = tuple(r[0] == "v" and graph.needs_grad[r[1]] for r in ins)
    y = env["y"][1]
    kwargs = {k: ("c", v) for k, v in kw.items()}
    label = "causal attentions as one attention op"
    return Step(Attention, impl, ins, kwargs, [y], needs, [graph.meta[y]], label)


def _add_layer_norm_step(graph, steps, first, last, env, used_after) -> Step | None:
    """The residual add and the LayerNorm after it as one AddLayerNorm step (both outputs:
    the sum goes on to the next add), where its kernel takes them: x and a of one shape,
    no broadcasting (an embedding's (T, C) positions added to (B, T, C) runs as written)."""
    if _not_closed(env, ["x", "a", "w", "b"], ["s", "y"], ADD_LAYER_NORM, last, used_after):
        return None
    if graph.meta[env["x"][1]] != graph.meta[env["a"][1]]:
        return None
    ins = [env[n] for n in ("x", "a", "w", "b")]
    kw = {"nd": env["$nd"], "eps": env["$eps"]}
    impl = kernels.pick("add_layer_norm", "cpu", *[_dummy(graph, r) for r in ins], **kw)
    if impl is None:
        return None
    needs = tuple(r[0] == "v" and graph.needs_grad[r[1]] for r in ins)
    outs = [env["s"][1], env["y"][1]]
    kwargs = {k: ("c", v) for k, v in kw.items()}
    label = "residual adds with their LayerNorm as one kernel"
    return Step(AddLayerNorm, impl, ins, kwargs, outs, needs, [graph.meta[o] for o in outs], label)


def _dummy(graph: Graph, ref):
    """An array of the value's shape and dtype, for the kernel's predicate."""
    if ref[0] != "v":
        return None
    shape, dtype = graph.meta[ref[1]]
    return np.zeros(shape, dtype) if graph.device == "cpu" else None
