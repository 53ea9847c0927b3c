"""Training benchmark: the compiled training step per variant, and the study's wall time.

For every variant of ``gaussian_pde.training.VARIANTS`` the training program (Adam, all
(seed, rate) lanes of the full study, ``jax.vmap`` + ``lax.scan``) is compiled once and
timed on ``--steps`` steps; the step time is reported against the ``pre_ln`` baseline
measured in the same process (a ratio, so machine load affects both sides). ``--study``
also times ``gaussian-pde train --quick`` (budget: 2 minutes on 2 cores) and, with
``--full``, the full study (budget: 15 minutes).

    PYTHONPATH=$PWD python benchmarks/bench_training.py [--study] [--full] [--json PATH]
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _record import write_record  # noqa: E402

from gaussian_pde.training import VARIANTS, get_task, init_params, model_spec  # noqa: E402
from gaussian_pde.training._train import _make_lane  # noqa: E402


def _step_time(variant, task, lanes, steps, batch, depth):
    spec = model_spec(variant, depth=depth)
    p = init_params(spec, task, jax.random.PRNGKey(0))
    params = jax.tree_util.tree_map(lambda a: jnp.stack([a] * lanes), p)
    x, y = task.batches(0, steps, batch)
    xs = jnp.asarray(np.stack([x] * lanes), jnp.float32)
    ys = jnp.asarray(np.stack([y] * lanes))
    lr = jnp.full(lanes, 1e-3, jnp.float32)
    t0 = time.perf_counter()
    f = jax.jit(_make_lane(spec, task, 10.0)).lower(params, lr, xs, ys).compile()
    t_compile = time.perf_counter() - t0
    best = np.inf
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(f(params, lr, xs, ys))
        best = min(best, time.perf_counter() - t0)
    return t_compile, best / steps


def _study_time(quick):
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "gaussian_pde", "--quiet", "train", "--out", out]
        t0 = time.perf_counter()
        subprocess.run(cmd + (["--quick"] if quick else []), check=True,
                       capture_output=True)
        return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--study", action="store_true", help="also time `train --quick`")
    ap.add_argument("--full", action="store_true", help="also time the full study")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    task = get_task("mixture")
    lanes, batch, depth = 15, 32, 4      # the full study: 5 seeds x 3 rates
    rows = {}
    for v in VARIANTS:
        tc, ts = _step_time(v, task, lanes, args.steps, batch, depth)
        rows[v] = {"compile_s": tc, "step_s": ts}
        print(f"{v:16s} compile {tc:6.2f} s  step {1e3 * ts:7.2f} ms", flush=True)
    base = rows["pre_ln"]["step_s"]
    for v in rows:
        rows[v]["step_ratio_vs_pre_ln"] = rows[v]["step_s"] / base
    payload = {"lanes": lanes, "batch": batch, "depth": depth, "steps": args.steps,
               "variants": rows}
    if args.study or args.full:
        payload["quick_study_s"] = _study_time(True)
        print(f"train --quick: {payload['quick_study_s']:.1f} s (budget 120 s)")
    if args.full:
        payload["full_study_s"] = _study_time(False)
        print(f"train (full): {payload['full_study_s']:.1f} s (budget 900 s)")
    write_record("bench_training", payload, args.json)


if __name__ == "__main__":
    main()
