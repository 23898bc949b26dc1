"""What each rank runs in tests/test_zero_optimizer.py (started by mpiexec; not a test module),
and the recipe both sides share: the parameters, the gradients, the optimizer, the steps.

    mpiexec -n 2 python tests/zero_worker.py OUT_DIR

Each rank trains 7 parameters in two groups (llm.c's way: the decayed group in the
constructor, the other through add_param_group) for STEPS steps of ZeroRedundancyOptimizer
over AdamW on gradients averaged over the ranks, then writes OUT_DIR/rank<r>.json (the indices
and sizes of the state it holds) and OUT_DIR/params5.<r>.npz; rank 0 saves the consolidated
state dict to OUT_DIR/state.pt. Then every rank builds a fresh optimizer, loads that file,
takes MORE steps and writes OUT_DIR/params7.<r>.npz.
"""

import json
import sys
from pathlib import Path

import numpy as np

import tensorgrad as tg
import tensorgrad.distributed as dist
from tensorgrad.distributed.optim import ZeroRedundancyOptimizer

# group 0 (decayed), then group 1; 2 ranks partition them greedily, largest first:
# rank 0 owns 0, 2, 4, 6 (2181 elements), rank 1 owns 1, 3, 5 (2197)
SHAPES = [(64, 32), (48, 40), (100,), (16, 16), (32,), (7, 3), (1,)]
DECAYED = 4
STEPS, MORE, LR = 5, 2, 1e-2


def initial() -> list[np.ndarray]:
    rngs = [np.random.default_rng([1, i]) for i in range(len(SHAPES))]
    return [rng.standard_normal(s).astype(np.float32) for rng, s in zip(rngs, SHAPES)]


def grad(k: int, rank: int, i: int) -> np.ndarray:
    """Rank ``rank``'s gradient of parameter i at step k."""
    return np.random.default_rng([2, k, rank, i]).standard_normal(SHAPES[i]).astype(np.float32)


def mean_grad(k: int, i: int, n: int) -> np.ndarray:
    """The gradients of n ranks averaged in one process, as all_reduce(op='mean') does."""
    g = grad(k, 0, i)
    for r in range(1, n):
        g = g + grad(k, r, i)
    return g * np.float32(1.0 / n)


def build(params, zero: bool):
    """AdamW over the two groups, sharded (ZeroRedundancyOptimizer) or plain."""
    if zero:
        opt = ZeroRedundancyOptimizer(
            params[:DECAYED], optimizer_class=tg.optim.AdamW, lr=LR, weight_decay=0.1
        )
    else:
        opt = tg.optim.AdamW(params[:DECAYED], lr=LR, weight_decay=0.1)
    opt.add_param_group({"params": params[DECAYED:], "weight_decay": 0.0})
    return opt


def train(opt, params, steps, grads) -> None:
    """Steps ``steps`` with ``grads(k, i)``; lr changes through param_groups, as a scheduler."""
    for k in steps:
        for group in opt.param_groups:
            group["lr"] = LR * (1 + k) / (STEPS + MORE)
        for i, p in enumerate(params):
            p.grad = tg.tensor(grads(k, i))
        opt.step()
        opt.zero_grad()


def main(out: Path) -> None:
    n = dist.init()
    r = dist.rank()

    def grads(k, i):
        return dist.all_reduce(grad(k, r, i), op="mean")

    params = [tg.nn.Parameter(a) for a in initial()]
    opt = build(params, zero=True)
    train(opt, params, range(STEPS), grads)
    index = {id(p): i for i, p in enumerate(params)}
    held = {index[id(p)]: st["exp_avg"].size for p, st in opt.optim.state.items()}
    res = {"world": n, "held": held}
    opt.consolidate_state_dict(to=0)
    if r == 0:
        tg.save(opt.state_dict(), out / "state.pt")
    else:
        try:
            opt.state_dict()
        except RuntimeError as e:
            res["error"] = str(e)
    np.savez(out / f"params5.{r}.npz", *[p.array for p in params])
    dist.barrier()  # state.pt is written

    again = [tg.nn.Parameter(p.array.copy()) for p in params]
    opt = build(again, zero=True)
    opt.load_state_dict(tg.load(out / "state.pt"))
    train(opt, again, range(STEPS, STEPS + MORE), grads)
    np.savez(out / f"params7.{r}.npz", *[p.array for p in again])
    (out / f"rank{r}.json").write_text(json.dumps(res))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
