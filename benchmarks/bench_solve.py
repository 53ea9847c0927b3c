"""Benchmark: gp.solve against the published scheme (explicit Euler + PSD projection).

The baseline is the scheme of the code published with the paper: fixed-step explicit
Euler on Sigma with, at every step, a projection onto the PSD cone by clipping negative
eigenvalues. Both run in this process on the same generated right-hand side, so the
ratios do not depend on the machine's speed that day.

The paper workload is also timed with ``method="rosenbrock"`` (the L-stable RODAS4 of
``gaussian_pde._batch``, one trajectory), which is not stability-limited on its stiff tail;
a table gives the speed-up of every method per seed.

Run:  python benchmarks/bench_solve.py
"""

from __future__ import annotations

import time

import numpy as np

import gaussian_pde as gp
from gaussian_pde._exact import blowup_time, exact_covariance


def euler_psd(att, cov0, h, t_end=None, steady_tol=None, max_steps=10_000_000):
    """Explicit Euler with eigenvalue clipping; stops at t_end or when |rhs|_F < steady_tol."""
    cov = cov0.copy()
    t, n = 0.0, 0
    while n < max_steps:
        rate = att.cov_rhs(cov)
        if steady_tol is not None and np.linalg.norm(rate) < steady_tol:
            break
        step = h if t_end is None else min(h, t_end - t)
        if step <= 0:
            break
        cov = cov + step * rate
        if not np.isfinite(cov).all() or np.abs(cov).max() > 1e12:
            raise FloatingPointError("Euler baseline diverged")
        w, U = np.linalg.eigh(0.5 * (cov + cov.T))
        cov = (U * np.clip(w, 0.0, None)) @ U.T
        t += step
        n += 1
    return t, cov, n


def timed(fn, repeat=3):
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def short_horizon(d, seed=0):
    """Softmax with V = I up to half the blow-up time: solve at 1e-8 vs Euler at 1e-3."""
    rng = np.random.default_rng(seed)
    att = gp.Softmax(rng.standard_normal((d, d)), rng.standard_normal((d, d)), np.eye(d))
    G = rng.standard_normal((d, d))
    cov0 = G @ G.T / d
    t_star = blowup_time(att, cov0)
    T = 0.5 * t_star if np.isfinite(t_star) else 1.0
    exact = exact_covariance(att, cov0, T)
    t_solve, sol = timed(lambda: gp.solve(att, None, cov0, (0, T), t_eval=[T]))
    err_solve = rel(sol.cov[-1], exact)
    h = T / 8
    while True:  # halve the step until the baseline reaches 1e-3
        _, cov, n = euler_psd(att, cov0, h, t_end=T)
        if rel(cov, exact) < 1e-3:
            break
        h /= 2
    t_base, (_, cov, n) = timed(lambda: euler_psd(att, cov0, h, t_end=T))
    return dict(case=f"short horizon, softmax V=I, d={d}", solve_s=t_solve, solve_err=err_solve,
                base_s=t_base, base_err=rel(cov, exact), base_steps=n, ratio=t_base / t_solve,
                T=T)


#: methods timed on the paper workload ("rosenbrock": gp.solve's RODAS4, gaussian_pde._batch)
PAPER_METHODS = ("DOP853", "LSODA", "rosenbrock")


def paper_workload(seed, d=5, h=0.02, tol=5e-5):
    """Rank-histogram setting of the paper, to steady state (mean grows, so cov-only mode)."""
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((d // 2, d))
    G = rng.standard_normal((d, d))
    att = gp.Softmax(Q, -Q, G.T @ G, scale=1 / np.sqrt(d))
    cov0 = G @ G.T
    while True:
        try:
            t_base, (T, cov_b, n) = timed(lambda h=h: euler_psd(att, cov0, h, steady_tol=tol), 1)
            break
        except FloatingPointError:
            h /= 2
    ref = gp.solve(att, None, cov0, (0, T), t_eval=[T], rtol=1e-13, atol=1e-16).cov[-1]
    rows = []
    for method in PAPER_METHODS:
        # the loosest tolerance that reaches 1e-8 (as the baseline's step is the largest
        # stable one), found once, then timed
        for rtol in (1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-11):
            sol = gp.solve(att, None, cov0, (0, T), t_eval=[T], rtol=rtol, atol=1e-14,
                           method=method)
            if rel(sol.cov[-1], ref) < 1e-8:
                break
        t_solve, sol = timed(lambda r=rtol, m=method: gp.solve(
            att, None, cov0, (0, T), t_eval=[T], rtol=r, atol=1e-14, method=m))
        rows.append(dict(case=f"paper workload d={d}, seed {seed}, {method} rtol={rtol:.0e}",
                         solve_s=t_solve, solve_err=rel(sol.cov[-1], ref), base_s=t_base,
                         base_err=rel(cov_b, ref), base_steps=n, T=T, h=h,
                         ratio=t_base / t_solve, method=method, seed=seed))
    return rows


def main():
    rows = [short_horizon(2), short_horizon(5)]
    for seed in range(5):
        rows += paper_workload(seed)
    print("| case | solve time (s) | solve rel. error | baseline time (s) | baseline rel. "
          "error | baseline steps | speed-up |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['solve_s']:.4f} | {r['solve_err']:.1e} | {r['base_s']:.3f} | "
              f"{r['base_err']:.1e} | {r['base_steps']} | {r['ratio']:.0f}x |")
    print()
    print("| seed | T | " + " | ".join(f"{m} speed-up" for m in PAPER_METHODS) + " |")
    print("|---" * (2 + len(PAPER_METHODS)) + "|")
    for seed in range(5):
        rs = {r["method"]: r for r in rows if r.get("seed") == seed}
        print(f"| {seed} | {rs['DOP853']['T']:.4g} | "
              + " | ".join(f"{rs[m]['ratio']:.0f}x" for m in PAPER_METHODS) + " |")
    for method in PAPER_METHODS:
        paper = [r["ratio"] for r in rows if r.get("method") == method]
        print(f"paper workload speed-up with {method}: median {np.median(paper):.0f}x, "
              f"min {np.min(paper):.0f}x (target >= 100x)")


if __name__ == "__main__":
    main()
