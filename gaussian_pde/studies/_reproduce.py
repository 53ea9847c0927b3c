r"""``gaussian-pde reproduce``: the paper's Gaussian figures, and what they look like accurately.

Writes into an output folder (all files atomically, :mod:`gaussian_pde._common.io`):

* ``regimes_<type>.png`` for softmax, L2, multi-head and Sinkhorn: the 2-D regimes of
  docs/math.md section 4.4, the families of the published ``2d_plots.py`` with its draws
  (:mod:`gaussian_pde.studies._regimes`: convergence to 0, to a line, to a plane and to
  two lines in the PSD cone, blow-up and the :math:`\Sigma_0`-dependent regime as
  :math:`\Sigma/\operatorname{tr}\Sigma` in the disk);
* ``eigenvalue_flows.png``: eigenvalues of :math:`\Sigma/\operatorname{tr}\Sigma` over time;
* ``rank_histograms.png``: ranks for d = 3, 4, 5, softmax and L2, V = I and
  :math:`V = G^TG`, the paper's protocol next to the accurate one;
* ``report.md`` (embeds the figures), ``results.json`` and ``histograms.npz``.

The two protocols for the histograms (settings: :math:`Q \in \mathbb R^{\lfloor d/2\rfloor
\times d}` standard normal, :math:`K = -Q`, :math:`\Sigma_0 = GG^T`, scale
:math:`1/\sqrt d`):

*paper*
    integrate until :math:`\|\Sigma'\|_F <` ``paper_tol`` and count the eigenvalues of
    :math:`\Sigma` above 0.1;
*accurate*
    the rank of the true limit: for softmax with :math:`V = I` from the exact solution
    :math:`\Sigma(t) = \Sigma_0^{1/2}(I - tC)^{-1}\Sigma_0^{1/2}`,
    :math:`C = \Sigma_0^{1/2}(A + A^T)\Sigma_0^{1/2} \preceq 0`, whose limit is
    :math:`\Sigma_0^{1/2}\Pi_{\ker C}\Sigma_0^{1/2}`; otherwise by integrating to
    ``t = 1e8`` with :func:`gaussian_pde.integrate._batch.solve_batch` (DOP853, switching to the
    L-stable Rosenbrock method RODAS4 where a trajectory turns stiff) and classifying with
    :func:`gaussian_pde.analysis.classify_trajectory` (undecided trajectories are
    reported as such, never guessed).

Speed: per ``d`` one :func:`~gaussian_pde.integrate._batch.solve_batch` call per protocol holds all
four panels (their slow tails share iterations), and the full run splits over two
processes (:func:`_compute`: a forked child integrates the histograms of d = 5 and 3 while
the parent does the regimes and d = 4; every random draw is made before the split, so
the results equal the serial ones bit for bit). ``--quick`` runs serially.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import pathlib
import time

import numpy as np

from .._common.io import ensure_output_dir, save_figure, write_npz, write_text
from .._common.linalg import psd_sqrt
from .._common.validation import validate_int, validate_positive
from ..analysis import classify_trajectory, limit_rank
from ..attention._l2 import L2
from ..attention._softmax import Softmax
from ..integrate._batch import solve_batch
from ._regimes import (
    FAMILIES,
    N_FIGURES,
    _run_regimes,
    draw_all,
    regime_figures,
    regime_grids,
    report_lines,
    unit_trace_grid,
)

__all__ = ["reproduce", "unit_trace_grid", "REGIMES", "TYPES", "PAPER_THRESHOLD"]

#: the 2-D regimes (families of the published 2d_plots.py), in the order of the figures
REGIMES = FAMILIES
#: attention types of the regime figures
TYPES = ("softmax", "l2", "multihead", "sinkhorn")
#: the paper's rank threshold on the eigenvalues of the stopped covariance
PAPER_THRESHOLD = 0.1
#: rank thresholds of the accurate protocol (relative to the largest eigenvalue)
ACCURATE_RTOL = 1e-6
#: dimensions of the rank histograms
_HIST_DS = (3, 4, 5)
#: horizon of the accurate histograms
_HIST_HORIZON = 1e8
#: per-trajectory evaluation cap, Jacobian evaluations included (a trajectory that hits it
#: ends undecided, never guessed). The integrator is solve_batch's default
#: method="auto": DOP853 until a trajectory turns stiff (the V = G^T G cases approach
#: their rank-deficient limit like 1/t while the surviving directions relax fast), then
#: the L-stable Rosenbrock method RODAS4, whose steps are not stability-limited: every
#: histogram trajectory reaches t = 1e8 well within the cap.
_MAX_NFEV = 100_000
#: tolerances of the histogram runs. The paper protocol only counts eigenvalues above 0.1
#: at the stop. The accurate protocol classifies eigenvalues at 1e-6 of the largest at
#: t = 1e8, which is sensitive near the "settled" border: rtol 1e-6 changed 34 of the
#: 1000 accurate ranks against 1e-7 (seed 0), so 1e-7.
_PAPER_RTOL = 1e-6
_ACCURATE_RTOL = 1e-7


# ----------------------------------------------------------------------------------------
# the rank histograms
# ----------------------------------------------------------------------------------------

def _hist_settings(rng, d, n):
    k = d // 2
    Qs = rng.standard_normal((n, k, d))
    Gs = rng.standard_normal((n, d, d))
    return Qs, Gs


def _exact_limit_softmax_identity(Q, cov0, scale):
    """Limit of the exact V = I softmax solution for K = -Q (C = R(A + A^T)R <= 0)."""
    R = psd_sqrt(cov0)
    C = R @ (-2.0 * scale * Q.T @ Q) @ R
    w, U = np.linalg.eigh(0.5 * (C + C.T))
    null = U[:, np.abs(w) <= 1e-12 * max(np.abs(w).max(), 1e-300)]
    return R @ null @ null.T @ R


_PANELS = (("softmax", "I"), ("softmax", "GtG"), ("l2", "I"), ("l2", "GtG"))


def _histograms_many(settings, paper_tol, progress=None):
    """:func:`_histograms_d` for several ``d``: ``settings`` is ``[(Qs, Gs), ...]``.

    ``progress``: called after each ``d``.
    """
    out = {}
    for Qs, Gs in settings:
        out.update(_histograms_d(Qs, Gs, paper_tol))
        if progress is not None:
            progress(f"histograms: d = {Qs.shape[-1]}")
    return out


def _histograms_d(Qs, Gs, paper_tol):
    """The four rank-histogram panels of one ``d`` for settings ``Qs``, ``Gs``."""
    out = {}
    panels = _PANELS
    n_settings, d = Qs.shape[0], Qs.shape[-1]
    cov0s = Gs @ np.swapaxes(Gs, -1, -2)
    scale = 1.0 / np.sqrt(d)
    Vs = {"I": np.broadcast_to(np.eye(d), Gs.shape), "GtG": np.swapaxes(Gs, -1, -2) @ Gs}
    cls = {"softmax": Softmax, "l2": L2}
    atts = {(kind, vname): [cls[kind](Q, -Q, V, scale=scale) for Q, V in zip(Qs, Vs[vname])]
            for kind, vname in panels}
    # one batch per protocol for all the panels of this d (rows: panel by panel), so
    # the slow tails of the panels share their iterations
    paper_all = solve_batch([a for p in panels for a in atts[p]],
                            np.concatenate([cov0s] * len(panels)), (0.0, _HIST_HORIZON),
                            rtol=_PAPER_RTOL, atol=1e-12, steady_atol=paper_tol,
                            max_nfev=_MAX_NFEV)
    acc_panels = [p for p in panels if p != ("softmax", "I")]   # softmax V = I: exact
    acc_all = solve_batch([a for p in acc_panels for a in atts[p]],
                          np.concatenate([cov0s] * len(acc_panels)), (0.0, _HIST_HORIZON),
                          rtol=_ACCURATE_RTOL, atol=1e-14, max_nfev=_MAX_NFEV)
    for kind, vname in panels:
        pi = panels.index((kind, vname))
        rows = np.arange(pi * n_settings, (pi + 1) * n_settings)
        paper_rank = np.array([
            limit_rank(paper_all.cov_final[b], rtol=0.0, atol=PAPER_THRESHOLD)
            if paper_all.status[b] == "steady" else -1 for b in rows])
        exact_limit = None
        if kind == "softmax" and vname == "I":
            lims = np.array([_exact_limit_softmax_identity(Q, c, scale)
                             for Q, c in zip(Qs, cov0s)])
            true_rank = np.array([limit_rank(x, rtol=1e-8) for x in lims])
            exact_limit = lims
            outcome = ["rank (exact solution)"] * n_settings
            limits = lims
        else:
            ai = acc_panels.index((kind, vname))
            true_rank, outcome, limits = [], [], []
            for i, b in enumerate(range(ai * n_settings, (ai + 1) * n_settings)):
                oc = classify_trajectory(
                    np.array([0.0, acc_all.t_final[b]]),
                    np.array([cov0s[i], acc_all.cov_final[b]]),
                    attention=atts[(kind, vname)][i], status=acc_all.status[b],
                    message=acc_all.message[b], rtol=ACCURATE_RTOL)
                outcome.append(str(oc.outcome))
                true_rank.append(oc.rank if oc.outcome in ("rank", "zero") else -1)
                limits.append(oc.limit if oc.limit is not None
                              else np.full((d, d), np.nan))
            true_rank, limits = np.array(true_rank), np.array(limits)
        lim_thr = np.array([limit_rank(x, rtol=0.0, atol=PAPER_THRESHOLD)
                            if np.isfinite(x).all() else -1 for x in limits])
        # lower bound of the limit from the conserved N^T Sigma^-1 N (K = -Q):
        bound = d - np.array([np.linalg.matrix_rank(Q) for Q in Qs])
        out[(kind, vname, d)] = dict(
            paper=paper_rank, accurate=true_rank, limit_paper_threshold=lim_thr,
            outcome=outcome, bound=bound, t_paper=paper_all.t_final[rows],
            exact=exact_limit is not None)
    return out


# ----------------------------------------------------------------------------------------
# figures and report
# ----------------------------------------------------------------------------------------

def _figures(out, regimes, hists, ds, progress=None):
    """Write the figures; ``progress``: called after each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .. import plotting

    paths = regime_figures(out, regimes, save_figure, progress=progress)

    fig, axes = plt.subplots(len(ds), 4, figsize=(16, 3.2 * len(ds)), squeeze=False)
    for i, d in enumerate(ds):
        for j, (kind, vname) in enumerate((("softmax", "I"), ("softmax", "GtG"),
                                           ("l2", "I"), ("l2", "GtG"))):
            h = hists[(kind, vname, d)]
            plotting.plot_rank_histogram(
                {"paper": h["paper"],
                 "accurate": h["accurate"]}, d, axes[i, j],
                title=f"{kind}, V = {'I' if vname == 'I' else 'G^T G'}, d = {d}")
    fig.suptitle("Rank of the stationary covariance: the paper's protocol vs the true limit "
                 "(? = undecided)", fontsize=11)
    fig.tight_layout()
    paths["rank_histograms"] = save_figure(fig, out / "rank_histograms.png", dpi=80)
    plt.close(fig)
    if progress is not None:
        progress("figure: rank_histograms.png")
    return paths


