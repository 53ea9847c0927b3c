"""The Gaussian closure of an attention: gp.solve's compiled engine against the closure's event loop.

``gp.solve_closure`` with its default ``method="auto"`` hands an attention with a compiled
field to :func:`gaussian_pde.solve` (the compiled engine); ``method="RK45"`` integrates the
same closure, which is exact for these types, in the event loop (the default before).
Both at the closure's tolerances (``rtol = 1e-8``, ``atol = 1e-10``) on one layer
``t in (0, t_end)``, ``t_end`` half the blow-up time where there is one:

* **time**: CPU seconds of one call (``time.process_time``), the least of ``--rounds``
  calls, the two methods interleaved round by round so that both see the same machine;
* **error**: ``max |Sigma(t_end) - Sigma_ref| / max |Sigma_ref|``, with ``Sigma_ref`` the
  exact covariance (:func:`gaussian_pde.exact_covariance`, softmax with ``V = I``) or
  ``gp.solve`` at ``rtol = 1e-13``, ``atol = 1e-15`` (other value matrices);
* **nfev**: right-hand-side evaluations.

Run:  python benchmarks/bench_closure_engine.py [--rounds 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _record import write_record  # noqa: E402

import gaussian_pde as gp  # noqa: E402

METHODS = ("auto", "RK45")


def cases():
    """``name -> (attention, mean0, cov0, t_end, reference covariance at t_end)``."""
    rng = np.random.default_rng(11)
    out = {}
    for d in (2, 8):
        att = gp.Softmax(*(0.5 * rng.standard_normal((2, d, d)) / np.sqrt(d)), np.eye(d))
        cov0 = np.eye(d) + 0.1 * np.ones((d, d))
        t_end = 0.5 * gp.blowup_time(att, cov0)
        out[f"softmax V = I, d = {d}"] = (att, 0.3 * np.ones(d), cov0, t_end,
                                          gp.exact_covariance(att, cov0, t_end))
    d = 8
    att = gp.MultiHead([gp.Softmax(*(0.3 * rng.standard_normal((3, d, d)))) for _ in range(2)])
    mean0, cov0 = 0.3 * np.ones(d), np.eye(d) + 0.1 * np.ones((d, d))
    ref = gp.solve(att, mean0, cov0, (0, 0.25), rtol=1e-13, atol=1e-15)
    out[f"MultiHead of 2 softmax heads, d = {d}"] = (att, mean0, cov0, 0.25, ref.cov_final)
    return out


def measure(att, mean0, cov0, t_end, ref, rounds):
    """Least CPU seconds, relative error at ``t_end`` and evaluations of each method."""
    def run(method):
        return gp.solve_closure(att, mean0, cov0, (0.0, t_end), t_eval=[0.0, t_end],
                                method=method)

    for method in METHODS:        # the first call compiles (the engine) or warms
        run(method)
    best = dict.fromkeys(METHODS, float("inf"))
    sols = {}
    for _ in range(rounds):
        for method in METHODS:
            start = time.process_time()
            sols[method] = run(method)
            best[method] = min(best[method], time.process_time() - start)
    scale = np.abs(ref).max()
    return {m: dict(seconds=best[m], rel_error=float(np.abs(sols[m].cov[-1] - ref).max() / scale),
                    nfev=int(sols[m].nfev), status=str(sols[m].status)) for m in METHODS}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    rows, raw = [], {}
    for name, (att, mean0, cov0, t_end, ref) in cases().items():
        r = measure(att, mean0, cov0, t_end, ref, args.rounds)
        raw[name] = dict(t_end=t_end, **r)
        e, k = r["auto"], r["RK45"]
        rows.append([name, f"{e['seconds'] * 1e3:.3g}", f"{k['seconds'] * 1e3:.3g}",
                     f"{k['seconds'] / e['seconds']:.2g}", f"{e['rel_error']:.2g}",
                     f"{k['rel_error']:.2g}", str(e["nfev"]), str(k["nfev"])])
        print("  ".join(rows[-1]), flush=True)
    table = dict(title=("gp.solve_closure of an attention: the default (gp.solve's compiled "
                        "engine) against method='RK45' (the closure's event loop), one layer, "
                        "rtol 1e-8, atol 1e-10 (CPU, least of the rounds)"),
                 columns=["case", "engine ms", "RK45 ms", "RK45 / engine", "engine rel. error",
                          "RK45 rel. error", "engine nfev", "RK45 nfev"],
                 rows=rows)
    payload = dict(rounds=args.rounds, tables=[table], settings=raw)
    print("wrote", write_record("bench_closure_engine", payload, args.json))


if __name__ == "__main__":
    main()
