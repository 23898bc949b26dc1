"""Autograd: the tape and its walk, and the API users program it with.

    grad(outputs, inputs, ...)       gradients returned as a tuple (``.grad`` untouched)
    backward(tensors, ...)           gradients accumulated into leaves' ``.grad``
    Function                         an op with your own backward (``F.apply(...)``)
    functional                       jacobian, hessian, vjp, jvp, hvp, vhp
    no_grad, enable_grad, set_grad_enabled, is_grad_enabled
    record_ops(observer)             watch each op's inputs and outputs as it runs
    unobserved()                     ops inside are not shown to observers (a side computation)

``create_graph=True`` records the backward itself, so gradients can be differentiated again
(gradient penalties, Hessian-vector products, Newton's method). The library's own ops are
``Op`` subclasses (``graph.py``): forward on raw arrays, backward written once for arrays
and Tensors alike. ``walk.py`` holds the plain backward path (``loss.backward()`` with no
hooks, no retain_grad, no create_graph), ``engine.py`` the layers over it (``grad``, hooks,
retained outputs, create_graph) and ``observe.py`` record_ops/unobserved.

Imports: .engine, .function, .functional, .graph, .observe.
"""

from . import functional
from .engine import RemovableHandle, backward, grad, queue_callback, register_hook
from .function import Function, FunctionCtx
from .graph import (
    Op,
    enable_grad,
    is_grad_enabled,
    no_grad,
    register_tensor_type,
    register_tensor_xp,
    set_grad_enabled,
    unbroadcast,
    xp_of,
)
from .observe import record_ops, unobserved

__all__ = [
    "Function",
    "FunctionCtx",
    "Op",
    "RemovableHandle",
    "backward",
    "enable_grad",
    "functional",
    "grad",
    "is_grad_enabled",
    "no_grad",
    "queue_callback",
    "record_ops",
    "unobserved",
    "register_hook",
    "register_tensor_type",
    "register_tensor_xp",
    "set_grad_enabled",
    "unbroadcast",
    "xp_of",
]
