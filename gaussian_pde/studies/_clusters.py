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
  particles with label :math:`k` and :math:`\mathcal N(\alpha_k(t),\Sigma_k(t))`, pooled
  over components (:func:`moment_errors`); where the closure is exact (one component,
  softmax) these are pure Monte Carlo and shrink like :math:`n^{-1/2}`
  (:func:`error_scaling`, slope with a bootstrap interval, :func:`slope_with_interval`);
* **clusters**: the number of clusters of the mixture (single linkage of the components
  on their pairwise Bures-Wasserstein distances, tolerance ``merge_tol``,
  :func:`mixture_cluster_counts`), and of the particles by the same rule and tolerance on
  the components of a Gaussian mixture fitted to the point cloud by EM, warm-started over
  depth (:func:`particle_clusters`, :func:`fit_gaussian_mixture`): both sides count
  clusters in the same statistic and units, with no threshold of its own for the
  particles; the merge times are the first crossings of the merge heights on the same
  output times (:func:`crossing_times`, :func:`merge_time_gap`), and the metastable
  plateaus between them (:func:`plateaus`). (:func:`particle_cluster_counts`, single
  linkage of the points at a distance threshold, is kept for reference: its threshold has
  no counterpart in the closure.)

The study (:func:`run_clusters`, command ``gaussian-pde clusters``) runs the starting
mixtures :data:`CLUSTER_MIXTURES` (2 to 8 components, random and symmetric) in ``d = 2``
and 3, softmax / L2 / multi-head attention with ``V = I`` and ``V`` random (72 cases),
and writes figures and a Markdown report (:func:`write_clusters`).

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
from .._common.runge_kutta import rk4_march
from .._common.validation import validate_allocation, validate_int
from ..attention import (
    CLUSTER_QUICK_TYPES,
    CLUSTER_REFERENCE_TYPE,
    CLUSTER_TYPES,
    cluster_attention_of,
)
from ..closure import (
    GaussianMixture,
    merge_heights,
    pairwise_bures_wasserstein,
    solve_mixture,
)
from ..particles import simulate_particles

__all__ = [
    "ClusterRun",
    "CLUSTER_ATTENTIONS",
    "check_case_memory",
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
    "labelled_moments",
    "moment_errors",
    "slope_with_interval",
    "fit_gaussian_mixture",
    "particle_clusters",
    "crossing_times",
    "merge_time_gap",
    "run_case",
    "ErrorScaling",
    "default_seed_counts",
    "error_scaling",
    "CLUSTER_MIXTURES",
    "SCALING_CASE",
    "scaling_case",
    "run_clusters",
    "write_clusters",
]

#: attention families of the study (the attention package's table; docs above)
CLUSTER_ATTENTIONS = CLUSTER_TYPES
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
    return cluster_attention_of(kind, Q, V)


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


def labelled_moments(x, labels, K):
    r"""Mean and covariance (``1/n_k``) of the tokens with each label: (K, d) and (K, d, d)."""
    x = np.asarray(x, float)
    d = x.shape[1]
    m, C = np.empty((K, d)), np.empty((K, d, d))
    for k in range(K):
        xk = x[labels == k]
        m[k] = xk.mean(0)
        C[k] = (xk - m[k]).T @ (xk - m[k]) / len(xk)
    return m, C


def moment_errors(means, covs, ref_means, ref_covs, weights):
    r"""Errors of per-component moments against a reference, pooled over components.

    With :math:`w_k` the weights,

    * ``"mean"``: :math:`\big(\sum_kw_k|m_k - \alpha_k|^2\big)^{1/2}`;
    * ``"cov"``: :math:`\big(\sum_kw_k\|C_k - \Sigma_k\|_F^2\big)^{1/2}`;
    * ``"bw"``: :math:`\big(\sum_kw_kW_2^2(\mathcal N(m_k, C_k), \mathcal N(\alpha_k,
      \Sigma_k))\big)^{1/2}`, the Gaussian-fit W2 of the component-wise coupling (an upper
      bound of the W2 distance between the two Gaussian mixtures).

    Leading axes of ``means`` (..., K, d) and ``covs`` (..., K, d, d) broadcast against the
    reference. Returns ``{"mean", "cov", "bw"}`` of arrays of shape (...).
    """
    means, covs = np.asarray(means, float), np.asarray(covs, float)
    w = np.asarray(weights, float)
    dm = np.sum((means - ref_means) ** 2, axis=-1)
    dc = np.sum((covs - ref_covs) ** 2, axis=(-2, -1))
    bw2 = bures_wasserstein(means, covs, np.broadcast_to(ref_means, means.shape),
                            np.broadcast_to(ref_covs, covs.shape), squared=True)
    return {"mean": np.sqrt(dm @ w), "cov": np.sqrt(dc @ w), "bw": np.sqrt(bw2 @ w)}


