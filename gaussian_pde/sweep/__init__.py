"""Resumable parameter sweeps, local by default and on a Dask cluster when asked.

A sweep maps the regimes of the Gaussian moment ODEs over random weight draws,
dimensions and attention types (docs/math.md section 4.4): which fraction of settings blow up,
vanish or collapse to rank ``r``. Typical use::

    from gaussian_pde.sweep import SweepSpec, format_summary, load_results, run_sweep, summarize
    spec = SweepSpec.from_toml("examples/sweep_small.toml")
    run_sweep(spec, "results/")                       # LocalCluster, one worker per core
    run_sweep(spec, "results/", scheduler="tcp://10.0.0.5:8786")   # an existing cluster
    run_sweep(spec, "results/", scheduler="inprocess")             # no Dask at all
    print(format_summary(summarize(load_results("results/"))))

The same from the shell: ``gaussian-pde sweep run SPEC.toml --out RESULTS`` and
``gaussian-pde sweep summarize RESULTS``. Rerunning an interrupted sweep computes only
the missing tasks. Importing this module does not import dask, zarr or matplotlib.

Integrity: each task stores, just before its ``done`` flag, an integrity record (a 64-bit
BLAKE2b digest of its rows of every array). A stored task whose chunk file was truncated,
deleted or overwritten no longer matches its record (or no longer decodes):

* a resume (``run_sweep`` / ``sweep run`` on the same folder) clears its flag and
  recomputes it, warns with :class:`SweepIntegrityWarning` naming the tasks, and counts
  them in ``SweepReport.n_damaged``;
* ``load_results`` / ``summarize`` / ``sweep summarize`` raise :class:`DamagedResultsError`
  (a ``ValueError``) naming each damaged task, the array and chunk file, and the command
  that repairs the folder (rerun ``sweep run`` on it), instead of a wrong summary.

Folders written before integrity records existed still load and resume, unverified
(``SweepResults.verified`` is False, with a :class:`SweepIntegrityWarning`): a chunk that
no longer decodes, a ``done`` chunk partly set and a computed row whose ``status`` is the
fill value are still detected, but a deleted or overwritten chunk that decodes is not.
Tasks a resume adds to such a folder get no record either; run the sweep into a new
folder to have it verified.
"""

from __future__ import annotations

import numpy as np

from ._compute import (
    OUTCOMES,
    STATUSES,
    classify_outcome,
    compute_batch,
    draw_mean,
    draw_setting,
    limit_rank,
    time_grid,
)
from ._estimate import SweepEstimate
from ._run import SchedulerUnreachableError, SweepReport, check_local_workers, run_sweep
from ._spec import InitialSpec, RecordSpec, SolverSpec, SweepSpec, WeightSpec
from ._store import DamagedResultsError, SweepIntegrityWarning, SweepResults, load_results

__all__ = [
    "OUTCOMES",
    "STATUSES",
    "DamagedResultsError",
    "InitialSpec",
    "RecordSpec",
    "SchedulerUnreachableError",
    "SolverSpec",
    "SweepEstimate",
    "SweepIntegrityWarning",
    "SweepReport",
    "SweepResults",
    "SweepSpec",
    "WeightSpec",
    "check_local_workers",
    "classify_outcome",
    "compute_batch",
    "draw_mean",
    "draw_setting",
    "format_summary",
    "limit_rank",
    "load_results",
    "plot_summary",
    "run_sweep",
    "summarize",
    "time_grid",
]


