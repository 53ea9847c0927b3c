"""Accuracy of the defaults against the exact softmax V = I solution.

Run: ``python benchmarks/accuracy_exact.py [--n 200] [--seed 2026]``. For ``--n`` random
settings (d = 2 to 5, k = 1 to d, Q and K standard normal, V = I, Sigma_0 = G G^T / d),
``gp.solve`` (without and with a standard normal mean) and ``solve_batch`` integrate to
0.9 t* (t* the exact blow-up time; 5 where there is none) with their default options, and
are compared at 11 times with :func:`gaussian_pde.exact_covariance` (docs/math.md 4.1);
where t* is finite, both run to 2 t* and their blow-up time is compared with t*. A run
that does not finish is counted apart with its status (with V = I the mean grows like
e^t, so on horizons of several hundred it leaves the float range before the covariance
blows up).
"""

import argparse
from collections import Counter

import numpy as np

import gaussian_pde as gp
from gaussian_pde import solve_batch


def _rel(a, b):
    return np.max(np.linalg.norm(a - b, axis=(-2, -1)) / np.linalg.norm(b, axis=(-2, -1)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--seed", type=int, default=2026)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    err = {"solve": [], "solve with mean": [], "solve_batch": []}
    t_err = {"solve": [], "solve_batch": []}
    other = Counter()
    for _ in range(a.n):
        d = int(rng.integers(2, 6))
        k = int(rng.integers(1, d + 1))
        Q, K = rng.standard_normal((2, k, d))
        att = gp.Softmax(Q, K, np.eye(d))
        G = rng.standard_normal((d, d))
        cov0 = G @ G.T / d
        t_star = gp.blowup_time(att, cov0)
        T = 0.9 * t_star if np.isfinite(t_star) else 5.0
        t_eval = np.linspace(0.0, T, 11)
        exact = gp.exact_covariance(att, cov0, t_eval)
        runs = {"solve": gp.solve(att, None, cov0, (0.0, T), t_eval=t_eval),
                "solve with mean": gp.solve(att, rng.standard_normal(d), cov0, (0.0, T),
                                            t_eval=t_eval)}
        b = solve_batch([att], cov0[None], (0.0, T), t_eval=t_eval)
        for key, sol in runs.items():
            if sol.status == "finished":
                err[key].append(_rel(sol.cov, exact))
            else:
                other[(key, str(sol.status))] += 1
        if b.status[0] == "finished":
            err["solve_batch"].append(_rel(b.cov[0], exact))
        else:
            other[("solve_batch", str(b.status[0]))] += 1
        if np.isfinite(t_star):
            t_err["solve"].append(abs(gp.solve(att, None, cov0, (0.0, 2 * t_star)).t_blowup
                                      - t_star) / t_star)
            t_err["solve_batch"].append(abs(solve_batch([att], cov0[None], (0.0, 2 * t_star))
                                            .t_blowup[0] - t_star) / t_star)
    print(f"{a.n} settings, default options; largest relative error against the exact "
          "solution:")
    for key, e in err.items():
        print(f"  {key}: covariance {max(e):.1e} over {len(e)} finished runs")
    for key, e in t_err.items():
        print(f"  {key}: blow-up time {max(e):.1e} over {len(e)} blow-ups")
    for (key, status), count in sorted(other.items()):
        print(f"  {key}: {count} runs ended {status}")


if __name__ == "__main__":
    from _record import recorded_main

    recorded_main("accuracy_exact", main)
