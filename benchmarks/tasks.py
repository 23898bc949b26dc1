"""The measurements, one framework per process (run by benchmarks.run through benchmarks.worker).

Each task builds what it measures inside its own process, so that the two frameworks'
thread pools never compete (OpenBLAS and OpenMP threads that spin after a call slow the
other framework down by up to 10x when both live in one process) and so that the resident
set of one framework's step is measured alone. The PyTorch twin always starts from the
weights of the identically seeded tensorgrad model, so both do the same arithmetic.
"""

from __future__ import annotations

import time

import numpy as np

from .common import SHAPES, gpt_config, measure, peak_growth, proc_status

TG, TORCH = "tensorgrad", "torch"


def _tg_model(cfg):
    """gpt-train's model: the GPT, compiled (its default; the first two steps trace)."""
    import tensorgrad as tg
    from gpt.model import GPT

    tg.manual_seed(0)
    return tg.compile(GPT(cfg))


def _torch_model(cfg, src=None):
    """The PyTorch twin holding the weights of ``src`` (by default a fresh seeded GPT)."""
    from .torch_gpt import TorchGPT, load_tensorgrad_state

    model = TorchGPT(cfg)
    load_tensorgrad_state(model, src if src is not None else _tg_model(cfg))
    return model


def _batch(B: int, T: int, V: int):
    g = np.random.default_rng(1234)
    return g.integers(0, V, (B, T), dtype=np.int64), g.integers(0, V, (B, T), dtype=np.int64)


# ----------------------------------------------------------------------------- GEMM peak
def gemm(fw: str, sizes=(2048, 4096), reps: int = 5) -> dict:
    """float32 n×n @ n×n in GFLOP/s (2·n³ FLOPs) for each n."""
    out = {}
    for n in sizes:
        g = np.random.default_rng(0)
        a = g.standard_normal((n, n), dtype=np.float32)
        b = g.standard_normal((n, n), dtype=np.float32)
        if fw == TORCH:
            import torch

            a, b = torch.from_numpy(a), torch.from_numpy(b)
        m = measure(lambda a=a, b=b: a @ b, reps, warmup=1)
        out[str(n)] = dict(m, gflops=2 * n**3 / m["median_s"] / 1e9)
    return out