def slope_with_interval(ns, errors, *, n_boot=2000, level=0.95, seed=0):
    r"""Slope of :math:`\log\mathrm{RMS}_s(e)` against :math:`\log n`, with a bootstrap interval.

    Parameters
    ----------
    ns : array_like, shape (N,)
        Particle counts.
    errors : sequence of array_like
        The errors of the runs at each ``n`` (one 1-D array per count; the number of runs
        may differ).
    n_boot : int
        Bootstrap resamples: the runs are resampled with replacement at each ``n``
        independently (runs at different ``n`` are independent).
    level : float
        Coverage of the percentile interval.
    seed : int
        Seed of the resampling.

    Returns
    -------
    slope : float
        Least-squares slope of the log RMS over runs against :math:`\log n`.
    interval : (float, float)
        Percentile bootstrap interval of the slope.
    rms : ndarray, shape (N,)
    """
    x = np.log(np.asarray(ns, float))
    xc = x - x.mean()
    e2 = [np.asarray(e, float) ** 2 for e in errors]
    rms = np.sqrt([v.mean() for v in e2])
    rng = np.random.default_rng(seed)
    boot = np.empty((n_boot, len(e2)))
    for i, v in enumerate(e2):
        boot[:, i] = np.sqrt(v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1))
    slopes = np.log(boot) @ xc / (xc @ xc)
    a = (1 - level) / 2
    return (float(np.log(rms) @ xc / (xc @ xc)),
            (float(np.quantile(slopes, a)), float(np.quantile(slopes, 1 - a))), rms)


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


def fit_gaussian_mixture(x, n_components, *, init=None, max_iter=200, tol=1e-9,
                         reg_covar=1e-6, seed=0, n_init=10):
    r"""Maximum-likelihood Gaussian mixture of a point cloud by expectation-maximisation.

    The standard EM iteration with full covariances (as scikit-learn's
    ``GaussianMixture(covariance_type="full")``): responsibilities in the log domain,
    weighted moments, ``reg_covar`` added to every covariance diagonal.

    Parameters
    ----------
    x : array_like, shape (n, d)
        Points.
    n_components : int
        Number of Gaussians.
    init : (weights, means, covs), optional
        Starting fit (a warm start, e.g. the fit at the previous time); else ``n_init``
        k-means++ starts (:func:`scipy.cluster.vq.kmeans2`, their cluster moments), of
        which the fit of the highest likelihood is kept (scikit-learn's ``n_init``: one
        k-means++ start often joins two nearby clusters and splits another).
    max_iter, tol : int, float
        Stop after ``max_iter`` iterations or when the mean log-likelihood gains less
        than ``tol``.
    reg_covar : float
        Added to the diagonal of each covariance.
    seed : int
        Seed of the first k-means++ start (then ``seed + 1``, ...).
    n_init : int
        Number of k-means++ starts without ``init``.

    Returns
    -------
    weights : ndarray, shape (K,)
    means : ndarray, shape (K, d)
    covs : ndarray, shape (K, d, d)
    """
    if init is None and n_init > 1:
        fits = [_em(x, n_components, None, max_iter, tol, reg_covar, seed + i)
                for i in range(n_init)]
        return max(fits, key=lambda f: f[3])[:3]
    return _em(x, n_components, init, max_iter, tol, reg_covar, seed)[:3]


def _em(x, n_components, init, max_iter, tol, reg_covar, seed):
    """EM from ``init`` or one k-means++ start: ``(weights, means, covs, mean log-likelihood)``."""
    from scipy.cluster.vq import kmeans2

    x = np.asarray(x, float)
    n, d = x.shape
    K = int(n_components)
    eye = reg_covar * np.eye(d)
    if init is None:
        _, lab = kmeans2(x, K, minit="++", seed=seed)
        R = np.zeros((n, K))
        R[np.arange(n), lab] = 1.0
    else:
        R = None
        w, m, C = (np.array(a, float) for a in init)
    prev = -np.inf
    for _ in range(max_iter + 1):
        if R is not None:                                  # M step
            nk = R.sum(axis=0) + 1e-12
            w = nk / n
            m = (R.T @ x) / nk[:, None]
            dx = x[None] - m[:, None]                      # (K, n, d)
            C = np.einsum("kn,kni,knj->kij", R.T, dx, dx) / nk[:, None, None] + eye
        # E step
        L = np.linalg.cholesky(C)
        dx = x[None] - m[:, None]
        z = np.linalg.solve(L, np.swapaxes(dx, 1, 2))      # (K, d, n)
        logdet = 2 * np.sum(np.log(np.diagonal(L, axis1=1, axis2=2)), axis=1)
        logp = (np.log(w)[:, None] - 0.5 * (logdet[:, None] + np.sum(z * z, axis=1)
                                            + d * np.log(2 * np.pi)))      # (K, n)
        top = logp.max(axis=0)
        ll = top + np.log(np.exp(logp - top).sum(axis=0))
        R = np.exp(logp - ll).T
        cur = float(ll.mean())
        if cur - prev < tol:
            break
        prev = cur
    return w, m, C, cur


