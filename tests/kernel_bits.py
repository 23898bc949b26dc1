"""Every CPU numba kernel with a reduction, run once on fixed inputs; prints, as JSON, the
sha256 of each output and gradient, and the numba thread count the kernels ran with (not a
test module: tests/test_kernel_determinism.py runs it at 1, 2 and 4 threads and compares).

    TG_KERNEL_THREADS=n NUMBA_NUM_THREADS=n python tests/kernel_bits.py

PARALLEL_MIN is lowered so that these small inputs take the threaded paths (the kernels' code
is the same at any size; only the size from which threads are used changes). OpenBLAS runs
on the same count in every run (the test sets it to 2), so that only the kernels' own threads
change between runs, with OpenBLAS's threads in play as in a user's run: two cases have strips
whose products OpenBLAS splits over its threads (m·n·k of 2^18 or more), where its AVX2
kernels give other bits on another count.
"""

from __future__ import annotations

import hashlib
import json
import sys

import numba
import numpy as np

import tensorgrad as tg
from tensorgrad import nn
from tensorgrad.compiler import compiled_forward
from tensorgrad.kernels import cpu_gpt2_block as KB
from tensorgrad.kernels import cpu_numba as K
from tensorgrad.kernels import cpu_numba_adamw as KW
from tensorgrad.kernels import cpu_numba_attention as KA
from tensorgrad.kernels import cpu_numba_embedding as KE

THRESHOLD = 1024  # elements from which the kernels use their threads (here)
for module in (K, KA, KW):
    module.PARALLEL_MIN = THRESHOLD
KA.STRIP_BYTES = 8 * 1024  # several query strips at these sizes


out: dict = {}


def keep(name, *arrays):
    for i, a in enumerate(arrays):
        if a is not None:
            a = np.ascontiguousarray(a)
            out[f"{name}[{i}]"] = hashlib.sha256(a.tobytes() + str(a.shape).encode()).hexdigest()


def rng(seed):
    return np.random.default_rng(seed)


def op(cls, *args, seed=0, **kw):
    """Forward and backward of one kernel Op (a fixed upstream gradient)."""
    fn = cls()
    y = fn.forward(*args, **kw)
    ys = y if isinstance(y, tuple) else (y,)
    gs = [
        rng(seed + 100 + i).standard_normal(np.shape(t)).astype(np.float32)
        for i, t in enumerate(ys)
    ]
    g = fn.backward(*gs)
    return (*ys, *(g if isinstance(g, tuple) else (g,)))


f32 = np.float32
x = rng(1).standard_normal((64, 96)).astype(f32) * 3
keep("softmax", *op(K.NumbaSoftmax, x))
keep("log_softmax", *op(K.NumbaLogSoftmax, x))
t = rng(2).integers(0, 96, 64)
t[::7] = -100
fn = K.NumbaCrossEntropy()
loss = fn.forward(x, t)
keep("cross_entropy", loss, *fn.backward(np.asarray(1.0, f32)))
w, b = rng(3).standard_normal(96).astype(f32), rng(4).standard_normal(96).astype(f32)
keep("layer_norm", *op(K.NumbaLayerNorm, x, w, b))
keep("layer_norm_2d", *op(K.NumbaLayerNorm, x.reshape(64, 8, 12), w.reshape(8, 12), None, nd=2))
keep("layer_norm_f64", *op(K.NumbaLayerNorm, x.astype(np.float64), w.astype(np.float64), None))
keep("add_layer_norm", *op(K.NumbaAddLayerNorm, x, x[::-1].copy(), w, b))
keep("gelu", *op(K.NumbaGelu, x))
keep("gelu_erf", *op(K.NumbaGelu, x, approximate="none"))

for mode in ("rows", "heads"):  # the heads over numba's threads, or over Python threads
    KA.THREADS_OVER = mode
    for i, (L, S, E, Ev, causal) in enumerate(
        [(64, 64, 16, 16, True), (24, 24, 16, 16, True), (20, 48, 8, 8, False)]
    ):
        q = rng(10 + i).standard_normal((2, 3, L, E)).astype(f32)
        k = rng(20 + i).standard_normal((2, 3, S, E)).astype(f32)
        v = rng(30 + i).standard_normal((2, 3, S, Ev)).astype(f32)
        keep(f"attention_{mode}_{i}", *op(KA.NumbaFlashAttention, q, k, v, None, is_causal=causal))


