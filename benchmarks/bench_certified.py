"""Benchmark: the certified limit (docs/math.md 4.5) per setting, in CPU time.

Run ``python benchmarks/bench_certified.py`` (the first ``--n`` published settings of
every panel, each with the published draw k = i; default 20, about a minute of CPU) or
``--paths FILE`` for the converged attempts of a saved replay (``{"paths": ...}`` as
``published_histograms(..., return_paths=True)`` returns). Reported, in one process
(CPU seconds, ``time.process_time``, as the machine is shared):

* per panel: settings, CPU seconds per setting, median and largest accepted steps, and
  the outcomes (``undecided`` must be 0);
* ``step_us``: one step of the published scheme in the same process, and
  ``certified_over_step``: CPU seconds of all certified limits over that step, a
  machine-independent measure.
"""

import argparse
import collections
import json
import sys
import time

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20, help="settings per panel")
    ap.add_argument("--paths", default=None, help="saved replay paths (json)")
    args = ap.parse_args()
    paths = json.load(open(args.paths))["paths"] if args.paths else None
    total_s, total_n, rows = 0.0, 0, {}
    for key, jobs in _jobs(paths, args.n).items():
        t0 = time.process_time()
        res = certified_limits([a for a, _ in jobs], [c for _, c in jobs])
        s = time.process_time() - t0
        total_s += s
        total_n += len(jobs)
        steps = np.array([r.steps for r in res])
        rows[key] = dict(n=len(jobs), cpu_s_per_setting=s / len(jobs),
                         steps_median=int(np.median(steps)), steps_max=int(steps.max()),
                         outcomes=dict(collections.Counter(r.outcome for r in res)))
        print(key, json.dumps(rows[key]), file=sys.stderr, flush=True)
    step_s = pub.step_seconds()
    print(f"Certified limit, CPU per setting ({total_n} settings, {total_s:.2f} s of CPU in "
          f"all; one published step {step_s * 1e6:.1f} us, so a setting costs "
          f"{total_s / total_n / step_s:.0f} published steps):")
    print("| panel | settings | CPU s per setting | steps: median | steps: max | outcomes |")
    print("|---|---|---|---|---|---|")
    for key, r in rows.items():
        out = ", ".join(f"{v} x {k}" for k, v in sorted(r["outcomes"].items()))
        print(f"| {key} | {r['n']} | {r['cpu_s_per_setting']:.3f} | {r['steps_median']} | "
              f"{r['steps_max']} | {out} |")


if __name__ == "__main__":
    from _record import recorded_main

    recorded_main("bench_certified", main)