def particle_clusters(x, merge_tol, n_components, *, seed=0):
    r"""Clusters of point clouds over time, in the units of the mixture's merge events.

    At each time a Gaussian mixture of ``n_components`` (the starting number of
    components) is fitted by EM (:func:`fit_gaussian_mixture`, warm-started from the fit
    at the previous time, the best of ten k-means++ starts at the first); the fitted components are then joined
    by the rule of :func:`gaussian_pde.solve_mixture`: single linkage on their
    Bures-Wasserstein distances at tolerance ``merge_tol``. A merged cluster, fitted with
    several Gaussians, is split by EM into pieces whose distances are of the order of its
    own width, below the tolerance, so it counts once.

    Parameters
    ----------
    x : array_like, shape (T, n, d)
        Point clouds over time.
    merge_tol : float
        Bures-Wasserstein linkage tolerance (the mixture's ``merge_tol``).
    n_components : int
        Gaussians fitted at each time.
    seed : int
        Seed of the first k-means++ start.

    Returns
    -------
    counts : ndarray of int, shape (T,)
    heights : ndarray, shape (T, n_components - 1)
        Single-linkage merge heights of the fitted components (:func:`merge_heights`).
    """
    x = np.asarray(x, float)
    fit, counts, heights = None, [], []
    for xt in x:
        fit = fit_gaussian_mixture(xt, n_components, init=fit, seed=seed)
        h = merge_heights(pairwise_bures_wasserstein(fit[1], fit[2]))
        heights.append(h)
        counts.append(1 + int(np.sum(h > merge_tol)))
    return np.asarray(counts), np.asarray(heights).reshape(len(x), max(n_components - 1, 0))


def crossing_times(t, heights, tol):
    r"""First downward crossing of ``tol`` by each merge height, linearly interpolated in ``t``.

    The counterpart, on sampled heights (T, K - 1), of the merge events of
    :func:`gaussian_pde.solve_mixture`: each height counts once, at the first time its
    running minimum reaches ``tol`` (a fitted height that hovers at the tolerance, up and
    down with the Monte Carlo noise, is one merge). Returns the sorted times.
    """
    t = np.asarray(t, float)
    h = np.minimum.accumulate(np.asarray(heights, float), axis=0)
    out = []
    for j in range(h.shape[1]):
        g = h[:, j] - tol
        hit = np.nonzero((g[:-1] > 0) & (g[1:] <= 0))[0]
        if hit.size:
            i = hit[0]
            out.append(t[i] + (t[i + 1] - t[i]) * g[i] / (g[i] - g[i + 1]))
    return np.sort(np.asarray(out, float))


def merge_time_gap(a, b, t_end):
    r"""Largest gap between two sorted lists of merge times, matched in order.

    A merge in one list and not the other (different counts) is matched to ``t_end``,
    the end of the observed interval. Returns 0 when both are empty.
    """
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    m = max(a.size, b.size)
    if m == 0:
        return 0.0
    a = np.concatenate([a, np.full(m - a.size, t_end)])
    b = np.concatenate([b, np.full(m - b.size, t_end)])
    return float(np.max(np.abs(a - b)))


# --------------------------------------------------------------------------------------
# one case


@dataclasses.dataclass
class ClusterRun:
    """One case: closure, particles and the measures over depth.

    Attributes: ``name``, ``t`` (T,), ``closure`` (MixtureSolution), ``particles``
    (ParticleSolution), ``labels`` (n,), ``w2`` and ``w2_floor`` (T,), ``component_error``
    (T, K), ``moment_error`` (dict of (T,) arrays, :func:`moment_errors` of the labelled
    particles against the closure), ``clusters_mixture`` and ``clusters_particles`` (T,),
    ``heights_particles`` (T, K - 1), ``merge_times_mixture`` and
    ``merge_times_particles`` (:func:`crossing_times` of the merge heights of the closure's
    components and of the particles' fitted components, on the same times; the closure's
    event times are ``closure.merge_times``), ``merge_gap`` (:func:`merge_time_gap`),
    ``merge_tol``,
    ``seconds_closure``, ``seconds_particles``.
    """

    name: str
    t: np.ndarray
    closure: object
    particles: object
    labels: np.ndarray
    w2: np.ndarray
    w2_floor: np.ndarray
    component_error: np.ndarray
    moment_error: dict
    clusters_mixture: np.ndarray
    clusters_particles: np.ndarray
    heights_particles: np.ndarray
    merge_times_mixture: np.ndarray
    merge_times_particles: np.ndarray
    merge_gap: float
    merge_tol: float
    seconds_closure: float
    seconds_particles: float


