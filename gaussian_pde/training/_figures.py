r"""Figures of the training study (drawing only; the numbers come from ``_summary``).

``training_<task>.png``
    Per task at the study's base depth: loss (top row) and global gradient norm (bottom
    row) against the step, one column per shown learning rate, one colour per variant
    (thin: each seed; thick: median; ``x``: a non-finite run).
``drift_<task>.png``
    Per task: linear CKA with the input, the target and input probes, the centred and
    uncentred change between layers and the growth :math:`\operatorname{tr}\hat\Sigma_\ell
    / \operatorname{tr}\hat\Sigma_0` against the layer (median over seeds; solid:
    trained, dotted: at initialisation).
``stability_<task>.png``
    The largest stable learning rate against depth, per variant (median over seeds),
    plain Adam and with warmup and clipping.
``layer_grads_<task>.png``
    Each layer's gradient norm at the first step and its largest over training, at the
    largest depth of the task.
``theory.png``
    The Gaussian theory's blow-up depth :math:`L^*` against the depth :math:`L` of every
    run without normalisation, coloured by outcome; below the diagonal the theory
    predicts failure.
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
from ._summary import (
    DRIFT_KEYS,
    bridge_rate,
    drift_curves,
    layer_grad_curves,
    stability_curves,
    theory_points,
    training_curves,
)

__all__ = ["plot_training", "plot_drift", "plot_bridge", "plot_bridge_slope",
           "plot_bridge_weights", "plot_stability", "plot_layer_grads", "plot_theory", "COLORS",
           "STYLES"]

#: one colour per variant
COLORS = {"pre_ln": "C0", "post_ln": "C1", "no_ln": "C3", "no_residual": "C2",
          "neither": "C5", "pde_euler": "C4", "pde_rk4": "C6", "pde_euler_tied": "C7",
          "pde_rk4_tied": "C8", "peri_ln": "C9", "dyt": "tab:olive", "ngpt": "navy",
          "rezero": "tab:brown", "no_ln_sqrt": "salmon", "no_ln_depth": "darkred",
          "pde_euler_tL": "C4", "pde_rk4_tL": "C6", "pde_euler_tied_tL": "C7",
          "pde_rk4_tied_tL": "C8"}
#: line style per variant (the T = L simulators dashed)
STYLES = {v: "--" for v in COLORS if v.endswith("_tL")}


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


#: curves longer than this are drawn as trailing means over 1 % of their steps
SMOOTH_FROM = 500


def running_mean(y, window):
    r"""Trailing mean of ``y`` over ``window`` steps, :math:`\bar y_i = \frac1w\sum_{j=i-w+1}^{i} y_j`.

    The first ``window - 1`` entries average what there is; from the first non-finite
    entry on the result is NaN (a run that diverged stays visibly cut).
    """
    y = np.asarray(y, dtype=float)
    out = np.full(y.shape, np.nan)
    bad = np.flatnonzero(~np.isfinite(y))
    n = y.size if bad.size == 0 else int(bad[0])
    if n:
        c = np.cumsum(y[:n])
        out[:n] = c
        if n > window:
            out[window:n] -= c[:n - window]
        out[:n] /= np.minimum(np.arange(1, n + 1), window)
    return out


def plot_training(results, task, path):
    """Loss and gradient-norm curves of every variant on ``task``, by learning rate.

    Curves longer than :data:`SMOOTH_FROM` steps are drawn as trailing means over 1 % of
    the steps (:func:`running_mean`; a single batch's loss is noise at that length); an
    ``x`` marks the last finite value of a run that became non-finite.
    """
    plt = _plt()
    curves = training_curves(results, task)
    depth = results["config"]["depth"]
    rates = list(curves)
    fig, axes = plt.subplots(2, len(rates), figsize=(4.6 * len(rates), 6.4), squeeze=False,
                             sharex=True)
    window = 1
    for ci, lr in enumerate(rates):
        for row, key, lab in ((0, "loss", "training loss"), (1, "grad_norm", "gradient norm")):
            ax = axes[row, ci]
            for v, rec in curves[lr].items():
                c = COLORS.get(v, "k")
                n = len(rec["median_" + key])
                window = max(1, n // 100) if n > SMOOTH_FROM else 1
                for y in rec[key]:
                    ax.plot(running_mean(y, window), color=c, lw=0.5, alpha=0.35)
                ax.plot(running_mean(rec["median_" + key], window), STYLES.get(v, "-"),
                        color=c, lw=1.6, label=v)
                for y in rec[key]:
                    s = np.flatnonzero(np.isfinite(y))
                    if s.size and s[-1] < len(y) - 1:
                        ax.plot([s[-1]], [y[s[-1]]], "x", color=c, ms=6)
            ax.set_yscale("log")
            ax.set_title(f"{task}, L = {depth}, lr = {lr:.3g}: {lab}", fontsize=9)
            if row == 1:
                ax.set_xlabel("step")
    axes[0, 0].legend(fontsize=6, ncol=3)
    smooth = f"; means over {window} steps" if window > 1 else ""
    fig.suptitle(f"{task}: thin lines seeds, thick the median{smooth}; x: non-finite",
                 fontsize=9)
    return _save(plt, fig, path, 80)


def plot_drift(results, task, path):
    """Drift and growth against depth on ``task``, trained and at initialisation."""
    plt = _plt()
    curves = drift_curves(results, task)
    lr = bridge_rate(results, task)
    ncol = (len(DRIFT_KEYS) + 1) // 2
    fig, axes = plt.subplots(2, ncol, figsize=(4.4 * ncol, 7.2), squeeze=False)
    for pi, (key, lab) in enumerate(DRIFT_KEYS):
        ax = axes[pi // ncol, pi % ncol]
        for v, byw in curves.items():
            for when, ls in (("init", ":"), ("final", "-")):
                y = byw[when][key]
                # step measures are layers 1..L; the others start at the input (layer 0)
                x = np.arange(1, y.size + 1) if key.endswith("step") else np.arange(y.size)
                ax.plot(x, y, ls, color=COLORS.get(v, "k"), lw=1.1,
                        label=v if when == "final" else None)
        if key in ("trace", "rel_step", "centred_step"):
            ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(_integer_ticks())
        ax.set_title(lab, fontsize=8)
    axes[0, 0].legend(fontsize=5, ncol=2)
    fig.suptitle(f"{task}: median over seeds at L = {results['config']['depth']}, "
                 f"lr = {lr:.3g}; solid: trained, dotted: at initialisation", fontsize=9)
    return _save(plt, fig, path, 80)


def plot_stability(results, task, path):
    """Largest stable learning rate against depth, plain and with warmup and clipping."""
    plt = _plt()
    optims = list(results["config"]["optims"])
    fig, axes = plt.subplots(1, len(optims), figsize=(6.0 * len(optims), 4.4), squeeze=False,
                             sharey=True)
    floor = min(results["config"]["learning_rates"]) / 2
    for ax, o in zip(axes[0], optims):
        for v, (L, r) in stability_curves(results, task, o).items():
            ax.plot(L, np.where(r > 0, r, floor), STYLES.get(v, "-") + "o",
                    color=COLORS.get(v, "k"), ms=3, lw=1.2, label=v)
        ax.axhline(floor, color="k", lw=0.5, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("depth L")
        ax.set_title(f"{task}, {o}: largest stable learning rate (dotted: none stable)",
                     fontsize=8)
    axes[0, 0].set_ylabel("median over seeds")
    axes[0, 0].legend(fontsize=6, ncol=2)
    return _save(plt, fig, path, 80)


def plot_layer_grads(results, task, path):
    """Per-layer gradient norms at the first step and their largest, at the largest depth."""
    plt = _plt()
    depth = max(r["depth"] for runs in results["runs"][task].values() for r in runs)
    curves = layer_grad_curves(results, task, depth)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
    for v, (start, mx) in curves.items():
        for ax, y in zip(axes[0], (start, mx)):
            ax.plot(np.arange(1, y.size + 1), y, STYLES.get(v, "-"), color=COLORS.get(v, "k"),
                    lw=1.1, label=v)
    lr = bridge_rate(results, task)
    for ax, lab in zip(axes[0], ("at the first step", "largest over training")):
        ax.set_yscale("log")
        ax.set_xlabel("layer (weight set)")
        ax.set_title(f"{task}, L = {depth}, lr = {lr:.3g}: gradient norm {lab}", fontsize=8)
    axes[0, 0].legend(fontsize=5, ncol=2)
    return _save(plt, fig, path, 80)


def plot_theory(results, path):
    """The theory's blow-up depth against the depth, every run without normalisation."""
    pts = theory_points(results)
    if not pts:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), squeeze=False)
    L = np.array([p[2] for p in pts], float)
    ls = np.array([p[3] for p in pts], float)
    failed = np.array([p[4] for p in pts])
    growth = np.array([p[5] for p in pts], float)
    cap = 4 * L.max()
    y = np.where(np.isfinite(ls), ls, cap)
    rng = np.random.default_rng(0)
    jit = L * 2 ** rng.uniform(-0.15, 0.15, L.size)
    for ax, flag, labs in ((axes[0, 0], failed, ("trained", "failed")),
                           (axes[0, 1], ~np.isfinite(growth) | (growth > 10),
                            ("growth <= 10 at init", "growth > 10 at init"))):
        for val, c, lab in ((False, "C0", labs[0]), (True, "C3", labs[1])):
            m = flag == val
            ax.scatter(jit[m], y[m], s=6, color=c, alpha=0.5, label=lab)
        x = np.array([L.min() / 1.5, L.max() * 1.5])
        ax.plot(x, x, "k-", lw=0.8, label="L* = L")
        ax.axhline(cap, color="k", ls=":", lw=0.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("depth L (jittered)")
        ax.set_ylabel("L* = t*/h (dotted: no blow-up found)")
        ax.legend(fontsize=7)
    pred = y < L
    axes[0, 0].set_title(f"failure: agreement {np.mean(pred == failed):.2f} "
                         f"({L.size} runs)", fontsize=9)
    grew = ~np.isfinite(growth) | (growth > 10)
    axes[0, 1].set_title(f"growth at init: agreement {np.mean(pred == grew):.2f}", fontsize=9)
    return _save(plt, fig, path, 80)


def _bridge_models(results):
    return [(t, v, b) for t, byv in results["bridge"].items() for v, b in byv.items()]


def plot_bridge(results, path):
    """The model's covariance error against the Gaussian prediction, by layer (or None).

    One panel per bridged model (at most three across); colour: the number of tokens
    ``n``; solid: the attention alone (exact Gaussian map), dashed: with the FFN (closure).
    Where a Gaussian map stopped, a vertical line in its style marks the last layer it
    reached, and a note in the panel's corner says which map and where.
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
        notes = []
        for kind, ls in (("attention", "-"), ("full", "--")):
            r = b[kind]
            for j, _ in enumerate(r["n_tokens"]):
                ax.plot(range(len(r["cov_err"][j])), r["cov_err"][j], ls, color=f"C{j}",
                        marker="o", ms=3)
            reached = r.get("layers_reached", len(r["pred_trace"]) - 1)
            if r["status"] != "finished":
                ax.axvline(reached, color="0.45", ls=ls, lw=0.8)
                notes.append(f"{kind}: Gaussian {r['status']} after layer {reached + 1}")
        if notes:       # inside the panel, one line per map: they cannot overlap
            ax.text(0.98, 0.03, "\n".join(notes), transform=ax.transAxes, ha="right",
                    va="bottom", fontsize=7, bbox=dict(fc="white", ec="none", alpha=0.8))
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
