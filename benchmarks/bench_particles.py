"""Benchmark: one softmax particle-velocity evaluation against its floor.

The floor is measured in the same process: over the same tiles (``chunk_size`` query rows
times ``4 * chunk_size`` key columns, n = 10,000 and 50,000, d = k = 8), the two matrix
products and one ``exp`` that any softmax attention needs, done as plain NumPy on
preallocated blocks (``matmul(..., out=)``, ``exp(..., out=)``), without shifts, checks or
diagnostics. The target is a ratio of at most 1.5. The floor is also measured with the
best tile shape from a small set, so the ratio is not flattered by a slow tile size.

Also reported: float32 accuracy (largest velocity error relative to the largest velocity,
against float64) and, with ``--memory``, the peak resident memory of a fresh process that
evaluates the velocity of n = 100,000 tokens in d = 8 once (ru_maxrss).

Usage::

    python benchmarks/bench_particles.py               # n = 10,000 and 50,000, d = 8
    python benchmarks/bench_particles.py --n 10000 --repeat 5
    python benchmarks/bench_particles.py --memory      # adds the n = 100,000 memory check
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np

from gaussian_pde.attention._kernels import _COLUMN_FACTOR, DEFAULT_CHUNK_SIZE
from gaussian_pde.attention._softmax import Softmax
from gaussian_pde.particles._simulate import sample_gaussian


def problem(n, d, seed=0):
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((d, d)) / np.sqrt(d)
    K = rng.standard_normal((d, d)) / np.sqrt(d)
    att = Softmax(Q, K, np.eye(d))
    x = sample_gaussian(np.zeros(d), np.eye(d), n, seed=seed)
    return att, x


def floor_time(n, d, k, rows, cols, dtype, repeat):
    """Best-of-``repeat`` time of matmul + exp + matmul over all tiles of an n x n problem."""
    rng = np.random.default_rng(1)
    a = (0.1 * rng.standard_normal((n, k))).astype(dtype)
    bT = np.ascontiguousarray((0.1 * rng.standard_normal((n, k))).astype(dtype).T)
    y = rng.standard_normal((n, d)).astype(dtype)
    buf = np.empty(rows * cols, dtype=dtype)
    acc = np.zeros((n, d))
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        for r0 in range(0, n, rows):
            r1 = min(r0 + rows, n)
            for c0 in range(0, n, cols):
                c1 = min(c0 + cols, n)
                S = buf[: (r1 - r0) * (c1 - c0)].reshape(r1 - r0, c1 - c0)
                np.matmul(a[r0:r1], bT[:, c0:c1], out=S)
                np.exp(S, out=S)
                acc[r0:r1] += S @ y[c0:c1]
        best = min(best, time.perf_counter() - t0)
    return best


def velocity_time(att, x, dtype, repeat):
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        v, _ = att.particle_velocity(x, dtype=dtype)
        best = min(best, time.perf_counter() - t0)
    return best, v


def memory_child(n, d, dtype):
    import resource

    att, x = problem(n, d)
    v, _ = att.particle_velocity(x, dtype=np.dtype(dtype))
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{peak_kib / 1024:.1f}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[10_000, 50_000])
    p.add_argument("--d", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--memory", action="store_true", help="also measure peak RSS at n=100,000")
    p.add_argument("--json", default=None, help="where the record goes (default: docs/...)")
    p.add_argument("--memory-child", nargs=3, metavar=("N", "D", "DTYPE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_child:
        memory_child(int(args.memory_child[0]), int(args.memory_child[1]), args.memory_child[2])
        return 0
    d = k = args.d
    rows = DEFAULT_CHUNK_SIZE
    cols = _COLUMN_FACTOR * rows
    shapes = [(rows, cols), (256, 1024), (1024, 4096), (128, 8192)]
    print(f"softmax particle velocity, d = k = {d}, chunk_size = {rows} "
          f"(tiles {rows} x {cols}), best of {args.repeat}")
    print(f"{'n':>7} {'dtype':>8} {'velocity s':>11} {'floor s':>9} {'ratio':>6} "
          f"{'best floor s':>13} {'ratio':>6} {'f32 rel err':>12}")
    records = []
    for n in args.n:
        att, x = problem(n, d)
        v64 = None
        for dtype in (np.float64, np.float32):
            tv = tf = np.inf
            for _ in range(args.repeat):  # interleaved: a busy machine slows both alike
                t, v = velocity_time(att, x, dtype, 1)
                tv = min(tv, t)
                tf = min(tf, floor_time(n, d, k, rows, cols, dtype, 1))
            tbest = tf
            if n <= 20_000:
                tbest = min([tf] + [floor_time(n, d, k, r, min(c, n), dtype, args.repeat)
                                    for r, c in shapes[1:]])
            if dtype == np.float64:
                v64, err = v, ""
            else:
                err = f"{np.max(np.abs(v - v64)) / np.max(np.abs(v64)):.2e}"
            print(f"{n:>7} {np.dtype(dtype).name:>8} {tv:>11.3f} {tf:>9.3f} {tv / tf:>6.2f} "
                  f"{tbest:>13.3f} {tv / tbest:>6.2f} {err:>12}", flush=True)
            records.append({"n": n, "d": d, "dtype": np.dtype(dtype).name, "velocity_s": tv,
                         "floor_s": tf, "ratio": tv / tf, "best_floor_s": tbest,
                         "ratio_best": tv / tbest, "f32_rel_err": err or None})
    if args.memory:
        for dtype in ("float64", "float32"):
            out = subprocess.run([sys.executable, __file__, "--memory-child", "100000",
                                  str(d), dtype], capture_output=True, text=True, check=True)
            print(f"peak RSS, one velocity evaluation, n = 100000, d = {d}, {dtype}: "
                  f"{out.stdout.strip()} MiB")
    from _record import write_record

    write_record("bench_particles", {"chunk_size": rows, "rows": records}, args.json)
    return 0


if __name__ == "__main__":
    from _record import recorded_main

    recorded_main("bench_particles", main)
