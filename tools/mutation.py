"""Mutation testing of the compiler, the kernels and the loaders with cosmic-ray (issue 53).

    pip install cosmic-ray==8.7.0                   # a dev tool, not a dependency
    python tools/mutation.py                        # every target of mutation/targets.toml, all mutants
    python tools/mutation.py tensorgrad/serialization.py --sample 20 --seed 1
    python tools/mutation.py --count                # the mutants each target has, nothing run
    python tools/mutation.py --report               # the last run's figures and survivors again

The working tree (tracked and untracked, not ignored files) is copied to WORKDIR/tree and every
mutant is written there, never in the checkout: an interrupted run leaves no mutant behind, and
the checkout stays free to edit while it runs. Per target: a baseline run of its tests on the
unmutated copy (a failing baseline would "kill" every mutant: the target stops there), then
`cosmic-ray init`, the operator filter, the sample, `cosmic-ray exec` (one mutant at a time,
one test process at a time). Each mutant's tests run through `--test TARGET`, which points
PYTHONPATH at the copy (a test's subprocesses import the mutant too) and NUMBA_CACHE_DIR at an
empty directory (numba = "fresh") or at the warm cache of the baseline (numba = "warm").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "mutation" / "targets.toml"


def load_targets() -> dict:
    with open(TARGETS, "rb") as f:
        return tomllib.load(f)


def slug(target: str) -> str:
    return target.replace("/", "_").removesuffix(".py")


def copy_tree(workdir: Path) -> Path:
    tree = workdir / "tree"
    if tree.exists():
        shutil.rmtree(tree)
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / name)
    return tree


def test_env(workdir: Path, numba: str) -> tuple[dict, Path | None]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(workdir / "tree")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    fresh = None
    if numba == "fresh":
        base = workdir / "numba-fresh"
        shutil.rmtree(base, ignore_errors=True)  # left by a mutant killed at its timeout
        base.mkdir(parents=True)
        fresh = base / str(os.getpid())
        fresh.mkdir()
        env["NUMBA_CACHE_DIR"] = str(fresh)
    else:
        env["NUMBA_CACHE_DIR"] = str(workdir / "numba-warm")
    return env, fresh


def run_tests(target: str, workdir: Path, log: str) -> int:
    """One mutant's tests (cosmic-ray's test-command): pytest over the target's files."""
    spec = load_targets()
    t = spec["targets"][target]
    env, fresh = test_env(workdir, t["numba"])
    cmd = [sys.executable, "-m", "pytest", *spec["settings"]["pytest"], *t["tests"]]
    start = time.monotonic()
    try:
        rc = subprocess.run(cmd, cwd=workdir / "tree", env=env).returncode
    finally:
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
    with open(workdir / log, "a") as f:
        f.write(json.dumps({"target": target, "s": round(time.monotonic() - start, 1), "rc": rc}))
        f.write("\n")
    return rc


def cosmic_config(target: str, workdir: Path, settings: dict) -> Path:
    test_cmd = (
        f"{sys.executable} {ROOT / 'tools' / 'mutation.py'} --test {target} --workdir {workdir}"
    )
    excl = ", ".join(json.dumps(e) for e in settings["exclude-operators"])
    path = workdir / f"{slug(target)}.toml"
    path.write_text(
        "[cosmic-ray]\n"
        f'module-path = "{target}"\n'
        f"timeout = {float(settings['timeout'])}\n"
        "excluded-modules = []\n"
        f"test-command = {json.dumps(test_cmd)}\n\n"
        '[cosmic-ray.distributor]\nname = "local"\n\n'
        f"[cosmic-ray.filters.operators-filter]\nexclude-operators = [{excl}]\n"
    )
    return path


def init_session(target: str, workdir: Path, settings: dict) -> Path:
    cfg = cosmic_config(target, workdir, settings)
    db = workdir / f"{slug(target)}.sqlite"
    db.unlink(missing_ok=True)
    tree = workdir / "tree"
    subprocess.run(["cosmic-ray", "init", str(cfg), str(db)], cwd=tree, check=True)
    subprocess.run(["cr-filter-operators", str(db), str(cfg)], cwd=tree, check=True)
    return db


