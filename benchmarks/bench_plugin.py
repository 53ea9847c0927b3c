"""A type from another package on the compiled path: key-norm softmax against L2.

The example plugin ``examples/keynorm_plugin`` brings its own compiled kernel (one
Cholesky solve with ``I + gamma L^T L`` per evaluation); L2 attention, the package's
type of the same family, solves with ``I_k + B B^T``. Both run ``solve_batch`` with
means on the compiled integrator, over the same batch: ``B`` trajectories in ``d``
dimensions with random weights (one set per trajectory, the same ``Q, K, V`` for both
types), random means and covariances, to ``t_end`` at the default tolerances. Each is
compiled and run once first, then the two are timed alternately, best of ``--runs``; the
ratio keynorm / L2 is that of the best times (target: at most 2). The time per field
evaluation is the ratio of the time to the evaluations both made.

Run: ``python benchmarks/bench_plugin.py [--quick]`` (the plugin is imported from its
folder when it is not installed). Writes ``bench_plugin.json`` through ``_record.py``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import gaussian_pde as gp

ROOT = Path(__file__).resolve().parent.parent
try:
    from keynorm_plugin import KeyNormSoftmax
except ImportError:                 # not installed: from its folder
    sys.path.insert(0, str(ROOT / "examples" / "keynorm_plugin"))
    from keynorm_plugin import KeyNormSoftmax


def batch(d, B, seed):
    """The attentions of both types and the initial means and covariances."""
    rng = np.random.default_rng(seed)
    keynorm, l2 = [], []
    for _ in range(B):
        Q, K = 0.5 * rng.standard_normal((2, d, d))
        V = rng.standard_normal((d, d)) / np.sqrt(d)
        keynorm.append(KeyNormSoftmax(Q, K, V, gamma=float(rng.uniform(0.1, 2.0))))
        l2.append(gp.L2(Q, K, V))
    L = rng.standard_normal((B, d, d)) / np.sqrt(d)
    covs = L @ np.swapaxes(L, 1, 2) + 0.1 * np.eye(d)
    return keynorm, l2, rng.standard_normal((B, d)), covs


def run(atts, covs, means, t_end):
    t0 = time.perf_counter()
    sol = gp.solve_batch(atts, covs, (0.0, t_end), mean0s=means)
    return time.perf_counter() - t0, sol


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    shapes = [(2, 200), (3, 200)] if args.quick else [(2, 1000), (3, 1000), (5, 1000)]
    for d, B in shapes:
        keynorm, l2, means, covs = batch(d, B, seed=100 + d)
        best = {}
        for name, atts in (("keynorm", keynorm), ("l2", l2)):
            _, sol = run(atts, covs, means, 2.0)          # compile, or load from the cache
            assert sol.path == "compiled", (name, sol.path)
            names, counts = np.unique([str(s) for s in sol.status], return_counts=True)
            best[name] = [np.inf, int(np.sum(sol.nfev)),
                          {str(k): int(v) for k, v in zip(names, counts)}]
        for _ in range(args.runs):
            for name, atts in (("keynorm", keynorm), ("l2", l2)):
                best[name][0] = min(best[name][0], run(atts, covs, means, 2.0)[0])
        ratio = best["keynorm"][0] / best["l2"][0]
        per_eval = ((best["keynorm"][0] / best["keynorm"][1])
                    / (best["l2"][0] / best["l2"][1]))
        rows.append([d, B, best["l2"][0], best["keynorm"][0], ratio, per_eval,
                     best["l2"][1], best["keynorm"][1]])
        print(f"d = {d}, B = {B}: L2 {best['l2'][0]:.3f} s ({best['l2'][1]} evaluations), "
              f"keynorm {best['keynorm'][0]:.3f} s ({best['keynorm'][1]}); ratio {ratio:.2f}, "
              f"per evaluation {per_eval:.2f}; statuses {best['l2'][2]} / {best['keynorm'][2]}",
              flush=True)
    payload = dict(
        worst_ratio=max(r[4] for r in rows), target_ratio=2.0,
        tables=[dict(title="solve_batch with means, compiled path: the key-norm plugin against L2",
                     columns=["d", "trajectories", "L2 (s)", "keynorm (s)", "keynorm / L2",
                              "per evaluation", "L2 evaluations", "keynorm evaluations"],
                     rows=rows)],
        notes=["Best of the alternated runs after one compiling run each; t in (0, 2), default "
               "tolerances, the same Q, K, V for both types."])
    from _record import write_record

    write_record("bench_plugin", payload, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
