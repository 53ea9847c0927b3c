r"""Gaussian-mixture closure of the Transformer PDE: many clusters of tokens.

The token distribution is a mixture

.. math:: \mu = \sum_{k=1}^K w_k\,\mathcal N(\alpha_k, \Sigma_k),\qquad w_k > 0,\ \sum_k w_k = 1,

with weights constant in time (the continuity equation transports mass; each component
is followed along the flow). For softmax and L2 attention, and sums of such heads, the
velocity against a mixture is in closed form. A head's score is quadratic in the key
token (docs/math.md 3.2),

.. math:: s(x, y) = -\tfrac12 y^THy + y^T h(x) + r(x),\qquad h(x) = Ax + g,

(softmax: :math:`H = 0`, :math:`A = cK^TQ`; L2: :math:`H = 2cK^TK`, :math:`A = 2cK^TQ`,
:math:`r(x) = -c|Qx|^2`; :math:`g = 0` for both; a query bias :math:`q` gives
:math:`g = cK^Tq`, which tilts each component,
:math:`e^{g^Ty}\mathcal N(y;\alpha_k,\Sigma_k) = e^{g^T\alpha_k + g^T\Sigma_kg/2}
\mathcal N(y;\alpha_k + \Sigma_kg,\Sigma_k)`, so the formulas below with :math:`g = 0`
serve on the tilted weights and means: ``QuadraticScore.tilt``). A head without a
quadratic score may give its field against a mixture itself
(``Attention.mixture_field``: linear attention, whose field sees only the mixture's
second moment). Per component, with
:math:`P_k = I + \Sigma_kH`, the tilted mean and the log of the Gaussian integral
:math:`Z_k(x) = \mathbb E_{y\sim\mathcal N(\alpha_k,\Sigma_k)}[e^{s(x,y)}]` are

.. math::

    m_k(x) = P_k^{-1}\big(\alpha_k + \Sigma_k h(x)\big),\qquad
    \log Z_k(x) = r(x) - \tfrac12\log\det P_k + \tfrac12\big(m_k(x) + \alpha_k\big)^Th(x)
                  - \tfrac12\,\alpha_k^THm_k(x),

neither of which inverts :math:`\Sigma_k` (singular components are fine; ``derivations/
mixture.py`` derives both with SymPy and checks them by direct integration). The field is

.. math::

    \Gamma(x) = V\,\frac{\sum_k w_kZ_k(x)\,m_k(x)}{\sum_k w_kZ_k(x)}
              = V\sum_k \pi_k(x)\,m_k(x),\qquad
    \pi_k(x) = \operatorname{softmax}_k\big(\log w_k + \log Z_k(x)\big),

computed in the log domain; :math:`r(x)` is common to all components and cancels.

**Closure.** Each component follows the Gaussian closure of docs/math.md 6 in factor form,

.. math::

    \alpha_k' = \mathbb E_k[\Gamma(X)],\qquad
    L_k' = \mathbb E\big[\Gamma(\alpha_k + L_kz)\,z^T\big],\qquad \Sigma_k = L_kL_k^T,

with the tensor Gauss-Hermite rule (``n_per_dim`` nodes per dimension), vectorised over
components and nodes. With one component :math:`\Gamma = Vm_1` is affine and this is the
exact moment ODE of :func:`gaussian_pde.solve`. The closure is exact whenever the field
is affine on every component, e.g. weak attention (:math:`\pi_k \approx w_k`); otherwise
its error against particles is measured (:mod:`gaussian_pde.studies._clusters`).

**Events.** :func:`solve_mixture` runs the compiled engine
(:func:`gaussian_pde.integrate._compiled_engine.integrate_one`, the field of
:mod:`._mixture_field`) or the event loop
:func:`gaussian_pde.integrate._event_loop.integrate_system`, both with the mixture's *total*
covariance
:math:`\Sigma_{\mathrm{tot}} = \sum_k w_k(\Sigma_k + \alpha_k\alpha_k^T) - \bar\alpha\bar\alpha^T`
(:math:`\bar\alpha = \sum_k w_k\alpha_k`), so blow-up, steady state and rank collapse mean
what they mean for :func:`gaussian_pde.solve`; a *merge* event (``merge_tol``) records
each time the number of single-linkage clusters of the components, under the
Bures-Wasserstein distance, drops (on the engine, the field kernel's own events:
:func:`._mixture_field._merge_gaps`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.integrate import BDF, LSODA, Radau

from .._common.gaussian import bures_wasserstein
from .._common.linalg import psd_sqrt
from .._common.validation import (
    validate_allocation,
    validate_array,
    validate_covariance,
    validate_flag,
    validate_int,
    validate_positive,
    validate_quadrature,
    validate_seed,
)
from ..attention import quadratic_heads
from ..integrate import (
    METHODS,
    Status,
    integrate_covariance_state,
    integrate_system,
    rank_first,
    run_options,
)
from . import _mixture_field
from ._engine import DEFAULT_N_PER_DIM, standard_nodes
from ._mixture_kernel import softmax_average

__all__ = [
    "GaussianMixture",
    "MixtureSolution",
    "solve_mixture",
    "mixture_velocity",
    "mixture_closure_terms",
    "component_terms",
    "component_log_partition",
    "pairwise_bures_wasserstein",
    "merge_heights",
]


# --------------------------------------------------------------------------------------
# the state


class GaussianMixture:
    r"""A mixture of Gaussians :math:`\mu = \sum_k w_k\,\mathcal N(\alpha_k, \Sigma_k)`.

    Parameters
    ----------
    weights : array_like, shape (K,)
        Positive, summing to one (to ``1e-10``; then normalised exactly).
    means : array_like, shape (K, d)
        Component means :math:`\alpha_k`.
    covs : array_like, shape (K, d, d)
        Component covariances :math:`\Sigma_k`, symmetric positive semi-definite (any rank).

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> mix = gp.GaussianMixture([0.5, 0.5], [[-2.0, 0.0], [2.0, 0.0]], [np.eye(2)] * 2)
    >>> mix.K, mix.d, mix.total_mean.tolist()
    (2, 2, [0.0, 0.0])
    """

    def __init__(self, weights, means, covs):
        w = validate_array(weights, "weights", ndim=1)
        if w.size == 0:
            raise ValueError("`weights` must hold at least one component.")
        if np.any(w <= 0):
            raise ValueError(f"`weights` must be positive, got {w.tolist()}.")
        if abs(w.sum() - 1.0) > 1e-10:
            raise ValueError(f"`weights` must sum to 1, got a sum of {w.sum()!r}.")
        means = validate_array(means, "means", ndim=2)
        if means.shape[0] != w.size:
            raise ValueError(f"`means` must have shape ({w.size}, d) to match the {w.size} "
                             f"weights, got {means.shape}.")
        if means.shape[1] == 0:
            raise ValueError("`means` must have at least one coordinate (d >= 1).")
        d = means.shape[1]
        covs = validate_array(covs, "covs", ndim=3)
        if covs.shape != (w.size, d, d):
            raise ValueError(f"`covs` must have shape ({w.size}, {d}, {d}) to match `weights` "
                             f"and `means`, got {covs.shape}.")
        covs = validate_covariance(covs, "covs", d=d, batch=True)
        self.weights = w / w.sum()
        self.means = means
        self.covs = covs
        for a in (self.weights, self.means, self.covs):
            a.setflags(write=False)

    @property
    def K(self) -> int:
        """Number of components."""
        return self.weights.size

    @property
    def d(self) -> int:
        """Token dimension."""
        return self.means.shape[1]

    @property
    def total_mean(self):
        r""":math:`\bar\alpha = \sum_k w_k\alpha_k`."""
        return self.weights @ self.means

    @property
    def total_cov(self):
        r""":math:`\sum_k w_k(\Sigma_k + \alpha_k\alpha_k^T) - \bar\alpha\bar\alpha^T`."""
        return _total_cov(self.weights, self.means, self.covs)

    def factors(self):
        r"""Principal square roots :math:`L_k = \Sigma_k^{1/2}`, shape (K, d, d)."""
        return psd_sqrt(self.covs)

    def counts(self, n):
        """Stratified component sizes for ``n`` tokens (largest remainder of ``n w_k``)."""
        n = validate_int(n, "n", minimum=self.K)
        raw = n * self.weights
        c = np.floor(raw).astype(int)
        rest = n - c.sum()
        c[np.argsort(-(raw - c), kind="stable")[:rest]] += 1
        return c

    def sample(self, n, *, seed=None, stratified=True):
        r"""Draw ``n`` tokens and their component labels.

        Parameters
        ----------
        n : int
            Number of tokens (at least ``K`` when ``stratified``).
        seed : int, sequence of int, numpy.random.Generator or None
            The same seed gives the same tokens.
        stratified : bool
            Component sizes fixed at the largest-remainder rounding of :math:`nw_k`
            (:meth:`counts`; removes the multinomial noise of the weights), else
            multinomial.

        Returns
        -------
        x : ndarray, shape (n, d)
            :math:`x_i = \alpha_{\ell_i} + \Sigma_{\ell_i}^{1/2}z_i`.
        labels : ndarray of int, shape (n,)
            The component :math:`\ell_i` of each token (sorted when ``stratified``).
        """
        stratified = validate_flag(stratified, "stratified")
        n = validate_int(n, "n", minimum=self.K if stratified else 1)
        # tokens, normal draws and the means gathered per token (n x d each), labels (n)
        validate_allocation(n * (3 * self.d + 1), "n")
        rng = validate_seed(seed)
        if stratified:
            counts = self.counts(n)
            labels = np.repeat(np.arange(self.K), counts)
        else:
            labels = np.sort(rng.choice(self.K, size=n, p=self.weights))
            counts = np.bincount(labels, minlength=self.K)
        z = rng.standard_normal((labels.size, self.d))
        L = self.factors()
        x = self.means[labels]
        stop = np.cumsum(counts)
        for k, (a, b) in enumerate(zip(stop - counts, stop)):   # labels are sorted
            x[a:b] += z[a:b] @ L[k].T
        return x, labels

    def component(self, k):
        """``(mean, cov)`` of component ``k`` (an integer, ``-K <= k < K``)."""
        k = validate_int(k, "k")
        if not -self.K <= k < self.K:
            raise ValueError(f"`k` must be a component index in [-{self.K}, {self.K}), got {k}.")
        return self.means[k].copy(), self.covs[k].copy()

    def __repr__(self):
        return f"GaussianMixture(K={self.K}, d={self.d})"


def _total_cov(w, means, covs):
    mbar = w @ means
    second = np.einsum("k,kij->ij", w, covs) + np.einsum("k,ki,kj->ij", w, means, means)
    return second - np.outer(mbar, mbar)


# --------------------------------------------------------------------------------------
# the velocity against a mixture

#: entries of the (components, points) logit block evaluated at once (32 MB of float64)
_CHUNK_ENTRIES = 1 << 22
#: from this many (point, component) pairs on, the compiled row-by-row softmax
#: (:mod:`gaussian_pde.closure._mixture_kernel`, about twice as fast and O(N + K) memory)
_COMPILED_PAIRS = 1 << 18


def component_terms(A, H, means, covs):
    r"""Per-component terms of one head: :math:`m_k(x) = c_k + B_kx` and :math:`\log\det P_k`.

    With :math:`P_k = I + \Sigma_kH`: :math:`c_k = P_k^{-1}\alpha_k`,
    :math:`B_k = P_k^{-1}\Sigma_kA` (``H = None`` means :math:`H = 0`, :math:`P_k = I`).

    Returns
    -------
    c : ndarray, shape (K, d)
    B : ndarray, shape (K, d, d)
    logdet : ndarray, shape (K,)
    """
    if H is None:
        return means, covs @ A, np.zeros(means.shape[0])
    d = means.shape[1]
    P = np.eye(d) + covs @ H
    sign, logdet = np.linalg.slogdet(P)
    rhs = np.concatenate([means[:, :, None], covs @ A], axis=2)   # (K, d, 1 + d)
    try:
        sol = np.linalg.solve(P, rhs)
    except np.linalg.LinAlgError:
        # a singular P_k (a trial state past a blow-up): no field there, the integrator
        # sees a state that is not finite and treats it as such
        sol = np.full(rhs.shape, np.nan)
        logdet = np.full(means.shape[0], np.nan)
    return sol[:, :, 0], sol[:, :, 1:], logdet


def component_log_partition(A, H, means, covs, X):
    r"""Per component and point: :math:`\log Z_k(x) - r(x)` and the tilted mean :math:`m_k(x)`.

    .. math::

        m_k(x) = P_k^{-1}(\alpha_k + \Sigma_kAx),\qquad
        \log Z_k(x) - r(x) = -\tfrac12\log\det P_k + \tfrac12(m_k(x) + \alpha_k)^TAx
                            - \tfrac12\alpha_k^THm_k(x),

    :math:`P_k = I + \Sigma_kH` (``H = None``: :math:`H = 0`); the score is
    :math:`-\tfrac12y^THy + y^TAx + r(x)` (``derivations/mixture.py``).

    Parameters
    ----------
    A : ndarray, shape (d, d)
        Bilinear coupling of the score.
    H : ndarray, shape (d, d), or None
        Hessian of minus the score in ``y``.
    means : ndarray, shape (K, d)
        Component means.
    covs : ndarray, shape (K, d, d)
        Component covariances.
    X : ndarray, shape (N, d)
        Query tokens.

    Returns
    -------
    log_z : ndarray, shape (K, N)
    m : ndarray, shape (K, N, d)
    """
    c, B, logdet = component_terms(A, H, means, covs)
    m = c[:, None, :] + X @ np.swapaxes(B, 1, 2)                 # (K, N, d)
    u = X @ A.T                                                  # h(x) = A x
    log_z = -0.5 * logdet[:, None] + 0.5 * np.sum((m + means[:, None, :]) * u, axis=2)
    if H is not None:
        log_z -= 0.5 * np.sum((means @ H)[:, None, :] * m, axis=2)
    return log_z, m


def _head_velocity(head, logw, means, covs, X):
    r"""One head's :math:`V\sum_k\pi_k(x)m_k(x)` at points ``X`` (N, d).

    :math:`\log Z_k(x) - r(x)` is a quadratic polynomial in :math:`x` and :math:`m_k(x)`
    is affine, so both are evaluated as products of the features
    :math:`(1, x, x\otimes x)` with per-component coefficients (:math:`O(K)` small
    matrices, then two matrix products over all points), never forming the
    ``(K, N, d)`` array of tilted means:

    .. math::

        \log Z_k(x) - r(x) = a_k + b_k^Tx + x^TM_kx,\qquad
        \sum_k\pi_km_k(x) = \sum_k\pi_kc_k + \Big(\sum_k\pi_kB_k\Big)x,

    :math:`a_k = -\frac12\log\det P_k - \frac12\alpha_k^THc_k`,
    :math:`b_k = \frac12A^T(c_k + \alpha_k) - \frac12B_k^TH\alpha_k`,
    :math:`M_k = \frac12B_k^TA` (:func:`component_log_partition`, expanded).

    Cost per point and component: one row of two matrix products of widths
    :math:`1 + d + d^2` and :math:`d + d^2`, and one exponential, so
    :math:`O(NKd^2)` for ``N`` points; the points go in blocks of
    ``_CHUNK_ENTRIES / K`` so the ``(K, block)`` logits stay in a few MB, whatever ``N``;
    from ``_COMPILED_PAIRS`` pairs on the compiled row-by-row softmax
    (:func:`~gaussian_pde.closure._mixture_kernel.softmax_average`) needs no such block.
    """
    logw, means = head.tilt(logw, means, covs)     # a linear term g^T y of the score
    A, H = head.A, head.H
    c, B, logdet = component_terms(A, H, means, covs)
    K, d = means.shape
    a = -0.5 * logdet
    b = 0.5 * (c + means) @ A                                    # rows: A^T (c_k + alpha_k)
    if H is not None:
        Ha = means @ H                                           # rows: alpha_k^T H
        a = a - 0.5 * np.sum(Ha * c, axis=1)
        b = b - 0.5 * np.einsum("kji,kj->ki", B, Ha)
    M = 0.5 * np.swapaxes(B, 1, 2) @ A                           # (K, d, d)
    # logit = [1, x, x (x) x] @ coef, and sum_k pi_k [c_k, B_k] = pi @ out: two GEMMs
    # logit = coef @ [1, x, x (x) x], and sum_k pi_k [c_k, B_k] = out @ pi: two GEMMs
    coef = np.concatenate([(logw + a)[:, None], b, M.reshape(K, d * d)], axis=1)  # (K, F)
    out = np.concatenate([c, B.reshape(K, d * d)], axis=1)                      # (K, R)
    N = X.shape[0]
    if N * K >= _COMPILED_PAIRS:
        feat = np.concatenate([np.ones((N, 1)), X, (X[:, :, None] * X[:, None, :])
                               .reshape(N, d * d)], axis=1)
        if np.all(np.isfinite(feat)) and np.all(np.isfinite(coef)):
            r = softmax_average(feat, np.ascontiguousarray(coef), np.ascontiguousarray(out))
            mbar = r[:, :d] + np.einsum("nij,nj->ni", r[:, d:].reshape(N, d, d), X)
            return mbar @ head.V.T
    mbar = np.empty((N, d))
    rows = max(1, _CHUNK_ENTRIES // K)      # points per block: K x P logits stay small
    for lo in range(0, N, rows):
        x = X[lo:lo + rows]
        feat = np.concatenate([np.ones((1, x.shape[0])), x.T,
                               (x.T[:, None, :] * x.T[None, :, :]).reshape(d * d, -1)])
        pi = coef @ feat                                         # (K, P)
        pi -= pi.max(axis=0)                                     # log-domain softmax over k
        np.exp(pi, out=pi)
        r = (out.T @ pi) / pi.sum(axis=0)                        # (d + d^2, P)
        mbar[lo:lo + rows] = (r[:d] + np.einsum("ijn,jn->in", r[d:].reshape(d, d, -1),
                                                x.T)).T
    return mbar @ head.V.T


def _velocity(heads, logw, means, covs, X):
    """The sum of the heads' fields against the mixture at ``X``.

    Each head (of ``quadratic_heads(attention, fields=True)``) is a quadratic score, whose
    closed form is :func:`_head_velocity`, or a head with its own ``mixture_field``.
    """
    out = None
    for h in heads:
        own = getattr(h, "mixture_field", None)
        v = own(logw, means, covs, X) if own is not None else _head_velocity(h, logw, means,
                                                                              covs, X)
        out = v if out is None else out + v
    return out


def mixture_velocity(attention, mixture, x):
    r"""The mean-field velocity :math:`\Gamma[\mu](x)` against a Gaussian mixture.

    .. math:: \Gamma(x) = \sum_{\text{heads}} V\sum_k\pi_k(x)\,m_k(x),\qquad
              \pi_k(x) \propto w_kZ_k(x),

    in the log domain (module docstring for :math:`m_k` and :math:`\log Z_k`).

    Parameters
    ----------
    attention : Softmax, L2 or MultiHead of them
        The attention.
    mixture : GaussianMixture
        The token distribution.
    x : array_like, shape (n, d)
        Query tokens.

    Returns
    -------
    ndarray, shape (n, d)
    """
    heads = quadratic_heads(attention, fields=True)
    mixture = _validate_mixture(mixture, attention.d)
    x = validate_array(x, "x", ndim=2)
    if x.shape[1] != mixture.d:
        raise ValueError(f"`x` must have shape (n, {mixture.d}), got {x.shape}.")
    with np.errstate(all="ignore"):
        v = _velocity(heads, np.log(mixture.weights), mixture.means, mixture.covs, x)
    if not np.all(np.isfinite(v)):
        raise ValueError("`x` (or `mixture`) is too large: the scores overflow float64 and "
                         f"the velocity is not finite (largest |x| {np.max(np.abs(x)):.3g}); "
                         "rescale the tokens or the mixture.")
    return v


def _closure(heads, logw, means, L, Z, W):
    r"""``(alpha', L')`` of every component, (K, d) and (K, d, d).

    A point mass (:math:`L_k = 0`) keeps :math:`L_k' = \mathbb E[\Gamma(\alpha_k)z^T] = 0`
    exactly and moves with :math:`\alpha_k' = \Gamma(\alpha_k)`: its field is evaluated at
    its mean alone, not summed over nodes whose weights add up to 1 only to rounding.
    """
    K, d = means.shape
    covs = L @ np.swapaxes(L, 1, 2)
    point = ~np.any(L.reshape(K, -1) != 0, axis=1)
    spread = ~point
    X = means[spread][:, None, :] + Z @ np.swapaxes(L[spread], 1, 2)   # (K_s, N, d)
    n = X.shape[0] * X.shape[1]
    G = _velocity(heads, logw, means, covs, np.concatenate([X.reshape(-1, d), means[point]]))
    Gs = G[:n].reshape(X.shape)
    dm = np.empty((K, d))
    dL = np.zeros((K, d, d))
    dm[spread] = W @ Gs
    dL[spread] = np.swapaxes(Gs, 1, 2) @ (W[:, None] * Z)
    dm[point] = G[n:]
    return dm, dL


def mixture_closure_terms(attention, mixture, n_per_dim=DEFAULT_N_PER_DIM):
    r"""Closure right-hand side of every component in factor form.

    .. math:: \alpha_k' = \mathbb E[\Gamma(\alpha_k + L_kz)],\qquad
              L_k' = \mathbb E[\Gamma(\alpha_k + L_kz)\,z^T],\qquad L_k = \Sigma_k^{1/2},

    by the tensor Gauss-Hermite rule with ``n_per_dim`` nodes per dimension.

    Returns
    -------
    dmeans : ndarray, shape (K, d)
    dL : ndarray, shape (K, d, d)
    dcovs : ndarray, shape (K, d, d)
        :math:`\Sigma_k' = L_kL_k'^T + L_k'L_k^T` (independent of the factor).
    """
    heads = quadratic_heads(attention, fields=True)
    mixture = _validate_mixture(mixture, attention.d)
    n_per_dim = validate_quadrature(n_per_dim, "n_per_dim", d=mixture.d)
    Z, W = standard_nodes(mixture.d, n_per_dim)
    L = mixture.factors()
    dm, dL = _closure(heads, np.log(mixture.weights), mixture.means, L, Z, W)
    C = L @ np.swapaxes(dL, 1, 2)
    return dm, dL, C + np.swapaxes(C, 1, 2)


def _validate_mixture(mixture, d):
    if not isinstance(mixture, GaussianMixture):
        raise TypeError(f"`mixture` must be a GaussianMixture, got {type(mixture).__name__}.")
    if mixture.d != d:
        raise ValueError(f"`mixture` has dimension d = {mixture.d}, the attention d = {d}.")
    return mixture


# --------------------------------------------------------------------------------------
# merging: single linkage on the Bures-Wasserstein distances


def pairwise_bures_wasserstein(means, covs):
    r"""Bures-Wasserstein distances between all pairs of components.

    Parameters
    ----------
    means : array_like, shape (..., K, d)
        Component means.
    covs : array_like, shape (..., K, d, d)
        Component covariances.

    Returns
    -------
    ndarray, shape (..., K, K)
        Symmetric, zero diagonal.
    """
    means = np.asarray(means, float)
    covs = np.asarray(covs, float)
    K = means.shape[-2]
    i, j = np.triu_indices(K, 1)
    out = np.zeros(means.shape[:-2] + (K, K))
    if i.size:
        dist = bures_wasserstein(means[..., i, :], covs[..., i, :, :],
                                 means[..., j, :], covs[..., j, :, :])
        out[..., i, j] = dist
        out[..., j, i] = dist
    return out


def merge_heights(dist):
    r"""Single-linkage merge heights (minimum-spanning-tree edges), ascending.

    With the distance matrix ``dist`` (K, K), the number of clusters at tolerance
    :math:`\tau` (components joined when a chain of pairs each within :math:`\tau`
    links them) is :math:`1 + \#\{\text{heights} > \tau\}`. The sorted heights are
    continuous in the distances, which makes them usable as event functions.

    Returns
    -------
    ndarray, shape (K - 1,)
    """
    dist = np.asarray(dist, float)
    K = dist.shape[0]
    if K < 2:
        return np.empty(0)
    # Prim's algorithm on a dense graph
    inside = np.zeros(K, bool)
    inside[0] = True
    best = dist[0].copy()
    heights = []
    for _ in range(K - 1):
        cand = np.where(inside, np.inf, best)
        j = int(np.argmin(cand))
        heights.append(cand[j])
        inside[j] = True
        best = np.minimum(best, dist[j])
    return np.sort(np.asarray(heights))


# --------------------------------------------------------------------------------------
# the solver


class _MixtureSystem:
    r"""The state ``(alpha_1..alpha_K, L_1..L_K)`` for :func:`integrate_system`.

    ``trace``, ``cov_and_rate`` and ``mean_and_cov`` give the mixture's total covariance
    :math:`\Sigma_{\mathrm{tot}}` and its rate
    :math:`\sum_k w_k(\Sigma_k' + \alpha_k'\alpha_k^T + \alpha_k\alpha_k'^T)
    - \bar\alpha'\bar\alpha^T - \bar\alpha\bar\alpha'^T`, so the package's events act
    on the whole token distribution.
    """

    def __init__(self, heads, weights, d, n_per_dim):
        self.heads, self.w, self.d = heads, weights, d
        self.K = weights.size
        self.logw = np.log(weights)
        self.Z, self.W = standard_nodes(d, n_per_dim)
        self.nfev = 0
        self.last_y = None
        self._merge_cache = (None, None)

    def split(self, y):
        """``(means (..., K, d), L (..., K, d, d))`` of a state or a stack of states."""
        y = np.asarray(y)
        K, d = self.K, self.d
        lead = y.shape[:-1]
        return (y[..., :K * d].reshape(lead + (K, d)),
                y[..., K * d:].reshape(lead + (K, d, d)))

    def pack(self, means, L):
        return np.concatenate([np.ravel(means), np.ravel(L)])

    def rates(self, y):
        means, L = self.split(y)
        return means, L, *_closure(self.heads, self.logw, means, L, self.Z, self.W)

    def fun(self, t, y):
        self.nfev += 1
        _, _, dm, dL = self.rates(y)
        return self.pack(dm, dL)

    __call__ = fun

    def jacobian(self, t, y):
        r"""Forward-difference Jacobian of :meth:`fun` (``n`` evaluations, counted).

        For the implicit methods' Newton iterations (LSODA's, of ``method="auto"``, too);
        steps :math:`\sqrt{\epsilon}\max(1, |y_i|)`.
        """
        y = np.asarray(y, dtype=float)
        f0 = self.fun(t, y)
        J = np.empty((f0.size, y.size))
        for i in range(y.size):
            h = 1.49e-8 * max(1.0, abs(y[i]))
            yi = y.copy()
            yi[i] += h
            J[:, i] = (self.fun(t, yi) - f0) / h
        return J

    def trace(self, y):
        means, L = self.split(y)
        mbar = self.w @ means
        return float(self.w @ (np.sum(L * L, axis=(1, 2)) + np.sum(means * means, axis=1))
                     - mbar @ mbar)

    def cov_and_rate(self, y):
        means, L, dm, dL = self.rates(y)
        w = self.w
        covs = L @ np.swapaxes(L, 1, 2)
        C = L @ np.swapaxes(dL, 1, 2)
        dcovs = C + np.swapaxes(C, 1, 2)
        mbar, dmbar = w @ means, w @ dm
        cross = np.einsum("k,ki,kj->ij", w, dm, means)
        rate = (np.einsum("k,kij->ij", w, dcovs) + cross + cross.T
                - np.outer(dmbar, mbar) - np.outer(mbar, dmbar))
        return _total_cov(w, means, covs), rate

    def mean_and_cov(self, y):
        self.last_y = y   # read by the merge events, which the loop calls right after
        means, L = self.split(y)
        return self.w @ means, _total_cov(self.w, means, L @ np.swapaxes(L, 1, 2))

    def heights(self, y):
        key = y.tobytes()
        if self._merge_cache[0] != key:
            means, L = self.split(y)
            dist = pairwise_bures_wasserstein(means, L @ np.swapaxes(L, 1, 2))
            self._merge_cache = (key, merge_heights(dist))
        return self._merge_cache[1]


def _merge_events(system, tol, terminal):
    """One event per single-linkage merge height, all named ``"merge"``."""
    evs = []
    for j in range(system.K - 1):
        def merge(t, mean, cov, j=j):
            return float(system.heights(system.last_y)[j] - tol)

        merge.terminal = terminal
        merge.direction = -1.0
        merge.__name__ = "merge"
        evs.append(merge)
    return evs


@dataclasses.dataclass(frozen=True)
class MixtureSolution:
    r"""Result of :func:`solve_mixture`.

    Attributes
    ----------
    t : ndarray, shape (T,)
        Output times.
    weights : ndarray, shape (K,)
        Component weights (constant in time).
    means : ndarray, shape (T, K, d)
        Component means.
    covs : ndarray, shape (T, K, d, d)
        Component covariances, symmetric PSD, each with the rank it started with.
    factors : ndarray, shape (T, K, d, d)
        ``covs = factors @ factors^T``.
    status : Status
        As for :func:`gaussian_pde.solve`, the events acting on the total covariance;
        ``"event"`` when a terminal merge (``stop_at_merge``) or user event fired.
    message : str
    t_blowup : float or None
        Blow-up time of the total covariance, when confirmed.
    t_final : float
        Where the integration stopped.
    means_final, covs_final : ndarray
        The state there, (K, d) and (K, d, d).
    t_events : dict
        Event times by name; ``"merge"`` (sorted) holds the times at which the number of
        single-linkage clusters under ``merge_tol`` dropped (once per lost cluster).
    nfev : int
        Right-hand-side evaluations.
    merge_tol : float or None
        The tolerance of the merge events.
    """

    t: np.ndarray
    weights: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    factors: np.ndarray
    status: Status
    message: str
    t_blowup: float | None
    t_final: float
    means_final: np.ndarray
    covs_final: np.ndarray
    t_events: dict
    nfev: int
    merge_tol: float | None = None

    @property
    def success(self) -> bool:
        """``False`` only when the solver failed."""
        return Status(self.status).success

    @property
    def merge_times(self):
        """Sorted times at which two clusters of components merged (empty without ``merge_tol``)."""
        return np.sort(np.asarray(self.t_events.get("merge", []), float))

    def mixture(self, i=-1):
        """The mixture at output index ``i``."""
        return GaussianMixture(self.weights, self.means[i], self.covs[i])

    @property
    def total_mean(self):
        """Mean of the token distribution, shape (T, d)."""
        return np.einsum("k,tki->ti", self.weights, self.means)

    @property
    def total_cov(self):
        """Covariance of the token distribution, shape (T, d, d)."""
        return np.stack([_total_cov(self.weights, m, c) for m, c in zip(self.means, self.covs)])


def _distinct(mixture):
    """``(rep, first)``: each component's index among the distinct ones, and their firsts."""
    seen, rep = {}, np.empty(mixture.K, dtype=int)
    for k in range(mixture.K):
        key = (mixture.means[k].tobytes(), mixture.covs[k].tobytes())
        rep[k] = seen.setdefault(key, len(seen))
    first = np.unique(rep, return_index=True)[1]
    return rep, first