def check_case_memory(n, name="n", w2_method="exact"):
    r"""Refuse, before any work, ``n`` particles whose exact :math:`W_2` would not fit in memory.

    The exact distance (:func:`w2_samples`) builds the :math:`n\times n` cost matrix and
    the assignment works on a copy: :math:`16 n^2` bytes, against half the machine's
    memory (:func:`~gaussian_pde._common.validation.validate_allocation`); the message
    names ``name``. The sliced distance needs no such matrix. Returns ``n``.
    """
    n = validate_int(n, name, minimum=2)
    if w2_method == "exact":
        validate_allocation(2 * n * n, name)
    return n


def run_case(attention, mixture, t_eval, *, n=400, seed=0, merge_tol=1.0, n_per_dim=6,
             w2_method="exact", name="case"):
    """Closure and particles from the same mixture, and every measure at ``t_eval``.

    The particles' clusters are :func:`particle_clusters` with the closure's
    ``merge_tol`` (same statistic, same rule, same units). The times are those both
    reached (a run that stops early is cut there). Particles whose exact :math:`W_2`
    would not fit in memory are refused first (:func:`check_case_memory`).
    """
    n = check_case_memory(n, "n", w2_method)
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
    pm = np.empty((T,) + mixture.means.shape)
    pc = np.empty((T,) + mixture.covs.shape)
    for i in range(T):
        mix_t = GaussianMixture(sol.weights, sol.means[i], sol.covs[i])
        w2[i], floor[i] = w2_to_mixture(part.x[i], mix_t, method=w2_method, seed=seed + i)
        err[i] = component_errors(part.x[i], labels, sol.means[i], sol.covs[i])
        pm[i], pc[i] = labelled_moments(part.x[i], labels, mixture.K)
    merr = moment_errors(pm, pc, sol.means[:T], sol.covs[:T], sol.weights)
    cm = mixture_cluster_counts(sol.means[:T], sol.covs[:T], merge_tol)
    hm = np.array([merge_heights(D) for D in pairwise_bures_wasserstein(sol.means[:T],
                                                                        sol.covs[:T])])
    cp, hp = particle_clusters(part.x[:T], merge_tol, mixture.K, seed=seed)
    tm = crossing_times(t_eval[:T], hm.reshape(T, mixture.K - 1), merge_tol)
    tp = crossing_times(t_eval[:T], hp, merge_tol)
    return ClusterRun(name=name, t=t_eval[:T], closure=sol, particles=part, labels=labels,
                      w2=w2, w2_floor=floor, component_error=err, moment_error=merr,
                      clusters_mixture=cm, clusters_particles=cp, heights_particles=hp,
                      merge_times_mixture=tm, merge_times_particles=tp,
                      merge_gap=merge_time_gap(tm, tp, t_eval[T - 1]), merge_tol=merge_tol,
                      seconds_closure=t1 - t0, seconds_particles=t2 - t1)


@dataclasses.dataclass
class ErrorScaling:
    r"""Per-component moments of particle runs against the closure, over ``n`` and seeds.

    Attributes
    ----------
    ns : ndarray, shape (N,)
    n_seeds : ndarray of int, shape (N,)
        Runs at each ``n``.
    weights : ndarray, shape (K,)
    closure_means, closure_covs : ndarray, (K, d) and (K, d, d)
        The closure at ``t_end``.
    means, covs : list of ndarray, (S_i, K, d) and (S_i, K, d, d)
        Moments of the labelled particles at ``t_end``, one array per ``n``.
    seconds : float
        Wall time of the particle runs.
    """

    ns: np.ndarray
    n_seeds: np.ndarray
    weights: np.ndarray
    closure_means: np.ndarray
    closure_covs: np.ndarray
    means: list
    covs: list
    seconds: float

    def errors(self, ref_means=None, ref_covs=None):
        """:func:`moment_errors` against the closure (or the reference given).

        Returns ``{"mean", "cov", "bw"}``, each a list of (S_i,) arrays.
        """
        rm = self.closure_means if ref_means is None else ref_means
        rc = self.closure_covs if ref_covs is None else ref_covs
        per = [moment_errors(m, c, rm, rc, self.weights) for m, c in zip(self.means, self.covs)]
        return {k: [p[k] for p in per] for k in ("mean", "cov", "bw")}

    def fit(self, metric="bw", ref_means=None, ref_covs=None, **kw):
        """:func:`slope_with_interval` of one metric: ``(slope, (lo, hi), rms)``."""
        return slope_with_interval(self.ns, self.errors(ref_means, ref_covs)[metric], **kw)


def _rk4_particles(attention, x, t_end, dt):
    """Classical RK4 on the particle system, equal steps no longer than ``dt``."""
    def f(t, y):
        return attention.particle_velocity(y, warn=False)[0]
    return rk4_march(f, x, (0.0, t_end), dt)[-1]


def default_seed_counts(ns, largest=4):
    """Runs per size with equal cost per size: ``largest * (n_max / n)^2``, at most 64."""
    ns = np.asarray(ns, float)
    return np.minimum(64, np.round(largest * (ns.max() / ns) ** 2)).astype(int)


