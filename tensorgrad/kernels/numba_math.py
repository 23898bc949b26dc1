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

Also here: :func:`rmax`, a float32 row's maximum as a vectorised integer reduction; the row
sums :func:`rsum`, :func:`rdot`, :func:`rsqdev` and :func:`rdot2dev`, vectorised in an order
the code fixes (see "One computation" below); and :func:`jit`, numba's ``njit`` as every CPU
kernel compiles, with NumPy's error model (see its docstring: it is what lets LLVM vectorise
a loop that divides).

One computation. No cached kernel is compiled with ``reassoc`` (or ``nsz``): LLVM may then
order a sum or an expression as it likes, and numba optimises the same code twice over. A
``parallel=True`` kernel's loop body, and any jitted function it calls, is compiled in a
library of its own and again, inlined, inside its caller's; the process that compiles runs
the first copy, and numba's cache stores (and every later process loads) the second. With
``reassoc`` the two copies ordered ``out += x + b`` and the row sums differently, so a run
whose kernels were compiled in the process and one that loaded them from the cache differed
in their last bits (issue 49: gpt-train's grad_norm 5.734244346618652 against
5.7342448234558105 at step 1). Without it every copy computes what the source says: only
``contract`` (a multiply-add fused where the code writes one) is allowed. Row sums are
therefore written here as explicit vector code (:func:`_lanes`), since LLVM vectorises a
plain loop's sum only where it may reassociate it. tests/test_cache_identity.py compares
every kernel's bits compiled and cached.

Imports: hashlib, llvmlite, math, numba, numpy, pathlib.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload


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
    0.88 ms with NumPy's. Each dispatcher made is kept in ``DISPATCHERS`` for
    :func:`counts`."""
    make = njit(error_model="numpy", cache=cache, **options)

    def made(fn):
        dispatcher = make(fn)
        if cache:
            _stamp_with_sources(dispatcher)
        DISPATCHERS.append((dispatcher, cache))
        return dispatcher

    return made


DISPATCHERS: list = []  # (dispatcher, cached on disk) of every kernel jit made


def sources_digest() -> str:
    """A digest of every file whose code a cached kernel may hold: the modules of
    tensorgrad/kernels (formulas.py's and this module's functions are inlined into their
    callers) and ops/nn.py (constants formulas.py reads)."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in [*sorted(here.glob("*.py")), here.parent / "ops" / "nn.py"]:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:20]


SOURCES = sources_digest()


def _stamp_with_sources(dispatcher) -> None:
    """Make the kernel's cache entry stale when any file it may inline changes. numba checks a
    cached kernel against its own file only (modification time and size), so an edit to
    formulas.py would leave every kernel that inlines it running the old formula from the
    cache; the stamp it compares now carries :data:`SOURCES` too."""
    cache_file = dispatcher._cache._cache_file  # (numba's own: set when the cache is made)
    cache_file._source_stamp = (cache_file._source_stamp, SOURCES)


def counts() -> dict:
    """This process's machine code of the kernels so far, in specialisations: ``compiled``
    (numba built it here, and its cache keeps it for later processes), ``loaded`` (from
    numba's cache), ``generated`` (the compiler's kernels for a model, built in every
    process)."""
    out = {"compiled": 0, "loaded": 0, "generated": 0}
    for d, cached in DISPATCHERS:
        hits = sum(d.stats.cache_hits.values()) if cached else 0
        built = len(d.overloads) - hits
        out["compiled" if cached else "generated"] += built
        out["loaded"] += hits
    return out


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


# ----------------------------------------------------------------------------- any float
# The formulas (kernels/formulas.py) are written once for float32 and float64: ``like(k, x)``
# is the number k in x's type (a bare literal would make numba compute float32 in float64),
# ``exp_of``, ``exp_nonpos_of`` and ``erfc_of`` the float32 forms above or libm's for float64. Each resolves at
# compile time, per type.


def like(k, x):
    """k as x's float type (inside jitted code)."""
    return type(x)(k)


def exp_of(x):
    """e^x: exp32 for a float32, libm's exp for a float64 (inside jitted code)."""
    return math.exp(x)


def exp_nonpos_of(x):
    """e^x for x <= 0: exp32_nonpos for a float32, libm's exp for a float64."""
    return math.exp(x)


def erfc_of(z):
    """erfc(z) for z >= 0: a float32 fit (below) for a float32, libm's for a float64."""
    return math.erfc(z)


# erfc(z) = t·exp(-z² + poly(t)), t = 1/(1 + z/2): Numerical Recipes' Chebyshev fit, about
# 1e-7 relative error (exact in the tail): float32's erfc, vectorisable with exp32
_ERFC = tuple(
    F32(c)
    for c in (
        -1.26551223,
        1.00002368,
        0.37409196,
        0.09678418,
        -0.18628806,
        0.27886807,
        -1.13520398,
        1.48851587,
        -0.82215223,
        0.17087277,
    )
)


