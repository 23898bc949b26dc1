"""Vectorisable float32 exp for numba loops (PyPI's numba has no SVML).

``math.exp`` inside an ``@njit`` loop is a scalar libm call per element, which made a numba
softmax slower than NumPy's SIMD ``np.exp``. :func:`exp32` is branch-free arithmetic that
LLVM turns into AVX2 / AVX-512 code: Cody-Waite range reduction x = n·ln2 + r with
ln2 split in two (n·C1 is exact), Cephes' degree-6 polynomial for e^r on |r| <= ln2/2, and
2^n built in the exponent bits (two factors, so that n = 128 near the overflow threshold
still works).

Accuracy (tests/test_kernels_cpu.py checks it on 5·10^6 points against float64 exp): at
most 1.5 ulp of the float32 result where e^x is a normal float32; 0 below x = -87.34
(NumPy would return a subnormal < 1.2e-38 there), inf above x = 88.72, NaN for NaN.
The function must be compiled without ``reassoc`` fast-math: reassociation would fold
the two-step reduction back into one and lose the low bits of r.

Also here: :func:`rmax`, a float32 row's maximum as a vectorised integer reduction, and
:func:`jit`, numba's ``njit`` as every CPU kernel compiles, with NumPy's error
model (see its docstring: it is what lets LLVM vectorise a loop that divides).

Imports: llvmlite, math, numba, numpy.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def _bits_f32(typingctx, i):
    """The float32 whose bit pattern is the int32 i (a register move, no memory)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def _i32_bits(typingctx, x):
    """The int32 whose bit pattern is the float32 x (a register move, no memory)."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


@intrinsic
def _rint32(typingctx, x):
    """Round a float32 to the nearest integer value (llvm.rint: one SIMD instruction)."""
    sig = types.float32(types.float32)

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.rint", [ir.FloatType()])
        return builder.call(fn, [args[0]])

    return sig, codegen


def jit(cache: bool = True, **options):
    """``numba.njit(**options)`` as the CPU kernels compile: cached on disk (unless ``cache``
    is False: code generated at run time has no file to cache beside), and with NumPy's
    error model, so that ``a / b`` is IEEE division (inf or NaN for a zero b, as NumPy and
    the reference ops give) rather than Python's, whose zero check in every iteration keeps
    LLVM from vectorising the loop. Measured on family 25 model 17 (Zen 4), one thread,
    1.57M float32 elements: the tanh GELU's forward took 11.8 ms with Python's error model,
    0.88 ms with NumPy's."""
    return njit(error_model="numpy", cache=cache, **options)


F32 = np.float32
_LOG2E = F32(1.44269504088896341)
_C1 = F32(0.693359375)  # ln2 = C1 + C2, C1 with few bits so that n·C1 is exact
_C2 = F32(-2.12194440e-4)
_P = tuple(
    F32(c)
    for c in (
        1.9875691500e-4,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        5.0000001201e-1,
    )
)
EXP_HI = F32(88.72283935546875)  # largest x with a finite float32 e^x
EXP_LO = F32(-87.33654022216797)  # smallest x with a normal float32 e^x
EXP_ULP = 1.5  # the bound the test holds exp32 to


@jit(inline="always", fastmath={"contract"})
def _exp_reduced(xc):
    """(e^r, n) with xc = n·ln2 + r, for xc clamped to [EXP_LO, EXP_HI]: the range reduction
    and polynomial that exp32 and exp32_nonpos share."""
    n = _rint32(xc * _LOG2E)
    r = (xc - n * _C1) - n * _C2
    p = ((((_P[0] * r + _P[1]) * r + _P[2]) * r + _P[3]) * r + _P[4]) * r + _P[5]
    return p * (r * r) + r + F32(1), np.int32(n)


@jit(inline="always", fastmath={"contract"})
def exp32(x):
    """e^x of a float32 (see the module docstring for range and accuracy)."""
    y, ni = _exp_reduced(min(max(x, EXP_LO), EXP_HI))
    h = ni >> 1
    y = y * _bits_f32((h + 127) << 23) * _bits_f32((ni - h + 127) << 23)
    if x < EXP_LO:
        y = F32(0)
    if x > EXP_HI:
        y = F32(np.inf)
    if math.isnan(x):
        y = x
    return y


@jit(inline="always", fastmath={"contract"})
def exp32_nonpos(x):
    """exp32(x) for x <= 0 or NaN (a score minus its row's max, a log-probability), bit for
    bit: no upper clamp, and 2^n in one factor, as n >= -126. Fewer instructions in a loop
    bound by them: a (12288, 256) softmax forward 0.67 -> 0.60 ms on two threads (Zen 5)."""
    y, ni = _exp_reduced(max(x, EXP_LO))
    y = y * _bits_f32((ni + 127) << 23)
    if x < EXP_LO:
        y = F32(0)
    if math.isnan(x):
        y = x
    return y


@jit(fastmath={"contract"})
def exp32_in_place(s):
    """s <- exp32(s) over a flat float32 array. (One array: exp32_array with out aliasing x
    keeps LLVM's loop scalar, its run-time overlap check failing: 46 against 27 µs in
    gpt-nano's attention forward.)"""
    for i in range(s.size):
        s[i] = exp32(s[i])


@jit(fastmath={"contract"})
def exp32_array(x, out):
    """out = exp32(x) elementwise over flat float32 arrays (for tests and benchmarks)."""
    for i in range(x.size):
        out[i] = exp32(x[i])


@jit(fastmath={"contract"})
def exp32_nonpos_array(x, out):
    """out = exp32_nonpos(x) elementwise (for tests)."""
    for i in range(x.size):
        out[i] = exp32_nonpos(x[i])


_SIGNLESS = np.int32(0x7FFFFFFF)
_KEY_NEG_INF = np.int32(-0x7F800001)  # the ordered key of -inf (0xFF800000 ^ 0x7FFFFFFF)


@jit()
def rmax(a):
    """The maximum of a float32 array (-inf for an empty one), through the bits: x's int32
    bits b, with b ^ 0x7FFFFFFF where b < 0, order as x does (-0 just below +0). LLVM
    vectorises that integer max but not a float one: a (12288, 256) row max took 0.45 ms
    on one thread with four float maxima, 0.14 ms this way (Zen 5). A positive NaN is
    returned (its key is above +inf's), a negative one skipped; either way the NaN
    reaches the row's sum, and so its output, as in the reference."""
    m = _KEY_NEG_INF
    for j in range(a.size):
        b = _i32_bits(a[j])
        m = max(m, b ^ ((b >> 31) & _SIGNLESS))
    return _bits_f32(m ^ ((m >> 31) & _SIGNLESS))
