"""Composite patterns: a window of traced ops that an existing kernel computes as one op.

A pattern is a list of ops written as a learner would read them: each line is an op's name,
its inputs and keyword arguments, and the names of its outputs. In a line, a plain name binds
to the traced value found there (the same name must find the same value again), ``"$name"``
binds to a constant (the same name must find an equal constant), and any other value must
equal the traced constant. A window of consecutive steps that matches, whose inner values no
later step reads, becomes one step of the kernel the pattern names.

The one pattern today is the pre-LayerNorm GPT-2 block, as ``gpt/model.py``'s ``Block``
computes it with the fused attention: it runs as the fused block kernel
(``kernels/cpu_gpt2_block.py``). An edited block (another activation, another scale, a
parallel attention and MLP, RMSNorm) traces other ops, does not match, and runs as written:
the pattern is the graph's, never a module's type.

Imports: numpy, .trace, ..kernels.
"""

from __future__ import annotations

import numpy as np

from .. import kernels
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
BLOCK_PARAMS = [n for _, ins, _, _ in GPT2_BLOCK for n in ins if isinstance(n, str) and "." in n]
# (the fused kernel's inputs after x, in the kernel's order: kernels.cpu_gpt2_block)


def match_composites(graph: Graph, steps: list, used_after: dict) -> list:
    """``steps`` with every window that matches GPT2_BLOCK replaced by one kernel step
    (``used_after``: slot -> index in ``steps`` of the last step that reads it)."""
    out, k, n = [], 0, len(GPT2_BLOCK)
    while k < len(steps):
        found = _match(GPT2_BLOCK, steps[k : k + n]) if k + n <= len(steps) else None
        step = found and _gpt2_block_step(graph, steps, k, k + n - 1, found, used_after)
        if step is not None:
            out.append(step)
            k += n
        else:
            out.append(steps[k])
            k += 1
    return out


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
    inner = {env[n][1] for n in env if not n.startswith("$") and env[n][0] == "v"}
    inner -= {env["x"][1], env["out"][1], *(env[p][1] for p in BLOCK_PARAMS)}
    if any(used_after.get(s, -1) > last for s in inner):
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
    return Step(impl, impl, ins, kwargs, [out], needs, [graph.meta[out]])


def _dummy(graph: Graph, ref):
    """An array of the value's shape and dtype, for the kernel's predicate."""
    if ref[0] != "v":
        return None
    shape, dtype = graph.meta[ref[1]]
    return np.zeros(shape, dtype) if graph.device == "cpu" else None