@jit(inline="always", fastmath={"contract"})
def erfc32(z):
    t = F32(1) / (F32(1) + F32(0.5) * z)
    c = _ERFC  # (Horner written out: a loop here, inlined, tripped numba's SSA check)
    p = c[8] + t * c[9]
    p = c[4] + t * (c[5] + t * (c[6] + t * (c[7] + t * p)))
    p = c[0] + t * (c[1] + t * (c[2] + t * (c[3] + t * p)))
    return t * exp32(p - z * z)


@overload(like, inline="always")
def _like(k, x):
    t = np.float32 if x == types.float32 else np.float64
    return lambda k, x: t(k)


@overload(exp_of)
def _exp_of(x):
    if x == types.float32:
        return lambda x: exp32(x)
    return lambda x: math.exp(x)


@overload(exp_nonpos_of, inline="always")
def _exp_nonpos_of(x):
    if x == types.float32:
        return lambda x: exp32_nonpos(x)
    return lambda x: math.exp(x)


@overload(erfc_of)  # (not inline="always": with exp32 inside it numba's SSA check warned)
def _erfc_of(z):
    if z == types.float32:
        return lambda z: erfc32(z)
    return lambda z: math.erfc(z)


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


# ----------------------------------------------------------------------------- row sums
# Σ over a row as vector code with a fixed order, since no kernel may reassociate (see the
# module docstring): LANE_BYTES-wide partial sums (16 float32 or 8 float64 lanes), UNROLL of
# them side by side; element j goes to lane j mod W of partial sum (j div W) mod UNROLL while
# whole blocks of UNROLL·W elements last, then the remaining whole vectors to the first
# partial sum, in order. The partial sums are added pairwise, their lanes halved (lane i plus
# lane i + W/2, ...), and the elements past the last whole vector, summed one by one, last.
# An AVX2 machine runs the 64-byte vectors as two halves: the same sums, lane for lane.
# (A loop of 16 scalar accumulators would say the same, but numba leaves LLVM's SLP
# vectoriser off: it ran scalar, 4x slower than a reassociated loop.)
LANE_BYTES = 64
UNROLL = 4


