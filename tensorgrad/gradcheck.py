"""Gradient checking: tape gradients against float64 central finite differences, and
second derivatives (``gradgradcheck``) against finite differences of the first.

Imports: numpy, .autograd, .devices, .tensor.
"""

from __future__ import annotations

import numpy as np

from .autograd import enable_grad, grad, no_grad
from .devices import to_numpy
from .tensor import Tensor


class GradcheckError(AssertionError):
    """A tape gradient disagrees with finite differences (message names input and index)."""


def _as_float64(inputs):
    out = []
    for x in inputs:
        if isinstance(x, Tensor):
            # a C-ordered copy, so that perturbing a reshape(-1) view of it perturbs x
            arr = x.array.astype(np.float64, order="C") if x.dtype.kind == "f" else x.array
            t = Tensor(arr, requires_grad=x.requires_grad)
            out.append(t)
        else:
            out.append(x)
    return out


def gradcheck(
    fn, inputs, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3, seed: int = 0
) -> bool:
    """Check d fn(*inputs) / d input for every input Tensor that requires grad.

    The inputs are copied to float64; a non-scalar output is reduced to a scalar with
    fixed random weights, so every output element takes part. Each input element is
    perturbed by ±eps and the central difference is compared with the tape gradient:
    |analytic - numeric| <= atol + rtol·|numeric|. Returns True, or raises GradcheckError
    naming the input, the worst index and both values.
    """
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    xs = _as_float64(inputs)
    out = fn(*xs)
    if not isinstance(out, Tensor):
        raise TypeError(f"gradcheck: fn must return a Tensor, got {type(out).__name__}")
    weights = np.random.default_rng(seed).standard_normal(out.shape)
    weights = Tensor(weights.astype(np.float64)) if out.ndim else Tensor(np.float64(1.0))

    def scalar(*args):
        return float((fn(*args) * weights).sum().item())

    for x in xs:
        if isinstance(x, Tensor):
            x.grad = None
    (out * weights).sum().backward()
    for i, x in enumerate(xs):
        if not (isinstance(x, Tensor) and x.requires_grad):
            continue
        analytic = (
            np.zeros(x.shape) if x.grad is None else to_numpy(x.grad.array).astype(np.float64)
        )
        numeric = np.zeros(x.shape)
        flat = x.array.reshape(-1)  # a view: perturbing it perturbs x
        with no_grad():
            for j in range(flat.size):
                orig = flat[j].item()
                flat[j] = orig + eps
                up = scalar(*xs)
                flat[j] = orig - eps
                down = scalar(*xs)
                flat[j] = orig
                numeric.reshape(-1)[j] = (up - down) / (2 * eps)
        err = np.abs(analytic - numeric) - (atol + rtol * np.abs(numeric))
        if err.size and (np.nanmax(err) > 0 or not np.all(np.isfinite(analytic))):
            k = np.unravel_index(
                int(np.nanargmax(np.where(np.isfinite(err), err, np.inf))), x.shape
            )
            raise GradcheckError(
                f"gradcheck failed for input {i} of shape {tuple(x.shape)}: at index {tuple(int(v) for v in k)} "
                f"the tape gives {analytic[k]:.8g} but finite differences give {numeric[k]:.8g} "
                f"(atol={atol}, rtol={rtol})"
            )
    return True


def gradgradcheck(
    fn, inputs, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3, seed: int = 0
) -> bool:
    """Check second derivatives: the gradient of fn (taken with ``create_graph=True``) is
    itself gradchecked, each input's gradient weighted by fixed random numbers, against
    finite differences of that first gradient. Inputs are copied to float64 as in
    :func:`gradcheck`; raises GradcheckError naming the input and index on a mismatch."""
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    xs = _as_float64(inputs)
    rng = np.random.default_rng(seed + 1)
    out = fn(*xs)
    w = Tensor(rng.standard_normal(out.shape)) if out.ndim else Tensor(np.float64(1.0))
    wanted = [x for x in xs if isinstance(x, Tensor) and x.requires_grad]
    vs = [Tensor(rng.standard_normal(x.shape)) for x in wanted]

    def first_gradient(*args):
        diff = [a for a in args if isinstance(a, Tensor) and a.requires_grad]
        with enable_grad():
            y = (fn(*args) * w).sum()
            gs = grad(y, diff, create_graph=True, allow_unused=True)
            total = sum((a * 0).sum() for a in diff)  # keeps every input in the graph
            for g, v in zip(gs, vs):
                if g is not None:
                    total = total + (g * v).sum()
        return total

    return gradcheck(first_gradient, xs, eps=eps, atol=atol, rtol=rtol, seed=seed)
