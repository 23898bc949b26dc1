"""Cache-sized chunks on a small thread pool, for the CPU kernels' elementwise passes.

A fused op such as GELU or LayerNorm runs several NumPy passes. Over a whole
activation (megabytes) each pass streams through main memory; over a chunk of
~128 KiB the passes after the first hit the cache, which on its own halves the
time. NumPy releases the GIL inside its loops, so the chunks can also be spread
over threads: ``TG_NUM_THREADS=n`` turns that on. It is off by default because on
the 2-core machine of benchmarks/ it made a training step no faster (BLAS's own
threads are still spinning when the elementwise passes start) and small ops slower.
Small arrays always run inline: a pool only pays off above ``PARALLEL_MIN``.

Imports: concurrent, os.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

CHUNK_BYTES = 1 << 17  # per array per chunk: a few arrays of this size fit in L2
PARALLEL_MIN = 1 << 16  # elements below which threads cost more than they save

_pool: ThreadPoolExecutor | None = None


def num_threads() -> int:
    """Threads for the chunked passes: TG_NUM_THREADS, default 1 (see the module docstring)."""
    return max(1, int(os.environ.get("TG_NUM_THREADS", "1") or 1))


def _get_pool(n: int) -> ThreadPoolExecutor:
    global _pool
    if _pool is None or _pool._max_workers != n:
        _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="tensorgrad")
    return _pool


def n_chunks(n_rows: int, row_elems: int, itemsize: int = 4) -> int:
    """How many chunks ``chunked`` cuts n_rows rows into (for per-chunk partial results)."""
    return -(-n_rows // _rows_per_chunk(row_elems, itemsize)) if n_rows > 0 else 0


def _rows_per_chunk(row_elems: int, itemsize: int) -> int:
    return max(1, CHUNK_BYTES // max(1, row_elems * itemsize))


def chunked(fn, n_rows: int, row_elems: int, itemsize: int = 4, cpu: bool = True) -> None:
    """Call ``fn(i, start, stop)`` for chunk i of the row ranges covering [0, n_rows).

    ``fn`` must write disjoint outputs for disjoint ranges. Rows are grouped so that a
    chunk holds about CHUNK_BYTES per array; the chunks are dealt to the threads in turn.
    With ``cpu=False`` (a GPU array module) it is one call over all rows: fn(0, 0, n_rows).
    """
    if n_rows <= 0:
        return
    if not cpu:
        fn(0, 0, n_rows)
        return
    rows = _rows_per_chunk(row_elems, itemsize)
    bounds = [(s, min(s + rows, n_rows)) for s in range(0, n_rows, rows)]
    threads = min(num_threads(), len(bounds))
    if threads <= 1 or n_rows * row_elems < PARALLEL_MIN:
        for i, (s, e) in enumerate(bounds):
            fn(i, s, e)
        return

    def work(k):
        for i in range(k, len(bounds), threads):
            fn(i, *bounds[i])

    # the calling thread takes a share too; result() re-raises a worker's exception
    futures = [_get_pool(threads - 1).submit(work, k) for k in range(1, threads)]
    work(0)
    for f in futures:
        f.result()
