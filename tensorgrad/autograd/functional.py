"""Derivatives of whole functions (``torch.autograd.functional``): jacobian, hessian, vjp,
jvp, hvp, vhp, all built on :func:`tensorgrad.autograd.grad`.

``func`` takes the tensor(s) in ``inputs`` and returns a tensor (or a tuple of them).
Results are detached unless ``create_graph=True``, which keeps them differentiable with
respect to the inputs. ``jvp`` uses the double-vjp trick: the vjp is linear in its vector
u, so differentiating ``u ↦ Jᵀu`` against u along v gives ``Jv``.

Imports: .engine, .graph, ..devices.
"""

from __future__ import annotations

from ..devices import get_array_module
from .engine import grad
from .graph import constant, enable_grad, is_tensor, xp_of


def _as_tuple(x):
    return (x,) if is_tensor(x) else tuple(x)


def _prepare(inputs, create_graph: bool) -> tuple:
    """Fresh tensors that require grad: detached copies, or (create_graph) clones that stay
    connected to the inputs' own graph."""
    out = []
    for x in _as_tuple(inputs):
        if create_graph and x.requires_grad:
            out.append(x.clone())
        else:
            out.append(x.detach().requires_grad_(True))
    return tuple(out)


def _grads(outputs, inputs, vs, create_graph: bool) -> tuple:
    """grad with zeros (not None) for inputs the outputs do not depend on."""
    outs = [o for o in outputs if o.requires_grad]
    keep = [v for o, v in zip(outputs, vs) if o.requires_grad]
    if not outs:
        return tuple(constant(x.array * 0) for x in inputs)
    return grad(
        outs, inputs, keep, create_graph=create_graph, retain_graph=True, materialize_grads=True
    )


def _finish(ts, create_graph: bool):
    return tuple(t if create_graph else t.detach() for t in ts)


def _pack(ts, like):
    return ts[0] if is_tensor(like) else tuple(ts)


def vjp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """(func(inputs), vᵀ·J): the gradient of ⟨func(inputs), v⟩ with respect to the inputs."""
    xs = _prepare(inputs, create_graph)
    with enable_grad():
        out = func(*xs)
        outs = _as_tuple(out)
        vs = _vectors(v, outs, "vjp")
        g = _grads(outs, xs, vs, create_graph)
    return _pack(_finish(outs, create_graph), out), _pack(_finish(g, create_graph), inputs)


def jvp(func, inputs, v=None, create_graph: bool = False, strict: bool = False):
    """(func(inputs), J·v), by differentiating the vjp u ↦ uᵀJ with respect to u along v."""
    xs = _prepare(inputs, create_graph)
    vs = _vectors(v, xs, "jvp")
    with enable_grad():
        out = func(*xs)
        outs = _as_tuple(out)
        us = tuple(constant(o.array * 0).requires_grad_(True) for o in outs)
        g = _grads(outs, xs, us, create_graph=True)
        jv = _grads(g, us, vs, create_graph)
    return _pack(_finish(outs, create_graph), out), _pack(_finish(jv, create_graph), out)


def jacobian(func, inputs, create_graph: bool = False, strict: bool = False, vectorize=False):
    """J[i][j] = d output_i / d input_j, of shape output_i.shape + input_j.shape: one vjp per
    output element. A single output and a single input give one tensor, else nested tuples."""
    xs = _prepare(inputs, create_graph)
    with enable_grad():
        out = func(*xs)
        outs = _as_tuple(out)
        rows = []
        for o in outs:
            xp = get_array_module(o.array)
            per_input = [[] for _ in xs]
            for k in range(o.array.size):
                e = xp.zeros(o.array.size, o.array.dtype)
                e[k] = 1
                g = _grads((o,), xs, (constant(e.reshape(o.array.shape)),), create_graph)
                for j, gj in enumerate(g):
                    per_input[j].append(gj)
            rows.append(tuple(_stack_rows(p, o, x) for p, x in zip(per_input, xs)))
    rows = tuple(_finish(r, create_graph) for r in rows)
    if is_tensor(out):
        return rows[0][0] if is_tensor(inputs) else rows[0]
    return tuple(r[0] for r in rows) if is_tensor(inputs) else rows


def _stack_rows(gs, o, x):
    shape = tuple(o.shape) + tuple(x.shape)
    if not gs:
        return constant(x.array.reshape(shape))
    xp = xp_of(*gs)
    return xp.reshape(xp.stack(gs, axis=0), shape)


def hessian(func, inputs, create_graph: bool = False, strict: bool = False, vectorize=False):
    """H[i][j] = d² func / d input_i d input_j for a scalar func (the jacobian of its gradient)."""

    def gradient(*xs):
        out = func(*xs)
        return _grads((out,), xs, (None,), create_graph=True)

    h = jacobian(gradient, inputs, create_graph=create_graph)
    if is_tensor(inputs):
        return h[0]
    return h


def hvp(func, inputs, v, create_graph: bool = False, strict: bool = False):
    """(func(inputs), H·v) for a scalar func, as the gradient of ⟨∇func, v⟩."""
    xs = _prepare(inputs, create_graph)
    vs = _vectors(v, xs, "hvp")
    with enable_grad():
        out = func(*xs)
        g = _grads((out,), xs, (None,), create_graph=True)
        dot = sum((gi * vi).sum() for gi, vi in zip(g, vs))
        hv = _grads((dot,), xs, (None,), create_graph)
    return _finish((out,), create_graph)[0], _pack(_finish(hv, create_graph), inputs)


def vhp(func, inputs, v, create_graph: bool = False, strict: bool = False):
    """(func(inputs), vᵀ·H); the Hessian is symmetric, so this is :func:`hvp`."""
    return hvp(func, inputs, v, create_graph=create_graph, strict=strict)


def _vectors(v, like, who: str) -> tuple:
    if v is None:
        if any(t.array.size != 1 for t in like):
            raise RuntimeError(f"{who}: v is required unless every tensor has one element")
        return tuple(constant(t.array * 0 + 1) for t in like)
    vs = _as_tuple(v)
    if len(vs) != len(like) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(vs, like)):
        raise RuntimeError(
            f"{who}: v has shapes {[tuple(a.shape) for a in vs]}, expected "
            f"{[tuple(b.shape) for b in like]}"
        )
    return tuple(a.detach() for a in vs)
