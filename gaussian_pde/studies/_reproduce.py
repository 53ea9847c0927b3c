r"""``gaussian-pde reproduce``: the paper's Gaussian figures, and what they look like accurately.

Writes into an output folder (all files atomically, :mod:`gaussian_pde._common.io`):

* ``regimes_<type>.png`` for softmax, L2, multi-head and Sinkhorn: the 2-D regimes of
  docs/math.md section 4.4, the families of the published ``2d_plots.py`` with its draws
  (:mod:`gaussian_pde.studies._regimes`: convergence to 0, to a line, to a plane and to
  two lines in the PSD cone, blow-up and the :math:`\Sigma_0`-dependent regime as
  :math:`\Sigma/\operatorname{tr}\Sigma` in the disk);
* ``eigenvalue_flows.png``: eigenvalues of :math:`\Sigma/\operatorname{tr}\Sigma` over time;
* ``rank_histograms.png``: ranks for d = 3, 4, 5, softmax and L2, V = I and
  :math:`V = R^TR` (:math:`R` independent of :math:`\Sigma_0`): the published replay next
  to the true limit;
* ``report.md`` (embeds the figures), ``results.json`` and ``histograms.npz``.

Histogram settings: :math:`Q \in \mathbb R^{\lfloor d/2\rfloor \times d}` standard normal,
:math:`K = -Q`, :math:`\Sigma_0 = GG^T`, :math:`V = R^TR`, scale :math:`1/\sqrt d`.

*published*
    the published script's counts, replayed number for number by
    :func:`gaussian_pde.studies.published_histograms` (in this run, unless
    ``gaussian-pde reproduce --protocol published`` wrote ``published_histograms.json``
    into the same folder, whose counts are read instead); setting by setting, the report
    also reads ``published_certified.json`` when that run made it;
*true*
    for softmax with :math:`V = I` the exact limit
    :math:`\Sigma_0^{1/2}\Pi_{\ker C}\Sigma_0^{1/2}`; otherwise the covariance integrated
    to ``t = 1e8`` with :func:`gaussian_pde.integrate._batch.solve_batch` and classified
    by :func:`gaussian_pde.analysis.classify_trajectory` where that gives the rank
    :math:`d - \operatorname{rank}Q` proved in docs/math.md 4.5, and the certified limit
    (:func:`gaussian_pde.certified_limits`, the growth of :math:`\Sigma^{-1}`) for every
    other setting.

Speed: per ``d`` one :func:`~gaussian_pde.integrate._batch.solve_batch` call per protocol holds all
four panels (their slow tails share iterations), and the full run splits over two
processes (:func:`_compute`: a forked child integrates the histograms of d = 5 and 3 while
the parent does the regimes and d = 4; every random draw is made before the split, so
the results equal the serial ones bit for bit), and so do the six figures
(:func:`~gaussian_pde.studies._regimes.draw_figures`: a forked child draws from the end of
the list while the parent draws from the front; the files are those of the serial run).
``--quick`` runs serially.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import multiprocessing
import os
import pathlib
import time

import numpy as np

from .._common.io import ensure_output_dir, save_figure, write_npz, write_text
from .._common.linalg import psd_sqrt
from .._common.validation import validate_int
from ..analysis import classify_trajectory, limit_rank
from ..attention import PUBLISHED_TYPES, REGIME_TYPES, get_attention
from ..integrate import solve_batch
from ._certified import certified_limits, theorem_rank
from ._published import step_seconds
from ._regimes import (
    FAMILIES,
    N_FIGURES,
    _run_regimes,
    draw_all,
    draw_figures,
    figure_tasks,
    fixed_margins,
    regime_grids,
    report_lines,
    unit_trace_grid,
)

__all__ = ["reproduce", "unit_trace_grid", "REGIMES", "TYPES", "PAPER_THRESHOLD"]

#: the 2-D regimes (families of the published 2d_plots.py), in the order of the figures
REGIMES = FAMILIES
#: attention types of the regime figures
TYPES = REGIME_TYPES
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
#: the L-stable Rosenbrock method RODAS4P2, whose steps are not stability-limited: every
#: histogram trajectory reaches t = 1e8 well within the cap.
_MAX_NFEV = 100_000
#: tolerance of the histogram runs. The classification at t = 1e8 thresholds eigenvalues
#: at 1e-6 of the largest, which is sensitive near the "settled" border: rtol 1e-6 changed
#: 34 of the 1000 ranks against 1e-7 (seed 0), so 1e-7.
_ACCURATE_RTOL = 1e-7
#: the published scripts' run time and the cost of one step of their scheme (d = 5,
#: projected Euler) on the machine where it was measured: the speed-up is a ratio of steps
PUBLISHED_SCRIPTS_S, PUBLISHED_STEP_S = 708.0, 27.5e-6


# ----------------------------------------------------------------------------------------
# the rank histograms
# ----------------------------------------------------------------------------------------

def _hist_settings(rng, d, n):
    r"""Settings of one ``d``: :math:`Q` (``(n, d // 2, d)``), :math:`G` and :math:`R`.

    :math:`\Sigma_0 = GG^T` and :math:`V = R^TR` with :math:`R` drawn *independently* of
    :math:`G` (docs/math.md 4.4), all from ``rng`` in this order.
    """
    k = d // 2
    Qs = rng.standard_normal((n, k, d))
    Gs = rng.standard_normal((n, d, d))
    Rs = rng.standard_normal((n, d, d))
    return Qs, Gs, Rs


def _exact_limit(S, cov0):
    r"""Limit of the exact solution of :math:`\Sigma' = \Sigma S\Sigma` for :math:`S \preceq 0`.

    Softmax with :math:`V = I` and :math:`K = -Q`: :math:`S = A + A^T = -2cQ^TQ`, and
    :math:`C = RSR \preceq 0` with :math:`R = \Sigma_0^{1/2}`.
    """
    R = psd_sqrt(cov0)
    C = R @ S @ R
    w, U = np.linalg.eigh(0.5 * (C + C.T))
    null = U[:, np.abs(w) <= 1e-12 * max(np.abs(w).max(), 1e-300)]
    return R @ null @ null.T @ R


#: the rank-histogram panels: the published types, V = I and V = R^T R
_PANELS = tuple((kind, vname) for kind in PUBLISHED_TYPES for vname in ("I", "RtR"))


def _histograms_many(settings, progress=None, certify=False):
    """:func:`_histograms_d` for several ``d``: ``settings`` is ``[(Qs, Gs, Rs), ...]``.

    ``progress``: called after each ``d``.
    """
    out = {}
    for Qs, Gs, Rs in settings:
        out.update(_histograms_d(Qs, Gs, Rs, certify=certify))
        if progress is not None:
            progress(f"histograms: d = {Qs.shape[-1]}")
    return out


def _histograms_d(Qs, Gs, Rs, certify=False):
    r"""The four rank-histogram panels of one ``d``.

    The true rank of a setting: for softmax with :math:`V = I` from the exact limit
    (docs/math.md 4.1); otherwise the classification of the covariance integrated to
    :math:`t = 10^8` where it gives the rank :math:`d - \operatorname{rank}Q`. Every other
    setting (the classification is undecided, or an eigenvalue still decays above its
    threshold at :math:`t = 10^8`) is integrated by :func:`gaussian_pde.certified_limits`
    (the growth of :math:`\Sigma^{-1}`) when ``certify``; what that leaves undecided, or
    everything when not ``certify``, takes the rank :math:`d - \operatorname{rank}Q` of
    the theorem of docs/math.md 4.5 where its hypotheses are checked on the setting
    (:math:`K = -Q`, :math:`V` symmetric positive definite, :math:`\Sigma_0` full rank),
    with ``source`` ``"theorem"``; otherwise it stays undecided.
    """
    out = {}
    panels = _PANELS
    n_settings, d = Qs.shape[0], Qs.shape[-1]
    cov0s = Gs @ np.swapaxes(Gs, -1, -2)
    scale = 1.0 / np.sqrt(d)
    Vs = {"I": np.broadcast_to(np.eye(d), Gs.shape), "RtR": np.swapaxes(Rs, -1, -2) @ Rs}
    atts = {(kind, vname): [get_attention(kind)(Q, -Q, V, scale=scale)
                            for Q, V in zip(Qs, Vs[vname])]
            for kind, vname in panels}
    bound = d - np.array([np.linalg.matrix_rank(Q) for Q in Qs])
    # a panel whose covariance solves a Riccati equation (the attention has a Riccati
    # matrix, e.g. with V = I) has its limit in closed form
    exact = {p: all(a.riccati_matrix() is not None for a in atts[p]) for p in panels}
    acc_panels = [p for p in panels if not exact[p]]
    acc_all = solve_batch([a for p in acc_panels for a in atts[p]],
                          np.concatenate([cov0s] * len(acc_panels)), (0.0, _HIST_HORIZON),
                          rtol=_ACCURATE_RTOL, atol=1e-14, max_nfev=_MAX_NFEV)
    res = {}
    for kind, vname in panels:
        if exact[(kind, vname)]:
            lims = np.array([_exact_limit(a.riccati_matrix(), c)
                             for a, c in zip(atts[(kind, vname)], cov0s)])
            res[(kind, vname)] = dict(
                accurate=np.array([limit_rank(x, rtol=1e-8) for x in lims]),
                outcome=["rank (exact solution)"] * n_settings, limits=lims)
            continue
        ai = acc_panels.index((kind, vname))
        ranks, outcome, limits = [], [], []
        for i, b in enumerate(range(ai * n_settings, (ai + 1) * n_settings)):
            oc = classify_trajectory(
                np.array([0.0, acc_all.t_final[b]]),
                np.array([cov0s[i], acc_all.cov_final[b]]),
                attention=atts[(kind, vname)][i], status=acc_all.status[b],
                message=acc_all.message[b], rtol=ACCURATE_RTOL)
            outcome.append(str(oc.outcome))
            ranks.append(oc.rank if oc.outcome in ("rank", "zero") else -1)
            limits.append(oc.limit if oc.limit is not None else np.full((d, d), np.nan))
        res[(kind, vname)] = dict(accurate=np.array(ranks), outcome=outcome,
                                  limits=np.array(limits))
    # the certified limit wherever the classification at t = 1e8 does not give the rank
    # d - rank(Q) that docs/math.md 4.5 proves for these panels (V = I or V = R^T R > 0):
    # undecided, below the bound, or above it (a vanishing eigenvalue still above the
    # relative threshold at t = 1e8; seen at d = 5)
    todo = [(p, i) for p in acc_panels for i in range(n_settings)
            if res[p]["accurate"][i] != bound[i]]
    t0 = time.process_time()   # CPU: the machine may be shared
    cert = certified_limits([atts[p][i] for p, i in todo], np.array([cov0s[i] for _, i in todo])
                            ) if todo and certify else []
    cert_s = time.process_time() - t0
    for kind, vname in panels:
        r = res[(kind, vname)]
        true = r["accurate"].copy()
        source = np.array(["exact" if exact[(kind, vname)] else "classified"]
                          * n_settings, dtype=object)
        out[(kind, vname, d)] = dict(r, true=true, source=source, bound=bound,
                                     certified_s=0.0, n_certified=0, n_theorem=0)
    for (p, i), c in zip(todo, cert):
        h = out[(p[0], p[1], d)]
        h["true"][i] = c.rank if c.outcome in ("rank", "zero") else -1
        h["source"][i] = "certified"
        h["outcome"][i] = f"certified {c.outcome}: {c.message}"
        h["n_certified"] += 1
        if c.limit is not None:
            h["limits"][i] = c.limit
    # docs/math.md 4.5: K = -Q, V symmetric positive definite and Sigma_0 full rank give the
    # limit rank d - rank(Q) exactly; each hypothesis checked per setting (theorem_rank)
    for p, i in todo:
        h = out[(p[0], p[1], d)]
        rank = theorem_rank(atts[p][i], cov0s[i])
        if h["true"][i] != bound[i] and rank is not None:
            h["outcome"][i] = (f"theorem (docs/math.md 4.5): rank {rank}; numerically "
                               f"{h['outcome'][i]}")
            h["true"][i] = rank
            h["source"][i] = "theorem"
            h["n_theorem"] += 1
    for (kind, vname) in panels:
        h = out[(kind, vname, d)]
        h["certified_s"] = cert_s * h["n_certified"] / max(len(todo), 1)
        h["limit_paper_threshold"] = np.array(
            [limit_rank(x, rtol=0.0, atol=PAPER_THRESHOLD) if np.isfinite(x).all() else -1
             for x in h.pop("limits")])
        h["exact"] = exact[(kind, vname)]
    return out


# ----------------------------------------------------------------------------------------
# figures and report
# ----------------------------------------------------------------------------------------

def _figures(out, regimes, hists, ds, progress=None, published=None, processes=1):
    """Write the figures; ``progress``: called after each.

    ``processes=2``: on two processes (:func:`draw_figures`). Returns ``{name: path}`` and
    ``{name: (wall, cpu)}``, the seconds of each figure.
    """
    tasks = figure_tasks(regimes) + [
        ("rank_histograms", functools.partial(_draw_histograms, hists=hists, ds=ds,
                                              published=published))]
    return draw_figures(tasks, out, save_figure, processes=processes, progress=progress)


def _draw_histograms(fig, hists, ds, published):
    """The rank histograms, one row per ``d`` and one column per panel, into ``fig``."""
    from .. import plotting

    fig.set_size_inches(13, 3.1 * len(ds))
    axes = fig.subplots(len(ds), 4, squeeze=False)
    for i, d in enumerate(ds):
        for j, (kind, vname) in enumerate(_PANELS):
            h = hists[(kind, vname, d)]
            series = {}
            pub = (published or {}).get(_PUB_KEY[(kind, vname)] + (str(d),))
            if pub is not None:
                series["published"] = np.repeat(np.arange(len(pub)), pub)
            series["true"] = h["true"]
            plotting.plot_rank_histogram(
                series, d, axes[i, j],
                title=f"{kind}, V = {'I' if vname == 'I' else 'R^T R'}, d = {d}")
    shown = "the published script replayed vs the true limit" if published else "the true limit"
    fig.suptitle(f"Rank of the limit covariance: {shown} (? = undecided)", fontsize=13)
    fixed_margins(fig, left=0.716, right=0.15, bottom=0.585, top=0.677, wspace=0.287,
                  hspace=0.36)


_PUB_KEY = {(kind, vname): (kind, {"I": "identity", "RtR": "random"}[vname])
            for kind, vname in _PANELS}


def _read_published(out):
    """Counts of ``published_histograms.json`` in ``out`` as ``{(type, values, d): counts}``."""
    path = pathlib.Path(out) / "published_histograms.json"
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return {(k, v, d): c for k, vv in raw.items() for v, dd in vv.items() for d, c in dd.items()}


def _replay_published():
    """The published script's counts, replayed in this process (:func:`published_histograms`)."""
    from ._published import published_histograms

    raw = published_histograms()["histograms"]
    return {(k, v, d): c for k, vv in raw.items() for v, dd in vv.items() for d, c in dd.items()}


def _read_published_certified(out):
    """``published_certified.json`` (written by ``reproduce --protocol published``)."""
    path = pathlib.Path(out) / "published_certified.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _counts(r, d):
    c = np.bincount(np.where(np.asarray(r) < 0, d + 1, r), minlength=d + 2)
    return " ".join(str(x) for x in c[:d + 1]) + (f" ?{c[-1]}" if c[-1] else "")


def _report(cfg, regimes, hists, ds, paths, timing, published=None, pub_cert=None):
    L = ["# gaussian-pde reproduce: the Gaussian results of Castin et al.", "",
         f"Seed {cfg['seed']}, {'quick' if cfg['quick'] else 'full'} run, "
         f"{timing['compute_s']:.2f} s of compute ({timing['cpu_s']:.2f} s CPU), "
         f"{timing['wall_s']:.2f} s wall including the figures ({timing['figures_s'][0]:.2f} s, "
         f"{timing['figures_s'][1]:.2f} s CPU). One step of the published "
         f"scheme (d = 5, projected Euler) took {timing['published_step_us']:.1f} us in this "
         f"run, so the published scripts ({PUBLISHED_SCRIPTS_S:g} s at "
         f"{PUBLISHED_STEP_S * 1e6:g} us per step) would take "
         f"{timing['published_scripts_s']:.0f} s here: {timing['speedup_compute']:.0f}x "
         f"(compute) and {timing['speedup_wall']:.0f}x (with figures) faster.", "",
         *report_lines(regimes, paths)]
    L += ["## Rank histograms", "",
          f"{cfg['n_settings']} settings per dimension and panel: Q in R^(floor(d/2) x d) "
          "standard normal, K = -Q, Sigma_0 = G G^T, V = I or V = R^T R with R independent "
          "of G, scale 1/sqrt(d).", "",
          "* **published**: the published script replayed number for number "
          "(`gaussian-pde reproduce --protocol published`, docs/math.md section 9; its own "
          "settings, seeds 40/26/27/41), " + (
              "replayed in this run in {:.1f} s ({:.1f} s of CPU);".format(
                  *timing["published_replay_s"])
              if timing.get("published_replay_s") is not None else
              "read from `published_histograms.json` in this folder;"),
          "* **true**: for softmax with V = I the exact limit (docs/math.md 4.1); otherwise "
          "the covariance integrated to t = 1e8 (`solve_batch`) and classified (relative "
          f"threshold {ACCURATE_RTOL:g}) where that gives d - rank(Q); every other setting "
          "is integrated by the certified limit (`gaussian_pde.certified_limits`: the "
          "growth of Sigma^-1, with its evidence; with `--certify`), and what "
          "is still open takes the rank d - rank(Q) that docs/math.md 4.5 proves for K = -Q, V symmetric "
          "positive definite and Sigma_0 full rank (hypotheses checked on each setting; "
          "column *by 4.5*); `?` = undecided.", "",
          "| type | V | d | published counts (rank 0..d) | true counts | at t = 1e8 or exact "
          "| certified | by 4.5 | below d - rank Q |", "|---" * 9 + "|"]
    summary = {}
    for kind, vname in _PANELS:
        for d in ds:
            h = hists[(kind, vname, d)]
            pub = (published or {}).get(_PUB_KEY[(kind, vname)] + (str(d),))
            below = int(((h["true"] >= 0) & (h["true"] < h["bound"])).sum())
            und = int((h["true"] < 0).sum())
            summary[f"{kind}_{vname}_{d}"] = dict(
                n=int(h["true"].size), undecided=und, below_bound=below,
                certified=int(h["n_certified"]), certified_s=float(h["certified_s"]),
                theorem=int(h["n_theorem"]),
                published=pub, true=np.bincount(np.clip(h["true"], 0, None)[h["true"] >= 0],
                                                minlength=d + 1).tolist())
            L.append(f"| {kind} | {'I' if vname == 'I' else 'R^T R'} | {d} | "
                     f"{' '.join(map(str, pub)) if pub is not None else 'not run'} | "
                     f"{_counts(h['true'], d)} | "
                     f"{h['true'].size - h['n_certified'] - h['n_theorem']} | "
                     f"{h['n_certified']} | {h['n_theorem']} | {below} |")
    und = sum(v["undecided"] for v in summary.values())
    below = sum(v["below_bound"] for v in summary.values())
    L += ["", f"Undecided: {und}; ranks below d - rank(Q): {below}. By docs/math.md 4.2 and "
          "4.5 every setting here (V = I or V symmetric positive definite, K = -Q) has a limit "
          "of rank exactly d - rank(Q) = " + ", ".join(f"{d - d // 2} (d = {d})" for d in ds)
          + ".", ""]
    L += _published_section(pub_cert)
    L += [f"![rank histograms]({paths['rank_histograms'].name})", ""]
    return "\n".join(L), summary


def _published_section(pub_cert):
    """The published replay against the certified limits of its own settings."""
    L = ["## Published histograms against the true limit, setting by setting", ""]
    if pub_cert is None:
        return L + ["Not run in this folder: `gaussian-pde reproduce --protocol published "
                    "--out <this folder>` replays the published script and "
                    "certifies the limit of each of its settings.", ""]
    L += ["Each recorded setting of the replay (its Q, V and the Sigma_0 of its converged "
          "attempt) integrated by `certified_limits` (docs/math.md 4.5). Reasons: "
          "**threshold** (the limit's surviving eigenvalue is below 0.1: the true limit "
          "counted at 0.1 gives the published rank), **early stop** (the stop test "
          "|r|_F < tol fired while a vanishing eigenvalue was still above 0.1), **scheme** "
          "(the Euler iterate, with its clipping, differs from the limit otherwise). "
          "*decay*: how the vanishing eigenvalues decay (1/t, 1/t^2, or both in one "
          "setting); *closed form*: settings whose limit is N (N^T Sigma_0^-1 N)^-1 N^T to "
          "1e-3.", "",
          "| panel | d | published | true (certified) | undecided | below d - rank Q | "
          "disagree | threshold | early stop | scheme | not recorded (rank > ceil(d/2)) | "
          "decay | closed form |",
          "|---" * 13 + "|"]
    rows = []
    for key, p in pub_cert["panels"].items():
        decay = ", ".join(f"{k}: {v}" for k, v in sorted(p.get("decay", {}).items()))
        L.append(f"| {p['type']} V={p['values']} | {p['d']} | {' '.join(map(str, p['published']))} "
                 f"| {' '.join(map(str, p['true']))} | {p['undecided']} | "
                 f"{p.get('below_bound', '-')} | {p['disagree']} | "
                 f"{p['reasons'].get('threshold', 0)} | {p['reasons'].get('early stop', 0)} | "
                 f"{p['reasons'].get('scheme', 0)} | {p['not_recorded']} | {decay} | "
                 f"{p.get('closed_form', '-')} |")
        rows += [(key, r) for r in p["settings"] if r["reason"] != "agree"]
    per = pub_cert.get("certified_s_per_setting", pub_cert["certified_s"] / max(pub_cert["n"], 1))
    L += ["", f"Certified limits of the {pub_cert['n']} settings: {pub_cert['certified_s']:.1f} s "
          f"CPU ({per * 1e3:.0f} ms per setting) = {pub_cert['certified_over_step']:.3g} "
          f"published steps (one step {pub_cert['step_us']:.1f} us in the same run).", "",
          "Disagreeing settings, with the evidence of the true rank:", "",
          "| panel | setting | draw | published rank | true rank | limit at 0.1 | reason | "
          "decay exponents | conserved drift | closed-form gap | smallest surviving "
          "eigenvalue |", "|---" * 11 + "|"]
    for key, r in rows:
        surv = r.get("limit_eigenvalues") or []
        L.append(f"| {key} | {r['setting']} | {r['draw']} | {r['published']} | {r['true']} | "
                 f"{r['limit_at_0.1']} | {r['reason']} | "
                 f"{', '.join(f'{x:.3f}' for x in r.get('decay_rates', []))} | "
                 f"{r.get('conserved_drift', float('nan')):.1e} | "
                 f"{r.get('closed_form_gap', float('nan')):.1e} | "
                 f"{(f'{min(surv):.3g}' if surv else '-')} |")
    return L + [""]


def _cpu_time():
    """CPU seconds of this process and of its finished child processes."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _compute(rng, grid, n_eval, drawn, settings, parallel, progress=None, certify=False):
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
            from ..integrate import compile_kernels

            compile_kernels()       # once, before the fork: the child inherits them
            pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx)
    if pool is None:
        child_ds = []
    try:
        future = (pool.submit(_histograms_many, [settings[d] for d in child_ds], None, certify)
                  if pool is not None else None)
        regimes = _run_regimes(grid, n_eval, drawn, progress=progress)
        hists = _histograms_many([settings[d] for d in ds if d not in child_ds],
                                 progress=progress, certify=certify)
        if future is not None:
            try:
                hists.update(future.result())
                if progress is not None:
                    for d in child_ds:
                        progress(f"histograms: d = {d} (worker process)")
            except concurrent.futures.process.BrokenProcessPool:   # the child died: here
                hists.update(_histograms_many([settings[d] for d in child_ds],
                                              progress=progress, certify=certify))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return regimes, {k: hists[k] for d in ds for k in
                     [(kind, vname, d) for kind, vname in _PANELS]}


#: first line of the main job's examples section in ``report.md`` (kept by a later run)
EXAMPLES_MARKER = "<!-- gaussian-pde: built-in examples -->"


def examples_section(path):
    """The built-in examples' section of an existing ``report.md`` ("" when there is none)."""
    path = pathlib.Path(path)
    if not path.is_file():
        return ""
    text = path.read_text()
    if text.startswith("# Built-in 2-D examples"):   # ``--examples`` alone: its whole report
        return "\n\n" + EXAMPLES_MARKER + "\n#" + text.rstrip("\n") + "\n"
    i = text.find(EXAMPLES_MARKER)
    return "" if i < 0 else "\n\n" + text[i:].rstrip("\n") + "\n"


def progress_steps():
    """Number of times :func:`reproduce` calls its ``progress`` callback.

    One per regime, per histogram dimension and per figure.
    """
    return len(REGIMES) + len(_HIST_DS) + N_FIGURES + 1


def reproduce(out, *, seed=0, quick=False, certify=False, progress=None):
    """Run the reproduction into folder ``out``; returns a summary dict.

    Parameters
    ----------
    out : path-like
        Output folder (created if needed; must be writable).
    seed : int
        Seed of every random draw.
    quick : bool
        Small grids and 10 settings per dimension (for tests), computed and drawn on
        one process.
    certify : bool
        Integrate every histogram setting that the classification at :math:`t = 10^8`
        leaves open with :func:`gaussian_pde.certified_limits`, which gives each of them
        its decay exponents and conserved drift (about 35 s more CPU for the 59 settings
        of seed 0). ``False`` (the default, which keeps the run fast): those settings
        take the rank proved in docs/math.md 4.5, whose hypotheses are checked on each.
    progress : callable or None
        Called with a short message (e.g. ``"regimes: blowup"``) after each long step
        (:func:`progress_steps` calls in all); ``None`` (the default): silent.
    """
    out = ensure_output_dir(out, "out")
    seed = validate_int(seed, "seed", minimum=0)
    rng = np.random.default_rng(seed)
    grid = regime_grids("quick" if quick else "default")   # family -> initial covariances
    n_eval = 30 if quick else 80
    n_settings = 10 if quick else 100
    ds = _HIST_DS
    w0, c0 = time.perf_counter(), _cpu_time()
    # every random draw first: the regimes' are the published script's (fixed seeds)
    drawn = draw_all()
    settings = {d: _hist_settings(rng, d, n_settings) for d in ds}
    regimes, hists = _compute(rng, grid, n_eval, drawn, settings,
                              parallel=not quick, progress=progress, certify=certify)
    compute_s, cpu_s = time.perf_counter() - w0, _cpu_time() - c0
    published = _read_published(out)
    replay_s = None
    if published is None:    # the replay takes seconds: the figure shows both protocols
        r0, rc0 = time.perf_counter(), time.process_time()
        published = _replay_published()
        replay_s = (time.perf_counter() - r0, time.process_time() - rc0)   # wall, CPU
    pub_cert = _read_published_certified(out)
    f0, fc0 = time.perf_counter(), _cpu_time()
    paths, figure_s = _figures(out, regimes, hists, ds, progress=progress, published=published,
                               processes=1 if quick else 2)
    wall_s = time.perf_counter() - w0
    figures_s = (time.perf_counter() - f0, _cpu_time() - fc0)   # wall, CPU
    cfg = dict(seed=seed, quick=quick, n_settings=n_settings,
               n_grid={f: len(g) for f, g in grid.items()})
    # the speed against the published scripts, as a ratio: they take PUBLISHED_SCRIPTS_S
    # where one step of their scheme costs PUBLISHED_STEP_S; that step is timed here
    step_s = step_seconds(500 if quick else 2000)
    scripts_s = PUBLISHED_SCRIPTS_S * step_s / PUBLISHED_STEP_S
    timing = dict(compute_s=compute_s, cpu_s=cpu_s, wall_s=wall_s, published_replay_s=replay_s,
                  figures_s=figures_s, figure_s=figure_s,
                  published_step_us=step_s * 1e6, published_scripts_s=scripts_s,
                  speedup_compute=scripts_s / compute_s, speedup_wall=scripts_s / wall_s)
    text, summary = _report(cfg, regimes, hists, ds, paths, timing, published, pub_cert)
    arrays = {}
    for (kind, vname, d), h in hists.items():
        for key in ("true", "accurate", "limit_paper_threshold", "bound"):
            arrays[f"{kind}_{vname}_d{d}_{key}"] = h[key]
    write_npz(out / "histograms.npz", **arrays)
    regime_json = {f"{r}/{n}": [dict(outcome=str(o.outcome), rank=o.rank, t_blowup=o.t_blowup,
                                     message=o.message) for o in v["outcomes"]]
                   for (r, n), v in regimes.items()}
    write_text(out / "results.json", json.dumps(dict(
        config=cfg, timing=timing, histograms=summary, regimes=regime_json,
        histogram_counts={f"{k}_{v}_{d}": dict(true=h["true"].tolist(),
                                               accurate=h["accurate"].tolist(),
                                               source=list(h["source"]),
                                               outcome=list(h["outcome"]))
                          for (k, v, d), h in hists.items()}), indent=1) + "\n")
    report = write_text(out / "report.md", text + examples_section(out / "report.md"))
    return dict(report=report, figures={k: pathlib.Path(p) for k, p in paths.items()},
                timing=timing, histograms=summary, config=cfg)
