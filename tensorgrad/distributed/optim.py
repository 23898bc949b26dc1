"""``ZeroRedundancyOptimizer``: ZeRO stage 1, the optimizer state sharded over the ranks, as
``torch.distributed.optim.ZeroRedundancyOptimizer``.

    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=tg.optim.AdamW, lr=3e-4)
    loss.backward()                 # gradients averaged over the ranks (DDP), as usual
    opt.step()                      # this rank's share updated, then every parameter broadcast
    opt.consolidate_state_dict(to=0)                 # a collective: every rank calls it
    if rank == 0: tg.save(opt.state_dict(), path)    # the whole state, as the plain optimizer's

Each rank owns a partition of the parameters (PyTorch's: in each group, largest first, each to
the rank with the fewest elements so far) and a local ``optimizer_class`` over its partition
only, so it keeps the state (AdamW's two moments) of about 1/N of the parameters. ``step()``
runs the local optimizer, then each parameter is broadcast from its owner, so every rank ends
with the same values. ``param_groups`` hold every parameter, as PyTorch's; their
hyperparameters are copied to the local optimizer before each step (a scheduler may change
``lr``) and back after. An update is elementwise, so each parameter gets the very update the
plain optimizer would give it: the parameters are bitwise those of the unsharded optimizer.
One process (no process group, or one rank) owns everything and is the plain optimizer.
``parameters_as_bucket_view`` is accepted and changes nothing here (PyTorch's packing of the
broadcast); ``overlap_with_ddp`` needs DDP communication hooks, which tensorgrad lacks.

Imports: numpy, ..devices, ..distributed, ..optim, ..tensor.
"""

from __future__ import annotations

import numpy as np

from .. import distributed as dist
from ..devices import to_numpy
from ..optim.optimizer import Optimizer
from ..tensor import Tensor


