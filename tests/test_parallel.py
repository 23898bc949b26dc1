"""Chunked, threaded CPU passes give the same numbers as one pass over the whole array."""

import numpy as np
import pytest

import tensorgrad as tg
import tensorgrad.functional as F
from tensorgrad.kernels import chunks as parallel

rng = np.random.default_rng(0)
X = rng.standard_normal((5, 7, 24)).astype(np.float32)
W, B = rng.standard_normal(24).astype(np.float32), rng.standard_normal(24).astype(np.float32)
Q, K, V = (rng.standard_normal((2, 3, 9, 8)).astype(np.float32) for _ in range(3))
T = rng.integers(0, 24, 35)

CASES = {
    "gelu": lambda: F.gelu(tg.tensor(X, requires_grad=True), "tanh"),
    "layer_norm": lambda: F.layer_norm(
        tg.tensor(X, requires_grad=True),
        24,
        tg.tensor(W, requires_grad=True),
        tg.tensor(B, requires_grad=True),
    ),
    "softmax": lambda: F.softmax(tg.tensor(X, requires_grad=True), dim=-1),
    "cross_entropy": lambda: F.cross_entropy(tg.tensor(X.reshape(35, 24), requires_grad=True), T),
    "attention": lambda: F.scaled_dot_product_attention(
        tg.tensor(Q, requires_grad=True),
        tg.tensor(K, requires_grad=True),
        tg.tensor(V, requires_grad=True),
        is_causal=True,
    ),
}


def run(case):
    tg.manual_seed(0)
    out = CASES[case]()
    leaves = [t for t in out.grad_fn.edges if isinstance(t, tg.Tensor)]
    (out * 1.5).sum().backward()
    return [out.detach().numpy()] + [t.grad.numpy() for t in leaves]


@pytest.mark.parametrize("case", sorted(CASES))
def test_chunked_threads_match_one_pass(case, monkeypatch):
    whole = run(case)
    monkeypatch.setattr(parallel, "CHUNK_BYTES", 64)  # many tiny chunks
    monkeypatch.setattr(parallel, "PARALLEL_MIN", 0)  # and always the thread pool
    monkeypatch.setenv("TG_NUM_THREADS", "3")
    assert parallel.n_chunks(35, 24) > 3
    for got, want in zip(run(case), whole):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=case)


def test_malloc_tuning_respects_opt_out(monkeypatch):
    from tensorgrad import backend

    monkeypatch.setenv("TG_MALLOC_TUNING", "0")
    assert backend.tune_cpu_malloc() is False
    monkeypatch.delenv("TG_MALLOC_TUNING")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")  # the user's own setting wins
    assert backend.tune_cpu_malloc() is False