def _solve_gaussian(attention, mixture, t_span, *, merge_tol, stop_at_merge, **options):
    """One component: :func:`gaussian_pde.solve` on its mean and covariance."""
    from ..integrate import solve

    if not isinstance(stop_at_merge, (bool, np.bool_)):
        raise TypeError(f"`stop_at_merge` must be a bool, got {type(stop_at_merge).__name__}.")
    if merge_tol is not None:
        merge_tol = validate_positive(merge_tol, "merge_tol")
    sol = solve(attention, mixture.means[0], mixture.covs[0], t_span, **options)
    t_events = dict(sol.t_events)
    if merge_tol is not None:
        t_events["merge"] = np.empty(0)     # one component: nothing to merge
    return MixtureSolution(
        t=sol.t, weights=mixture.weights.copy(), means=sol.mean[:, None].copy(),
        covs=sol.cov[:, None].copy(), factors=sol.factor[:, None].copy(),
        status=sol.status, message=sol.message, t_blowup=sol.t_blowup, t_final=sol.t_final,
        means_final=sol.mean_final[None].copy(), covs_final=sol.cov_final[None].copy(),
        t_events=t_events, nfev=sol.nfev, merge_tol=merge_tol)


#: largest state (K (d + d^2) unknowns) given a finite-difference Jacobian for the
#: implicit methods (LSODA, ``method="auto"``); above it they take their own differences
_FD_JACOBIAN_MAX = 240
#: evaluations a run takes at the least (DOP853's first step guess and step)
_MIN_EVALUATIONS = 14
#: runs estimated to take longer than this (seconds) say so when they start
_ANNOUNCE_S = 60.0
#: runs estimated to take longer than this (seconds) even at the least are refused
_REFUSE_S = 1800.0
#: dense (N, N) arrays an implicit method holds at the least, N = K (d + d^2) unknowns
#: (complex ones count twice): BDF its identity, Jacobian, iteration matrix and LU
#: factors; Radau the identity, Jacobian, the real LU and the complex matrix and LU;
#: LSODA the Jacobian in its Fortran work array; the engine (``"auto"``) the Jacobian and
#: the LU factors of its RODAS4P2 steps. ``"auto"`` with user events is LSODA.
_JACOBIAN_ARRAYS = ((BDF, 4), (Radau, 7), (LSODA, 1))
#: dense (N, N) arrays the engine holds
_ENGINE_ARRAYS = 2


