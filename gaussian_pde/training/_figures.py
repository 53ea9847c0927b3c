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
    One row per bridged (task, variant): the model's covariance error against the
    Gaussian prediction by layer, the traces of both, the error against :math:`n`
    (a Monte Carlo error falls like :math:`n^{-1/2}`) and the attention's effective
    sample size over :math:`n`.
"""

from __future__ import annotations

import numpy as np

from .._common.io import save_figure
from ._summary import DRIFT_KEYS, drift_curves, training_curves

__all__ = ["plot_training", "plot_drift", "plot_bridge", "COLORS"]

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


def _bridge_row(axes, t, v, b, first):
    for kind, ls in (("attention", "-"), ("full", "--")):
        r = b[kind]
        ns = r["n_tokens"]
        for j, n in enumerate(ns):
            c = f"C{j}"
            L1 = len(r["cov_err"][j])
            axes[0].plot(range(L1), r["cov_err"][j], ls, color=c,
                         label=f"n={n} ({kind})" if first else None)
            axes[1].plot(range(L1), r["model_trace"][j], ls, color=c)
            axes[3].plot(range(1, L1), r["ess_frac"][j], ls, color=c)
        axes[1].plot(range(len(r["pred_trace"])), r["pred_trace"], ls, color="k", lw=2,
                     label=f"Gaussian ({kind})")
        ce = np.array(r["cov_err"])
        for layer in range(1, ce.shape[1]):
            axes[2].plot(ns, ce[:, layer], ls + "o", color=f"C{layer}", ms=3,
                         label=f"layer {layer}" if kind == "attention" else None)
    ns = np.asarray(b["attention"]["n_tokens"], float)
    axes[2].plot(ns, 0.5 * (ns / ns[0]) ** -0.5, "k:", label="n^-1/2")
    axes[0].set_title(f"{t}/{v}: rel. covariance error by layer", fontsize=8)
    axes[1].set_title("tr S: model (colours, by n), Gaussian (black)", fontsize=8)
    axes[2].set_title("rel. covariance error against n (solid: attention)", fontsize=8)
    axes[3].set_title("ESS / n of the attention, by layer", fontsize=8)
    for ax in axes:
        ax.set_yscale("log")
    axes[2].set_xscale("log")
    for ax in (axes[0], axes[1], axes[3]):
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(_integer_ticks())
    axes[2].set_xlabel("tokens n")
    axes[1].legend(fontsize=6)
    axes[2].legend(fontsize=6, ncol=2)


def plot_bridge(results, path):
    """The trained models without LayerNorm against the Gaussian prediction (or None)."""
    rows = [(t, v) for t, byv in results["bridge"].items() for v in byv]
    if not rows:
        return None
    plt = _plt()
    fig, axes = plt.subplots(len(rows), 4, figsize=(16, 2.9 * len(rows)), squeeze=False)
    for i, (t, v) in enumerate(rows):
        _bridge_row(axes[i], t, v, results["bridge"][t][v], i == 0)
    axes[0, 0].legend(fontsize=6, ncol=2)
    return _save(plt, fig, path, 75)
