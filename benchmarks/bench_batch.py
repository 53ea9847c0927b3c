"""Per-trajectory cost: solve_batch on 1000 trajectories vs separate gp.solve calls.

Run: ``python benchmarks/bench_batch.py [--n 1000] [--single 50]``. The separate calls are
timed on a subset (``--single``) in the same process and extrapolated to ``--n``.
Problem: 2-D softmax, V = I, random Q, K in R^{1x2} and unit-trace Sigma_0, t in [0, 5]
(about half blow up, half converge), default tolerances (DOP853, rtol 1e-10), 51 output
times. Target: speed-up >= 20. The separate calls are timed twice: with the
default compiled DOP853 of ``gp.solve`` and with SciPy's Python DOP853, the same algorithm
that ``solve_batch`` vectorises. Load on a shared machine moves both sides alike only if
they run close together, so the batch and the separate calls are interleaved over
``--rounds`` rounds and the best time of each side is kept. Times are CPU time of the
process (``time.process_time``), which other processes on the machine disturb less than
wall time.
"""

import argparse
import time

import numpy as np
from scipy.integrate import DOP853

import gaussian_pde as gp
from gaussian_pde.integrate._batch import solve_batch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--single", type=int, default=50)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    atts, covs = [], []
    for _ in range(a.n):
        Q, K, G = rng.standard_normal((1, 2)), rng.standard_normal((1, 2)), rng.standard_normal((2, 2))
        atts.append(gp.Softmax(Q, K, np.eye(2)))
        covs.append(G @ G.T / np.trace(G @ G.T))
    covs = np.array(covs)
    t_eval = np.linspace(0, 5, 51)
    idx = rng.choice(a.n, size=min(a.single, a.n), replace=False)
    # gp.solve's default DOP853 is stepped by the Fortran code; scipy.integrate.DOP853 (a
    # class) is SciPy's Python DOP853, the algorithm solve_batch vectorises
    methods = (("compiled DOP853 (default)", "DOP853"), ("SciPy's Python DOP853", DOP853))
    t_batch, t_single = np.inf, dict.fromkeys([label for label, _ in methods], np.inf)
    for _ in range(a.rounds):
        t0 = time.process_time()
        bs = solve_batch(atts, covs, (0, 5), t_eval=t_eval)
        t_batch = min(t_batch, time.process_time() - t0)
        for label, method in methods:
            t0 = time.process_time()
            for i in idx:
                gp.solve(atts[i], None, covs[i], (0, 5), t_eval=t_eval, method=method)
            t_single[label] = min(t_single[label], (time.process_time() - t0) / idx.size)
    st, cnt = np.unique(bs.status.astype(str), return_counts=True)
    print(f"statuses: {dict(zip(map(str, st), map(int, cnt)))}")
    print(f"batch of {a.n} (best of {a.rounds}): {t_batch:.3f} s = "
          f"{1e3 * t_batch / a.n:.3f} ms/trajectory")
    for label, t in t_single.items():
        print(f"separate gp.solve, {label} ({idx.size} timed, best of {a.rounds}): "
              f"{1e3 * t:.3f} ms/trajectory; speed-up per trajectory: {t * a.n / t_batch:.1f}x")

if __name__ == "__main__":
    from _record import recorded_main

    recorded_main("bench_batch", main)
