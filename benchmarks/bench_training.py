"""Training benchmark: the compiled training step per variant, and the study's wall time.

For every variant of ``gaussian_pde.training.VARIANTS`` the training program (Adam, all
(seed, rate) lanes of the full study, ``jax.vmap`` + ``lax.scan``) is built twice, with
XLA's optimisations and with the fast build of ``--quick`` (``optimize=False``), and each
is timed on ``--steps`` steps: build time, and time per step (best of 3). Step times are
also given against the ``pre_ln`` baseline measured in the same process (ratios, so that
machine load affects both sides). ``--study`` also times ``gaussian-pde train --quick``
(budget: 2 minutes on 2 cores) and ``--full`` the full study (budget: 30 minutes), as
wall time and as the command's CPU time (user + system, all threads); ``--keep DIR``
keeps the full study's output (the docs' results: ``docs/_static/results/training``).

    PYTHONPATH=$PWD python benchmarks/bench_training.py [--study] [--full] [--keep DIR]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from _record import write_record  # noqa: E402

from gaussian_pde.cli._train import FULL  # noqa: E402
from gaussian_pde.training import DEFAULT_LEARNING_RATES, VARIANTS, get_task, model_spec  # noqa: E402
from gaussian_pde.training._compile import compile_options  # noqa: E402
from gaussian_pde.training._model import initial_params  # noqa: E402
from gaussian_pde.training._train import _make_lane  # noqa: E402

#: study budgets on two cores, seconds
BUDGETS = {"quick": 120.0, "full": 1800.0}


def _build(lowered, optimize):
    for opts in compile_options(optimize):
        try:
            return lowered.compile(compiler_options=opts)
        except Exception:  # an option this XLA lacks: the next set
            continue
    raise RuntimeError("no option set compiled")


def _step_time(variant, task, lanes, steps, batch, depth, optimize):
    spec = model_spec(variant, depth=depth)
    p = initial_params(spec, task, 0)
    params = jax.tree_util.tree_map(lambda a: np.stack([a] * lanes), p)
    x, y = task.batches(0, steps, batch)
    xs, ys = x[None].astype(np.float32), y[None]       # one seed's batches, shared by the lanes
    lr = np.full(lanes, 1e-3, np.float32)
    which = np.zeros(lanes, np.int32)
    t0 = time.perf_counter()
    lowered = jax.jit(_make_lane(spec, task, 10.0, 0, None)).lower(params, lr, which, xs, ys)
    f = _build(lowered, optimize)
    t_build = time.perf_counter() - t0
    best = np.inf
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(f(params, lr, which, xs, ys))
        best = min(best, time.perf_counter() - t0)
    return t_build, best / steps


def _study_time(quick, keep=None):
    with tempfile.TemporaryDirectory() as tmp:
        out = keep if keep is not None else tmp
        cmd = [sys.executable, "-m", "gaussian_pde", "--quiet", "train", "--out", str(out)]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        subprocess.run(cmd + (["--quick"] if quick else []), check=True,
                       capture_output=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "load_before": load, "load_after": os.getloadavg()[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--study", action="store_true", help="also time `train --quick`")
    ap.add_argument("--full", action="store_true", help="also time the full study")
    ap.add_argument("--keep", default=None, help="folder for the full study's output")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    task = get_task("mixture")
    lanes = FULL["seeds"] * len(DEFAULT_LEARNING_RATES)      # the full study's grid
    batch, depth = FULL["batch"], FULL["depth"]
    rows = {}
    for v in VARIANTS:
        rows[v] = {}
        for build, optimize in (("optimized", True), ("fast", False)):
            tc, ts = _step_time(v, task, lanes, args.steps, batch, depth, optimize)
            rows[v][build] = {"build_s": tc, "step_s": ts}
            print(f"{v:16s} {build:9s} build {tc:6.2f} s  step {1e3 * ts:7.3f} ms", flush=True)
    for build in ("optimized", "fast"):
        base = rows["pre_ln"][build]["step_s"]
        for v in rows:
            rows[v][build]["step_ratio_vs_pre_ln"] = rows[v][build]["step_s"] / base
    payload = {"task": task.name, "lanes": lanes, "batch": batch, "depth": depth,
               "steps": args.steps, "variants": rows, "budgets_s": BUDGETS}
    if args.study or args.full:
        payload["quick_study"] = _study_time(True)
        q = payload["quick_study"]
        print(f"train --quick: {q['wall_s']:.1f} s wall, {q['cpu_s']:.1f} s CPU "
              f"(budget {BUDGETS['quick']:g} s)", flush=True)
    if args.full:
        payload["full_study"] = _study_time(False, args.keep)
        f = payload["full_study"]
        print(f"train (full): {f['wall_s']:.1f} s wall, {f['cpu_s']:.1f} s CPU "
              f"(budget {BUDGETS['full']:g} s)", flush=True)
    payload["tables"] = _tables(payload)
    write_record("bench_training", payload, args.json)


def _load(study):
    """The machine's load around a study run, or "-" in records that did not keep it."""
    if "load_before" not in study:
        return "-"
    return f"{study['load_before']:.1f} / {study['load_after']:.1f}"


def _tables(payload):
    """The record's tables: the training step per variant; the studies against their budgets."""
    rows = []
    for v, builds in payload["variants"].items():
        o, f = builds["optimized"], builds["fast"]
        rows.append([v, f"{o['build_s']:.2f}", f"{1e3 * o['step_s']:.2f}",
                     f"{o['step_ratio_vs_pre_ln']:.2f}", f"{f['build_s']:.2f}",
                     f"{1e3 * f['step_s']:.2f}", f"{f['step_ratio_vs_pre_ln']:.2f}"])
    tables = [{"title": f"Compiled training step ({payload['lanes']} lanes of the full study, "
                        f"batch {payload['batch']}, depth {payload['depth']}, task "
                        f"{payload['task']}; ratios against pre_ln in the same run)",
               "columns": ["variant", "optimized: build s", "step ms", "x pre_ln",
                           "fast: build s", "step ms", "x pre_ln"],
               "rows": rows}]
    studies = [(name, key) for name, key in (("train --quick", "quick"), ("train (full)", "full"))
               if f"{key}_study" in payload]
    if studies:
        tables.append({
            "title": "The training study's wall and CPU time (all threads) against its budget",
            "columns": ["command", "wall s", "CPU s", "budget s", "wall / budget",
                        "load (1 min) before / after"],
            "rows": [[name, f"{payload[key + '_study']['wall_s']:.1f}",
                      f"{payload[key + '_study']['cpu_s']:.1f}", f"{BUDGETS[key]:g}",
                      f"{payload[key + '_study']['wall_s'] / BUDGETS[key]:.2f}",
                      _load(payload[key + '_study'])]
                     for name, key in studies]})
    return tables


if __name__ == "__main__":
    main()