def error_scaling(attention, mixture, t_end, ns, n_seeds=None, *, n_per_dim=6, dt=None,
                  seed=0):
    r"""Particle moments at ``t_end`` for each ``n`` and seed, against the closure.

    The particles are integrated by classical RK4 (:meth:`particle_velocity` of the
    attention, equal steps of at most ``dt``, default ``t_end``; its error, :math:`O(dt^4)`,
    is checked far below the Monte Carlo error of the sizes used) from stratified
    labelled samples; the closure by :func:`gaussian_pde.solve_mixture` at
    ``rtol = 1e-10``. Where the closure is exact (one component and a Gaussian-preserving
    attention, e.g. softmax: the closure is then the moment ODE) the errors are pure
    Monte Carlo and shrink like :math:`n^{-1/2}`; :meth:`ErrorScaling.fit` gives the slope
    with a bootstrap interval.

    Parameters
    ----------
    attention, mixture
        As for :func:`gaussian_pde.solve_mixture`.
    t_end : float
        Final time.
    ns : sequence of int
        Particle counts.
    n_seeds : int or sequence of int, optional
        Runs per count (default :func:`default_seed_counts`: equal cost per count).
    n_per_dim : int
        Quadrature of the closure.
    dt : float, optional
        Largest RK4 step.
    seed : int
        Base seed; run ``j`` at size ``n`` uses the seed ``[seed, n, j]``.

    Returns
    -------
    ErrorScaling
    """
    dt = t_end if dt is None else dt
    sol = solve_mixture(attention, mixture, (0.0, t_end), n_per_dim=n_per_dim, rtol=1e-10,
                        atol=1e-12)
    K = mixture.K
    ns = np.asarray(ns, int)
    if n_seeds is None:
        n_seeds = default_seed_counts(ns)
    n_seeds = np.broadcast_to(np.asarray(n_seeds, int), ns.shape).copy()
    means, covs = [], []
    t0 = time.perf_counter()
    for n, S in zip(ns, n_seeds):
        M, Cv = [], []
        for j in range(S):
            x0, lab = mixture.sample(int(n), seed=[int(seed), int(n), j])
            m, c = labelled_moments(_rk4_particles(attention, x0, t_end, dt), lab, K)
            M.append(m)
            Cv.append(c)
        means.append(np.asarray(M))
        covs.append(np.asarray(Cv))
    return ErrorScaling(ns=ns, n_seeds=n_seeds, weights=sol.weights,
                        closure_means=sol.means_final, closure_covs=sol.covs_final,
                        means=means, covs=covs, seconds=time.perf_counter() - t0)


# --------------------------------------------------------------------------------------
# the study


#: starting mixtures of the full grid, per dimension: (K, config)
CLUSTER_MIXTURES = ((2, "symmetric"), (3, "random"), (4, "symmetric"), (6, "random"),
                    (8, "symmetric"), (8, "random"))


#: the quick grid's cases (K, d, configuration, value), each with its family of
#: CLUSTER_QUICK_TYPES
_QUICK_CASES = ((4, 2, "symmetric", "identity"), (3, 2, "random", "random"),
                (4, 3, "random", "identity"))


def cluster_cases(quick):
    out = []
    if quick:
        grid = [(K, d, config, kind, value) for (K, d, config, value), kind
                in zip(_QUICK_CASES, CLUSTER_QUICK_TYPES, strict=True)]
    else:
        grid = [(K, d, config, kind, value) for d in (2, 3) for K, config in CLUSTER_MIXTURES
                for kind in CLUSTER_ATTENTIONS for value in CLUSTER_VALUES]
    for i, (K, d, config, kind, value) in enumerate(grid):
        out.append(dict(name=f"K{K}-d{d}-{config}-{kind}-V{value}", K=K, d=d, config=config,
                        kind=kind, value=value, seed=i))
    return out


#: the exact case of the n^{-1/2} check: one component, the reference family
#: (Gaussian-preserving)
SCALING_CASE = dict(kind=CLUSTER_REFERENCE_TYPE, d=3, q=1.0, t_end=0.5,
                    mean=(0.5, -0.3, 0.2),
                    cov=((1.0, 0.3, 0.0), (0.3, 0.6, 0.1), (0.0, 0.1, 0.8)))


def scaling_case():
    """``(attention, mixture, t_end)`` of :data:`SCALING_CASE`."""
    c = SCALING_CASE
    att = cluster_attention(c["kind"], c["d"], q=c["q"], seed=0)
    return att, GaussianMixture([1.0], [c["mean"]], [c["cov"]]), c["t_end"]


