r"""Distances between Gaussian measures.

The Bures-Wasserstein (Wasserstein-2) distance between Gaussians has a closed form
(Dowson and Landau 1982; Olkin and Pukelsheim 1982; used throughout ``ot.gaussian``):

.. math::

    W_2^2\big(\mathcal N(m_1, \Sigma_1), \mathcal N(m_2, \Sigma_2)\big)
    = |m_1 - m_2|^2 + \operatorname{tr}\Sigma_1 + \operatorname{tr}\Sigma_2
      - 2\operatorname{tr}\big(\Sigma_1^{1/2}\Sigma_2\Sigma_1^{1/2}\big)^{1/2} .
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit, ndtr, ndtri

from .linalg import psd_sqrt
from .validation import validate_array, validate_covariance, validate_flag, validate_tolerance

__all__ = ["bures_wasserstein", "logistic_normal_moments"]


def bures_wasserstein(mean1, cov1, mean2, cov2, squared=False):
    r"""Wasserstein-2 distance between two Gaussian measures (Bures-Wasserstein).

    .. math::

        W_2^2 = |m_1 - m_2|^2 + \operatorname{tr}\Sigma_1 + \operatorname{tr}\Sigma_2
          - 2\operatorname{tr}\big(\Sigma_1^{1/2}\Sigma_2\Sigma_1^{1/2}\big)^{1/2}

    Parameters
    ----------
    mean1, mean2 : array_like, shape (..., d)
        Means; leading axes broadcast (stacks of Gaussians).
    cov1, cov2 : array_like, shape (..., d, d)
        Symmetric positive semi-definite covariances (any rank: the matrix square roots
        are taken by eigendecomposition with rounding-level negative eigenvalues clipped,
        nothing is inverted).
    squared : bool
        Return :math:`W_2^2` instead of :math:`W_2`.

    Returns
    -------
    float or ndarray, shape (...)
        The distance (or its square); rounding-level negative squares are clipped to zero.

    References
    ----------
    D. C. Dowson and B. V. Landau, "The Frechet distance between multivariate normal
    distributions", J. Multivariate Anal. 12 (1982) 450-455.

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> float(gp.bures_wasserstein(np.zeros(2), np.eye(2), np.array([3.0, 4.0]), 4 * np.eye(2)))
    5.196152422706632
    """
    m1 = validate_array(mean1, "mean1", ndim=None)
    m2 = validate_array(mean2, "mean2", ndim=None)
    c1 = validate_array(cov1, "cov1", ndim=None)
    c2 = validate_array(cov2, "cov2", ndim=None)
    for name, c in (("cov1", c1), ("cov2", c2)):
        if c.ndim < 2 or c.shape[-1] != c.shape[-2] or c.size == 0:
            raise ValueError(f"`{name}` must have shape (..., d, d) with d >= 1 (not empty), "
                             f"got {c.shape}.")
        # symmetric PSD, checked like every covariance argument (an indefinite matrix
        # would have its negative eigenvalues clipped into a silently wrong distance)
        flat = c.reshape(-1, *c.shape[-2:])
        validate_covariance(flat, name, batch=True)
    d = c1.shape[-1]
    if c2.shape[-1] != d:
        raise ValueError(f"`cov1` and `cov2` must have the same size d, got {c1.shape} and "
                         f"{c2.shape}.")
    for name, m in (("mean1", m1), ("mean2", m2)):
        if m.ndim < 1 or m.shape[-1] != d:
            raise ValueError(f"`{name}` must have shape (..., {d}), got {m.shape}.")
    squared = validate_flag(squared, "squared")
    # W2 is homogeneous, W2(c m, c^2 S) = c W2(m, S): computed on inputs scaled to order
    # one, so that means near 1e200 or covariances near 1e300 do not overflow the squares
    dm = m1 - m2
    c = max(float(np.max(np.abs(dm), initial=0.0)), float(np.sqrt(np.max(np.abs(c1)))),
            float(np.sqrt(np.max(np.abs(c2)))))
    c = 1.0 if not (np.isfinite(c) and c > 0) else c
    dm, c1, c2 = dm / c, c1 / c / c, c2 / c / c     # (c * c would overflow first)
    r1 = psd_sqrt(c1)
    cross = psd_sqrt(r1 @ c2 @ r1)
    w2 = (np.sum(dm ** 2, axis=-1) + np.trace(c1, axis1=-2, axis2=-1)
          + np.trace(c2, axis1=-2, axis2=-1) - 2.0 * np.trace(cross, axis1=-2, axis2=-1))
    w2 = np.clip(w2, 0.0, None)
    out = w2 * c * c if squared else np.sqrt(w2) * c
    return float(out) if np.ndim(out) == 0 else out


def logistic_normal_moments(m, s, tol=1e-12):
    r"""Expectations of the logistic function and its derivative of a Gaussian, with an error bound.

    Trapezoidal rule in :math:`t` for :math:`\int f(m + st)\,\varphi(t)\,dt`, with
    :math:`f = \sigma` or :math:`\sigma' = \sigma(1-\sigma)`. Both are analytic and bounded by
    1 in the strip :math:`|\operatorname{Im} w| \le \pi/2` (:math:`|1 + e^{-w}| \ge 1` there),
    so the integrand is analytic in :math:`|\operatorname{Im} t| < a = \min(\pi/(2 s), 2)`
    with :math:`\int |f\varphi|(t \pm ia)\,dt \le e^{a^2/2} =: M`. The infinite trapezoidal
    sum with step :math:`h` then errs by at most :math:`2M/(e^{2\pi a/h} - 1)`
    (Trefethen and Weideman, SIAM Review 56 (2014), Thm 5.1); truncating it at
    :math:`|t| \le T` adds at most :math:`h\sum_{|t_k|>T}\varphi(t_k) \le 2\Phi(-(T - h))`.
    ``h`` and ``T`` are chosen so that the sum of both is below ``tol``.

    Parameters
    ----------
    m, s : array_like
        Means and standard deviations (``s >= 0``), broadcast together.
    tol : float
        Absolute error bound to meet, in ``(0, 1e-3]``.

    Returns
    -------
    e_sig, e_dsig : ndarray
        The two expectations.
    bound : float
        A rigorous bound on the absolute quadrature error of each (rounding aside).
    """
    tol = validate_tolerance(tol, "tol", upper=1e-3 + 1e-18)
    m, s = np.broadcast_arrays(np.asarray(m, float), np.asarray(s, float))
    if np.any(s < 0) or not np.all(np.isfinite(s)) or not np.all(np.isfinite(m)):
        raise ValueError("`s` must be finite and non-negative and `m` finite.")
    s_max = float(np.max(s, initial=0.0))
    a = min(np.pi / (2 * s_max), 2.0) if s_max > 0 else 2.0
    M = np.exp(a * a / 2)
    h = 2 * np.pi * a / np.log1p(4 * M / tol)
    T = -ndtri(tol / 4) + h
    k = np.arange(-np.ceil(T / h), np.ceil(T / h) + 1)
    t = k * h
    wt = h * np.exp(-0.5 * t * t) / np.sqrt(2 * np.pi)
    disc = 2 * M / np.expm1(2 * np.pi * a / h)
    trunc = 2 * ndtr(-(k[-1] * h - h))
    z = m[..., None] + s[..., None] * t
    sig = expit(z)
    e_sig = sig @ wt
    e_dsig = (sig * (1 - sig)) @ wt
    return e_sig, e_dsig, float(disc + trunc)
