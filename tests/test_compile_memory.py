"""Tracing costs no more memory than an eager call: the first two calls of a compiled model
run eagerly while the trace records them, and the trace holds the values it numbers weakly,
so an intermediate no later op reads is freed as in eager mode (it was held until the trace
ended: at gpt2-124M with T 1024 the first step peaked at 2.4x PyTorch's memory).

Memory is counted with tracemalloc, which NumPy reports its buffers to: bytes, not time.
"""

from __future__ import annotations

import gc
import tracemalloc
import weakref

import numpy as np

import tensorgrad as tg
import tensorgrad.nn as nn
from gpt.config import GPTConfig
from gpt.model import GPT


def forward_peak(model, *args) -> int:
    """Bytes allocated at the forward's peak beyond what was held before it."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = model(*args)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    del out
    return peak


class Chain(nn.Module):
    """Eight steps in a row on 16 MB arrays, each read once: eager mode holds two or three at
    a time, a trace that held its values would hold all 24."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(tg.ones(2048, 2048))

    def forward(self, x):
        for _ in range(8):
            x = (x * self.w).relu() - 0.25
        return x.sum()


def test_a_traced_call_frees_what_no_later_op_reads():
    x = tg.ones(2048, 2048)
    with tg.no_grad():  # no backward: nothing is saved for it, eagerly or traced
        eager = forward_peak(Chain(), x)
        warm = tg.compile(Chain())  # (the compiler's first use imports modules: not counted)
        warm(x), warm(x)
        compiled = tg.compile(Chain())
        traced = [forward_peak(compiled, x) for _ in range(2)]
    assert eager < 4 * 16 << 20
    for peak in traced:  # less than one array above eager (holding them all: 384 MB)
        assert peak <= eager + (12 << 20), (eager, traced)


def test_the_gpts_traced_steps_peak_no_higher_than_an_eager_step():
    cfg = GPTConfig(n_layer=3, n_head=4, n_embd=32, block_size=256, vocab_size=64, dropout=0.0)
    x = tg.tensor(np.random.default_rng(0).integers(0, 64, (2, 256)))
    tg.manual_seed(0)
    eager = GPT(cfg)
    forward_peak(eager, x, x)  # (the first call makes the causal mask, kept)
    want = forward_peak(eager, x, x)
    tg.manual_seed(0)
    compiled = tg.compile(GPT(cfg))  # (the compiler was used by the test above, or not: the
    # imports of its first use are a few MB, within the margin)
    peaks = [forward_peak(compiled, x, x) for _ in range(2)]  # both traced calls
    for peak in peaks:
        assert peak <= 1.15 * want, (want, peaks)


def test_a_finished_trace_is_freed_at_once(monkeypatch):
    """The trace's weak references call back into it through a weak reference: no cycle keeps
    a finished trace (its inputs, constants and code) until the cycle collector runs."""
    from tensorgrad.compiler import trace

    made = []
    init = trace.Tracer.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    monkeypatch.setattr(trace.Tracer, "__init__", recording)
    model, x = tg.compile(nn.Linear(4, 4)), tg.ones(2, 4)
    gc.collect()
    gc.disable()
    try:
        for _ in range(3):
            model(x)
        alive = [r() is not None for r in made]
    finally:
        gc.enable()
    assert len(made) == 2 and not any(alive)