# ----------------------------------------------------------------------------- training step
def train(fw: str, shape: str, reps: int, settle: int = 0) -> dict:
    """Forward + backward + AdamW step of one GPT: median time, its phases, the first losses.
    ``settle``: untimed steps first (tensorgrad's thread governor measures over its first)."""
    L, H, C, T, B, V = SHAPES[shape]
    cfg = gpt_config(shape, T, T)
    t = time.perf_counter()
    model, opt, flops = _build(fw, cfg, [T])
    build_s = time.perf_counter() - t
    x, y = _batch(B, T, V)
    if fw == TORCH:
        import torch

        x, y = torch.from_numpy(x), torch.from_numpy(y)
    phases, losses = [], []  # (forward, backward, optimizer) seconds of each step

    def step():
        t0 = time.perf_counter()
        _, loss = model(x, y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad()  # set_to_none in both frameworks
        phases.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
        losses.append(float(loss.item()))

    t = time.perf_counter()
    step()  # the first step also allocates AdamW's moments
    first_s = time.perf_counter() - t
    step()
    for _ in range(settle):
        step()
    # a repetition is at least 0.3 s of steps (one step at the larger sizes): a tiny model's
    # single 5 ms step is at the mercy of the VM's scheduler, in both frameworks alike
    m = measure(step, reps, warmup=2, min_rep_s=0.3)
    timed = phases[4 + settle :]
    return dict(
        m,
        shape=shape,
        B=B,
        T=T,
        n_layer=L,
        n_head=H,
        n_embd=C,
        vocab_size=V,
        flops_per_token=flops[T],
        build_s=build_s,
        first_step_s=first_s,
        loss0=losses[0],
        loss1=losses[1],
        fwd_s=float(np.median([p[0] for p in timed])),
        bwd_s=float(np.median([p[1] for p in timed])),
        opt_s=float(np.median([p[2] for p in timed])),
    )


def _stepper(fw, model, opt, B, T, V):
    x, y = _batch(B, T, V)
    if fw == TORCH:
        import torch

        x, y = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return step


def _build(fw, cfg, Ts=()):
    """Model, its AdamW (as configure_optimizers) and {T: training FLOPs per token}."""
    model = _tg_model(cfg)
    flops = {T: model.estimate_flops_per_token(T) for T in Ts}
    if fw == TORCH:
        model = _torch_model(cfg, model)  # the tensorgrad model is freed here
    return model, model.configure_optimizers(0.1, 6e-4, (0.9, 0.95)), flops


def scaling(fw: str, shape: str, B: int, Ts: list, reps: int) -> dict:
    """Step time against sequence length T for one model (block_size = max T)."""
    V = SHAPES[shape][5]
    cfg = gpt_config(shape, max(Ts), max(Ts))
    model, opt, flops = _build(fw, cfg, Ts)
    out = {}
    for T in Ts:
        step = _stepper(fw, model, opt, B, T, V)
        m = measure(step, reps, warmup=2)  # (a compiled model traces its first two steps)
        out[str(T)] = dict(m, T=T, B=B, flops_per_token=flops[T])
    return out


def memory(fw: str, shape: str, configs: list) -> dict:
    """Resident memory of training steps, one (B, T) after another in this process.

    Meant to run with MALLOC_MMAP_THRESHOLD_=65536, so that every freed array goes back to
    the OS and the resident set follows live memory. Per (B, T): one warm-up step, then the
    peak growth of the next step above the resident set just before it (parameters and
    AdamW moments): activations, gradients and temporaries.
    """
    rss_import = proc_status()["VmRSS"]
    cfg = gpt_config(shape, max(T for _, T in configs), max(T for _, T in configs))
    model, opt, _ = _build(fw, cfg)
    rss_model = proc_status()["VmRSS"]
    out = {"rss_import_mb": rss_import, "rss_model_mb": rss_model, "steps": {}}
    for B, T in configs:
        step = _stepper(fw, model, opt, B, T, cfg.vocab_size)
        first = peak_growth(step)
        if fw == TG:
            step()  # a compiled model traces its first two steps: measure a replayed one
        m = peak_growth(step)
        m["first_peak_growth_mb"] = first["peak_growth_mb"]
        m["peak_above_import_mb"] = m["peak_mb"] - rss_import
        out["steps"][f"{B}x{T}"] = dict(m, B=B, T=T)
    return out


# ----------------------------------------------------------------------------- single ops
def _op_specs():
    """(name, shape text, inputs {name: (shape, kind)}, tensorgrad fn, torch fn) per op.

    kind 'f' = float32 input that needs a gradient, 'i<n>' = integer ids in [0, n).
    """
    import tensorgrad.nn.functional as tF

    def tfn():
        import torch.nn.functional as F

        return F

    B, nh, T, hs = 8, 6, 256, 64
    N, V, C = 512, 50304, 768
    return [
        (
            "matmul",
            f"({N},{C})@({C},{4 * C})",
            {"x": ((N, C), "f"), "w": ((C, 4 * C), "f")},
            lambda a: a["x"] @ a["w"],
            lambda a: a["x"] @ a["w"],
        ),
        (
            "linear (+bias)",
            f"({N},{C})·W({4 * C},{C})ᵀ",
            {"x": ((N, C), "f"), "w": ((4 * C, C), "f"), "b": ((4 * C,), "f")},
            lambda a: tF.linear(a["x"], a["w"], a["b"]),
            lambda a: tfn().linear(a["x"], a["w"], a["b"]),
        ),
        (
            "linear lm_head",
            f"({N},{C})·W({V},{C})ᵀ",
            {"x": ((N, C), "f"), "w": ((V, C), "f")},
            lambda a: tF.linear(a["x"], a["w"]),
            lambda a: tfn().linear(a["x"], a["w"]),
        ),
        (
            "batched matmul",
            f"({B},{nh},{T},{hs})@({B},{nh},{hs},{T})",
            {"x": ((B, nh, T, hs), "f"), "y": ((B, nh, hs, T), "f")},
            lambda a: a["x"] @ a["y"],
            lambda a: a["x"] @ a["y"],
        ),
        (
            "softmax",
            f"({B},{nh},{T},{T}) dim -1",
            {"x": ((B, nh, T, T), "f")},
            lambda a: tF.softmax(a["x"], dim=-1),
            lambda a: tfn().softmax(a["x"], dim=-1),
        ),
        (
            "log_softmax",
            f"({N},{V})",
            {"x": ((N, V), "f")},
            lambda a: tF.log_softmax(a["x"], dim=-1),
            lambda a: tfn().log_softmax(a["x"], dim=-1),
        ),
        (
            "cross_entropy",
            f"({N},{V}) logits",
            {"x": ((N, V), "f"), "t": ((N,), f"i{V}")},
            lambda a: tF.cross_entropy(a["x"], a["t"]),
            lambda a: tfn().cross_entropy(a["x"], a["t"]),
        ),
        (
            "layer_norm",
            f"({N},{C})",
            {"x": ((N, C), "f"), "w": ((C,), "f"), "b": ((C,), "f")},
            lambda a: tF.layer_norm(a["x"], C, a["w"], a["b"]),
            lambda a: tfn().layer_norm(a["x"], (C,), a["w"], a["b"]),
        ),
        (
            "gelu (tanh)",
            f"({N},{4 * C})",
            {"x": ((N, 4 * C), "f")},
            lambda a: tF.gelu(a["x"], approximate="tanh"),
            lambda a: tfn().gelu(a["x"], approximate="tanh"),
        ),
        (
            "embedding",
            f"W({V},{C}), {N} ids",
            {"w": ((V, C), "f"), "i": ((2, N // 2), f"i{V}")},
            lambda a: tF.embedding(a["i"], a["w"]),
            lambda a: tfn().embedding(a["i"], a["w"]),
        ),
        (
            "sdpa (causal)",
            f"q,k,v ({B},{nh},{T},{hs})",
            {"q": ((B, nh, T, hs), "f"), "k": ((B, nh, T, hs), "f"), "v": ((B, nh, T, hs), "f")},
            lambda a: tF.scaled_dot_product_attention(a["q"], a["k"], a["v"], is_causal=True),
            lambda a: tfn().scaled_dot_product_attention(a["q"], a["k"], a["v"], is_causal=True),
        ),
        (
            "add (residual)",
            f"(2,{T},{C}) + (2,{T},{C})",
            {"x": ((2, T, C), "f"), "y": ((2, T, C), "f")},
            lambda a: a["x"] + a["y"],
            lambda a: a["x"] + a["y"],
        ),
    ]


def _make_inputs(spec_inputs, fw):
    g = np.random.default_rng(0)
    arrays = {}
    for name, (shape, kind) in spec_inputs.items():
        if kind == "f":
            arrays[name] = g.standard_normal(shape, dtype=np.float32)
        else:
            arrays[name] = g.integers(0, int(kind[1:]), shape, dtype=np.int64)
    if fw == TORCH:
        import torch

        return {
            k: (torch.from_numpy(v).requires_grad_(v.dtype == np.float32))
            for k, v in arrays.items()
        }
    import tensorgrad as tg

    return {
        k: (tg.Tensor(v, requires_grad=True, dtype=np.float32) if v.dtype == np.float32 else v)
        for k, v in arrays.items()
    }


def ops(fw: str, reps: int, min_rep_s: float = 0.1, only: list | None = None) -> dict:
    """Forward, and forward + backward (with a fixed random upstream gradient), per op."""
    out = {}
    for name, shape_txt, spec, tg_fn, torch_fn in _op_specs():
        if only and name not in only:
            continue
        fn = torch_fn if fw == TORCH else tg_fn
        out[name] = dict(_time_op(fw, fn, _make_inputs(spec, fw), reps, min_rep_s), shape=shape_txt)
    if not only or "adamw step" in only:
        out["adamw step"] = _adamw(fw, reps)
    return out


def _time_op(fw: str, fn, a: dict, reps: int, min_rep_s: float) -> dict:
    leaves = [v for v in a.values() if getattr(v, "requires_grad", False)]
    y0 = fn(a)
    g = np.random.default_rng(1).standard_normal(tuple(y0.shape), dtype=np.float32)
    if fw == TORCH:
        import torch

        g = torch.from_numpy(g)

    def fwd_bwd():
        y = fn(a)
        if y.ndim == 0:
            y.backward()
        else:
            y.backward(g)
        for v in leaves:
            v.grad = None

    return {
        "fwd": measure(lambda: fn(a), reps, warmup=1, min_rep_s=min_rep_s),
        "fwd_bwd": measure(fwd_bwd, reps, warmup=1, min_rep_s=min_rep_s),
        "out_dtype": str(y0.dtype).replace("torch.", ""),
    }


def _adamw(fw: str, reps: int) -> dict:
    """One AdamW step over gpt2-124M's parameters (grads present), as configure_optimizers."""
    cfg = gpt_config("gpt2-124M")
    if fw == TORCH:
        import torch

        model = _torch_model(cfg)
        opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))
        params = [p for grp in opt.param_groups for p in grp["params"]]
        for p in params:
            p.grad = torch.full_like(p, 1e-3)
    else:
        model = _tg_model(cfg)
        opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))
        import tensorgrad as tg

        params = [p for grp in opt.param_groups for p in grp["params"]]
        for p in params:
            p.grad = tg.Tensor(np.full(p.shape, 1e-3, np.float32))
    n = sum(int(np.prod(p.shape)) for p in params)
    m = measure(opt.step, reps, warmup=1)
    return {
        "shape": f"{n / 1e6:.1f}M params, {len(params)} tensors",
        "fwd": None,
        "fwd_bwd": m,
        "out_dtype": "float32",
    }


