"""Benchmark: the batched replay of the published histograms against a per-trajectory loop.

Run ``python benchmarks/bench_published.py`` (all twelve panels, several minutes) or with
``--types softmax --values identity --ds 3`` for one panel. Reported, in one process:

* ``step_us``: one step of the published scheme (d = 5, softmax, projected Euler) in the
  per-trajectory loop; the published scripts take 708 s where this step costs 27.5 us.
* ``replay_s`` and ``replay_over_step = replay_s / step_s``, comparable across machines
  (the published script: 708 s / 27.5 us = 2.6e7).
* ``ratio``: loop time per trajectory step, measured on the first ``--sample`` attempts of
  each panel's sequential path (same draws, same stop iterations), times the path steps
  of the replay, divided by ``replay_s``: how much faster the replay is per setting.
"""

import argparse
import json
import time

import numpy as np

from gaussian_pde.studies import _published as pub


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", nargs="+", default=["softmax", "l2"])
    ap.add_argument("--values", nargs="+", default=["identity", "random"])
    ap.add_argument("--ds", nargs="+", type=int, default=[3, 4, 5])
    ap.add_argument("--sample", type=int, default=3, help="loop attempts per panel")
    args = ap.parse_args()
    step_s = pub.step_seconds()
    t = time.perf_counter()
    res = pub.published_histograms(types=args.types, ds=args.ds, values=args.values,
                                   return_paths=True, progress=print)
    replay_s = time.perf_counter() - t
    loop_s = loop_steps = path_steps = 0
    for kind in args.types:
        settings = pub.published_settings(kind)
        for val in args.values:
            par = pub.PANELS[(kind, val)]
            for d in args.ds:
                path = res["paths"][kind][val][str(d)]
                path_steps += sum(min(r["stop_iteration"] + 1, par["max_iter"]) for r in path)
                qs, vs = settings[d]
                draws = pub._sigma0_draws(d, path[args.sample - 1]["draw"] + 1)
                h = par["h"][pub.DIMENSIONS.index(d)]
                for rec in path[:args.sample]:
                    v = np.eye(d) if val == "identity" else vs[rec["setting"]]
                    t = time.perf_counter()
                    ref = pub.reference_attempt(kind, qs[rec["setting"]], v, draws[rec["draw"]],
                                                h, par["tol"], par["max_iter"])
                    loop_s += time.perf_counter() - t
                    loop_steps += min(ref["iterations"] + 1, par["max_iter"])
                    assert ref["status"] == rec["status"] and ref["rank"] == rec["rank"]
    loop_per_step = loop_s / loop_steps
    out = {"step_us": step_s * 1e6, "replay_s": replay_s,
           "replay_over_step": replay_s / step_s, "path_steps": path_steps,
           "loop_us_per_step": loop_per_step * 1e6,
           "loop_estimate_s": loop_per_step * path_steps,
           "ratio": loop_per_step * path_steps / replay_s,
           "histograms": res["histograms"]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
