"""Figures of a :class:`~gaussian_pde.studies._compare.CompareReport` (imports matplotlib).

Used by ``gaussian-pde compare`` and by the validation notebooks. Every function returns
a matplotlib figure; the caller saves it (``gaussian_pde._common.io.save_figure``) and closes it.
"""

from __future__ import annotations

import warnings

import numpy as np

from ._compare import fit_slope

__all__ = ["plot_errors", "plot_scaling", "plot_moments", "plot_diagnostics", "all_figures"]

_LABELS = {
    "mean_error": r"$|\bar x_n - \alpha| / \sqrt{\mathrm{tr}\,\Sigma}$",
    "cov_error": r"$\|\Sigma_n - \Sigma\|_F / \|\Sigma\|_F$",
    "bw": r"$W_2$ (Bures-Wasserstein)",
    "bw_relative": r"$W_2 / \sqrt{\mathrm{tr}\,\Sigma}$",
    "sliced_w2": "sliced $W_2$ to fitted Gaussian",
    "kurtosis": "max |excess kurtosis|",
    "ess_median": "median ESS",
    "ess_min": "min ESS",
    "sinkhorn_error": "Sinkhorn marginal error",
}


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _colors(k):
    plt = _plt()
    return plt.cm.viridis(np.linspace(0.0, 0.85, max(k, 1)))


def plot_errors(report, metrics=("mean_error", "cov_error", "bw_relative")):
    """Errors against the ODE over time, one curve per ``n``, error bars over seeds."""
    plt = _plt()
    metrics = [m for m in metrics if getattr(report, m) is not None]
    if not metrics:
        metrics = ["sliced_w2"]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.4 * len(metrics), 3.6), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        mean, sem = report.summary(m)
        for i, (n, c) in enumerate(zip(report.n, _colors(len(report.n)))):
            ax.errorbar(report.t, mean[i], yerr=sem[i], color=c, marker="o", ms=3, capsize=2,
                        label=f"n = {n}")
        ax.set_yscale("log")
        ax.set_xlabel("t (depth)")
        ax.set_title(_LABELS.get(m, m), fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"{report.attention}: particles against the moment ODE "
                 f"(mean $\\pm$ s.e. over {len(report.seeds)} seeds)", fontsize=11)
    fig.tight_layout()
    return fig


