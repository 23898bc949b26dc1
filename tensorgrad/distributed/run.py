"""A torchrun-style launcher on mpiexec: start N ranks of a script written for ``torchrun``.

    python -m tensorgrad.distributed.run --nproc_per_node 2 train.py --batch_size=8

runs ``mpiexec -n 2 python -m tensorgrad.distributed.run --rank-entry train.py ...``; each rank
sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE (from the MPI launcher's variables) and
then runs the script as ``__main__`` with its own arguments, so ``init_process_group`` and
``int(os.environ['RANK'])`` work as under torchrun. mpiexec is the one next to this Python
(the ``[mpi]`` extra installs it) or else the first on PATH. One machine only: torchrun's
multi-node flags (``--nnodes`` > 1, ``--rdzv_*``, ``--master_addr``) are refused.

Imports: argparse, os, pathlib, runpy, shutil, subprocess, sys, .INSTALL_HINT, .launch_rank,
.launch_world_size.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

from . import INSTALL_HINT, launch_rank, launch_world_size

_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK")
MAX_RANKS_PER_CPU = 4  # beyond this, more ranks only share the CPUs (and memory) thinner
_LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE")


def find_mpiexec() -> list[str]:
    """The mpiexec command (with Open MPI's flags for root and more ranks than cores)."""
    exe = Path(sys.executable).parent / "mpiexec"
    found = str(exe) if exe.exists() else shutil.which("mpiexec")
    if found is None:
        raise SystemExit(f"tensorgrad.distributed.run: error: mpiexec not found: {INSTALL_HINT}")
    out = subprocess.run([found, "--version"], capture_output=True, text=True, check=False).stdout
    return [found, *(["--allow-run-as-root", "--oversubscribe"] if "Open MPI" in out else [])]


def _env_int(names, default: int) -> int:
    for n in names:
        if os.environ.get(n, "").isdigit():
            return int(os.environ[n])
    return default


def rank_entry(script: str, args: list[str]) -> None:
    """In one rank: torchrun's variables, then the script as __main__."""
    n, r = launch_world_size(), launch_rank()
    os.environ.update(
        RANK=str(r),
        WORLD_SIZE=str(n),
        LOCAL_RANK=str(_env_int(_LOCAL_RANK_VARS, r)),
        LOCAL_WORLD_SIZE=str(_env_int(_LOCAL_SIZE_VARS, n)),
        GROUP_RANK="0",
        MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
        MASTER_PORT=os.environ.get("MASTER_PORT", "29500"),
    )
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


def rank_count(text: str) -> int:
    """--nproc_per_node: 'auto' or 'cpu' (one rank per CPU), or ASCII digits (int() would also
    take '٣'), at most MAX_RANKS_PER_CPU per CPU: each rank is a whole Python process."""
    cpus = os.cpu_count() or 1
    if text in ("auto", "cpu"):
        return cpus
    err = f"tensorgrad.distributed.run: error: --nproc_per_node {text[:20]!r}"
    limit = MAX_RANKS_PER_CPU * cpus
    n = int(text) if text.isascii() and text.isdigit() and len(text) <= 12 else limit + 1
    if not (text.isascii() and text.isdigit()) or n < 1:
        raise SystemExit(f"{err}: a positive number in ASCII digits, or auto")
    if n > limit:
        raise SystemExit(
            f"{err}: at most {limit} ranks on this machine ({MAX_RANKS_PER_CPU} per CPU, "
            f"{cpus} CPUs); each rank is a Python process (auto starts one per CPU)"
        )
    return n


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tensorgrad.distributed.run",
        description="Start N ranks of a torchrun-style script on this machine (under mpiexec).",
    )
    p.add_argument("--nproc_per_node", "--nproc-per-node", default="1", help="ranks to start")
    p.add_argument("--nnodes", default="1", help="only 1 (one machine)")
    p.add_argument("--standalone", action="store_true", help="accepted (always standalone)")
    p.add_argument("--node_rank", "--node-rank", type=int, default=0, help="only 0")
    p.add_argument("--rank-entry", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("script", help="the training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    if a.rank_entry:
        rank_entry(a.script, a.script_args)
        return 0
    if a.nnodes not in ("1", "1:1") or a.node_rank != 0:
        raise SystemExit("tensorgrad.distributed.run: error: one machine only (--nnodes 1)")
    n = rank_count(a.nproc_per_node)
    if not os.path.isfile(a.script):
        raise SystemExit(
            f"tensorgrad.distributed.run: error: {a.script}: no such file (the script each "
            "rank runs)"
        )
    cmd = [*find_mpiexec(), "-n", str(n), sys.executable, "-m", "tensorgrad.distributed.run"]
    return subprocess.call([*cmd, "--rank-entry", a.script, *a.script_args])


if __name__ == "__main__":
    sys.exit(main())
