"""Selecting, sorting and comparing: ops whose results are indices or booleans (no gradient),
and the gathers and scatters that use indices (with gradients).

``Select`` is a base class of ``Tensor`` holding these methods.

Imports: collections, numpy, .autograd, .devices, .ops, .tensor_inplace.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from .autograd.graph import watch
from .devices import get_array_module, xp_for
from .ops import elementwise as E
from .ops import more_math as M
from .ops import more_shape as MS
from .ops.dims import wrap_dim, wrap_dims
from .ops.dtypes import result_type
from .tensor_inplace import InPlace, as_array

MaxResult = namedtuple("MaxResult", ["values", "indices"])  # max(dim), min(dim), sort, topk
Histogram = namedtuple("histogram", ["hist", "bin_edges"])  # torch.histogram's pair


class Select(InPlace):
    """Tensor's comparisons, index-valued ops, gathers and scatters (adds no state)."""

    __slots__ = ()

    # comparisons and logic: no gradient, boolean results (ops/more_math.py's Compare and
    # Predicate): applied as ops while a compile trace watches this thread (it records and
    # replays them), computed on the arrays otherwise
    def _compare(self, fn, other):
        """``fn`` (a name of ``M.COMPARISONS``) on both in their PyTorch result type (int
        tensor < 0.5 compares floats; float32 == a float64 0-d tensor compares in float32)."""
        if isinstance(other, (list, tuple)):
            other = self._leaf(get_array_module(self._array).asarray(other))
        elif not isinstance(other, (InPlace, bool, int, float, np.generic)) and not hasattr(
            other, "dtype"
        ):
            return NotImplemented  # e.g. pytest.approx: let the other side compare
        if isinstance(other, np.generic):
            other = other.item()
        dt = result_type(self, other)
        if watch.traces:
            return M.Compare.apply(self, other, fn=fn, dtype=dt)
        b = as_array(other) if hasattr(other, "dtype") else other
        return self._leaf(M.Compare.compute(self._array, b, fn, dt))

    def _predicate(self, fn: str):
        if watch.traces:
            return M.Predicate.apply(self, fn=fn)
        return self._leaf(M.Predicate.compute(self._array, fn))

    __eq__ = lambda self, o: self._compare("eq", o)  # noqa: E731
    __ne__ = lambda self, o: self._compare("ne", o)  # noqa: E731
    __lt__ = lambda self, o: self._compare("lt", o)  # noqa: E731
    __le__ = lambda self, o: self._compare("le", o)  # noqa: E731
    __gt__ = lambda self, o: self._compare("gt", o)  # noqa: E731
    __ge__ = lambda self, o: self._compare("ge", o)  # noqa: E731
    __and__ = lambda self, o: self._compare("and", o)  # noqa: E731
    __or__ = lambda self, o: self._compare("or", o)  # noqa: E731
    __xor__ = lambda self, o: self._compare("xor", o)  # noqa: E731
    __invert__ = lambda self: self._predicate("invert")  # noqa: E731
    __hash__ = object.__hash__
    eq, ne, lt, le, gt, ge = __eq__, __ne__, __lt__, __le__, __gt__, __ge__
    logical_and = lambda self, o: self._compare("logical_and", o)  # noqa: E731
    logical_or = lambda self, o: self._compare("logical_or", o)  # noqa: E731
    logical_xor = lambda self, o: self._compare("logical_xor", o)  # noqa: E731

    def logical_not(self):
        return self._predicate("logical_not")

    def isnan(self):
        return self._predicate("isnan")

    def isinf(self):
        return self._predicate("isinf")

    def isfinite(self):
        return self._predicate("isfinite")

    def _bool_reduce(self, op: str, dim, keepdim: bool):
        xp = get_array_module(self._array)
        axes = None if dim is None else wrap_dims(op, dim, self.ndim) if self.ndim else None
        return self._leaf(xp.asarray(getattr(xp, op)(self._array, axis=axes, keepdims=keepdim)))

    def all(self, dim=None, keepdim: bool = False, *, keepdims=False):
        return self._bool_reduce("all", dim, keepdim or keepdims)

    def any(self, dim=None, keepdim: bool = False, *, keepdims=False):
        return self._bool_reduce("any", dim, keepdim or keepdims)

    def count_nonzero(self, dim=None):
        """The number of nonzero elements (over ``dim``), int64."""
        return (self != 0).sum(dim)

    def allclose(self, other, rtol: float = 1e-05, atol: float = 1e-08, equal_nan=False) -> bool:
        """|self - other| <= atol + rtol·|other| everywhere (broadcast)."""
        xp = get_array_module(self._array)
        return bool(xp.allclose(self._array, as_array(other), rtol, atol, equal_nan))

    def equal(self, other) -> bool:
        """Same shape and the same values."""
        o = as_array(other)
        return tuple(o.shape) == tuple(self.shape) and bool((self._array == o).all())

    def max(self, dim=None, keepdim: bool = False, *, keepdims=False):
        """max() -> scalar tensor; max(dim) -> (values, indices), the gradient going to the
        returned index at ties (amax splits it); max(other) elementwise."""
        keepdim = keepdim or keepdims
        if isinstance(dim, InPlace):
            return self.maximum(dim)
        if dim is None:
            return self.amax()
        d = wrap_dim("max", dim, self.ndim) if self.ndim else dim
        return self._pick(d, keepdim, self.argmax(d, keepdim=True), "max")

    def min(self, dim=None, keepdim: bool = False, *, keepdims=False):
        keepdim = keepdim or keepdims
        if isinstance(dim, InPlace):
            return self.minimum(dim)
        if dim is None:
            return self.amin()
        d = wrap_dim("min", dim, self.ndim) if self.ndim else dim
        return self._pick(d, keepdim, self.argmin(d, keepdim=True), "min")

    def _pick(self, dim, keepdim, idx, op: str):
        if self.ndim == 0:
            wrap_dim(op, dim, 0)
            return MaxResult(self.clone(), idx.reshape(()))
        d = wrap_dim(op, dim, self.ndim)
        values = self.gather(d, idx)
        return MaxResult(values, idx) if keepdim else MaxResult(values.squeeze(d), idx.squeeze(d))

    def argmax(self, dim=None, keepdim: bool = False, *, keepdims=False):
        keepdim = keepdim or keepdims
        xp = get_array_module(self._array)
        if dim is None:
            return self._leaf(xp.asarray(xp.argmax(self._array)))
        d = wrap_dim("argmax", dim, self.ndim)
        return self._leaf(xp.asarray(xp.argmax(self._array, axis=d, keepdims=keepdim)))

    def argmin(self, dim=None, keepdim: bool = False, *, keepdims=False):
        keepdim = keepdim or keepdims
        xp = get_array_module(self._array)
        if dim is None:
            return self._leaf(xp.asarray(xp.argmin(self._array)))
        d = wrap_dim("argmin", dim, self.ndim)
        return self._leaf(xp.asarray(xp.argmin(self._array, axis=d, keepdims=keepdim)))

    # ------------------------------------------------------------------ sorting
    def argsort(self, dim: int = -1, descending: bool = False, stable: bool = False):
        xp = get_array_module(self._array)
        d = wrap_dim("argsort", dim, self.ndim)
        a = self._array if self.ndim else self._array.reshape(1)
        # a stable sort of -x keeps ties in index order, as PyTorch's stable descending sort
        idx = xp.argsort(-a if descending else a, axis=d, kind="stable")
        return self._leaf(idx.reshape(self._array.shape))

    def sort(self, dim: int = -1, descending: bool = False, stable: bool = False):
        """(values, indices) sorted along ``dim`` (stably); values carry the gradient."""
        idx = self.argsort(wrap_dim("sort", dim, self.ndim), descending)
        return MaxResult(self.gather(dim, idx), idx)

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
        """(values, indices) of the k largest (or smallest) along ``dim``, largest first."""
        d = wrap_dim("topk", dim, self.ndim)
        n = self.shape[d] if self.ndim else 1
        if not 0 <= k <= n:
            raise RuntimeError(f"topk: k ({k}) is out of range for dimension {d} of size {n}")
        idx = self.argsort(d, descending=largest)
        idx = idx[(slice(None),) * d + (slice(0, k),)] if self.ndim else idx
        idx = self._leaf(get_array_module(idx.array).ascontiguousarray(idx.array))
        return MaxResult(self.gather(d, idx), idx)

    # ------------------------------------------------------------------ indexing ops
    def gather(self, dim: int, index):
        """out[i][j] = self[i][index[i][j]] along ``dim`` (torch.gather)."""
        d = wrap_dim("gather", dim, self.ndim)
        idx = as_array(index)
        if idx.dtype.kind not in "iu":
            raise RuntimeError(f"gather: index must be an integer tensor, got {idx.dtype}")
        if idx.ndim != self.ndim:
            raise RuntimeError(f"gather: index has {idx.ndim} dims, the input {self.ndim}")
        return MS.Gather.apply(self, idx, d)

    def scatter_add(self, dim: int, index, src):
        """self with src[i][j] added at [i][index[i][j]] along ``dim`` (torch.scatter_add)."""
        d = wrap_dim("scatter_add", dim, self.ndim)
        idx = as_array(index)
        if idx.dtype.kind not in "iu":
            raise RuntimeError(f"scatter_add: index must be an integer tensor, got {idx.dtype}")
        src = src if isinstance(src, InPlace) else self._leaf(as_array(src, dtype=self.dtype))
        return MS.ScatterAdd.apply(self, idx, src.astype(self.dtype), d)

    def index_select(self, dim: int, index):
        d = wrap_dim("index_select", dim, self.ndim)
        idx = as_array(index)
        if idx.ndim > 1 or idx.dtype.kind not in "iu":
            raise RuntimeError("index_select: index must be a 0-d or 1-d integer tensor")
        ids = index.reshape(-1) if isinstance(index, InPlace) else idx.reshape(-1)  # (a tensor
        return self[ids] if d == 0 else self[(slice(None),) * d + (ids,)]  # stays one: a
        # compile trace sees the ids: replayed along dim 0, run eagerly with its line beyond)

    def scatter(self, dim: int, index, src=None, value=None):
        """self with src[i][j] (or ``value``) written at [i][index[i][j]] along ``dim``."""
        idx = as_array(index)
        if src is None or not isinstance(src, InPlace) and np.ndim(src) == 0:
            v = value if src is None else src
            src = self._leaf(get_array_module(self._array).full(idx.shape, v, dtype=self.dtype))
        hit = self._leaf(get_array_module(self._array).zeros(self.shape, dtype=np.int64))
        hit = hit.scatter_add(dim, idx, self._leaf(idx * 0 + 1)) > 0  # the written places
        return self.masked_fill(hit, 0).scatter_add(dim, idx, src)

    def index_add(self, dim: int, index, source, alpha=1):
        """self with source's slices i added at index[i] along ``dim`` (times ``alpha``)."""
        d = wrap_dim("index_add", dim, self.ndim)
        idx = as_array(index).reshape(-1)
        src = source if isinstance(source, InPlace) else self._leaf(as_array(source))
        shape = [1] * src.ndim
        shape[d] = idx.shape[0]
        full = get_array_module(idx).broadcast_to(idx.reshape(shape), src.shape)
        return self.scatter_add(d, full.copy(), src if alpha == 1 else src * alpha)

    def scatter_(self, dim: int, index, src=None, value=None):
        return self._update("scatter_", lambda x: x.scatter(dim, index, src, value))

    def scatter_add_(self, dim: int, index, src):
        return self._update("scatter_add_", lambda x: x.scatter_add(dim, index, src))

    def index_add_(self, dim: int, index, source, alpha=1):
        return self._update("index_add_", lambda x: x.index_add(dim, index, source, alpha))

    def nonzero(self, as_tuple: bool = False):
        """Indices of the nonzero elements: (n, ndim) int64, or one index tensor per dim."""
        xp = get_array_module(self._array)
        idx = [i.astype(np.int64) for i in xp.nonzero(self._array)]
        if as_tuple:
            return tuple(self._leaf(i) for i in idx)
        return self._leaf(xp.stack(idx, axis=1) if idx else xp.zeros((0, 0), dtype=np.int64))

    def unique(self, sorted: bool = True, return_inverse=False, return_counts=False, dim=None):
        """The distinct values (sorted), and optionally each element's index into them and their
        counts; no gradient."""
        if dim is not None:
            raise NotImplementedError("unique: dim= is not supported")
        xp = get_array_module(self._array)
        out = xp.unique(self._array, return_inverse=return_inverse, return_counts=return_counts)
        if not (return_inverse or return_counts):
            return self._leaf(out)
        vals, rest = out[0], list(out[1:])
        if return_inverse:
            rest[0] = rest[0].reshape(self._array.shape).astype(np.int64)
        return (self._leaf(vals), *(self._leaf(r.astype(np.int64)) for r in rest))

    def histogram(self, bins=100, *, range=None, weight=None, density=False):
        """(hist, bin_edges): counts (or densities) of the values in ``bins`` equal bins over
        ``range`` (min to max by default), or between the edges of a 1-d tensor ``bins``; the
        last bin includes its right edge. No gradient, as torch.histogram."""
        if self.dtype.kind != "f":
            raise RuntimeError(f"histogram: expected a floating point input, got {self.dtype}")
        xp = get_array_module(self._array)
        b = as_array(bins) if isinstance(bins, InPlace) else int(bins)
        w = None if weight is None else as_array(weight).reshape(-1)
        hist, edges = xp.histogram(
            self._array.reshape(-1), bins=b, range=range, weights=w, density=density
        )
        dt = self._array.dtype
        return Histogram(self._leaf(hist.astype(dt)), self._leaf(edges.astype(dt)))

    def where(self, condition, other):
        """self where ``condition`` holds, else ``other`` (broadcast; a Python number allowed),
        both cast to their PyTorch result type (an int tensor and 0.5 give float32)."""
        c = as_array(condition)
        if c.dtype != np.bool_:
            raise TypeError(f"where: condition must be boolean, got {c.dtype}")
        o = other if isinstance(other, (InPlace, bool, int, float)) else self._leaf(as_array(other))
        if isinstance(o, InPlace) and o.device != self.device:
            raise RuntimeError(
                f"where: expected all tensors on the same device, got {self.device} and {o.device}"
            )
        dt = result_type(self, o)
        xp = get_array_module(self._array)
        y = o.astype(dt) if isinstance(o, InPlace) else self._leaf(xp.asarray(o, dtype=dt))
        return E.Where.apply(c, self.astype(dt), y)

    def tril(self, diagonal: int = 0):
        xp = xp_for(self.device)
        keep = xp.tril(xp.ones(self.shape[-2:], dtype=bool), k=diagonal)
        return E.Where.apply(keep, self, xp.zeros((), dtype=self.dtype))

    def triu(self, diagonal: int = 0):
        xp = xp_for(self.device)
        keep = xp.triu(xp.ones(self.shape[-2:], dtype=bool), k=diagonal)
        return E.Where.apply(keep, self, xp.zeros((), dtype=self.dtype))
