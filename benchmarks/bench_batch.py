"""Per-trajectory cost: solve_batch on 1000 trajectories vs separate gp.solve calls.

Run: ``python benchmarks/bench_batch.py [--n 1000] [--single 50]``. The separate calls are
timed on a subset (``--single``) in the same process and extrapolated to ``--n``.
Problem: 2-D softmax, V = I, random Q, K in R^{1x2} and unit-trace Sigma_0, t in [0, 5]
(about half blow up, half converge), default tolerances (DOP853, rtol 1e-10), 51 output
times. Target: speed-up >= 20. The separate calls are timed twice: with the
default compiled DOP853 of ``gp.solve`` and with SciPy's Python DOP853, the same algorithm
that ``solve_batch`` vectorises.
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
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    atts, covs = [], []
    for _ in range(a.n):
        Q, K, G = rng.standard_normal((1, 2)), rng.standard_normal((1, 2)), rng.standard_normal((2, 2))
        atts.append(gp.Softmax(Q, K, np.eye(2)))
        covs.append(G @ G.T / np.trace(G @ G.T))
    covs = np.array(covs)
    t_eval = np.linspace(0, 5, 51)
    t0 = time.perf_counter()
    bs = solve_batch(atts, covs, (0, 5), t_eval=t_eval)
    t_batch = time.perf_counter() - t0
    idx = rng.choice(a.n, size=min(a.single, a.n), replace=False)
    st, cnt = np.unique(bs.status.astype(str), return_counts=True)
    print(f"statuses: {dict(zip(st, cnt))}")
    print(f"batch of {a.n}: {t_batch:.3f} s = {1e3 * t_batch / a.n:.3f} ms/trajectory")
    # gp.solve's default DOP853 is stepped by the Fortran code; scipy.integrate.DOP853 (a
    # class) is SciPy's Python DOP853, the algorithm solve_batch vectorises
    for label, method in (("compiled DOP853 (default)", "DOP853"),
                          ("SciPy's Python DOP853", DOP853)):
        t0 = time.perf_counter()
        for i in idx:
            gp.solve(atts[i], None, covs[i], (0, 5), t_eval=t_eval, method=method)
        t_single = (time.perf_counter() - t0) / idx.size
        print(f"separate gp.solve, {label} ({idx.size} timed): {1e3 * t_single:.3f} "
              f"ms/trajectory; speed-up per trajectory: {t_single * a.n / t_batch:.1f}x")


if __name__ == "__main__":
    main()
