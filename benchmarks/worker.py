"""Run one task of benchmarks.tasks in this process: python -m benchmarks.worker TASK_JSON OUT.

TASK_JSON holds {"task": name, "fw": "tensorgrad"|"torch", "threads": n, **arguments}; the
result (with this process's BLAS and thread info under "info") is written to OUT as JSON.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    spec = json.loads(sys.argv[1])
    task, fw, threads = spec.pop("task"), spec.pop("fw"), spec.pop("threads")
    from . import tasks
    from .common import set_threads, worker_info

    set_threads(threads, torch_too=fw == tasks.TORCH)
    result = getattr(tasks, task)(fw, **spec)
    result = {"result": result, "info": worker_info(fw == tasks.TORCH)}
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
