"""The compiler's pipeline: the passes a traced forward goes through, in order.

1. **Trace** (trace.py): the forward runs eagerly while the op observer records a ``Step``
   per op into a ``Graph`` (each step's reference Op, the class that ran it, its inputs).
2. **Guards** (guards.py): the call's signature and the Python state the traced code read,
   checked before each replay; a second trace must equal the first.
3. **Composites** (patterns.py): windows of ops that an existing kernel computes as one op
   (the GPT-2 block, causal attention, a GELU written out, a residual add and its
   LayerNorm) become one step each.
4. **Fused runs** (schedule.py, codegen.py, fused_op.py): runs of elementwise steps (and a
   last-axis reduction among them) become one step each, a generated numba kernel each way.
5. **Replay** (replay.py): later calls run the plan's steps as one graph node.

``plan`` makes steps 3 and 4: the graph's plan, the list of steps replay runs. Without
numba, or with ``TG_KERNELS=0``, nothing is fused; on another device than the CPU nothing
is replaced and the traced ops replay as they are.

Imports: .patterns, .schedule, .trace, ..kernels.
"""

from __future__ import annotations

from .. import kernels
from .patterns import match_composites
from .schedule import fuse_runs
from .trace import Graph


def plan(graph: Graph, fold=None) -> list:
    """The steps replay runs: composites as their kernels, then elementwise runs fused
    (``fold``: patterns.Fold, the values known now, a mask read from a buffer)."""
    steps = list(graph.steps)
    if not kernels.is_enabled() or graph.device != "cpu":
        return steps
    steps = match_composites(graph, steps, fold=fold)
    return fuse_runs(graph, steps) if _have_numba() else steps


def _have_numba() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True