def _outcome_counts(outcomes):
    kinds = {}
    for o in outcomes:
        key = str(o.outcome) + (f" {o.rank}" if o.outcome == "rank" else "")
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))


def _disagreement(h):
    dis = h["paper"] != h["accurate"]
    thr = h["limit_paper_threshold"] != h["accurate"]
    stop = h["paper"] != h["limit_paper_threshold"]
    return int(dis.sum()), int((dis & thr).sum()), int((dis & stop).sum())


def _report(cfg, regimes, hists, ds, paths, timing):
    L = ["# gaussian-pde reproduce: the Gaussian results of Castin et al.", "",
         f"Seed {cfg['seed']}, {'quick' if cfg['quick'] else 'full'} run, "
         f"{timing['compute_s']:.2f} s of compute ({timing['cpu_s']:.2f} s CPU), "
         f"{timing['wall_s']:.2f} s wall including figures.", "",
         *report_lines(regimes, paths)]
    L += ["## Rank histograms", "",
          f"{cfg['n_settings']} settings per dimension: Q in R^(floor(d/2) x d) standard "
          "normal, K = -Q, Sigma_0 = G G^T, V = I or V = G^T G (the same G), scale "
          "1/sqrt(d).", "",
          f"* **paper protocol**: integrate until the Frobenius norm of the right-hand side "
          f"is below {cfg['paper_tol']:g} (the published script uses 1e-4 or 5e-5 per panel "
          "with explicit Euler steps, docs/math.md section 9.5; `--paper-tol` changes it), "
          "count eigenvalues above 0.1;",
          "* **accurate protocol**: the rank of the true limit: for softmax with V = I from "
          "the exact solution (docs/math.md section 4.1), otherwise integrating to t = 1e8 "
          "(`solve_batch`: DOP853, switching per trajectory to the L-stable Rosenbrock "
          f"method RODAS4 once stiff; rtol {_ACCURATE_RTOL:g}) and "
          f"classifying (relative rank threshold {ACCURATE_RTOL:g}); `?` = undecided.", "",
          "| type | V | d | paper counts (rank 0..d) | accurate counts | disagree | "
          "of which: threshold 0.1 | of which: early stop |", "|---" * 8 + "|"]
    summary = {}
    for kind in ("softmax", "l2"):
        for vname in ("I", "GtG"):
            for d in ds:
                h = hists[(kind, vname, d)]

                def cnt(r, d=d):
                    c = np.bincount(np.where(r < 0, d + 1, r), minlength=d + 2)
                    return " ".join(str(x) for x in c[:d + 1]) + (f" ?{c[-1]}" if c[-1] else "")

                dis, thr, stop = _disagreement(h)
                summary[f"{kind}_{vname}_{d}"] = dict(disagree=dis, threshold=thr, early_stop=stop,
                                                      n=int(h["paper"].size))
                L.append(f"| {kind} | {'I' if vname == 'I' else 'G^T G'} | {d} | {cnt(h['paper'])} "
                         f"| {cnt(h['accurate'])} | {dis}/{h['paper'].size} | {thr} | {stop} |")
    tot = sum(v["disagree"] for v in summary.values())
    below = sum(int(((h["accurate"] >= 0) & (h["accurate"] < h["bound"])).sum())
                for h in hists.values())
    n_all = sum(v["n"] for v in summary.values())
    L += ["", f"The protocols disagree on {tot} of {n_all} settings. Why:", "",
          "* **threshold 0.1**: the limit covariance has eigenvalues that are non-zero but "
          "below 0.1 (Sigma_0 = G G^T has eigenvalues spread over orders of magnitude), "
          "so an absolute threshold counts them as zero: the rank is under-counted even "
          "with the exact limit (column: the exact/accurate limit counted with the 0.1 "
          "threshold differs from its true rank).",
          "* **early stop**: for K = -Q the covariance converges algebraically (like 1/t, "
          "docs/math.md section 4.1: Sigma(t) = (Sigma_0^-1 + 2ct Q^T Q)^-1 for V = I), so "
          "|Sigma'| = O(1/t^2) falls below the tolerance while a vanishing eigenvalue is "
          "still O(sqrt(tol)), possibly above 0.1: the rank is over-counted (column: the "
          "stopped state and the true limit, both counted above 0.1, differ).", "",
          "**True histogram for V = I**: the exact solution gives the limit "
          "Sigma_0^(1/2) Pi_ker(C) Sigma_0^(1/2), of rank d - rank(Q) = d - floor(d/2) for "
          "every full-rank Sigma_0: all settings have rank "
          + ", ".join(f"{d - d // 2} (d = {d})" for d in ds) + ". For K = -Q the quantity "
          "N^T Sigma^-1 N (N a basis of ker Q) is conserved for softmax and L2 with any V "
          "(Sigma^-1 changes only in the range of Q^T Q), so no limit can have rank below "
          "d - rank(Q). Accurate ranks below this bound (a true eigenvalue under the "
          f"relative threshold {ACCURATE_RTOL:g}): {below}.", "",
          f"![rank histograms]({paths['rank_histograms'].name})", ""]
    return "\n".join(L), summary


