r"""Figures of the training study (drawing only; the numbers come from ``_summary``).

``training_<task>.png``
    Per task: loss (top row) and global gradient norm (bottom row) against the step, one
    column per learning rate, one colour per variant (thin: each seed; thick: median;
    ``x``: a divergence).
``drift_<task>.png``
    Per task: step drift, drift from the input, :math:`W_2` between consecutive layers'
    Gaussian fits and the growth :math:`\operatorname{tr}\hat\Sigma_\ell /
    \operatorname{tr}\hat\Sigma_0` against the layer (median over seeds; solid: trained,
    dotted: at initialisation).
``bridge.png``
    The model's relative covariance error against the Gaussian prediction by layer, one
    panel per bridged (task, variant), colour: the number of tokens :math:`n`; where the
    Gaussian map stopped (blow-up), the layer it reached.
``bridge_slope.png``
    The slope of the error in :math:`\log n` per layer, every bridged model: :math:`-1/2`
    is Monte Carlo error, 0 a bias.
``bridge_weights.png``
    The attention's measured effective sample size over :math:`n` against its mean-field
    limit :math:`e^{-a^T\Sigma a}`, and the tail of the importance weights
    (:math:`e^{a^T\Sigma a}`, median to 90th percentile over the queries) by layer.
"""

from __future__ import annotations

import numpy as np

from .._common.io import save_figure
from ._summary import DRIFT_KEYS, drift_curves, training_curves

__all__ = ["plot_training", "plot_drift", "plot_bridge", "plot_bridge_slope",
           "plot_bridge_weights", "COLORS"]

#: one colour per variant
COLORS = {"pre_ln": "C0", "post_ln": "C1", "no_ln": "C3", "no_residual": "C2",
          "neither": "C5", "pde_euler": "C4", "pde_rk4": "C6", "pde_euler_tied": "C7",
          "pde_rk4_tied": "C8"}


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _integer_ticks():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _save(plt, fig, path, dpi):
    fig.tight_layout()
    path = save_figure(fig, path, dpi=dpi)
    plt.close(fig)
    return path


def plot_training(results, task, path):
    """Loss and gradient-norm curves of every variant on ``task``, by learning rate."""
    plt = _plt()
    curves = training_curves(results, task)
    rates = list(curves)
    fig, axes = plt.subplots(2, len(rates), figsize=(4.6 * len(rates), 6.4), squeeze=False,
                             sharex=True)
    for ci, lr in enumerate(rates):
        for row, key, lab in ((0, "loss", "training loss"), (1, "grad_norm", "gradient norm")):
            ax = axes[row, ci]
            for v, rec in curves[lr].items():
                c = COLORS.get(v, "k")
                for y in rec[key]:
                    ax.plot(y, color=c, lw=0.5, alpha=0.35)
                ax.plot(rec["median_" + key], color=c, lw=1.6, label=v)
                for y in rec[key]:
                    s = np.flatnonzero(np.isfinite(y))
                    if s.size and s[-1] < y.size - 1:
                        ax.plot([s[-1]], [y[s[-1]]], "x", color=c, ms=6)
            ax.set_yscale("log")
            ax.set_title(f"{task}, lr = {lr:g}: {lab}", fontsize=9)
            if row == 1:
                ax.set_xlabel("step")
    axes[0, 0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"{task}: thin lines seeds, thick the median; x: diverged", fontsize=9)
    return _save(plt, fig, path, 80)


def plot_drift(results, task, path):
    """Drift and growth against depth on ``task``, trained and at initialisation."""
    plt = _plt()
    curves = drift_curves(results, task)
    lr = results["config"]["bridge_learning_rate"]
    fig, axes = plt.subplots(1, len(DRIFT_KEYS), figsize=(4.2 * len(DRIFT_KEYS), 3.8),
                             squeeze=False)
    for pi, (key, lab) in enumerate(DRIFT_KEYS):
        ax = axes[0, pi]
        for v, byw in curves.items():
            for when, ls in (("init", ":"), ("final", "-")):
                y = byw[when][key]
                # steps are layers 1..L; the input's drift from itself (layer 0) is zero
                x = np.arange(y.size) if key == "trace" else np.arange(1, y.size + 1)
                if key == "rel_from_input":
                    x, y = x[:-1], y[1:]
                ax.plot(x, y, ls, color=COLORS.get(v, "k"), lw=1.3,
                        label=v if when == "final" else None)
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.set_title(lab, fontsize=8)
    axes[0, 0].legend(fontsize=6, ncol=2)
    fig.suptitle(f"{task}: median over seeds at lr = {lr:g}; solid: trained, dotted: at "
                 "initialisation", fontsize=9)
    return _save(plt, fig, path, 80)


def _bridge_models(results):
    return [(t, v, b) for t, byv in results["bridge"].items() for v, b in byv.items()]