# ----------------------------------------------------------------------------- generation
def generate(fw: str, contexts=(64, 128, 256, 512), n_new: int = 8, rounds: int = 2) -> dict:
    """Greedy decoding with and without the KV cache, gpt2-124M, batch 1, ``rounds`` times.

    Per context: prefill_s (the first new token, which runs the whole prompt; best round)
    and decode_s (median time of the later tokens, leaving out those during which other
    processes were busy when enough others remain); tokens/s = 1 / decode_s.
    """
    from .common import NOISY_CORES, _cpu_jiffies, others_cores

    cfg = gpt_config("gpt2-124M", block_size=1024)
    if fw == TORCH:
        import torch

        model = _torch_model(cfg)
        model.eval()

        def stream(prompt, cache):
            return model.generate_stream(torch.from_numpy(prompt), n_new, use_cache=cache)
    else:
        model = _tg_model(cfg)

        def stream(prompt, cache):
            return model.generate_stream(prompt, n_new, temperature=0.0, use_cache=cache)

    g = np.random.default_rng(7)
    for _ in stream(g.integers(0, cfg.vocab_size, (1, 16)), True):  # warm-up
        pass
    out = {}
    for ctx in contexts:
        prompt = g.integers(0, cfg.vocab_size, (1, ctx), dtype=np.int64)
        for cache in (True, False):
            prefill, times, noisy = [], [], []
            for _ in range(rounds):
                j0, t0 = _cpu_jiffies(), time.perf_counter()
                for i, _tok in enumerate(stream(prompt, cache)):
                    t1, j1 = time.perf_counter(), _cpu_jiffies()
                    if i == 0:
                        prefill.append(t1 - t0)
                    else:
                        times.append(t1 - t0)
                        noisy.append(others_cores(j0, j1, t1 - t0))
                    j0, t0 = _cpu_jiffies(), time.perf_counter()
            quiet = [t for t, c in zip(times, noisy) if c <= NOISY_CORES]
            decode = float(np.median(quiet if len(quiet) >= len(times) // 2 else times))
            out[f"{ctx}/{'cache' if cache else 'nocache'}"] = {
                "context": ctx,
                "use_cache": cache,
                "prefill_s": min(prefill),
                "decode_s": decode,
                "tokens_per_s": 1.0 / decode,
                "prefill_times_s": prefill,
                "times_s": times,
                "others_cores": [round(x, 2) for x in noisy],
                "reps_noisy": len(times) - len(quiet),
            }
    return out