def _cpu_time():
    """CPU seconds of this process and of its finished child processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _compute(rng, grid, n_eval, drawn, settings, paper_tol, parallel, progress=None):
    """The regimes and the histograms; on two cores when ``parallel`` (and fork exists).

    The work splits into independent solves: one child process integrates the
    histograms of the largest and the smallest ``d`` while this process does the regimes
    and the other ``d`` (about equal halves). Every random draw is made beforehand, so the
    results are those of the serial computation, bit for bit. ``progress`` is called in
    this process only: after each regime and each ``d`` (the child's when its results
    arrive).
    """
    ds = sorted(settings)
    child_ds = [ds[-1], ds[0]] if len(ds) > 1 else []
    pool = None
    if parallel and child_ds and (os.cpu_count() or 1) >= 2:
        try:
            ctx = multiprocessing.get_context("fork")
        except ValueError:   # no fork on this platform: serial
            ctx = None
        if ctx is not None:
            pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx)
    if pool is None:
        child_ds = []
    try:
        future = (pool.submit(_histograms_many, [settings[d] for d in child_ds], paper_tol)
                  if pool is not None else None)
        regimes = _run_regimes(grid, n_eval, drawn, progress=progress)
        hists = _histograms_many([settings[d] for d in ds if d not in child_ds], paper_tol,
                                 progress=progress)
        if future is not None:
            try:
                hists.update(future.result())
                if progress is not None:
                    for d in child_ds:
                        progress(f"histograms: d = {d} (worker process)")
            except concurrent.futures.process.BrokenProcessPool:   # the child died: here
                hists.update(_histograms_many([settings[d] for d in child_ds], paper_tol,
                                              progress=progress))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return regimes, {k: hists[k] for d in ds for k in
                     [(kind, vname, d) for kind, vname in _PANELS]}


def progress_steps():
    """Number of times :func:`reproduce` calls its ``progress`` callback.

    One per regime, per histogram dimension and per figure.
    """
    return len(REGIMES) + len(_HIST_DS) + N_FIGURES + 1


def reproduce(out, *, seed=0, quick=False, paper_tol=1e-3, progress=None):
    """Run the reproduction into folder ``out``; returns a summary dict.

    Parameters
    ----------
    out : path-like
        Output folder (created if needed; must be writable).
    seed : int
        Seed of every random draw.
    quick : bool
        Small grids and 10 settings per dimension (for tests).
    paper_tol : float
        Stopping tolerance of the paper's protocol on the Frobenius norm of the rhs.
    progress : callable or None
        Called with a short message (e.g. ``"regimes: blowup"``) after each long step
        (:func:`progress_steps` calls in all); ``None`` (the default): silent.
    """
    out = ensure_output_dir(out, "out")
    seed = validate_int(seed, "seed", minimum=0)
    paper_tol = validate_positive(paper_tol, "paper_tol")
    rng = np.random.default_rng(seed)
    grid = regime_grids("quick" if quick else "default")   # family -> initial covariances
    n_eval = 30 if quick else 80
    n_settings = 10 if quick else 100
    ds = _HIST_DS
    w0, c0 = time.perf_counter(), _cpu_time()
    # every random draw first: the regimes' are the published script's (fixed seeds)
    drawn = draw_all()
    settings = {d: _hist_settings(rng, d, n_settings) for d in ds}
    regimes, hists = _compute(rng, grid, n_eval, drawn, settings, paper_tol,
                              parallel=not quick, progress=progress)
    compute_s, cpu_s = time.perf_counter() - w0, _cpu_time() - c0
    paths = _figures(out, regimes, hists, ds, progress=progress)
    wall_s = time.perf_counter() - w0
    cfg = dict(seed=seed, quick=quick, paper_tol=paper_tol, n_settings=n_settings,
               n_grid={f: len(g) for f, g in grid.items()})
    timing = dict(compute_s=compute_s, cpu_s=cpu_s, wall_s=wall_s)
    text, summary = _report(cfg, regimes, hists, ds, paths, timing)
    arrays = {}
    for (kind, vname, d), h in hists.items():
        for key in ("paper", "accurate", "limit_paper_threshold", "bound"):
            arrays[f"{kind}_{vname}_d{d}_{key}"] = h[key]
    write_npz(out / "histograms.npz", **arrays)
    regime_json = {f"{r}/{n}": [dict(outcome=str(o.outcome), rank=o.rank, t_blowup=o.t_blowup,
                                     message=o.message) for o in v["outcomes"]]
                   for (r, n), v in regimes.items()}
    write_text(out / "results.json", json.dumps(dict(
        config=cfg, timing=timing, histograms=summary, regimes=regime_json,
        histogram_counts={f"{k}_{v}_{d}": dict(paper=h["paper"].tolist(),
                                               accurate=h["accurate"].tolist(),
                                               outcome=list(h["outcome"]))
                          for (k, v, d), h in hists.items()}), indent=1) + "\n")
    report = write_text(out / "report.md", text)
    return dict(report=report, figures={k: pathlib.Path(p) for k, p in paths.items()},
                timing=timing, histograms=summary, config=cfg)
