r"""Many clusters: the Gaussian-mixture closure against particles, and clustering measures.

A mixture :math:`\mu_0 = \sum_k w_k\mathcal N(\alpha_k,\Sigma_k)` is sampled with its
component labels (:meth:`gaussian_pde.GaussianMixture.sample`), the particles are moved
by :func:`gaussian_pde.simulate_particles`, and the mixture by
:func:`gaussian_pde.solve_mixture`. Measured over depth:

* **W2 between particles and mixture**: an equal-size sample of the closure's mixture
  against the particles, by exact assignment (:func:`w2_samples`, the optimal matching of
  two point clouds of the same size, :func:`scipy.optimize.linear_sum_assignment`) or
  sliced; its **Monte Carlo floor** is the same estimate between two independent samples
  of the mixture, which is what the distance would be if the closure were exact;
* **per-component errors**: the Bures-Wasserstein distance between the moments of the
  particles with label :math:`k` and :math:`\mathcal N(\alpha_k(t),\Sigma_k(t))`; these
  shrink like :math:`n^{-1/2}` where the closure is exact;
* **clusters**: the number of clusters of the mixture (single linkage of the components
  on their pairwise Bures-Wasserstein distances, tolerance ``merge_tol``,
  :func:`mixture_cluster_counts`), and of the particles (single linkage of the points
  with a distance threshold, clusters holding at least ``min_fraction`` of the tokens,
  :func:`particle_cluster_counts`, :mod:`scipy.cluster.hierarchy`); the merge times and
  the metastable plateaus between them (:func:`merge_times`, :func:`plateaus`).

The study (:func:`run_clusters`, command ``gaussian-pde clusters``) runs 2 to 8
components in ``d = 2`` and 3, random and symmetric starting configurations, softmax /
L2 / multi-head attention with ``V = I`` and ``V`` random, and writes figures and a
Markdown report (:func:`write_clusters`).

Attention families (:func:`cluster_attention`). With :math:`Q` random of scale ``q``:
``softmax``: :math:`K = -Q`, values :math:`V` (each cluster attends to the clusters on
the other side, :math:`y^TAx < 0`, so clusters are drawn together and merge);
``l2``: :math:`K = Q`, values :math:`-V` (local attention, a contraction);
``multihead``: the two heads with values halved.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
import warnings

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist

from .._common.gaussian import bures_wasserstein
from ..attention._l2 import L2
from ..attention._multihead import MultiHead
from ..attention._softmax import Softmax
from ..closure._mixture import (
    GaussianMixture,
    merge_heights,
    pairwise_bures_wasserstein,
    solve_mixture,
)
from ..particles._simulate import simulate_particles
from ._compare import fit_slope

__all__ = [
    "ClusterRun",
    "CLUSTER_ATTENTIONS",
    "CLUSTER_VALUES",
    "cluster_attention",
    "cluster_mixture",
    "w2_samples",
    "w2_to_mixture",
    "component_errors",
    "mixture_cluster_counts",
    "particle_cluster_counts",
    "merge_times",
    "plateaus",
    "run_case",
    "error_scaling",
    "run_clusters",
    "write_clusters",
]

#: attention families of the study
CLUSTER_ATTENTIONS = ("softmax", "l2", "multihead")
#: value matrices of the study
CLUSTER_VALUES = ("identity", "random")


# --------------------------------------------------------------------------------------
# configurations


def cluster_attention(kind, d, *, value="identity", q=0.5, seed=0):
    r"""An attention of the study (module docstring): ``kind`` in :data:`CLUSTER_ATTENTIONS`.

    Parameters
    ----------
    kind : {"softmax", "l2", "multihead"}
        The family.
    d : int
        Token dimension.
    value : {"identity", "random"}
        :math:`V = I`, or :math:`V = I + 0.3\,G/\sqrt d` with :math:`G` standard normal.
    q : float
        Scale of the random :math:`Q` (``Q = q * G'``, ``k = d``, score scale 1).
    seed : int
        Seed of the random weights.
    """
    if kind not in CLUSTER_ATTENTIONS:
        raise ValueError(f"`kind` must be one of {CLUSTER_ATTENTIONS}, got {kind!r}.")
    if value not in CLUSTER_VALUES:
        raise ValueError(f"`value` must be one of {CLUSTER_VALUES}, got {value!r}.")
    rng = np.random.default_rng(seed)
    Q = q * rng.standard_normal((d, d)) / np.sqrt(d)
    V = np.eye(d)
    if value == "random":
        V = V + 0.3 * rng.standard_normal((d, d)) / np.sqrt(d)
    soft = Softmax(Q, -Q, V, scale=1.0)
    loc = L2(Q, Q, -V, scale=1.0)
    if kind == "softmax":
        return soft
    if kind == "l2":
        return loc
    return MultiHead([Softmax(Q, -Q, V / 2, scale=1.0), L2(Q, Q, -V / 2, scale=1.0)])


def cluster_mixture(K, d, *, config="random", radius=3.0, spread=0.3, seed=0):
    r"""A starting mixture of ``K`` components in dimension ``d``.

    ``"symmetric"``: equal weights, means on a circle of ``radius`` in the first two
    coordinates (a regular polygon), covariances :math:`\text{spread}^2 I`;
    ``"random"``: Dirichlet(4) weights, means uniform in a ball of ``radius``, kept at
    least ``4 * spread`` apart, random covariances with eigenvalues in
    :math:`\text{spread}^2\,[0.5, 1.5]`.
    """
    if not (isinstance(K, (int, np.integer)) and K >= 1):
        raise ValueError(f"`K` must be a positive int, got {K!r}.")
    if not (isinstance(d, (int, np.integer)) and d >= 2):
        raise ValueError(f"`d` must be an int >= 2, got {d!r}.")
    if config == "symmetric":
        ang = 2 * np.pi * np.arange(K) / K
        means = np.zeros((K, d))
        means[:, 0], means[:, 1] = radius * np.cos(ang), radius * np.sin(ang)
        return GaussianMixture(np.full(K, 1.0 / K), means, [spread**2 * np.eye(d)] * K)
    if config != "random":
        raise ValueError(f"`config` must be 'random' or 'symmetric', got {config!r}.")
    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.full(K, 4.0))
    means = []
    while len(means) < K:
        p = rng.normal(size=d)
        p *= radius * rng.uniform() ** (1 / d) / np.linalg.norm(p)
        if all(np.linalg.norm(p - m) > 4 * spread for m in means):
            means.append(p)
    covs = []
    for _ in range(K):
        U, _ = np.linalg.qr(rng.normal(size=(d, d)))
        covs.append(U @ np.diag(spread**2 * rng.uniform(0.5, 1.5, d)) @ U.T)
    return GaussianMixture(w, means, covs)


# --------------------------------------------------------------------------------------
# distances and errors


def w2_samples(x, y, *, method="exact", n_projections=200, seed=0):
    r"""W2 distance between two equal-size point clouds (uniform weights).

    ``"exact"``: :math:`\big(\min_\sigma\frac1n\sum_i|x_i - y_{\sigma(i)}|^2\big)^{1/2}`
    by the optimal assignment; ``"sliced"``:
    :math:`\big(\mathbb E_\theta\,\frac1n\sum_i(\theta^Tx_{(i)} - \theta^Ty_{(i)})^2\big)^{1/2}`
    over ``n_projections`` random directions (sorted projections).
    """
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.ndim != 2 or x.shape != y.shape:
        raise ValueError(f"`x` and `y` must be (n, d) arrays of the same shape, got "
                         f"{x.shape} and {y.shape}.")
    if method == "exact":
        C = cdist(x, y, "sqeuclidean")
        r, c = linear_sum_assignment(C)
        return float(np.sqrt(C[r, c].mean()))
    if method == "sliced":
        rng = np.random.default_rng(seed)
        th = rng.normal(size=(n_projections, x.shape[1]))
        th /= np.linalg.norm(th, axis=1, keepdims=True)
        px, py = np.sort(x @ th.T, axis=0), np.sort(y @ th.T, axis=0)
        return float(np.sqrt(np.mean((px - py) ** 2)))
    raise ValueError(f"`method` must be 'exact' or 'sliced', got {method!r}.")


def w2_to_mixture(x, mixture, *, method="exact", seed=0):
    """``(W2(particles, mixture sample), Monte Carlo floor W2(sample, sample'))``.

    Both mixture samples are stratified (:meth:`GaussianMixture.sample`) with the size of ``x``.
    """
    n = np.asarray(x).shape[0]
    rng = np.random.default_rng(seed)
    y1, _ = mixture.sample(n, seed=rng)
    y2, _ = mixture.sample(n, seed=rng)
    return w2_samples(x, y1, method=method), w2_samples(y2, y1, method=method)


def component_errors(x, labels, means, covs):
    r"""Per component: Bures-Wasserstein distance of the labelled particles' moments to the closure.

    .. math:: e_k = W_2\big(\mathcal N(\hat m_k, \hat C_k), \mathcal N(\alpha_k, \Sigma_k)\big),

    :math:`\hat m_k`, :math:`\hat C_k` the mean and covariance (``1/n_k``) of the tokens with
    label :math:`k`. Returns shape (K,).
    """
    K = len(means)
    out = np.empty(K)
    for k in range(K):
        xk = x[labels == k]
        mk = xk.mean(0)
        Ck = (xk - mk).T @ (xk - mk) / len(xk)
        out[k] = bures_wasserstein(mk, Ck, means[k], covs[k])
    return out


# --------------------------------------------------------------------------------------
# clustering measures


def mixture_cluster_counts(means, covs, tol):
    r"""Number of single-linkage clusters of the components at each time.

    Components are joined when a chain of pairs each within ``tol`` in Bures-Wasserstein
    distance links them: :math:`1 + \#\{\text{merge heights} > \text{tol}\}`.

    Parameters
    ----------
    means : array_like, shape (T, K, d)
        Component means over time.
    covs : array_like, shape (T, K, d, d)
        Component covariances over time.
    tol : float
        Bures-Wasserstein linkage tolerance.

    Returns
    -------
    ndarray of int, shape (T,)
    """
    D = pairwise_bures_wasserstein(means, covs)
    return np.array([1 + int(np.sum(merge_heights(Dt) > tol)) for Dt in D])


def particle_cluster_counts(x, threshold, *, min_fraction=0.02):
    r"""Number of single-linkage clusters of point clouds, cut at a distance ``threshold``.

    :func:`scipy.cluster.hierarchy.linkage` (``"single"``) and
    :func:`~scipy.cluster.hierarchy.fcluster` (``criterion="distance"``); clusters with
    fewer than ``min_fraction`` of the tokens (tail outliers) are not counted.

    Parameters
    ----------
    x : array_like, shape (T, n, d) or (n, d)
        Point clouds over time, or one cloud.
    threshold : float
        Linkage distance.
    min_fraction : float
        Smallest share of the tokens a counted cluster holds.

    Returns
    -------
    ndarray of int, shape (T,) (or an int for one cloud)
    """
    x = np.asarray(x, float)
    one = x.ndim == 2
    out = []
    for xt in (x[None] if one else x):
        lab = fcluster(linkage(xt, "single"), threshold, criterion="distance")
        sizes = np.bincount(lab)
        out.append(int(np.sum(sizes >= max(1, min_fraction * len(xt)))))
    return out[0] if one else np.asarray(out)


def merge_times(t, counts):
    """Times (of ``t``) at which the cluster count dropped, once per lost cluster."""
    t, counts = np.asarray(t, float), np.asarray(counts)
    out = []
    for i in range(1, len(t)):
        out += [t[i]] * max(0, int(counts[i - 1] - counts[i]))
    return np.asarray(out)


def plateaus(t, counts):
    """Metastable plateaus: ``[(count, t_start, t_end, length), ...]`` of constant count."""
    t, counts = np.asarray(t, float), np.asarray(counts)
    out, start = [], 0
    for i in range(1, len(t) + 1):
        if i == len(t) or counts[i] != counts[start]:
            out.append((int(counts[start]), float(t[start]), float(t[i - 1]),
                        float(t[i - 1] - t[start])))
            start = i
    return out


# --------------------------------------------------------------------------------------
# one case


@dataclasses.dataclass
class ClusterRun:
    """One case: closure, particles and the measures over depth.

    Attributes: ``name``, ``t`` (T,), ``closure`` (MixtureSolution), ``particles``
    (ParticleSolution), ``labels`` (n,), ``w2`` and ``w2_floor`` (T,), ``component_error``
    (T, K), ``clusters_mixture`` and ``clusters_particles`` (T,), ``merge_times_mixture``,
    ``merge_times_particles``, ``seconds_closure``, ``seconds_particles``.
    """

    name: str
    t: np.ndarray
    closure: object
    particles: object
    labels: np.ndarray
    w2: np.ndarray
    w2_floor: np.ndarray
    component_error: np.ndarray
    clusters_mixture: np.ndarray
    clusters_particles: np.ndarray
    merge_times_mixture: np.ndarray
    merge_times_particles: np.ndarray
    seconds_closure: float
    seconds_particles: float


def run_case(attention, mixture, t_eval, *, n=400, seed=0, merge_tol=1.0,
             link_threshold=None, n_per_dim=6, w2_method="exact", name="case"):
    """Closure and particles from the same mixture, and every measure at ``t_eval``.

    ``link_threshold`` (particle single linkage) defaults to ``merge_tol / 2``. The times
    are those both reached (a run that stops early is cut there).
    """
    t_eval = np.asarray(t_eval, float)
    t0 = time.perf_counter()
    sol = solve_mixture(attention, mixture, (t_eval[0], t_eval[-1]), t_eval=t_eval,
                        n_per_dim=n_per_dim, merge_tol=merge_tol)
    t1 = time.perf_counter()
    x0, labels = mixture.sample(n, seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        part = simulate_particles(attention, x0, (t_eval[0], t_eval[-1]), t_eval=t_eval)
    t2 = time.perf_counter()
    T = min(len(sol.t), len(part.t))
    w2, floor, err = np.empty(T), np.empty(T), np.empty((T, mixture.K))
    for i in range(T):
        mix_t = GaussianMixture(sol.weights, sol.means[i], sol.covs[i])
        w2[i], floor[i] = w2_to_mixture(part.x[i], mix_t, method=w2_method, seed=seed + i)
        err[i] = component_errors(part.x[i], labels, sol.means[i], sol.covs[i])
    thr = merge_tol / 2 if link_threshold is None else link_threshold
    cm = mixture_cluster_counts(sol.means[:T], sol.covs[:T], merge_tol)
    cp = particle_cluster_counts(part.x[:T], thr)
    return ClusterRun(name=name, t=t_eval[:T], closure=sol, particles=part, labels=labels,
                      w2=w2, w2_floor=floor, component_error=err, clusters_mixture=cm,
                      clusters_particles=cp, merge_times_mixture=sol.merge_times,
                      merge_times_particles=merge_times(t_eval[:T], cp),
                      seconds_closure=t1 - t0, seconds_particles=t2 - t1)


def error_scaling(attention, mixture, t_eval, ns, seeds, *, n_per_dim=6):
    r"""Per-component closure error against ``n``: RMS over seeds of the final :math:`\max_k e_k`.

    Returns ``(ns, rms (N,), slope)``; ``slope`` is the least-squares slope of
    :math:`\log` RMS against :math:`\log n` (``-1/2`` where the closure is exact).
    """
    t_eval = np.asarray(t_eval, float)
    sol = solve_mixture(attention, mixture, (t_eval[0], t_eval[-1]), t_eval=t_eval,
                        n_per_dim=n_per_dim)
    rms = []
    for n in ns:
        errs = []
        for s in seeds:
            x0, lab = mixture.sample(n, seed=s)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                p = simulate_particles(attention, x0, (t_eval[0], t_eval[-1]),
                                       t_eval=t_eval, keep_positions=False)
            errs.append(component_errors(p.x_final, lab, sol.means_final, sol.covs_final).max())
        rms.append(np.sqrt(np.mean(np.square(errs))))
    rms = np.asarray(rms)
    return np.asarray(ns), rms, fit_slope(ns, rms)


# --------------------------------------------------------------------------------------
# the study


def _cases(quick):
    out = []
    if quick:
        grid = [(2, 2, "symmetric", "softmax", "identity"),
                (3, 2, "random", "l2", "random"),
                (4, 3, "random", "multihead", "identity")]
    else:
        grid = []
        for d in (2, 3):
            for K, config in ((2, "symmetric"), (4, "random"), (8, "symmetric"), (8, "random")):
                for kind in CLUSTER_ATTENTIONS:
                    for value in CLUSTER_VALUES:
                        grid.append((K, d, config, kind, value))
    for i, (K, d, config, kind, value) in enumerate(grid):
        out.append(dict(name=f"K{K}-d{d}-{config}-{kind}-V{value}", K=K, d=d, config=config,
                        kind=kind, value=value, seed=i))
    return out


def run_clusters(*, quick=False, n=None, t_end=None, progress=None, weak_scaling=True):
    """Run the study: every case of the grid, plus the ``n^{-1/2}`` scaling where the closure is exact.

    Returns ``{"runs": [ClusterRun...], "cases": [...], "scaling": (ns, rms, slope) or None}``.
    """
    n = (300 if quick else 800) if n is None else n
    t_end = (2.0 if quick else 4.0) if t_end is None else t_end
    t_eval = np.linspace(0.0, t_end, 11 if quick else 21)
    runs, cases = [], _cases(quick)
    for c in cases:
        att = cluster_attention(c["kind"], c["d"], value=c["value"], q=0.7, seed=c["seed"])
        mix = cluster_mixture(c["K"], c["d"], config=c["config"], seed=c["seed"])
        run = run_case(att, mix, t_eval, n=n, seed=c["seed"], name=c["name"],
                       n_per_dim=5 if c["d"] == 3 else 6)
        runs.append(run)
        if progress is not None:
            progress(f"{c['name']}: status {run.closure.status}, "
                     f"W2 {run.w2.max():.3g} (floor {run.w2_floor.max():.3g})")
    scaling = None
    if weak_scaling:
        att = cluster_attention("softmax", 2, q=0.1, seed=0)
        mix = cluster_mixture(2, 2, config="symmetric", radius=4.0, spread=0.3)
        ns = (100, 400, 1600) if quick else (200, 800, 3200)
        seeds = range(4 if quick else 8)
        scaling = error_scaling(att, mix, np.linspace(0, 1.0, 3), ns, seeds)
        if progress is not None:
            progress(f"n^-1/2 scaling (weak attention): slope {scaling[2]:.3f}")
    return {"runs": runs, "cases": cases, "scaling": scaling}


def _ellipse(ax, mean, cov, **kw):
    w, U = np.linalg.eigh(cov[:2, :2])
    th = np.linspace(0, 2 * np.pi, 60)
    pts = mean[:2, None] + U @ (2 * np.sqrt(np.clip(w, 0, None))[:, None]
                                * np.array([np.cos(th), np.sin(th)]))
    ax.plot(pts[0], pts[1], **kw)


def write_clusters(result, out):
    """Figures and ``report.md`` of :func:`run_clusters` in the folder ``out``; returns the summary dict."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = result["runs"]
    # ellipses over depth against particles (first coordinates), a few cases
    show = runs[: min(4, len(runs))]
    fig, axes = plt.subplots(len(show), 3, figsize=(10, 3.2 * len(show)), squeeze=False)
    for row, run in zip(axes, show):
        T = len(run.t)
        for ax, i in zip(row, (0, T // 2, T - 1)):
            x = run.particles.x[i]
            ax.scatter(x[:, 0], x[:, 1], c=run.labels, s=2, cmap="tab10", alpha=0.5)
            for k in range(run.closure.means.shape[1]):
                _ellipse(ax, run.closure.means[i, k], run.closure.covs[i, k], color="k", lw=1)
            ax.set_title(f"{run.name}\nt = {run.t[i]:.2f}", fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "ellipses.png", dpi=110)
    plt.close(fig)
    # cluster counts
    fig, ax = plt.subplots(figsize=(7, 4))
    for j, run in enumerate(runs[:8]):
        ax.plot(run.t, run.clusters_mixture + 0.03 * j, "-", color=f"C{j}", label=run.name)
        ax.plot(run.t, run.clusters_particles + 0.03 * j, ":", color=f"C{j}")
    ax.set_xlabel("depth t")
    ax.set_ylabel("number of clusters (solid: mixture, dotted: particles)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "cluster_counts.png", dpi=110)
    plt.close(fig)
    # merge times
    fig, ax = plt.subplots(figsize=(7, 4))
    for j, run in enumerate(runs):
        ax.plot(run.merge_times_mixture, np.full(len(run.merge_times_mixture), j), "ko", ms=4)
        ax.plot(run.merge_times_particles, np.full(len(run.merge_times_particles), j) + 0.2,
                "r^", ms=4)
    ax.set_yticks(range(len(runs)))
    ax.set_yticklabels([r.name for r in runs], fontsize=5)
    ax.set_xlabel("merge time (black: mixture events, red: particles)")
    fig.tight_layout()
    fig.savefig(out / "merge_times.png", dpi=110)
    plt.close(fig)
    # report
    lines = ["# Many clusters: the Gaussian-mixture closure against particles", "",
             "W2: exact-assignment W2 between the particles and an equal-size sample of the "
             "closure's mixture; floor: the same between two independent mixture samples "
             "(the value of an exact closure). Component error: max over components of the "
             "Bures-Wasserstein distance between the labelled particles' moments and the "
             "component. All maxima over depth.", "",
             "| case | status | max W2 | max floor | max component error | clusters (mixture) | "
             "clusters (particles) | merges mixture | merges particles | closure s | particles s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = []
    for r in runs:
        row = dict(name=r.name, status=str(r.closure.status), w2=float(r.w2.max()),
                   floor=float(r.w2_floor.max()), component_error=float(r.component_error.max()),
                   clusters_mixture=[int(r.clusters_mixture[0]), int(r.clusters_mixture[-1])],
                   clusters_particles=[int(r.clusters_particles[0]),
                                       int(r.clusters_particles[-1])],
                   merges_mixture=[float(v) for v in r.merge_times_mixture],
                   merges_particles=[float(v) for v in r.merge_times_particles],
                   seconds_closure=r.seconds_closure, seconds_particles=r.seconds_particles)
        summary.append(row)
        fmt = lambda v: ", ".join(f"{u:.2f}" for u in v) or "-"   # noqa: E731
        lines.append(f"| {r.name} | {row['status']} | {row['w2']:.3g} | {row['floor']:.3g} | "
                     f"{row['component_error']:.3g} | {row['clusters_mixture'][0]} -> "
                     f"{row['clusters_mixture'][1]} | {row['clusters_particles'][0]} -> "
                     f"{row['clusters_particles'][1]} | {fmt(row['merges_mixture'])} | "
                     f"{fmt(row['merges_particles'])} | {r.seconds_closure:.2f} | "
                     f"{r.seconds_particles:.2f} |")
    scaling = result.get("scaling")
    if scaling is not None:
        ns, rms, slope = scaling
        lines += ["", "## Where the closure is exact: error against n", "",
                  "Weak softmax attention (q = 0.1), two well-separated components in d = 2: "
                  "RMS over seeds of the final max component error.", "",
                  "| n | RMS error |", "|---|---|"]
        lines += [f"| {a} | {b:.4g} |" for a, b in zip(ns, rms)]
        lines += ["", f"Slope of log error against log n: **{slope:.3f}** (expected -0.5)."]
    lines += ["", "Figures: `ellipses.png`, `cluster_counts.png`, `merge_times.png`."]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return {"cases": summary,
            "scaling": None if scaling is None else dict(n=[int(v) for v in scaling[0]],
                                                         rms=[float(v) for v in scaling[1]],
                                                         slope=float(scaling[2]))}
