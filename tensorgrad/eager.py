"""``tensorgrad.compile``: accepted and a no-op (tensorgrad runs every op eagerly)."""

from __future__ import annotations

import warnings

_warned = [False]


def compile(model=None, **kwargs):  # noqa: A001  (torch.compile's name)
    """Return ``model`` unchanged (as a decorator too), warning once per process that
    tensorgrad has no compiler; the fast paths are its registered kernels, always on."""
    if not _warned[0]:
        _warned[0] = True
        warnings.warn(
            "tensorgrad.compile: tensorgrad runs eagerly; the model is returned unchanged",
            stacklevel=2,
        )
    if model is None:
        return lambda m: m
    return model


__all__ = ["compile"]