def summarize(results):
    """Outcome fractions and limit-rank histograms by attention type and dimension.

    Parameters
    ----------
    results : SweepResults or path-like
        Loaded results or a results folder.

    Returns
    -------
    list of dict
        One row per ``(attention, d)`` with keys ``attention``, ``d``, ``done``, ``total``,
        ``outcomes`` (name -> fraction of the computed settings, or ``None`` when not
        recorded), ``statuses`` (name -> count) and ``ranks`` (counts of limit rank
        ``0..d``, or ``None`` when not recorded).
    """
    if not isinstance(results, SweepResults):
        results = load_results(results)
    rows = []
    for (attention, d), block in results.blocks.items():
        done = block["done"]
        n = int(done.sum())
        row = {"attention": attention, "d": d, "done": n, "total": done.size,
               "outcomes": None, "ranks": None}
        status = block["status"][done]
        row["statuses"] = {name: int(np.sum(status == i))
                           for i, name in enumerate(results.statuses)
                           if np.any(status == i)}
        if "outcome" in block:
            codes = block["outcome"][done]
            row["outcomes"] = {name: (float(np.mean(codes == i)) if n else float("nan"))
                               for i, name in enumerate(results.outcomes)}
        if "limit_rank" in block:
            ranks = block["limit_rank"][done]
            ranks = ranks[ranks >= 0]
            row["ranks"] = np.bincount(ranks, minlength=d + 1)[:d + 1].tolist()
        rows.append(row)
    return rows


def format_summary(rows):
    """The rows of :func:`summarize` as a text table."""
    if not rows:
        return "(empty sweep)"
    outcome_names = next((list(r["outcomes"]) for r in rows if r["outcomes"]), [])
    head = f"{'attention':<10} {'d':>3} {'done':>11}  " + " ".join(
        f"{name:>9}" for name in outcome_names) + "  limit-rank counts (0..d)"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = " ".join(f"{r['outcomes'][name]:>9.3f}" for name in outcome_names) \
            if r["outcomes"] else ""
        ranks = " ".join(str(c) for c in r["ranks"]) if r["ranks"] is not None else "-"
        lines.append(f"{r['attention']:<10} {r['d']:>3} {r['done']:>5}/{r['total']:<5}  "
                     f"{cells}  {ranks}")
    return "\n".join(lines)


def plot_summary(rows, path=None):
    """Plot outcome fractions and limit-rank histograms; one column per attention type.

    Top row: stacked outcome fractions against ``d``. Bottom row: fraction of settings with
    each limit rank, grouped by ``d``. Saves to ``path`` (atomically) when given.

    Returns
    -------
    matplotlib.figure.Figure
    """
    import matplotlib

    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .._common.io import save_figure

    types = list(dict.fromkeys(r["attention"] for r in rows))
    fig, axes = plt.subplots(2, max(len(types), 1), figsize=(4.2 * max(len(types), 1), 7),
                             squeeze=False)
    for j, att in enumerate(types):
        sub = [r for r in rows if r["attention"] == att]
        dims = [r["d"] for r in sub]
        ax = axes[0, j]
        if sub[0]["outcomes"]:
            bottom = np.zeros(len(sub))
            for name in sub[0]["outcomes"]:
                frac = np.nan_to_num([r["outcomes"][name] for r in sub])
                ax.bar([str(d) for d in dims], frac, bottom=bottom, label=name)
                bottom += frac
            ax.set_ylim(0, 1)
        ax.set_title(f"{att}: outcome fractions")
        ax.set_xlabel("d")
        ax = axes[1, j]
        if sub[0]["ranks"] is not None:
            width = 0.8 / len(sub)
            for i, r in enumerate(sub):
                counts = np.asarray(r["ranks"], dtype=float)
                frac = counts / counts.sum() if counts.sum() else counts
                ax.bar(np.arange(counts.size) + (i - (len(sub) - 1) / 2) * width, frac,
                       width=width, label=f"d = {r['d']}")
            ax.legend(fontsize="small")
        ax.set_title(f"{att}: limit rank")
        ax.set_xlabel("rank of the limit of Sigma / tr Sigma")
    axes[0, 0].set_ylabel("fraction of settings")
    axes[1, 0].set_ylabel("fraction of settings")
    if types and rows[0]["outcomes"]:
        axes[0, -1].legend(fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.tight_layout()
    if path is not None:
        save_figure(fig, path, dpi=120)
    return fig