def _row_types(arrays, scalars):
    """The dtype a sum over ``arrays`` runs in (float64 if any of them is, else float32) where
    they are 1-D C-contiguous float rows and ``scalars`` are numbers; else None (numba then
    reports no matching signature)."""
    floats = (types.float32, types.float64)
    for a in arrays:
        if not (isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C"):
            return None
        if a.dtype not in floats:
            return None
    if not all(isinstance(s, (types.Float, types.Integer)) for s in scalars):
        return None
    return types.float64 if any(a.dtype == types.float64 for a in arrays) else types.float32


def _lanes(n_arrays: int, term, n_sums: int = 1):
    """codegen of ``n_sums`` sums Σ_j term(a[j], b[j], ..., scalars) over ``n_arrays`` rows
    of a.size elements (the others at least as long), side by side in one pass, each in the
    order described above, in the signature's float type (a float32 row's elements widened
    where that is float64). ``term(builder, values, scalars, accs)`` returns the accs with
    the element's terms added, for vectors and for scalars alike; one sum is returned as a
    number, several as a tuple."""

    def codegen(context, builder, sig, args):
        ret = sig.return_type
        dt = ret.dtype if isinstance(ret, types.UniTuple) else ret
        fty = context.get_value_type(dt)
        width = LANE_BYTES // (dt.bitwidth // 8)
        vty = ir.VectorType(fty, width)
        intp = context.get_value_type(types.intp)
        arrtys = sig.args[:n_arrays]
        rows = [context.make_array(t)(context, builder, v) for t, v in zip(arrtys, args)]
        datas = [r.data for r in rows]
        n = builder.extract_value(rows[0].shape, 0)
        scalars = [
            context.cast(builder, v, t, dt) for t, v in zip(sig.args[n_arrays:], args[n_arrays:])
        ]
        vscalars = [_splat(builder, s, vty) for s in scalars]

        def widen(x, t, ty):
            return x if t.dtype == dt else builder.fpext(x, ty)

        def load(off):
            out = []
            for d, t in zip(datas, arrtys):
                ety = context.get_value_type(t.dtype)
                ptr = builder.bitcast(builder.gep(d, [off]), ir.VectorType(ety, width).as_pointer())
                out.append(widen(builder.load(ptr, align=t.dtype.bitwidth // 8), t, vty))
            return out

        def add_terms(cells, values, scalars):
            new = term(builder, values, scalars, [builder.load(c) for c in cells])
            for c, v in zip(cells, new):
                builder.store(v, c)

        zero = ir.Constant(vty, [ir.Constant(fty, 0.0)] * width)
        accs = [  # accs[u][k]: partial sum u of sum k
            [cgutils.alloca_once_value(builder, zero) for _ in range(n_sums)] for _ in range(UNROLL)
        ]
        block = ir.Constant(intp, UNROLL * width)
        nblocks = builder.udiv(n, block)
        with cgutils.for_range(builder, nblocks) as loop:
            base = builder.mul(loop.index, block)
            for u in range(UNROLL):
                add_terms(accs[u], load(builder.add(base, ir.Constant(intp, u * width))), vscalars)
        done = builder.mul(nblocks, block)
        w = ir.Constant(intp, width)
        nvec = builder.udiv(builder.sub(n, done), w)
        with cgutils.for_range(builder, nvec) as loop:
            add_terms(accs[0], load(builder.add(done, builder.mul(loop.index, w))), vscalars)
        tails = [cgutils.alloca_once_value(builder, ir.Constant(fty, 0.0)) for _ in range(n_sums)]
        start = builder.add(done, builder.mul(nvec, w))
        one = ir.Constant(intp, 1)
        with cgutils.for_range_slice(builder, start, n, one, intp=intp) as (j, _):
            vals = [widen(builder.load(builder.gep(d, [j])), t, fty) for d, t in zip(datas, arrtys)]
            add_terms(tails, vals, scalars)
        sums = []
        for k in range(n_sums):
            v = [builder.load(accs[u][k]) for u in range(UNROLL)]
            while len(v) > 1:  # partial sums pairwise
                v = [builder.fadd(v[i], v[i + 1]) for i in range(0, len(v), 2)]
            v = v[0]
            half = width
            while half > 1:  # lanes halved
                half //= 2
                lo = builder.shuffle_vector(v, v, _mask(0, half))
                hi = builder.shuffle_vector(v, v, _mask(half, 2 * half))
                v = builder.fadd(lo, hi)
            first = builder.extract_element(v, ir.Constant(ir.IntType(32), 0))
            sums.append(builder.fadd(first, builder.load(tails[k])))
        return sums[0] if n_sums == 1 else context.make_tuple(builder, ret, sums)

    return codegen


def _fma(builder, x, y, z):
    """x·y + z rounded once (llvm.fma, on scalars and vectors alike)."""
    t = x.type
    suffix = (
        f"v{t.count}{t.element.intrinsic_name}"
        if isinstance(t, ir.VectorType)
        else t.intrinsic_name
    )
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(t, [t, t, t]), f"llvm.fma.{suffix}"
    )
    return builder.call(fn, [x, y, z])


def _mask(lo, hi):
    """The shuffle mask picking lanes lo..hi-1."""
    return ir.Constant(ir.VectorType(ir.IntType(32), hi - lo), list(range(lo, hi)))


def _splat(builder, x, vty):
    """The vector <W x float> of W copies of x."""
    v = ir.Constant(vty, ir.Undefined)
    for i in range(vty.count):
        v = builder.insert_element(v, x, ir.Constant(ir.IntType(32), i))
    return v


@intrinsic
def rsum(typingctx, a):
    """Σ a[j] over a 1-D C-contiguous float row, in the fixed vector order above."""
    dt = _row_types([a], [])
    if dt is None:
        return None
    return dt(a), _lanes(1, lambda bl, x, s, acc: [bl.fadd(acc[0], x[0])])


@intrinsic
def rdot(typingctx, a, b):
    """Σ a[j]·b[j] (each product fused into the partial sum: one rounding)."""
    dt = _row_types([a, b], [])
    if dt is None:
        return None
    return dt(a, b), _lanes(2, lambda bl, x, s, acc: [_fma(bl, x[0], x[1], acc[0])])


@intrinsic
def rsqdev(typingctx, a, m):
    """Σ (a[j] - m)² (a row's variance times its length, around its mean m)."""
    dt = _row_types([a], [m])
    if dt is None:
        return None

    def term(bl, x, s, acc):
        d = bl.fsub(x[0], s[0])
        return [_fma(bl, d, d, acc[0])]

    return dt(a, m), _lanes(1, term)


@intrinsic
def rdot2dev(typingctx, a, b, c, m):
    """(Σ ĝ, Σ ĝ·(c[j] - m)) with ĝ = a[j]·b[j] rounded, in one pass: LayerNorm backward's
    row sums (a = g, b = w, c = x, m = the row's mean)."""
    dt = _row_types([a, b, c], [m])
    if dt is None:
        return None

    def term(bl, x, s, acc):
        gh = bl.fmul(x[0], x[1])
        return [bl.fadd(acc[0], gh), _fma(bl, gh, bl.fsub(x[2], s[0]), acc[1])]

    return types.UniTuple(dt, 2)(a, b, c, m), _lanes(3, term, n_sums=2)