def plot_scaling(report, metrics=("mean_error", "cov_error", "bw_relative")):
    """Time-RMS error against ``n`` (log-log) with the fitted slope and :math:`n^{-1/2}`.

    The RMS runs over :attr:`CompareReport.slope_times` (named in the title); a single
    ``n`` has no slope and no fitted line.
    """
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 4.0))
    n = report.n.astype(float)
    for m, c in zip(metrics, ["tab:blue", "tab:orange", "tab:green", "tab:red"]):
        err = getattr(report, m)
        if err is None:
            continue
        common = np.all(np.isfinite(err), axis=(0, 1))
        if not common.any():
            continue
        per_run = np.sqrt(np.mean(err[:, :, common] ** 2, axis=-1))
        rms = np.sqrt(np.mean(per_run**2, axis=1))
        sem = np.std(per_run, axis=1, ddof=1) / np.sqrt(per_run.shape[1]) \
            if per_run.shape[1] > 1 else None
        slope = fit_slope(n, rms)      # NaN with fewer than two sizes: no line
        label = _LABELS.get(m, m) + (f": slope {slope:.2f}" if np.isfinite(slope) else "")
        ax.errorbar(n, rms, yerr=sem, fmt="o", color=c, capsize=3, label=label)
        if np.isfinite(slope):
            ok = np.isfinite(rms) & (rms > 0)
            s, b = np.polyfit(np.log(n[ok]), np.log(rms[ok]), 1)
            ax.plot(n, np.exp(b) * n**s, "-", color=c, alpha=0.6)
    if report.cov_error is not None:
        ref = np.sqrt(np.mean(report.cov_error[0][:, np.isfinite(report.cov_error[0]).all(0)]
                              ** 2)) * np.sqrt(n[0] / n)
        ax.plot(n, ref, "k--", lw=1, label=r"$\propto n^{-1/2}$")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of tokens n")
    ax.set_ylabel("time-RMS error (RMS over seeds)")
    times = report.slope_times
    over = ("" if times.size == 0 else f"\nat t = {times[0]:.3g} only (the initial draw)"
            if times.size == 1 else f"\nover t in [{times[0]:.3g}, {times[-1]:.3g}]")
    ax.set_title(f"{report.attention}: Monte Carlo error against n{over}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_moments(report):
    r"""Eigenvalues of the covariance and of :math:`\Sigma/\mathrm{tr}\,\Sigma` over time.

    ODE (lines) against the particles at the largest ``n`` (mean and s.e. over seeds).
    """
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.8))
    cov = report.cov[-1]  # (S, T, d, d) at the largest n
    ok = np.isfinite(cov).all(axis=(-2, -1))
    eig = np.full(cov.shape[:-1], np.nan)
    eig[ok] = np.linalg.eigvalsh(cov[ok])
    tr = np.nansum(eig, axis=-1, keepdims=True)
    d = eig.shape[-1]
    colors = _colors(d)
    for ax, vals, title in ((axes[0], eig, r"eigenvalues of $\Sigma$"),
                            (axes[1], eig / tr, r"eigenvalues of $\Sigma/\mathrm{tr}\,\Sigma$")):
        S = vals.shape[0]
        with warnings.catch_warnings():    # times after every run stopped: NaN, quietly
            warnings.simplefilter("ignore", RuntimeWarning)
            m = np.nanmean(vals, axis=0)
            se = np.nanstd(vals, axis=0, ddof=1) / np.sqrt(S) if S > 1 else 0 * m
        for k in range(d):
            ax.errorbar(report.t, m[:, k], yerr=se[:, k], fmt="o", ms=3, capsize=2,
                        color=colors[k], label=f"particles, $\\lambda_{k + 1}$")
        if report.ode_cov is not None:
            e_ode = np.full((report.t.size, d), np.nan)
            good = np.isfinite(report.ode_cov).all(axis=(-2, -1))
            e_ode[good] = np.linalg.eigvalsh(report.ode_cov[good])
            if ax is axes[1]:
                e_ode = e_ode / e_ode.sum(axis=-1, keepdims=True)
            for k in range(d):
                ax.plot(report.t, e_ode[:, k], "-", color=colors[k], lw=1.2,
                        label="ODE" if k == 0 else None)
        ax.set_xlabel("t (depth)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{report.attention}: moments, n = {report.n[-1]}", fontsize=11)
    fig.tight_layout()
    return fig


def plot_diagnostics(report):
    """Median and minimum effective sample size, and non-Gaussianity, over time."""
    plt = _plt()
    panels = ["ess_median", "ess_min", "sliced_w2", "kurtosis"]
    if report.sinkhorn_error is not None:
        panels.append("sinkhorn_error")
    ncol = 3 if len(panels) > 4 else len(panels)
    nrow = -(-len(panels) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.3 * nrow), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, m in zip(axes.flat, panels):
        mean, sem = report.summary(m)
        for i, (n, c) in enumerate(zip(report.n, _colors(len(report.n)))):
            ax.errorbar(report.t, mean[i], yerr=sem[i], color=c, marker="o", ms=3, capsize=2,
                        label=f"n = {n}")
        if m != "kurtosis":
            ax.set_yscale("log")
        ax.set_xlabel("t (depth)")
        ax.set_title(_LABELS.get(m, m), fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"{report.attention}: diagnostics (t = 0 shows the Gaussian Monte Carlo floor)",
                 fontsize=11)
    fig.tight_layout()
    return fig


def all_figures(report):
    """Name -> figure for every figure that applies to ``report``."""
    figs = {"moments": plot_moments(report), "diagnostics": plot_diagnostics(report)}
    if report.cov_error is not None:
        figs["errors"] = plot_errors(report)
        figs["scaling"] = plot_scaling(report)
    return figs
