"""Benchmark: the certified limit (docs/math.md 4.5) per setting, in CPU time.

Run ``python benchmarks/bench_certified.py`` (the first ``--n`` published settings of
every panel, each with the published draw k = i; default 20; ``--n 100`` is the whole
published protocol, 12 panels x 100 settings) or ``--paths FILE`` for the converged
attempts of a saved replay (``{"paths": ...}`` as ``published_histograms(...,
return_paths=True)`` returns). Every panel is certified by the package's engine (plain
states, ``integrate_states``) on its threads (``NUMBA_NUM_THREADS``, the cores).
Reported (CPU seconds, ``time.process_time``, as the machine is shared; the compilation
is done before any timing and reported apart):

* per panel: settings, CPU seconds per setting, median and largest accepted steps, the
  outcomes (``undecided`` must be 0);
* in all: CPU seconds, per setting; ``step_us``: one step of the published scheme in the
  same process, and the seconds per setting in published steps, a machine-independent
  measure.
"""

import argparse
import collections
import json
import sys
import time

import numba
import numpy as np

from gaussian_pde.attention._l2 import L2
from gaussian_pde.attention._softmax import Softmax
from gaussian_pde.studies import _published as pub
from gaussian_pde.studies._certified import certified_limits


def _jobs(paths, n):
    out = collections.defaultdict(list)
    for kind in ("softmax", "l2"):
        settings = pub.published_settings(kind)
        for val in ("identity", "random"):
            for d in pub.DIMENSIONS:
                qs, vs = settings[d]
                if paths is None:
                    pairs = [(i, i) for i in range(n)]
                else:
                    pairs = [(r["setting"], r["draw"]) for r in paths[kind][val][str(d)]
                             if r["status"] == "converged"]
                draws = pub._sigma0_draws(d, max(k for _, k in pairs) + 1)
                for i, k in pairs:
                    v = np.eye(d) if val == "identity" else vs[i]
                    att = (Softmax(qs[i], -qs[i], v, scale=1 / np.sqrt(d)) if kind == "softmax"
                           else L2(qs[i], -qs[i], v / np.sqrt(d), scale=1.0))
                    out[f"{kind}_{val}_d{d}"].append((att, draws[k]))
    return out


def _run(atts, covs):
    t0 = time.process_time()
    res = certified_limits(atts, covs)
    return res, time.process_time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20, help="settings per panel (100: all)")
    ap.add_argument("--paths", default=None, help="saved replay paths (json)")
    args = ap.parse_args()
    paths = json.load(open(args.paths))["paths"] if args.paths else None
    jobs = _jobs(paths, args.n)
    first = next(iter(jobs.values()))[0]
    t0 = time.perf_counter()
    certified_limits([first[0]], [first[1]])     # compile (or load the cache)
    compile_s = time.perf_counter() - t0
    total_s = 0.0
    total_n, rows = 0, {}
    for key, js in jobs.items():
        atts, covs = [a for a, _ in js], [c for _, c in js]
        res, s = _run(atts, covs)
        total_s += s
        total_n += len(js)
        steps = np.array([r.steps for r in res])
        rows[key] = dict(n=len(js), cpu=s / len(js), steps_median=int(np.median(steps)),
                         steps_max=int(steps.max()),
                         outcomes=dict(collections.Counter(r.outcome for r in res)))
        print(key, json.dumps(rows[key]), file=sys.stderr, flush=True)
    step_s = pub.step_seconds()
    print(f"Certified limits of {total_n} settings on {numba.config.NUMBA_NUM_THREADS} thread(s): "
          f"{total_s:.2f} s of CPU ({total_s / total_n * 1e3:.2f} ms per setting, "
          f"{total_s / total_n / step_s:.0f} published steps of {step_s * 1e6:.1f} us); "
          f"compilation or cache load {compile_s:.1f} s of wall time:")
    print("| panel | settings | CPU s per setting | steps: median | steps: max | outcomes |")
    print("|---|---|---|---|---|---|")
    for key, r in rows.items():
        out = ", ".join(f"{v} x {k}" for k, v in sorted(r["outcomes"].items()))
        print(f"| {key} | {r['n']} | {r['cpu']:.4f} | {r['steps_median']} | "
              f"{r['steps_max']} | {out} |")


if __name__ == "__main__":
    from _record import recorded_main

    recorded_main("bench_certified", main)
