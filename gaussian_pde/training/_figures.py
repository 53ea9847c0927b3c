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
    One row per bridged (task, variant): the model's covariance error against the
    Gaussian prediction by layer, the traces of both, the error against :math:`n`
    (a Monte Carlo error falls like :math:`n^{-1/2}`) and the attention's effective
    sample size over :math:`n`.
"""

from __future__ import annotations

import numpy as np

from .._common.io import save_figure
from ._summary import DRIFT_KEYS, drift_curves, layer_grad_curves, stability_curves, theory_points, training_curves

__all__ = ["plot_training", "plot_drift", "plot_bridge", "plot_stability", "plot_layer_grads",
           "plot_theory", "COLORS", "STYLES"]

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


def plot_training(results, task, path):
    """Loss and gradient-norm curves of every variant on ``task``, by learning rate."""
    plt = _plt()
    curves = training_curves(results, task)
    depth = results["config"]["depth"]
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
                ax.plot(rec["median_" + key], STYLES.get(v, "-"), color=c, lw=1.6, label=v)
                for y in rec[key]:
                    s = np.flatnonzero(np.isfinite(y))
                    if s.size and s[-1] < y.size - 1:
                        ax.plot([s[-1]], [y[s[-1]]], "x", color=c, ms=6)
            ax.set_yscale("log")
            ax.set_title(f"{task}, L = {depth}, lr = {lr:.3g}: {lab}", fontsize=9)
            if row == 1:
                ax.set_xlabel("step")
    axes[0, 0].legend(fontsize=6, ncol=3)
    fig.suptitle(f"{task}: thin lines seeds, thick the median; x: non-finite", fontsize=9)
    return _save(plt, fig, path, 80)


def plot_drift(results, task, path):
    """Drift and growth against depth on ``task``, trained and at initialisation."""
    plt = _plt()
    curves = drift_curves(results, task)
    lr = results["config"]["bridge_learning_rate"]
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
    lr = results["config"]["bridge_learning_rate"]
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
