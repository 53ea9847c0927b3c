"""Benchmark: the replay of the published histograms against a per-trajectory loop.

Run ``python benchmarks/bench_published.py`` (all twelve panels) or, for a subset,
``--types softmax --values identity --ds 3``. Everything is CPU time
(``time.process_time``) in one process, so the load of a shared machine cancels in the
ratios. Reported:

* ``kernel_load_s``: the first call of the compiled kernel (importing Numba, and
  compiling the kernel or loading it from Numba's cache); ``ratio_with_load`` counts it.
* ``replay_s``: :func:`gaussian_pde.studies.published_histograms` for the panels asked.
* ``loop_us_per_step``: the per-trajectory loop of the same scheme
  (:func:`~gaussian_pde.studies._published.reference_attempt`, the published expressions,
  ``eigh`` projection at every step), per panel, timed on ``--sample`` attempts of that
  panel's sequential path (same setting, same draw), each run for at most
  ``--loop-steps`` steps.
* ``loop_estimate_s``: per panel, loop time per step times the steps of the panel's
  sequential path (what the loop must run: every attempt to its stop), summed;
  ``ratio = loop_estimate_s / replay_s`` (target >= 20).
* ``script_ratio``: the published script's 2.575e7 steps (708 s at 27.5 us per step on an
  idle core) at this process's ``step_seconds`` (d = 5 softmax step), over ``replay_s``.
* ``checked``: sampled attempts with at most ``--check-steps`` steps are run to their
  stop by the loop; status and rank must agree with the replay (up to attempts within 1%
  of a decision boundary, listed in ``mismatch``).
"""

import argparse
import json
import time

import numpy as np

from gaussian_pde.studies import _published as pub

SCRIPT_STEPS = 708.0 / 27.5e-6


def _loop_step_cost(kind, val, d, path, args):
    """Loop seconds per step on the sampled attempts, and the status/rank check."""
    par = pub.PANELS[(kind, val)]
    h = par["h"][pub.DIMENSIONS.index(d)]
    qs, vs = pub.published_settings(kind)[d]
    picks = np.linspace(0, len(path) - 1, min(args.sample, len(path))).round().astype(int)
    draws = pub._sigma0_draws(d, max(path[m]["draw"] for m in picks) + 1)
    secs = steps = 0
    checked, mismatch = 0, []
    for m in picks:
        rec = path[m]
        v = np.eye(d) if val == "identity" else vs[rec["setting"]]
        full = min(rec["stop_iteration"] + 1, par["max_iter"]) <= args.check_steps
        cap = par["max_iter"] if full else args.loop_steps
        t = time.process_time()
        ref = pub.reference_attempt(kind, qs[rec["setting"]], v, draws[rec["draw"]], h,
                                    par["tol"], cap)
        secs += time.process_time() - t
        steps += min(ref["iterations"] + 1, cap)
        if full:
            checked += 1
            if (ref["status"], ref["rank"]) != (rec["status"], rec["rank"]):
                mismatch.append({"panel": f"{kind} {val} {d}", "setting": rec["setting"],
                                 "draw": rec["draw"], "replay": rec["status"],
                                 "loop": ref["status"], "rank": [rec["rank"], ref["rank"]]})
    return secs / steps, checked, mismatch


def _load_kernel():
    """First call of the compiled kernel: Numba's import and compilation (or cache load)."""
    qs, _ = pub.published_settings("softmax")[3]
    pub._run_attempt("softmax", pub._row_constants("softmax", qs[0], np.eye(3), 3),
                     np.eye(3), 0.09, 1e-4, 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", nargs="+", default=["softmax", "l2"])
    ap.add_argument("--values", nargs="+", default=["identity", "random"])
    ap.add_argument("--ds", nargs="+", type=int, default=[3, 4, 5])
    ap.add_argument("--sample", type=int, default=3, help="loop attempts per panel")
    ap.add_argument("--loop-steps", type=int, default=2000,
                    help="steps per timed loop attempt (the loop's cost per step is flat)")
    ap.add_argument("--check-steps", type=int, default=6000,
                    help="sampled attempts up to this many steps are run to their stop")
    ap.add_argument("--json", default=None,
                    help="also write the result, with the details per panel, here")
    ap.add_argument("--paths", default=None, help="write the sequential paths here")
    args = ap.parse_args()
    t = time.process_time()
    _load_kernel()
    load_s = time.process_time() - t
    t = time.process_time()
    res = pub.published_histograms(types=args.types, ds=args.ds, values=args.values,
                                   return_paths=True, progress=print)
    replay_s = time.process_time() - t
    step_s = pub.step_seconds()
    panels = {}
    loop_s = path_steps = 0.0
    checked, mismatch = 0, []
    for kind in args.types:
        for val in args.values:
            for d in args.ds:
                path = res["paths"][kind][val][str(d)]
                det = res["details"][kind][val][str(d)]
                per_step, n_chk, bad = _loop_step_cost(kind, val, d, path, args)
                checked += n_chk
                mismatch += bad
                loop_s += per_step * det["path_steps"]
                path_steps += det["path_steps"]
                panels[f"{kind} {val} {d}"] = {
                    "loop_us_per_step": per_step * 1e6, "path_steps": det["path_steps"]}
    out = {"kernel_load_s": load_s, "replay_s": replay_s, "loop_estimate_s": loop_s,
           "ratio": loop_s / replay_s, "ratio_with_load": loop_s / (load_s + replay_s),
           "path_steps": path_steps, "step_us": step_s * 1e6,
           "script_estimate_s": SCRIPT_STEPS * step_s,
           "script_ratio": SCRIPT_STEPS * step_s / replay_s,
           "checked": checked, "mismatch": mismatch, "panels": panels,
           "histograms": res["histograms"]}
    print(json.dumps(out, indent=1))
    from _record import write_record

    write_record("bench_published", {**out, "details": res["details"]}, args.json)
    if args.paths:
        with open(args.paths, "w") as fh:
            json.dump(res["paths"], fh)


if __name__ == "__main__":
    main()