def run_clusters(*, quick=False, n=None, t_end=None, progress=None, scaling=True):
    r"""Run the study: every case of the grid, plus the :math:`n^{-1/2}` check.

    Parameters
    ----------
    quick : bool
        Three cases, fewer particles, depth 2, a small scaling check.
    n : int, optional
        Particles per case (default 400; 150 with ``quick``).
    t_end : float, optional
        Depth (default 4; 2 with ``quick``).
    progress : callable, optional
        Called with one line per case.
    scaling : bool
        Run :func:`error_scaling` on :func:`scaling_case`.

    Returns
    -------
    dict
        ``{"runs": [ClusterRun...], "cases": [...], "scaling": ErrorScaling or None,
        "seconds": float}``.
    """
    t_start = time.perf_counter()
    n = (150 if quick else 400) if n is None else n
    t_end = (2.0 if quick else 4.0) if t_end is None else t_end
    t_eval = np.linspace(0.0, t_end, 11 if quick else 21)
    runs, cases = [], cluster_cases(quick)
    for c in cases:
        att = cluster_attention(c["kind"], c["d"], value=c["value"], q=0.7, seed=c["seed"])
        mix = cluster_mixture(c["K"], c["d"], config=c["config"], seed=c["seed"])
        run = run_case(att, mix, t_eval, n=n, seed=c["seed"], name=c["name"],
                       n_per_dim=5 if c["d"] == 3 else 6)
        runs.append(run)
        if progress is not None:
            progress(f"{c['name']}: status {run.closure.status}, max moment error "
                     f"{run.moment_error['bw'].max():.3g}, merge gap {run.merge_gap:.3g}")
    res = None
    if scaling:
        att, mix, te = scaling_case()
        if quick:
            res = error_scaling(att, mix, te, (50, 100, 200), (16, 8, 4))
        else:
            res = error_scaling(att, mix, te, (100, 200, 400, 800, 1600), (64, 64, 48, 32, 16))
        if progress is not None:
            slope, ci, _ = res.fit("bw")
            progress(f"n^-1/2 check (one component, {SCALING_CASE['kind']}): slope {slope:.3f} "
                     f"[{ci[0]:.3f}, {ci[1]:.3f}]")
    return {"runs": runs, "cases": cases, "scaling": res,
            "seconds": time.perf_counter() - t_start}


def _ellipse(ax, mean, cov, **kw):
    w, U = np.linalg.eigh(cov[:2, :2])
    th = np.linspace(0, 2 * np.pi, 60)
    pts = mean[:2, None] + U @ (2 * np.sqrt(np.clip(w, 0, None))[:, None]
                                * np.array([np.cos(th), np.sin(th)]))
    ax.plot(pts[0], pts[1], **kw)


