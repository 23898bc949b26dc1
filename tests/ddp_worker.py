"""A data-parallel training script in nanoGPT's style, written as for torchrun (not a test
module): tests/test_ddp.py runs it as one process and under
``python -m tensorgrad.distributed.run --nproc_per_node 2``; both must log the same losses.

    python tests/ddp_worker.py OUT.json

The global batch of each iteration is MICRO micro-batches, drawn from a fixed seed; a run of
N ranks takes micro-batches rank, rank + N, ... with ``gradient_accumulation_steps //= N``.
Even iterations sync through ``require_backward_grad_sync`` (as nanoGPT), odd ones through
``no_sync()``. Rank 0 writes the losses, the final weights and the all-reduce count.
"""

import json
import os
import sys
from contextlib import nullcontext

import numpy as np

# ruff: noqa: PLR0402  (written as PyTorch code is)
import tensorgrad as torch  # the only lines that differ from PyTorch code
import tensorgrad.nn as nn
from tensorgrad.distributed import ReduceOp, all_reduce, destroy_process_group, init_process_group
from tensorgrad.nn import functional as F
from tensorgrad.nn.parallel import DistributedDataParallel as DDP

VOCAB, BLOCK, MICRO, BATCH, ITERS = 13, 8, 4, 3, 6


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, 16)
        self.wpe = nn.Embedding(BLOCK, 16)
        self.ln = nn.LayerNorm(16)
        self.head = nn.Linear(16, VOCAB)

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1))
        x = self.ln(F.gelu(self.wte(idx) + self.wpe(pos)))  # (B, T, C)
        logits = self.head(x)
        return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def batch(it, micro):
    rng = np.random.default_rng(1000 * it + micro)
    data = rng.integers(0, VOCAB, size=(BATCH, BLOCK + 1))
    return torch.tensor(data[:, :-1].copy()), torch.tensor(data[:, 1:].copy())


def main(out_path):
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        init_process_group(backend="gloo")
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        assert int(os.environ["LOCAL_RANK"]) == rank
    else:
        rank, world = 0, 1
    steps = MICRO // world
    torch.manual_seed(1337 + rank)  # different on each rank: DDP copies rank 0's weights
    torch.cuda.manual_seed_all(1337 + rank)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if ddp:
        model = DDP(model, device_ids=[rank])
    raw = model.module if ddp else model
    losses = []
    for it in range(ITERS):
        total = torch.zeros(1)
        for k in range(steps):
            last = k == steps - 1
            sync = nullcontext()
            if ddp and it % 2 == 0:
                model.require_backward_grad_sync = last
            elif ddp and not last:
                sync = model.no_sync()
            with sync:
                _, loss = model(*batch(it, rank + k * world))
                loss = loss / MICRO * world
                loss.backward()
            total = total + loss.detach() / world
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ddp:
            all_reduce(total, op=ReduceOp.SUM)
        losses.append(total.item())
    if rank == 0:
        weights = {k: v.numpy().ravel().tolist() for k, v in raw.state_dict().items()}
        reductions = model.reducer.reductions if ddp else 0
        with open(out_path, "w") as f:
            json.dump({"losses": losses, "weights": weights, "reductions": reductions}, f)
    if ddp:
        destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
