"""Speed of the Gaussian-mixture closure against particles of the same accuracy.

Case: 8 components in d = 3 (random means and covariances), L2 attention (a contraction:
the state stays O(1)), to t = 20.

Accuracy is measured in one metric for both sides, the Gaussian-fit W2 of the labelled
components (``moment_errors(...)["bw"]``: the square root of the weighted sum over
components of the Bures-Wasserstein distance squared between component moments), at t = 20:

* **reference**: ``R`` independent particle runs of ``n_ref`` tokens; their labelled
  moments averaged (Monte Carlo error that of ``R * n_ref`` tokens; the finite-n bias of
  the particle system is O(1/n_ref), far below);
* **particle Monte Carlo constant** ``c``: each reference run against the average of the
  others has ``E_i^2 = c^2 / n_ref * R / (R - 1)``, so ``c`` comes from the same runs;
* **closure error** ``e_c``: the closure against the reference, less the reference's own
  noise ``c^2 / (R n_ref)`` (in quadrature). When that leaves nothing (the closure is
  exact to the reference's resolution) the measured distance itself is used, an upper
  bound of ``e_c``: the particle count below is then a lower bound;
* **same accuracy**: the particle count ``n* = (c / e_c)^2`` whose Monte Carlo error
  ``c / sqrt(n)`` equals ``e_c``, rounded up to a multiple of 8.

Particles at ``n*`` are timed to t = 20 (one run; ``simulate_particles``, RK45 at its
default tolerances) against the closure (best of 3, ``rtol = 1e-6``: its integration
error, checked against ``rtol = 1e-9``, is printed and is orders below ``e_c``). The
empirical-measure W2 (assignment between point clouds) is not used for the accuracy: in
d = 3 its Monte Carlo floor decays like ``n^{-1/3}`` from quantisation of the point cloud,
whatever the accuracy of the moments; it is printed for information.

Run: ``python benchmarks/bench_mixture.py [--quick]`` (``--quick``: t = 5, a smaller
reference). Prints one line per stage and the ratio.

**Scaling in K** (``--scaling``): softmax in d = 2 (``gp.Softmax.example(2, 0)``), K
random components (means N(0, 4 I), covariances 0.1 I, equal weights), over t in
(0, 0.01) at the defaults (64 nodes per component). Per K: the whole ``solve_mixture``
(best of 2), its evaluations, the time per evaluation, that time divided by
:math:`K^2 n^d d^2` (constant if the cost grows like :math:`K^2`), and, for K up to 400,
the one-shot evaluation the closure used before (every node against every component in
one ``(K n^d, K)`` array, reimplemented here) timed on the same state, interleaved: the
ratio old / new per evaluation, and the whole run on the event loop (``method="LSODA"``,
the default before the engine) against the default on the compiled engine, interleaved.
The exponent of the time per evaluation in K is fitted on K >= 100. Writes
``bench_mixture_scaling.json`` through ``_record.py``.

**Engine against event loop** (``--engine``): seeded mixtures (K = 2..4 components in
d = 2, 3; softmax, L2, biased softmax, linear and multi-head; some blow up), each solved
by the default (``solve_mixture`` on the compiled engine: DOP853, RODAS4P2 once stiff)
and by ``method="LSODA"`` (the event loop, :func:`scipy.integrate.solve_ivp`, the default
before), interleaved, best of 3 each: statuses, evaluations, times and the ratio
event loop / engine per setting, with the median and the extremes. Writes
``bench_mixture_engine.json``.

**Merge events** (``--merges``): the clusters study's grid (``gaussian-pde clusters``: 72
cases, K = 2..8 in d = 2, 3, the study's nodes and output times to t = 4,
``merge_tol = 1``), each solved by the default (the engine, which locates the merges on
its dense output) and by ``method="LSODA"`` (the event loop, the default before),
interleaved, best of 3 each: statuses, merge counts, the largest difference between the
merge times of the two, and the ratio event loop / engine. Writes
``bench_mixture_merges.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np

import gaussian_pde as gp
from gaussian_pde.closure import _mixture as MX
from gaussian_pde.studies import _clusters as C


def _particles(att, mix, n, t_end, seed):
    x0, lab = mix.sample(n, seed=seed)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = gp.simulate_particles(att, x0, (0, t_end), t_eval=[0.0, t_end],
                                  keep_positions=False)
    return time.perf_counter() - t0, p.x_final, lab


def _one_shot(head, logw, means, covs, X):
    """The field as evaluated before the blocks: one (points, K) array of logits."""
    A, H = head.A, head.H
    c, B, logdet = MX.component_terms(A, H, means, covs)
    K, d = means.shape
    b = 0.5 * (c + means) @ A
    M = 0.5 * np.swapaxes(B, 1, 2) @ A
    N = X.shape[0]
    quad = (X[:, :, None] * X[:, None, :]).reshape(N, d * d)
    logit = (logw - 0.5 * logdet) + X @ b.T + quad @ M.reshape(K, d * d).T
    pi = np.exp(logit - logit.max(axis=1, keepdims=True))
    pi /= pi.sum(axis=1, keepdims=True)
    Bbar = (pi @ B.reshape(K, d * d)).reshape(N, d, d)
    return (pi @ c + np.einsum("nij,nj->ni", Bbar, X)) @ head.V.T


def scaling(ks, json_path=None):
    """Time per evaluation and per run against K (module docstring)."""
    att = gp.Softmax.example(2, 0)
    (head,) = MX.quadratic_heads(att)
    rows = []
    for K in ks:
        rng = np.random.default_rng(K)
        mix = gp.GaussianMixture(np.full(K, 1 / K), 2 * rng.normal(size=(K, 2)),
                                 np.broadcast_to(0.1 * np.eye(2), (K, 2, 2)))
        Z, _ = MX.standard_nodes(2, MX.DEFAULT_N_PER_DIM)
        X = (mix.means[:, None, :] + Z @ np.swapaxes(mix.factors(), 1, 2)).reshape(-1, 2)
        logw = np.log(mix.weights)
        new, old = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            MX._velocity([head], logw, mix.means, mix.covs, X)
            new.append(time.perf_counter() - t0)
            if K <= 400:
                t0 = time.perf_counter()
                _one_shot(head, logw, mix.means, mix.covs, X)
                old.append(time.perf_counter() - t0)
        runs, loop = [], []
        for _ in range(2):
            t0 = time.perf_counter()
            sol = gp.solve_mixture(att, mix, (0, 0.01))
            runs.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ref = gp.solve_mixture(att, mix, (0, 0.01), method="LSODA")
            loop.append(time.perf_counter() - t0)
        per = min(new)
        row = {"K": K, "solve_s": min(runs), "nfev": sol.nfev, "status": str(sol.status),
               "lsoda_solve_s": min(loop), "lsoda_nfev": ref.nfev,
               "lsoda_status": str(ref.status), "lsoda_over_engine": min(loop) / min(runs),
               "eval_s": per, "eval_per_K2_n_d2_ns": 1e9 * per / (K * K * Z.shape[0] * 4),
               "old_eval_s": min(old) if old else None,
               "old_over_new": min(old) / per if old else None}
        rows.append(row)
        print(f"K = {K:5d}: solve {row['solve_s']:7.2f} s ({sol.nfev} evaluations, "
              f"{sol.status}; LSODA {row['lsoda_solve_s']:.2f} s, {ref.nfev} evaluations, "
              f"{row['lsoda_over_engine']:.2f}x); one evaluation {per:.4f} s = "
              f"{row['eval_per_K2_n_d2_ns']:.2f} ns x K^2 n^d d^2"
              + (f"; before: {row['old_eval_s']:.4f} s ({row['old_over_new']:.1f}x)"
                 if old else ""))
    big = [r for r in rows if r["K"] >= 100]
    slope = (float(np.polyfit(np.log([r["K"] for r in big]),
                              np.log([r["eval_s"] for r in big]), 1)[0])
             if len(big) >= 2 else None)
    if slope is not None:
        print(f"time per evaluation grows like K^{slope:.2f} (K >= 100)")
    from _record import write_record

    write_record("bench_mixture_scaling", {"d": 2, "t_span": [0, 0.01], "rows": rows,
                                           "exponent_K": slope}, json_path)
    return rows


def _engine_settings():
    """Seeded (name, attention, mixture, t_span, options) of ``--engine``."""
    names = ["softmax", "l2", "biased_softmax", "linear", "multihead"]
    out = []
    for seed in range(30):
        rng = np.random.default_rng(2000 + seed)
        name = names[seed % len(names)]
        K, d = 2 + seed % 3, 2 + (seed // 3) % 2
        att = gp.ATTENTIONS[name].example(d, rng)
        w = rng.random(K) + 0.3
        B = rng.normal(size=(K, d, d)) * 0.4
        mix = gp.GaussianMixture(w / w.sum(), rng.normal(size=(K, d)) * (0.5 + rng.random()),
                                 B @ np.swapaxes(B, 1, 2) + 0.05 * np.eye(d))
        kw = {"steady_tol": 1e-3} if seed % 4 == 1 else {}
        out.append((f"{name} K={K} d={d}", att, mix, (0.0, 4.0), kw))
    return out


def engine(json_path=None, repeats=3):
    """The default on the engine against the event loop (module docstring)."""
    rows = []
    for label, att, mix, span, kw in _engine_settings():
        t_new, t_old = [], []
        for _ in range(repeats):            # interleaved: both see the same load
            t0 = time.perf_counter()
            new = gp.solve_mixture(att, mix, span, **kw)
            t_new.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            old = gp.solve_mixture(att, mix, span, method="LSODA", **kw)
            t_old.append(time.perf_counter() - t0)
        row = {"setting": label, "options": sorted(kw), "status": str(new.status),
               "lsoda_status": str(old.status), "nfev": new.nfev, "lsoda_nfev": old.nfev,
               "engine_s": min(t_new), "lsoda_s": min(t_old),
               "lsoda_over_engine": min(t_old) / min(t_new),
               "stiff": "stiff from" in new.message}
        rows.append(row)
        print(f"{label:28s} {row['status']:13s} engine {row['engine_s'] * 1e3:8.2f} ms "
              f"({new.nfev:5d} ev.) | LSODA {row['lsoda_status']:13s} "
              f"{row['lsoda_s'] * 1e3:8.2f} ms ({old.nfev:5d} ev.) | "
              f"{row['lsoda_over_engine']:6.1f}x")
    r = np.array([row["lsoda_over_engine"] for row in rows])
    e = np.array([row["lsoda_nfev"] / row["nfev"] for row in rows])
    same = sum(row["status"] == row["lsoda_status"] for row in rows)
    summary = {"lsoda_over_engine_median": float(np.median(r)),
               "lsoda_over_engine_min": float(r.min()), "lsoda_over_engine_max": float(r.max()),
               "evaluations_lsoda_over_engine_median": float(np.median(e)),
               "same_status": same, "settings": len(rows)}
    print(f"event loop / engine: median {np.median(r):.1f}x, min {r.min():.1f}x, "
          f"max {r.max():.1f}x; evaluations LSODA / engine median {np.median(e):.2f}; "
          f"same status {same}/{len(rows)}")
    from _record import write_record

    columns = ["setting", "options", "status", "LSODA status", "evaluations",
               "LSODA evaluations", "engine s", "LSODA s", "LSODA / engine"]
    table = [[r["setting"], ", ".join(r["options"]), r["status"], r["lsoda_status"], r["nfev"],
              r["lsoda_nfev"], float(f"{r['engine_s']:.3g}"), float(f"{r['lsoda_s']:.3g}"),
              round(r["lsoda_over_engine"], 1)]
             for r in rows]
    write_record("bench_mixture_engine", {
        "repeats": repeats, **summary,
        "tables": [{"title": "solve_mixture: the default on the engine against the event "
                             "loop's LSODA (best of 3 each, interleaved)",
                    "columns": columns, "rows": table}]}, json_path)
    return rows


def merges(json_path=None, repeats=3):
    """Merge events on the engine against the event loop (module docstring)."""
    rows = []
    for c in C.cluster_cases(False):
        att = C.cluster_attention(c["kind"], c["d"], value=c["value"], q=0.7, seed=c["seed"])
        mix = C.cluster_mixture(c["K"], c["d"], config=c["config"], seed=c["seed"])
        kw = dict(t_eval=np.linspace(0.0, 4.0, 21), n_per_dim=5 if c["d"] == 3 else 6,
                  merge_tol=1.0)
        gp.solve_mixture(att, mix, (0.0, 4.0), **kw)          # compiled before timing
        t_new, t_old = [], []
        for _ in range(repeats):            # interleaved: both see the same load
            t0 = time.perf_counter()
            new = gp.solve_mixture(att, mix, (0.0, 4.0), **kw)
            t_new.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            old = gp.solve_mixture(att, mix, (0.0, 4.0), method="LSODA", **kw)
            t_old.append(time.perf_counter() - t0)
        same = new.merge_times.size == old.merge_times.size
        gap = float(np.max(np.abs(new.merge_times - old.merge_times), initial=0.0)) if same \
            else float("inf")
        rows.append([c["name"], str(new.status), str(old.status), int(new.merge_times.size),
                     int(old.merge_times.size), float(f"{gap:.2g}"),
                     float(f"{min(t_new):.3g}"), float(f"{min(t_old):.3g}"),
                     round(min(t_old) / min(t_new), 1)])
        print(" | ".join(str(x) for x in rows[-1]), flush=True)
    r = np.array([row[-1] for row in rows])
    gaps = np.array([row[5] for row in rows])
    summary = {"lsoda_over_engine_median": float(np.median(r)),
               "lsoda_over_engine_min": float(r.min()), "lsoda_over_engine_max": float(r.max()),
               "same_status": sum(row[1] == row[2] for row in rows),
               "same_merge_count": sum(row[3] == row[4] for row in rows),
               "largest_merge_time_difference": float(gaps.max()), "settings": len(rows)}
    print(summary)
    from _record import write_record

    columns = ["case", "status", "LSODA status", "merges", "LSODA merges",
               "largest merge-time difference", "engine s", "LSODA s", "LSODA / engine"]
    write_record("bench_mixture_merges", {
        "repeats": repeats, **summary,
        "tables": [{"title": "solve_mixture with merge_tol = 1 on the clusters study's grid: "
                             "the default on the engine against the event loop's LSODA "
                             "(best of 3 each, interleaved)",
                    "columns": columns, "rows": rows}]}, json_path)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="t = 5 and a smaller reference")
    ap.add_argument("--scaling", action="store_true",
                    help="time per evaluation and per run against K (d = 2)")
    ap.add_argument("--ks", type=int, nargs="+", default=[25, 50, 100, 200, 400, 1000],
                    help="component counts of --scaling")
    ap.add_argument("--engine", action="store_true",
                    help="the default on the engine against the event loop (LSODA)")
    ap.add_argument("--merges", action="store_true",
                    help="merge events on the engine against the event loop (LSODA)")
    ap.add_argument("--json", default=None,
                    help="where --scaling, --engine or --merges writes its record")
    args = ap.parse_args(argv)
    if args.engine:
        engine(args.json)
        return
    if args.merges:
        merges(args.json)
        return
    if args.scaling:
        scaling(args.ks, args.json)
        return
    t_end = 5.0 if args.quick else 20.0
    R, n_ref = (3, 300) if args.quick else (4, 1000)
    att = C.cluster_attention("l2", 3, q=0.3, seed=0)
    mix = C.cluster_mixture(8, 3, config="random", radius=4.0, spread=0.3, seed=0)
    w = mix.weights

    def closure():
        t0 = time.perf_counter()
        s = gp.solve_mixture(att, mix, (0, t_end), n_per_dim=4, rtol=1e-6, atol=1e-8)
        return time.perf_counter() - t0, s

    times = []
    for _ in range(3):
        dt, sol = closure()
        times.append(dt)
    t_closure = min(times)
    tight = gp.solve_mixture(att, mix, (0, t_end), n_per_dim=4, rtol=1e-9, atol=1e-11)
    e_int = C.moment_errors(sol.means_final, sol.covs_final, tight.means_final,
                            tight.covs_final, w)["bw"]
    print(f"closure: {t_closure:.3f} s (best of 3), status {sol.status}, nfev {sol.nfev}, "
          f"integration error {e_int:.1e}")

    M, Cv, secs = [], [], []
    for r in range(R):
        dt, x, lab = _particles(att, mix, n_ref, t_end, seed=100 + r)
        m, c = C.labelled_moments(x, lab, mix.K)
        M.append(m)
        Cv.append(c)
        secs.append(dt)
    M, Cv = np.asarray(M), np.asarray(Cv)
    ref_m, ref_c = M.mean(0), Cv.mean(0)
    loo = [C.moment_errors(M[i], Cv[i], (M.sum(0) - M[i]) / (R - 1),
                           (Cv.sum(0) - Cv[i]) / (R - 1), w)["bw"] for i in range(R)]
    c2 = n_ref * np.mean(np.square(loo)) * (R - 1) / R
    noise2 = c2 / (R * n_ref)
    print(f"reference: {R} x {n_ref} particles ({np.mean(secs):.2f} s each), Monte Carlo "
          f"constant c = {np.sqrt(c2):.3f}, reference noise {np.sqrt(noise2):.4f}")
    E_c = float(C.moment_errors(sol.means_final, sol.covs_final, ref_m, ref_c, w)["bw"])
    resolved = E_c**2 > 2 * noise2
    e_c = np.sqrt(E_c**2 - noise2) if resolved else E_c
    n_star = int(8 * np.ceil(c2 / e_c**2 / 8))
    print(f"closure vs reference: {E_c:.4f}; closure error "
          f"{'%.4f' % e_c if resolved else '<= %.4f (not resolved: n* is a lower bound)' % e_c}"
          f"; same accuracy at n* = {n_star} particles")
    tp, x, lab = _particles(att, mix, n_star, t_end, seed=7)
    m, c = C.labelled_moments(x, lab, mix.K)
    e_p = float(C.moment_errors(m, c, ref_m, ref_c, w)["bw"])
    times += [closure()[0] for _ in range(3)]     # again after the particles: same load
    t_closure = min(times)
    sub = np.random.default_rng(3).choice(n_star, min(n_star, 1000), replace=False)
    w2, floor = C.w2_to_mixture(x[sub], sol.mixture(-1), seed=2)
    print(f"particles n* = {n_star}: {tp:.2f} s, error vs reference {e_p:.4f} "
          f"(expected {np.sqrt(c2 / n_star + noise2):.4f}); empirical W2 to the closure "
          f"({sub.size} random tokens) {w2:.3f}, floor {floor:.3f}")
    print(f"ratio particles / closure at the same accuracy: {tp / t_closure:.1f} (closure "
          f"best of 6 around it: {t_closure:.3f} s)")


if __name__ == "__main__":
    if {"--engine", "--scaling", "--merges"} & set(sys.argv[1:]):
        main()                  # they write their own records (``--json``)
    else:
        from _record import recorded_main

        recorded_main("bench_mixture", main)
