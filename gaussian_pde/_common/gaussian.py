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

from .linalg import psd_sqrt
from .validation import validate_array, validate_covariance, validate_flag

__all__ = ["bures_wasserstein"]


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