def sample(db: Path, n: int | None, seed: int) -> int:
    """Keep n random pending mutants (by seed); the others are marked skipped 'not sampled'."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(db), WorkDB.Mode.open) as wdb:
        pending = sorted(wdb.pending_work_items, key=lambda w: w.job_id)
        if n is None or n >= len(pending):
            return len(pending)
        keep = {w.job_id for w in random.Random(seed).sample(pending, n)}
        for w in pending:
            if w.job_id not in keep:
                wdb.set_result(
                    w.job_id,
                    WorkResult(output="not sampled", worker_outcome=WorkerOutcome.SKIPPED),
                )
        return n


def summary(target: str, workdir: Path) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    db = workdir / f"{slug(target)}.sqlite"
    s = {
        "target": target,
        "mutants": 0,
        "filtered": 0,
        "not_sampled": 0,
        "run": 0,
        "killed": 0,
        "timeouts": 0,
        "survived": [],
        "incompetent": 0,
        "pending": 0,
    }
    with use_db(str(db), WorkDB.Mode.open) as wdb:
        items = {w.job_id: w for w in wdb.work_items}
        s["mutants"] = len(items)
        results = dict(wdb.results)
        for job, w in items.items():
            r = results.get(job)
            if r is None:
                s["pending"] += 1
            elif r.worker_outcome == WorkerOutcome.SKIPPED:
                s["not_sampled" if r.output == "not sampled" else "filtered"] += 1
            else:
                s["run"] += 1
                if r.test_outcome == TestOutcome.SURVIVED:
                    m = w.mutations[0]
                    s["survived"].append(
                        {
                            "job": job,
                            "operator": m.operator_name,
                            "line": m.start_pos[0],
                            "diff": r.diff,
                        }
                    )
                elif r.test_outcome == TestOutcome.KILLED:
                    s["killed"] += 1
                    s["timeouts"] += r.output == "timeout"
                else:
                    s["incompetent"] += 1
    return s


def print_summary(s: dict, timings: list) -> None:
    mine = [t["s"] for t in timings if t["target"] == s["target"]]
    judged = s["killed"] + len(s["survived"])
    rate = f"{100 * s['killed'] / judged:.0f}%" if judged else "-"
    mean = f"{sum(mine) / len(mine):.0f} s" if mine else "-"
    print(
        f"\n== {s['target']}: {s['mutants']} mutants, {s['filtered']} filtered by operator, "
        f"{s['not_sampled']} not sampled, {s['run']} run, {s['pending']} pending"
    )
    print(
        f"   killed {s['killed']} (timeouts {s['timeouts']}), survived {len(s['survived'])}, "
        f"incompetent {s['incompetent']}: kill rate {rate}; mean test run {mean} "
        f"over {len(mine)} runs (baseline included)"
    )
    for m in s["survived"]:
        print(f"   SURVIVED {m['operator']} line {m['line']} ({m['job'][:8]})")
        print(
            "     "
            + "\n     ".join(
                ln
                for ln in (m["diff"] or "").splitlines()
                if ln[:1] in "+-" and ln[:3] not in ("+++", "---")
            )
        )


def read_timings(workdir: Path) -> list:
    p = workdir / "timings.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines()] if p.exists() else []


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("targets", nargs="*", help="modules of mutation/targets.toml (default: all)")
    p.add_argument("--sample", type=int, help="run this many random mutants per target")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "tg-mutation"
    )
    p.add_argument("--count", action="store_true", help="count the mutants; run nothing")
    p.add_argument("--report", action="store_true", help="the last run's summary again")
    p.add_argument("--test", metavar="TARGET", help=argparse.SUPPRESS)  # cosmic-ray's command
    a = p.parse_args(argv)
    workdir = a.workdir.resolve()
    if a.test:
        return run_tests(a.test, workdir, "timings.jsonl")

    spec = load_targets()
    targets = a.targets or list(spec["targets"])
    unknown = [t for t in targets if t not in spec["targets"]]
    if unknown:
        p.error(f"not in {TARGETS.relative_to(ROOT)}: {', '.join(unknown)}")
    if a.report:
        for t in targets:
            if (workdir / f"{slug(t)}.sqlite").exists():
                print_summary(summary(t, workdir), read_timings(workdir))
        return 0

    workdir.mkdir(parents=True, exist_ok=True)
    if not a.count:
        (workdir / "timings.jsonl").unlink(missing_ok=True)
    copy_tree(workdir)
    total = 0
    for t in targets:
        db = init_session(t, workdir, spec["settings"])
        if a.count:
            s = summary(t, workdir)
            total += s["mutants"] - s["filtered"]
            print(f"{t}: {s['mutants'] - s['filtered']} mutants ({s['filtered']} filtered)")
            continue
        start = time.monotonic()
        print(f"\n== {t}: baseline", flush=True)
        if run_tests(t, workdir, "timings.jsonl") != 0:
            print(f"   the unmutated tests fail: {t} skipped (fix or drop the failing test)")
            continue
        n = sample(db, a.sample, a.seed)
        print(f"== {t}: {n} mutants to run", flush=True)
        subprocess.run(
            ["cosmic-ray", "exec", str(workdir / f"{slug(t)}.toml"), str(db)],
            cwd=workdir / "tree",
            check=True,
        )
        s = summary(t, workdir)
        s["wall_s"] = round(time.monotonic() - start)
        with open(workdir / "summary.jsonl", "a") as f:
            f.write(json.dumps(s) + "\n")
        print_summary(s, read_timings(workdir))
        print(f"   wall {s['wall_s']} s (baseline included)", flush=True)
    if a.count:
        print(f"total: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
