"""erf, the special function NumPy lacks, for the exact GELU (``Gelu`` of ``nn.py`` with
approximate='none'): ``erf_array`` on arrays, the recorded ``Erf`` op, and ``erf`` for either.

Imports: math, ..autograd, ..devices.
"""

from __future__ import annotations

import math

from ..autograd import Op, xp_of
from ..autograd.graph import is_tensor
from ..devices import get_array_module

# Abramowitz & Stegun 7.1.26-style rational erfc of W. J. Cody (1969), as in most libms:
# accurate to float64 rounding on float64 inputs, which the simpler fits are not
_ERF_A = (
    3.16112374387056560e00,
    1.13864154151050156e02,
    3.77485237685302021e02,
    3.20937758913846947e03,
    1.85777706184603153e-1,
)
_ERF_B = (
    2.36012909523441209e01,
    2.44024637934444173e02,
    1.28261652607737228e03,
    2.84423683343917062e03,
)
_ERFC_C = (
    5.64188496988670089e-1,
    8.88314979438837594e00,
    6.61191906371416295e01,
    2.98635138197400131e02,
    8.81952221241769090e02,
    1.71204761263407058e03,
    2.05107837782607147e03,
    1.23033935479799725e03,
    2.15311535474403846e-8,
)
_ERFC_D = (
    1.57449261107098347e01,
    1.17693950891312499e02,
    5.37181101862009858e02,
    1.62138957456669019e03,
    3.29079923573345963e03,
    4.36261909014324716e03,
    3.43936767414372164e03,
    1.23033935480374942e03,
)
_ERFC_P = (
    3.05326634961232344e-1,
    3.60344899949804439e-1,
    1.25781726111229246e-1,
    1.60837851487422766e-2,
    6.58749161529837803e-4,
    1.63153871373020978e-2,
)
_ERFC_Q = (
    2.56852019228982242e00,
    1.87295284992346725e00,
    5.27905102951428412e-1,
    6.05183413124413191e-2,
    2.33520497626869185e-3,
)
_SQRT_PI_INV = 1 / math.sqrt(math.pi)


def erf_array(xp, x):
    """The error function, elementwise (NumPy has none), after W. J. Cody's rational
    approximations (Math. Comp. 1969): three ranges of |x|, float64 rounding accuracy.
    Computed in float64 and returned in x's dtype."""
    z = xp.abs(x).astype(xp.float64)
    out = xp.empty_like(z)
    small = z < 0.5
    mid = (z >= 0.5) & (z < 4.0)
    big = z >= 4.0
    # |x| < 0.5: erf = x·P(x²)/Q(x²)
    zs = z[small]
    y = zs * zs
    num, den = _ERF_A[4] * y, y
    for i in range(3):
        num, den = (num + _ERF_A[i]) * y, (den + _ERF_B[i]) * y
    out[small] = zs * (num + _ERF_A[3]) / (den + _ERF_B[3])
    # 0.5 <= |x| < 4: erfc = exp(-x²)·P(x)/Q(x)
    zm = z[mid]
    num, den = _ERFC_C[8] * zm, zm
    for i in range(7):
        num, den = (num + _ERFC_C[i]) * zm, (den + _ERFC_D[i]) * zm
    erfc = (num + _ERFC_C[7]) / (den + _ERFC_D[7])
    out[mid] = 1 - _erfc_scale(xp, zm) * erfc
    # |x| >= 4: erfc = exp(-x²)/x·(1/√π + 1/x²·P(1/x²)/Q(1/x²))
    zb = z[big]
    y = 1 / (zb * zb)
    num, den = _ERFC_P[5] * y, y
    for i in range(4):
        num, den = (num + _ERFC_P[i]) * y, (den + _ERFC_Q[i]) * y
    r = y * (num + _ERFC_P[4]) / (den + _ERFC_Q[4])
    out[big] = 1 - _erfc_scale(xp, zb) * (_SQRT_PI_INV - r) / zb
    return xp.where(x < 0, -out, out).astype(x.dtype, copy=False)


def _erfc_scale(xp, z):
    """exp(-z²), with z² split into a 1/16-rounded part and a rest so no bits are lost."""
    zr = xp.trunc(z * 16) / 16
    return xp.exp(-zr * zr) * xp.exp(-(z - zr) * (z + zr))


class Erf(Op):
    """erf(x) = 2/√π ∫₀ˣ e^(-t²) dt;  ∂/∂x = 2/√π · e^(-x²)."""

    def forward(self, x):
        self.save(x)
        return erf_array(get_array_module(x), x)

    def backward(self, g):
        (x,) = self.saved
        return g * (xp_of(x).exp(-(x * x)) * x.dtype.type(2 / math.sqrt(math.pi)))


def erf(x):
    """erf elementwise: of an array, or (recorded) of a Tensor."""
    return Erf.apply(x) if is_tensor(x) else erf_array(get_array_module(x), x)