def plot_bridge(results, path):
    """The model's covariance error against the Gaussian prediction, by layer (or None).

    One panel per bridged model (at most three across); colour: the number of tokens
    ``n``; solid: the attention alone (exact Gaussian map), dashed: with the FFN (closure).
    Where the Gaussian map stopped, a dotted line marks the last layer it reached.
    """
    models = _bridge_models(results)
    if not models:
        return None
    plt = _plt()
    ncol = min(3, len(models))
    nrow = -(-len(models) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 2.9 * nrow + 0.6),
                             squeeze=False, sharey=True)
    ns = models[0][2]["attention"]["n_tokens"]
    for ax, (t, v, b) in zip(axes.ravel(), models):
        for kind, ls in (("attention", "-"), ("full", "--")):
            r = b[kind]
            for j, _ in enumerate(r["n_tokens"]):
                ax.plot(range(len(r["cov_err"][j])), r["cov_err"][j], ls, color=f"C{j}",
                        marker="o", ms=3)
            reached = r.get("layers_reached", len(r["pred_trace"]) - 1)
            if r["status"] != "finished":
                ax.axvline(reached, color="k", ls=":", lw=1)
                ax.text(reached, 0.98, f" {kind}: Gaussian {r['status']}\n after layer "
                        f"{reached + 1}", transform=ax.get_xaxis_transform(), va="top",
                        fontsize=8)
        ax.set_yscale("log")
        ax.set_title(f"{t} / {v}", fontsize=10)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.tick_params(labelsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("rel. covariance error", fontsize=9)
    for ax in axes.ravel()[len(models):]:
        ax.set_visible(False)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=f"C{j}", marker="o", ms=3, label=f"n = {n}")
               for j, n in enumerate(ns)]
    handles += [Line2D([], [], color="k", ls="-", label="attention alone (exact map)"),
                Line2D([], [], color="k", ls="--", label="with FFN (closure)")]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))
    path = save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_bridge_slope(results, path):
    r"""Slope of :math:`\log` error against :math:`\log n` per layer, every bridged model.

    About :math:`-1/2`: Monte Carlo error, the prediction holds; about 0: a bias.
    """
    models = _bridge_models(results)
    if not models:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.0, 3.8))
    for i, (t, v, b) in enumerate(models):
        for kind, marker, off in (("attention", "o", -0.08), ("full", "s", 0.08)):
            sl = np.asarray(b[kind]["slope"], float)
            layers = np.arange(sl.size)
            ok = np.isfinite(sl)
            ax.plot(layers[ok] + off, sl[ok], marker, color=f"C{i % 10}", ms=6,
                    mfc="none" if kind == "full" else f"C{i % 10}",
                    label=f"{t}/{v}" if kind == "attention" else None)
    ax.axhline(-0.5, color="k", ls="--", lw=1)
    ax.axhline(0.0, color="k", ls=":", lw=1)
    ax.text(0.99, -0.5, "Monte Carlo: -1/2", ha="right", va="bottom",
            transform=ax.get_yaxis_transform(), fontsize=8)
    ax.text(0.99, 0.0, "bias: 0", ha="right", va="bottom", transform=ax.get_yaxis_transform(),
            fontsize=8)
    ax.set_xlabel("layer")
    ax.set_ylabel("slope of log error in log n")
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.set_title("Does the error fall like n^-1/2? (filled: attention alone, open: with FFN)",
                 fontsize=9)
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1.0), loc="upper left")
    return _save(plt, fig, path, 110)


def plot_bridge_weights(results, path):
    r"""The measured ESS/n against its mean-field limit :math:`e^{-a^T\Sigma a}` (or None).

    On the diagonal, a small ESS/n is the limit's own value (not a finite-:math:`n`
    breakdown); bars: from the median to the 90th percentile of :math:`e^{a^T\Sigma a}`
    over the queries, the tail of the importance weights.
    """
    models = [(t, v, b) for t, v, b in _bridge_models(results)
              if "ess_mean_field" in b["attention"]]
    if not models:
        return None
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9.6, 3.8))
    lo, hi = 1.0, 1e-3
    for i, (t, v, b) in enumerate(models):
        r = b["attention"]
        meas = np.asarray(r["ess_frac"][-1], float)
        lim = np.asarray(r["ess_mean_field"], float)
        ok = np.isfinite(meas) & np.isfinite(lim) & (meas > 0) & (lim > 0)
        ax.plot(lim[ok], meas[ok], "o", color=f"C{i % 10}", label=f"{t}/{v}")
        if ok.any():
            lo, hi = min(lo, lim[ok].min(), meas[ok].min()), max(hi, lim[ok].max(),
                                                                   meas[ok].max())
        med = np.asarray(r["tail_median"], float)
        p90 = np.asarray(r["tail_p90"], float)
        layers = np.arange(1, med.size + 1) + 0.1 * (i - len(models) / 2)
        ax2.vlines(layers, med, p90, color=f"C{i % 10}")
        ax2.plot(layers, med, "o", color=f"C{i % 10}")
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("mean-field limit e^(-a'Sa) (median over queries)")
    ax.set_ylabel(f"measured ESS / n (n = {models[0][2]['attention']['n_tokens'][-1]})")
    ax.set_title("Small ESS/n is the mean-field value", fontsize=9)
    ax.legend(fontsize=7)
    ax2.set_yscale("log")
    ax2.set_xlabel("layer")
    ax2.xaxis.set_major_locator(_integer_ticks())
    ax2.set_ylabel("e^(a'Sa): median (dot) to 90th pct")
    ax2.set_title("The importance weights' tail (second moment)", fontsize=9)
    return _save(plt, fig, path, 110)