def _ellipse_figure(plt, runs, path, title):
    """Rows: cases; columns: four depths; particles (by label) and 2-sigma ellipses."""
    fig, axes = plt.subplots(len(runs), 4, figsize=(11, 2.6 * len(runs)), squeeze=False)
    for row, run in zip(axes, runs):
        T = len(run.t)
        for ax, i in zip(row, (0, T // 3, 2 * T // 3, T - 1)):
            x = run.particles.x[i]
            ax.scatter(x[:, 0], x[:, 1], c=run.labels, s=2, cmap="tab10", alpha=0.4,
                       vmin=0, vmax=9)
            for k in range(run.closure.means.shape[1]):
                _ellipse(ax, run.closure.means[i, k], run.closure.covs[i, k], color="k", lw=0.8)
            ax.set_title(f"{run.name}  t = {run.t[i]:.1f}", fontsize=6)
            ax.tick_params(labelsize=5)
            ax.set_aspect("equal", adjustable="datalim")
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _fmt_times(v):
    return ", ".join(f"{u:.2f}" for u in v) or "-"


def write_clusters(result, out):
    """Figures and ``report.md`` of :func:`run_clusters` in the folder ``out``; returns the summary dict.

    Figures: ``ellipses_d2.png`` and ``ellipses_d3.png`` (every component's 2-sigma
    ellipse over depth on the particles, first two coordinates, the softmax ``V = I`` case
    of each starting mixture, and in ``ellipses_all_*.png`` the other attentions),
    ``cluster_counts.png`` (number of clusters against depth, mixture and particles, one
    panel per case), ``merge_times.png``, and ``scaling.png`` (the :math:`n^{-1/2}` check).
    """
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures = plot_clusters(result, out)
    lines, summary, scal, seconds = cluster_report(result, figures)
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return {"cases": summary, "scaling": scal, "seconds": seconds, "figures": figures}


def plot_clusters(result, out):
    """The figures of :func:`write_clusters` in ``out``; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"]
    figures = []
    for d in sorted({r.closure.means.shape[2] for r in runs}):
        sel = [r for r in runs if r.closure.means.shape[2] == d]
        main = [r for r in sel if f"-{CLUSTER_REFERENCE_TYPE}-Videntity" in r.name] or sel[:4]
        figures.append(f"ellipses_d{d}.png")
        _ellipse_figure(plt, main, out / figures[-1],
                        f"d = {d}: components of the closure (black, 2 sigma) on the particles")
        rest = [r for r in sel if r not in main]
        for j in range(0, len(rest), 6):
            figures.append(f"ellipses_all_d{d}_{j // 6 + 1}.png")
            _ellipse_figure(plt, rest[j:j + 6], out / figures[-1],
                            f"d = {d}: components of the closure (black) on the particles")
    # cluster counts, one panel per case
    ncol = 6
    nrow = int(np.ceil(len(runs) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(13, 1.7 * nrow + 0.5), squeeze=False,
                             sharex=True)
    for ax, run in zip(axes.ravel(), runs):
        ax.step(run.t, run.clusters_mixture, "k-", where="post", lw=1.2, label="mixture")
        ax.step(run.t, run.clusters_particles, "r--", where="post", lw=1, label="particles")
        ax.set_title(run.name, fontsize=5)
        ax.tick_params(labelsize=5)
        ax.set_ylim(0.5, run.closure.means.shape[1] + 0.5)
    for ax in axes.ravel()[len(runs):]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=5)
    fig.supxlabel("depth t", fontsize=7)
    fig.supylabel("clusters (merge tol, Bures-Wasserstein)", fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "cluster_counts.png", dpi=90)
    plt.close(fig)
    figures.append("cluster_counts.png")
    # merge times
    fig, ax = plt.subplots(figsize=(7, 0.16 * len(runs) + 1.2))
    for j, run in enumerate(runs):
        ax.plot(run.merge_times_mixture, np.full(len(run.merge_times_mixture), j), "ko", ms=3)
        ax.plot(run.merge_times_particles, np.full(len(run.merge_times_particles), j) + 0.3,
                "r^", ms=3)
    ax.set_yticks(range(len(runs)))
    ax.set_yticklabels([r.name for r in runs], fontsize=4)
    ax.set_xlabel("merge time (black: mixture, red: particles)")
    ax.set_xlim(0, runs[0].t[-1] if runs else 1)
    fig.tight_layout()
    fig.savefig(out / "merge_times.png", dpi=110)
    plt.close(fig)
    figures.append("merge_times.png")
    scaling = result.get("scaling")
    if scaling is not None:
        fig, ax = plt.subplots(figsize=(4.5, 3.5))
        for metric, mk in (("mean", "o"), ("cov", "s"), ("bw", "^")):
            slope, ci, rms = scaling.fit(metric)
            ax.loglog(scaling.ns, rms, mk + "-", label=f"{metric}: slope {slope:.2f} "
                      f"[{ci[0]:.2f}, {ci[1]:.2f}]")
        ax.loglog(scaling.ns, rms[0] * (scaling.ns / scaling.ns[0]) ** -0.5, "k:",
                  label="n^-1/2")
        ax.set_xlabel("particles n")
        ax.set_ylabel("RMS moment error at t_end")
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(out / "scaling.png", dpi=110)
        plt.close(fig)
        figures.append("scaling.png")
    return figures


def cluster_report(result, figures):
    """The lines of ``report.md`` and the summary of :func:`write_clusters`.

    Returns ``(lines, cases, scaling, seconds)``.
    """
    runs = result["runs"]
    scaling = result.get("scaling")
    # report
    lines = ["# Many clusters: the Gaussian-mixture closure against particles", "",
             "Closure error: the labelled particles' per-component moments against the "
             "closure's components, pooled over components with their weights "
             "(`moment_errors`): `bw` is the Gaussian-fit W2 "
             "(sqrt(sum_k w_k W2^2(N(m_k, C_k), N(alpha_k, Sigma_k)))). Its Monte Carlo "
             "part is about the value at t = 0 (sampling error of the starting moments, "
             "`bw(0)`). W2: exact-assignment W2 between the particles and an equal-size "
             "sample of the closure's mixture, with its Monte Carlo floor (two mixture "
             "samples). Clusters: single linkage of the components on their "
             "Bures-Wasserstein distances at `merge_tol`; for the particles the same rule "
             "on the components of an EM fit of the point cloud (`particle_clusters`). Merge "
             "times: first crossing of each merge height, on the same output times for both; "
             "gap: the largest difference, a merge missing on one side counted at the end "
             "of the run.", "",
             "| case | status | bw(0) | max bw | bw(t_end) | max W2 | max floor | clusters "
             "mixture | clusters particles | merges mixture | merges particles | gap | "
             "closure s | particles s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary = []
    for r in runs:
        bw = r.moment_error["bw"]
        row = dict(name=r.name, status=str(r.closure.status), bw0=float(bw[0]),
                   bw_max=float(bw.max()), bw_end=float(bw[-1]), w2=float(r.w2.max()),
                   floor=float(r.w2_floor.max()),
                   clusters_mixture=[int(r.clusters_mixture[0]), int(r.clusters_mixture[-1])],
                   clusters_particles=[int(r.clusters_particles[0]),
                                       int(r.clusters_particles[-1])],
                   merges_mixture=[float(v) for v in r.merge_times_mixture],
                   merges_particles=[float(v) for v in r.merge_times_particles],
                   merge_events=[float(v) for v in r.closure.merge_times],
                   merge_gap=float(r.merge_gap),
                   seconds_closure=r.seconds_closure, seconds_particles=r.seconds_particles)
        summary.append(row)
        lines.append(f"| {r.name} | {row['status']} | {row['bw0']:.3f} | {row['bw_max']:.3f} | "
                     f"{row['bw_end']:.3f} | {row['w2']:.3f} | {row['floor']:.3f} | "
                     f"{row['clusters_mixture'][0]} -> {row['clusters_mixture'][1]} | "
                     f"{row['clusters_particles'][0]} -> {row['clusters_particles'][1]} | "
                     f"{_fmt_times(row['merges_mixture'])} | "
                     f"{_fmt_times(row['merges_particles'])} | {row['merge_gap']:.2f} | "
                     f"{r.seconds_closure:.2f} | {r.seconds_particles:.2f} |")
    # growth of the error over its Monte Carlo start, by group: not a closure error
    lines += ["", "## Growth of the error over its starting Monte Carlo level", "",
              "Ratio max bw / bw(0), median and maximum over the cases of each group. This is "
              "*not* a measure of the closure's error: bw(0) is the sample's Monte Carlo "
              "offset from the true starting mixture, which the flow carries and can amplify "
              "(with softmax and V = I the cloud moves and stretches exponentially); for an "
              "exact closure (one Gaussian, the same softmax attention) the ratio is as large "
              "or larger. Where the closure can be trusted is measured by its bias, separated "
              "from Monte Carlo, in `trust.md` (`gaussian-pde clusters --trust`, "
              "`gaussian_pde.studies._trust`).",
              "", "| group | cases | median ratio | max ratio | median merge gap |",
              "|---|---|---|---|---|"]
    groups = {}
    for r, row in zip(runs, summary):
        K, d, config, kind, value = r.name.split("-")
        for key in (f"attention {kind}", f"values {value[1:]}", f"dimension {d}",
                    f"start {config}", f"components {K[1:]}"):
            groups.setdefault(key, []).append(row)
    for key in sorted(groups):
        rows = groups[key]
        ratio = np.array([q["bw_max"] / q["bw0"] for q in rows])
        gap = np.array([q["merge_gap"] for q in rows])
        lines.append(f"| {key} | {len(rows)} | {np.median(ratio):.2f} | {ratio.max():.2f} | "
                     f"{np.median(gap):.2f} |")
    scal = None
    if scaling is not None:
        lines += ["", "## Where the closure is exact: error against n", "",
                  f"One component, {SCALING_CASE['kind']} attention (Gaussian-preserving: the "
                  f"closure is the exact moment ODE), d = {scaling.closure_means.shape[1]}, to t = "
                  f"{SCALING_CASE['t_end']}; particles by RK4; runs per n "
                  f"{scaling.n_seeds.tolist()}. RMS over runs of the moment errors; slope of "
                  f"log RMS against log n with a 95% bootstrap interval (runs resampled at "
                  f"each n). A closure wrong by a constant 0.05 in its mean is shown against "
                  f"the same particles.", "",
                  "| n | runs | mean | cov | bw | bw, closure mean + 0.05 |",
                  "|---|---|---|---|---|---|"]
        fits = {m: scaling.fit(m) for m in ("mean", "cov", "bw")}
        wrong = scaling.fit("bw", ref_means=scaling.closure_means + 0.05)
        for i, (n_, S_) in enumerate(zip(scaling.ns, scaling.n_seeds)):
            lines.append(f"| {n_} | {S_} | {fits['mean'][2][i]:.4f} | {fits['cov'][2][i]:.4f} | "
                         f"{fits['bw'][2][i]:.4f} | {wrong[2][i]:.4f} |")
        lines.append("")
        for m in ("mean", "cov", "bw"):
            sl, ci, _ = fits[m]
            lines.append(f"- slope ({m}): **{sl:.3f}**, 95% interval [{ci[0]:.3f}, {ci[1]:.3f}]")
        lines.append(f"- slope (bw, wrong closure): {wrong[0]:.3f}, interval "
                     f"[{wrong[1][0]:.3f}, {wrong[1][1]:.3f}]")
        scal = {m: dict(slope=fits[m][0], interval=list(fits[m][1]),
                        rms=[float(v) for v in fits[m][2]]) for m in fits}
        scal.update(n=[int(v) for v in scaling.ns], runs=[int(v) for v in scaling.n_seeds],
                    wrong_closure=dict(slope=wrong[0], interval=list(wrong[1])),
                    seconds=scaling.seconds)
    seconds = result.get("seconds")
    if seconds is not None:
        lines += ["", f"Run time of the study: {seconds:.0f} s."]
    lines += ["", "Figures: " + ", ".join(f"`{f}`" for f in figures) + "."]
    return lines, summary, scal, seconds
