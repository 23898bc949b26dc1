"""PyTorch's type promotion (``torch.result_type``) for the operands of one op.

Operands fall in three priority groups: tensors with dimensions, 0-d tensors, and
Python numbers. The result's category (bool < integer < float) is the highest over all
operands; its dtype comes from the highest-priority group that holds that category, so
float32 (dims) op float64 (0-d) is float32, an int tensor op 0.5 is float32 (the default
dtype) and an int tensor op a float64 0-d tensor is float64. NumPy would give float64
for the first two.

Imports: numpy.
"""

from __future__ import annotations

import numpy as np

DEFAULT_FLOAT = np.dtype(np.float32)
_INT = np.dtype(np.int64)


def category(dtype) -> int:
    """0 bool, 1 integer, 2 float (complex counts as float here)."""
    k = np.dtype(dtype).kind
    return 0 if k == "b" else 1 if k in "iu" else 2


def _promote(a, b):
    """Promotion within a group: across categories the higher category's dtype wins
    (int64 with float32 is float32, where NumPy says float64); within one, NumPy's rule."""
    if a is None:
        return b
    if b is None:
        return a
    ca, cb = category(a), category(b)
    if ca != cb:
        return np.dtype(a if ca > cb else b)
    try:
        return np.promote_types(a, b)
    except TypeError:  # bfloat16 with float16 before ml_dtypes 0.7: float32, as PyTorch
        return DEFAULT_FLOAT


def _combine(higher, lower):
    """c10's combine_categories: the higher-priority dtype wins unless the lower one is of a
    higher category (then the two are promoted)."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    if category(higher) >= category(lower):
        return higher
    return _promote(higher, lower)


def scalar_dtype(v):
    """The dtype a Python number stands for: bool, int64, or the default float."""
    if isinstance(v, (bool, np.bool_)):
        return np.dtype(np.bool_)
    if isinstance(v, (int, np.integer)):
        return _INT
    return DEFAULT_FLOAT


def result_type(*operands):
    """The dtype of an op over ``operands``: arrays (or Tensors: anything with ``dtype`` and
    ``ndim``) and Python numbers, by PyTorch's rules."""
    dim = zero = wrapped = None
    for x in operands:
        if hasattr(x, "dtype") and not isinstance(x, np.generic):
            if x.ndim:
                dim = _promote(dim, x.dtype)
            else:
                zero = _promote(zero, x.dtype)
        else:
            wrapped = _promote(wrapped, scalar_dtype(x))
    return np.dtype(_combine(dim, _combine(zero, wrapped)))