def block_params(C, seed):
    """A GPT-2 block's twelve parameters at width C."""
    shapes = [(C,), (C,), (3 * C, C), (3 * C,), (C, C), (C,), (C,), (C,)]
    shapes += [(4 * C, C), (4 * C,), (C, 4 * C), (C,)]
    return [(rng(seed + j).standard_normal(s) * 0.3).astype(f32) for j, s in enumerate(shapes)]


KA.STRIP_BYTES = 4 << 20  # one strip of 128 queries: GEMMs that OpenBLAS splits over threads
q, k, v = (rng(90 + j).standard_normal((2, 3, 128, 32)).astype(f32) for j in range(3))
keep("attention_big", *op(KA.NumbaFlashAttention, q, k, v, None, is_causal=True))
C, nh = 64, 2
params = block_params(C, 95)
xb = rng(99).standard_normal((3, 128, C)).astype(f32)
keep("gpt2_block_T128", *op(KB.NumbaGPT2Block, xb, *params, n_head=nh))
xb = rng(98).standard_normal((3, 64, C)).astype(f32)  # T <= 2·hs: the probabilities kept
keep("gpt2_block_T64_kept", *op(KB.NumbaGPT2Block, xb, *params, n_head=nh))
KA.STRIP_BYTES = 8 * 1024

for T in (5, 40):  # the short attention (head by head) and the query strips
    C, nh = 32, 2
    params = block_params(C, 40)
    xb = rng(50).standard_normal((4, T, C)).astype(f32)
    keep(f"gpt2_block_T{T}", *op(KB.NumbaGPT2Block, xb, *params, n_head=nh))

ids = rng(60).integers(0, 50, (32, 40))
table = rng(61).standard_normal((50, 64)).astype(f32)
keep("embedding", *op(KE.NumbaEmbedding, table, ids))

hp = {"lr": 1e-3, "b1": 0.9, "b2": 0.95, "eps": 1e-8, "wd": 0.1, "step": 3}
xs = [rng(70 + j).standard_normal(n).astype(f32) for j, n in enumerate([5000, 300, 17, 2048])]
gs = [rng(80 + j).standard_normal(a.size).astype(f32) for j, a in enumerate(xs)]
ms, vs = [np.zeros_like(a) + 0.1 for a in xs], [np.zeros_like(a) + 0.2 for a in xs]
KW.numba_adamw_update(xs[0], gs[0], ms[0], vs[0], **hp)
KW.numba_adamw_foreach(xs, gs, ms, vs, [hp] * len(xs))
keep("adamw", *xs, *ms, *vs)


class Fusible(nn.Module):
    """Elementwise runs that compile fuses: a bias and scale around tanh (their gradients
    summed over the rows in partial sums), and a residual add into RMSNorm (a row program)."""

    def __init__(self, C):
        super().__init__()
        self.b = nn.Parameter(tg.tensor(rng(90).standard_normal(C).astype(f32)))
        self.w = nn.Parameter(tg.tensor(rng(91).standard_normal(C).astype(f32)))

    def forward(self, x, r):
        s = (x + self.b).tanh() * self.w + r
        return s * (s.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt() * self.w


model = tg.compile(Fusible(128))
for i in range(3):  # traced twice, then replayed (the traced calls return replays too)
    xf = tg.tensor(rng(92).standard_normal((2, 128, 128)).astype(f32), requires_grad=True)
    rf = tg.tensor(rng(93).standard_normal((2, 128, 128)).astype(f32), requires_grad=True)
    for p in model.parameters():
        p.grad = None
    y = model(xf, rf)
    (y * tg.tensor(rng(94).standard_normal(y.shape).astype(f32))).sum().backward()
keep(
    "fused",
    y.detach().numpy(),
    xf.grad.numpy(),
    rf.grad.numpy(),
    model.b.grad.numpy(),
    model.w.grad.numpy(),
)
fused = compiled_forward(model).summary()["fused"]

with K.threads_for(THRESHOLD):
    threads = numba.get_num_threads()
counts = tg.kernels.compile_counts()  # compiled here, or loaded from numba's cache
json.dump({"threads": threads, "fused": fused, "hashes": out, "counts": counts}, sys.stdout)