def _jacobian_arrays(method, engine=False):
    """How many dense Jacobian-sized arrays ``method`` holds (0 for an explicit one)."""
    if isinstance(method, str):
        if method == "auto":
            if engine:
                return _ENGINE_ARRAYS, "the engine (method='auto')"
            return 1, "LSODA (method='auto' on the event loop)"
        method = METHODS[method]
    for cls, count in _JACOBIAN_ARRAYS:
        if issubclass(method, cls):
            return count, f"method {method.__name__}"
    return 0, ""


def _check_size(mixture, system, opts, merge_tol, method, engine=False):
    """Refuse what would not fit in memory or finish in half an hour; announce a long run.

    The time is a pilot: one evaluation of the field on a few components' nodes (after
    an untimed one that compiles the kernel), scaled to all K, times the fewest
    evaluations a run takes.
    """
    import time
    import warnings

    K, d = mixture.K, mixture.d
    n_nodes = system.Z.shape[0]
    n_out = opts.t_eval.size if opts.t_eval is not None else 1
    # per evaluation: the nodes, their field and features (K n^d rows of ~2 + 2d + d^2)
    need = K * n_nodes * (2 + 2 * d + d * d) + 3 * n_out * K * (d + d * d)
    what = f"K = {K} components of {n_nodes} nodes"
    if merge_tol is not None:       # the pairwise distances, their square roots and heights
        need += K * (K - 1) // 2 * (6 * d * d + 4)
        what += " and their K(K-1)/2 pairwise distances (`merge_tol`)"
    count, holder = _jacobian_arrays(method, engine)
    if count:
        n = K * (d + d * d)
        need += count * n * n
        what += (f", where {holder} holds {count} dense {n} x {n} Jacobian-sized "
                 f"array{'s' if count > 1 else ''} ({count * n * n * 8 / 2**30:.3g} GiB; "
                 "method='DOP853' holds none)")
    try:
        validate_allocation(need, "mixture")
    except ValueError:
        raise ValueError(f"`mixture` with {what} needs {need * 8 / 2**30:.3g} GiB of arrays, "
                         "more than half of this machine's memory.") from None
    # time: a pilot evaluation of the field on one component's nodes, scaled to all K
    probe = min(K, max(1, 4096 // n_nodes))
    X = (mixture.means[:probe, None, :]
         + system.Z @ np.swapaxes(mixture.factors()[:probe], 1, 2)).reshape(-1, d)
    with np.errstate(all="ignore"):     # untimed: the first call compiles the kernel
        _velocity(system.heads, system.logw, mixture.means, mixture.covs, X)
    start = time.perf_counter()
    with np.errstate(all="ignore"):
        _velocity(system.heads, system.logw, mixture.means, mixture.covs, X)
    per_eval = (time.perf_counter() - start) * K / probe
    if per_eval * _MIN_EVALUATIONS > _REFUSE_S:
        raise ValueError(f"`mixture` with K = {K} components of {n_nodes} nodes in d = {d} "
                         f"needs about {per_eval:.3g} s per evaluation of the field here, "
                         f"{per_eval * _MIN_EVALUATIONS / 3600:.2g} h or more for a run (at "
                         f"least {_MIN_EVALUATIONS} evaluations), more than "
                         f"{_REFUSE_S / 3600:.2g} h; use fewer components or a coarser "
                         "`n_per_dim`.")
    if per_eval * _MIN_EVALUATIONS > _ANNOUNCE_S:
        warnings.warn(f"solve_mixture: {K} components x {n_nodes} nodes in d = {d}: one "
                      f"evaluation takes about {per_eval:.3g} s here, a run at least "
                      f"{_MIN_EVALUATIONS} of them (about {per_eval * _MIN_EVALUATIONS / 60:.2g}"
                      " min or more).", UserWarning, stacklevel=3)
    return per_eval


def _solve_engine(params, mixture, system, y0, opts, merge_tol, stop_at_merge):
    r"""``method="auto"`` on the compiled engine (``params``: :func:`._mixture_field.pack`).

    The state :math:`(\alpha_1..\alpha_K, L_1..L_K)` as a plain state of
    :func:`gaussian_pde.integrate._compiled_engine.integrate_one`, its field the kernel of
    :mod:`._mixture_field`, which also leaves a factor of the total covariance for the
    events (``CoreOptions.cov_rows``): DOP853 steps, the blow-up look, steady state and
    rank collapse on :math:`\Sigma_{\mathrm{tot}}`, the merge events (``merge_tol``: the
    kernel's values of the merge heights, located on the dense output), the budget,
    overflow, statuses and messages of :func:`gaussian_pde.solve`
    (:func:`gaussian_pde.integrate.integrate_covariance_state`). Returns
    ``(run, nfev, None)``; or, where
    Hairer's stiffness test fires, ``(None, nfev, t)``: the engine stops there (the field
    has no closed-form Jacobian, and RODAS4P2 would take one by central differences,
    :math:`2N` evaluations, at every step) and the caller hands the run to the event
    loop's LSODA, which reuses its Jacobians.
    """
    K, d = mixture.K, mixture.d
    merges = merge_tol is not None
    fields = (*_mixture_field.kernels(), params, _mixture_field.ws_size(d, K, merges))
    ev = opts.events
    first = d if ev.rank_tol is None else int(rank_first(mixture.total_cov, ev.rank_tol))
    tr0 = max(system.trace(y0), np.finfo(float).tiny)
    gaps = (K - 1, bool(stop_at_merge), "merge") if merges else None
    return integrate_covariance_state(fields, y0, (d, K * (d + 1)), tr0, first, opts, gaps)


def solve_mixture(attention, mixture, t_span, *, t_eval=None, n_per_dim=DEFAULT_N_PER_DIM,
                  method="auto", rtol=1e-8, atol=1e-10, blowup_threshold=1e8,
                  steady_tol=None, steady_atol=0.0, rank_tol=None, merge_tol=None,
                  stop_at_merge=False, events=(), max_step=np.inf, first_step=None,
                  max_nfev=50_000):
    r"""Integrate the Gaussian-mixture closure.

    .. math::

        \alpha_k' = \mathbb E[\Gamma(\alpha_k + L_kz)],\qquad
        L_k' = \mathbb E[\Gamma(\alpha_k + L_kz)\,z^T],\qquad
        \Gamma(x) = V\sum_k\pi_k(x)\,m_k(x),

    :math:`z\sim\mathcal N(0, I)`, with the closed-form field of the module docstring and
    the Gauss-Hermite rule; weights constant. The events act on the *total* covariance of
    the mixture. Two or more distinct components run, with ``method="auto"`` and without
    user ``events`` or ``first_step``, on the compiled engine of
    :func:`gaussian_pde.solve` (:func:`~gaussian_pde.integrate._compiled_engine.integrate_one`,
    the field compiled in :mod:`gaussian_pde.closure._mixture_field`, which leaves a factor
    of the total covariance for the events, and the merge heights for the merge events),
    until it turns stiff; every other run on the event loop
    :func:`gaussian_pde.integrate._event_loop.integrate_system` (:func:`scipy.integrate.solve_ivp`).

    Parameters
    ----------
    attention : Softmax, L2 or MultiHead of them
        The attention (TypeError otherwise).
    mixture : GaussianMixture
        The initial mixture.
    t_span : (float, float)
        Interval of integration.
    t_eval : array_like, optional
        Output times within ``t_span``.
    n_per_dim : int
        Gauss-Hermite nodes per dimension (2..40); default 8.
    method : str or OdeSolver subclass
        ``"auto"`` (the default): on the compiled engine of :func:`gaussian_pde.solve`,
        DOP853 steps with Hairer's stiffness test, the events located on the dense
        output; where the test fires, the run is handed to the event loop's LSODA from
        the start (the ``message`` ends with ``"; stiff from t = ... on: LSODA from the
        start ..."``, ``nfev`` counts both): the field has no closed-form Jacobian, and
        RODAS4P2 would take one by central differences, :math:`2K(d + d^2)`
        evaluations, at every step, where LSODA reuses its own. With user ``events``
        or ``first_step``, the event loop's LSODA, which switches between
        Adams and BDF steps itself (a forward-difference Jacobian up to
        ``_FD_JACOBIAN_MAX`` unknowns, its own differences above). Or a
        :func:`scipy.integrate.solve_ivp` method, on the event loop.
    rtol, atol : float
        Tolerances on the entries of the means and factors.
    blowup_threshold, steady_tol, steady_atol, rank_tol
        As in :func:`gaussian_pde.solve`, applied to the total covariance
        :math:`\Sigma_{\mathrm{tot}}`.
    merge_tol : float, optional
        Record merges: with the Bures-Wasserstein distances between the components and
        their single-linkage merge heights :math:`h_1\le\dots\le h_{K-1}`
        (:func:`merge_heights`), the event ``"merge"`` fires whenever some :math:`h_j`
        falls below ``merge_tol``, i.e. whenever the number of clusters
        :math:`1 + \#\{h_j > \text{merge\_tol}\}` drops. Not terminal by default: the
        times of every merge are in ``t_events["merge"]`` and :attr:`MixtureSolution.merge_times`.
        With ``method="auto"`` the engine locates them on its dense output (the field
        kernel gives the heights, :func:`._mixture_field._merge_gaps`); the event loop
        (a named ``method``) by :func:`scipy.integrate.solve_ivp`'s root finding.
    stop_at_merge : bool
        Make the merge event terminal: stop at the first merge with status ``"event"``.
    events : callable or sequence of callables
        User events ``event(t, mean, cov)`` on the total mean and covariance.
    max_step, first_step
        As in :func:`gaussian_pde.solve`.
    max_nfev : int
        Give up (status ``"failed"``) after this many right-hand-side evaluations.

    Returns
    -------
    MixtureSolution

    Notes
    -----
    *Reductions.* Identical components (the same mean and covariance) follow the same
    equation forever, so they are solved once, with their weights added, and copied back:
    two identical components give exactly the result of one. A mixture of one distinct
    component is a Gaussian, whose field is affine: it is solved by
    :func:`gaussian_pde.solve` itself (the same steps, events and
    statuses; ``n_per_dim`` plays no part). A point mass (zero covariance) keeps a zero
    factor exactly and moves with the field at its mean.

    *Cost.* One evaluation of the closure takes :math:`O(K^2 n^d d^2)` operations
    (``K`` components, :math:`n^d` nodes each, every node against every component) and
    :math:`O(Kn^d d)` memory; a run estimated at a minute or more says so when it starts
    (a ``UserWarning`` with the estimate). Merge events need the :math:`K(K-1)/2` pairwise
    distances at every step, and an implicit method
    dense Jacobian-sized arrays of the :math:`N = K(d + d^2)` unknowns (:math:`N^2`
    doubles each: BDF holds at least 4, Radau 7, LSODA 1, the engine of ``"auto"`` 2,
    the scratch of its RODAS4P2 steps, held though a mixture's run hands its stiff
    stretch to LSODA: where they do not fit, ``"auto"`` takes the event loop); a request
    whose memory would
    not fit, or whose fewest evaluations are estimated (by a pilot evaluation) at more
    than half an hour, is refused up front with a ``ValueError`` giving the size.
    """
    heads = quadratic_heads(attention, fields=True)
    mixture = _validate_mixture(mixture, attention.d)
    d = mixture.d
    n_per_dim = validate_quadrature(n_per_dim, "n_per_dim", d=d)
    rep, first = _distinct(mixture)
    if first.size < mixture.K:
        reduced = GaussianMixture(np.bincount(rep, weights=mixture.weights),
                                  mixture.means[first], mixture.covs[first])
        sol = solve_mixture(attention, reduced, t_span, t_eval=t_eval, n_per_dim=n_per_dim,
                            method=method, rtol=rtol, atol=atol,
                            blowup_threshold=blowup_threshold, steady_tol=steady_tol,
                            steady_atol=steady_atol, rank_tol=rank_tol, merge_tol=merge_tol,
                            stop_at_merge=stop_at_merge, events=events, max_step=max_step,
                            first_step=first_step, max_nfev=max_nfev)
        return dataclasses.replace(
            sol, weights=mixture.weights.copy(), means=sol.means[:, rep],
            covs=sol.covs[:, rep], factors=sol.factors[:, rep],
            means_final=sol.means_final[rep], covs_final=sol.covs_final[rep])
    if mixture.K == 1:
        return _solve_gaussian(attention, mixture, t_span, t_eval=t_eval, method=method,
                               rtol=rtol, atol=atol, blowup_threshold=blowup_threshold,
                               steady_tol=steady_tol, steady_atol=steady_atol,
                               rank_tol=rank_tol, merge_tol=merge_tol,
                               stop_at_merge=stop_at_merge, events=events,
                               max_step=max_step, first_step=first_step, max_nfev=max_nfev)
    auto = isinstance(method, str) and method == "auto"
    opts, method, events = run_options(
        t_span, "DOP853" if auto else method, events, t_eval=t_eval, rtol=rtol, atol=atol,
        max_step=max_step, first_step=first_step, max_nfev=max_nfev,
        blowup_threshold=blowup_threshold, steady_tol=steady_tol, steady_atol=steady_atol,
        rank_tol=rank_tol)
    method = "auto" if auto else method
    if not isinstance(stop_at_merge, (bool, np.bool_)):
        raise TypeError(f"`stop_at_merge` must be a bool, got {type(stop_at_merge).__name__}.")
    system = _MixtureSystem(heads, mixture.weights, d, n_per_dim)
    if merge_tol is not None:
        merge_tol = validate_positive(merge_tol, "merge_tol")
    params = (_mixture_field.pack(heads, mixture.weights, system.Z, system.W, merge_tol)
              if auto and not events and opts.first_step is None else None)
    engine = params is not None
    if engine:
        try:
            _check_size(mixture, system, opts, merge_tol, method, engine=True)
        except ValueError:      # the engine's scratch does not fit: the event loop may
            engine = False
    if not engine:
        _check_size(mixture, system, opts, merge_tol, method)
    if merge_tol is not None:
        events = events + tuple(_merge_events(system, merge_tol, bool(stop_at_merge)))
    y0 = system.pack(mixture.means, mixture.factors())
    with np.errstate(all="ignore"):
        f0 = system.rates(y0)[2:]
    if not all(np.all(np.isfinite(f)) for f in f0):
        raise ValueError("`mixture` is too large for the closure: the field at its quadrature "
                         "nodes overflows float64; rescale the data or the weights.")
    run, spent, stiff_at = (_solve_engine(params, mixture, system, y0, opts, merge_tol,
                                          stop_at_merge) if engine else (None, 0, None))
    if run is None:
        jac = system.jacobian if y0.size <= _FD_JACOBIAN_MAX else None
        loop_opts = opts
        if spent and opts.max_nfev is not None:     # the budget left after the engine
            loop_opts = dataclasses.replace(opts, max_nfev=max(opts.max_nfev - spent, 1))
        run = integrate_system(system, y0, loop_opts, method, user_events=events, jac=jac)
        if stiff_at is not None:
            run = dataclasses.replace(
                run, nfev=run.nfev + spent,
                message=run.message + f"; stiff from t = {stiff_at:.6g} on: LSODA from the "
                "start (the engine's DOP853 steps up to there counted in nfev)")
    means, L = system.split(run.y)
    mf, Lf = system.split(run.y_final)
    t_events = dict(run.t_events)
    if "merge" in t_events:
        t_events["merge"] = np.sort(t_events["merge"])
    elif merge_tol is not None:
        t_events["merge"] = np.empty(0)
    return MixtureSolution(
        t=run.t, weights=mixture.weights.copy(), means=means.copy(),
        covs=L @ np.swapaxes(L, -1, -2), factors=L.copy(), status=run.status,
        message=run.message, t_blowup=run.t_blowup, t_final=run.t_final,
        means_final=mf.copy(), covs_final=Lf @ np.swapaxes(Lf, -1, -2), t_events=t_events,
        nfev=run.nfev, merge_tol=merge_tol)