class ZeroRedundancyOptimizer(Optimizer):
    """Wrap ``optimizer_class`` (built with ``**defaults``) so that each rank keeps the state
    of its own partition of ``params`` only."""

    def __init__(
        self,
        params,
        optimizer_class,
        process_group=None,
        parameters_as_bucket_view: bool = False,
        overlap_with_ddp: bool = False,
        **defaults,
    ):
        if process_group is not None:
            raise ValueError("ZeroRedundancyOptimizer: only the world group (None) exists")
        if overlap_with_ddp:
            raise ValueError(
                "ZeroRedundancyOptimizer: overlap_with_ddp=True needs DDP communication hooks, "
                "which tensorgrad does not have; leave it False (the step is then after backward)"
            )
        self.parameters_as_bucket_view = parameters_as_bucket_view
        one = not dist.is_initialized()
        self.rank, self.world_size = (0, 1) if one else (dist.rank(), dist.world_size())
        super().__init__(params, defaults)  # every parameter, in self.param_groups
        self._partition = self._partition_parameters()
        self.optim = optimizer_class(self._partition[self.rank], **defaults)
        _copy_hyperparameters(self.optim.param_groups, self.param_groups)
        self._gathered: dict | None = None  # index -> state, on the rank that consolidated

    def _partition_parameters(self) -> list[list[dict]]:
        """For each rank, its share of every parameter group (possibly empty)."""
        shares = [[] for _ in range(self.world_size)]
        sizes = [0] * self.world_size  # elements owned so far, over all groups
        for group in self.param_groups:
            mine = [[] for _ in range(self.world_size)]
            for p in sorted(group["params"], key=lambda p: p.numel(), reverse=True):
                r = sizes.index(min(sizes))
                mine[r].append(p)
                sizes[r] += p.numel()
            for r in range(self.world_size):
                shares[r].append(dict(group, params=mine[r]))
        return shares

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        if hasattr(self, "optim"):  # after __init__: the earlier groups keep their owners
            self._partition = self._partition_parameters()
            self.optim.add_param_group(self._partition[self.rank][-1])
            _copy_hyperparameters(self.optim.param_groups[-1:], self.param_groups[-1:])

    def step(self) -> None:
        """Update this rank's partition, then copy each parameter from its owner to all."""
        _copy_hyperparameters(self.param_groups, self.optim.param_groups)
        self.optim.step()
        _copy_hyperparameters(self.optim.param_groups, self.param_groups)
        if self.world_size > 1:
            for owner, groups in enumerate(self._partition):
                for group in groups:
                    for p in group["params"]:
                        dist.broadcast(p, src=owner)

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's share of the state on rank ``to``, as NumPy arrays (a
        collective: every rank calls it); ``state_dict()`` there returns this snapshot. Only
        broadcasts exist, so every rank receives each share (as PyTorch does)."""
        _copy_hyperparameters(self.param_groups, self.optim.param_groups)
        self._gathered = {} if self.rank == to else None
        for r in range(self.world_size):
            if r == to:  # rank `to` keeps its own share without a message
                if r == self.rank:
                    self._gathered.update(self._own_state())
                continue
            sent = self._own_state() if r == self.rank else {}
            # rank r says what it holds (JSON: scalars, and each array's dtype and shape),
            # then sends the arrays in that order
            plan = dist.broadcast_json({i: _layout(st) for i, st in sent.items()}, root=r)
            for i, layout in plan.items():
                st = {}
                for k, v in layout.items():
                    if isinstance(v, dict):
                        a = sent[int(i)][k] if r == self.rank else np.empty(v["shape"], v["dtype"])
                        v = dist.broadcast(a, src=r)
                    st[k] = v
                if self._gathered is not None:
                    self._gathered[int(i)] = st

    def _own_state(self) -> dict:
        """{global index: state with NumPy copies of its arrays} of this rank's partition."""
        index = {id(p): i for i, p in enumerate(self._params())}
        return {
            index[id(p)]: {
                k: np.array(to_numpy(v), order="C") if hasattr(v, "shape") else v
                for k, v in self.optim.state[p].items()
            }
            for group in self._partition[self.rank]
            for p in group["params"]
            if p in self.optim.state
        }

    def state_dict(self) -> dict:
        """The whole optimizer's state dict, as the plain optimizer's (global indices), on
        the rank that called ``consolidate_state_dict``; elsewhere a RuntimeError."""
        if self._gathered is None:
            raise RuntimeError(
                "Optimizer state has not been consolidated on this rank. Please call "
                f"`consolidate_state_dict(to={self.rank})` on all ranks beforehand if you "
                "meant to save the global state."
            )
        sd = super().state_dict()  # hyperparameters and indices; the state is in the shards
        sd["state"] = {
            i: {k: Tensor(v, dtype=v.dtype) if hasattr(v, "shape") else v for k, v in st.items()}
            for i, st in sorted(self._gathered.items())
        }
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a whole state dict (every rank passes the same): each rank keeps the state of
        its own partition, and every group's hyperparameters."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups) or any(
            len(a["params"]) != len(b["params"]) for a, b in zip(groups, self.param_groups)
        ):
            raise ValueError("ZeroRedundancyOptimizer.load_state_dict: parameter groups differ")
        index = {id(p): i for i, p in enumerate(self._params())}
        saved = {int(i): st for i, st in state_dict["state"].items()}
        local_groups, mine = [], []  # as the local optimizer numbers its own parameters
        for saved_group, share in zip(groups, self._partition[self.rank]):
            start = len(mine)
            mine += [index[id(p)] for p in share["params"]]
            local_groups.append(dict(saved_group, params=list(range(start, len(mine)))))
        local_state = {j: saved[i] for j, i in enumerate(mine) if i in saved}
        self.optim.load_state_dict({"param_groups": local_groups, "state": local_state})
        _copy_hyperparameters(self.optim.param_groups, self.param_groups)


def _copy_hyperparameters(src: list[dict], dst: list[dict]) -> None:
    for s, d in zip(src, dst):
        d.update({k: v for k, v in s.items() if k != "params"})


def _layout(state: dict) -> dict:
    """A parameter's state for JSON: scalars as they are, arrays as their dtype and shape."""
    return {
        k: {"dtype": v.dtype.str, "shape": list(v.shape)} if hasattr(v, "shape") else v
        for k, v in state.items()
    }


__all__ = ["ZeroRedundancyOptimizer"]
