"""nanoGPT's model.py (the copy in tests/test_compile_patterns.py, imports changed) against
gpt/model.py's stock GPT, both compiled: forward + backward + AdamW per step, alternating in
one process, median ms after 3 warm-up steps. 'nanogpt-unfused' is nanoGPT planned without the
GPT-2 block pattern (what it ran before patterns matched the dataflow).

    python -m benchmarks.nanogpt_compiled char-small 20
    python -m benchmarks.nanogpt_compiled baby 6
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_compile_patterns as ng  # noqa: E402

import tensorgrad as tg  # noqa: E402
from gpt.config import GPTConfig  # noqa: E402
from gpt.model import GPT  # noqa: E402
from tensorgrad.compiler import compiled_forward, patterns  # noqa: E402

shape = sys.argv[1] if len(sys.argv) > 1 else "char-small"
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
L, H, C, T, B = {"char-small": (4, 4, 128, 128, 32), "baby": (6, 6, 384, 256, 8)}[shape]
V = 65
g = np.random.default_rng(0)
x, y = tg.tensor(g.integers(0, V, (B, T))), tg.tensor(g.integers(0, V, (B, T)))


def nano_opt(m):
    ps = [p for p in m.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in ps if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0},
    ]
    return tg.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95))


runs = {}
tg.manual_seed(0)
m = tg.compile(
    GPT(GPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=C, dropout=0.0))
)
runs["gpt/model.py"] = (m, m.configure_optimizers(0.1, 6e-4, (0.9, 0.95)), None)
for name in ("nanogpt", "nanogpt-unfused"):
    tg.manual_seed(0)
    m = tg.compile(ng.GPT(ng.GPTConfig(block_size=T, vocab_size=V, n_layer=L, n_head=H, n_embd=C)))
    without = (
        [p for p in patterns.PATTERNS if p is not patterns.GPT2Block] if "unfused" in name else None
    )
    runs[name] = (m, nano_opt(m), without)


def step(name):
    m, opt, without = runs[name]
    saved = patterns.PATTERNS
    if without is not None:
        patterns.PATTERNS = without
    try:
        t0 = time.perf_counter()
        _, loss = m(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - t0
    finally:
        patterns.PATTERNS = saved


times = {n: [] for n in runs}
for r in range(reps + 3):
    for n in runs:
        t = step(n)
        if r >= 3:
            times[n].append(t)
for n, (m, _, _) in runs.items():
    print(n, compiled_forward(m).summary()["patterns"])
base = np.median(times["gpt/model.py"])
for n, ts in times.items():
    print(
        f"{shape} {n:16s} median {np.median(ts) * 1e3:7.1f} ms  / gpt/model.py {np.median(ts) / base:.3f}"
    )
