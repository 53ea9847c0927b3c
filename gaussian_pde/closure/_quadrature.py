r"""Deterministic quadrature against Gaussians.

Tensor-product Gauss-Hermite rule for :math:`\mathbb E[f(X)]`, :math:`X \sim
\mathcal N(\alpha, \Sigma)`: with probabilists' Hermite nodes :math:`z_i` and weights
:math:`w_i` (normalised to sum to one),

.. math:: \mathbb E[f(X)] \approx \sum_{i_1..i_d} w_{i_1}\cdots w_{i_d}\,
          f(\alpha + \Sigma^{1/2}(z_{i_1},\dots,z_{i_d})),

exact for polynomials of degree :math:`2m - 1` in each coordinate with ``m`` nodes per
dimension. Singular :math:`\Sigma` is fine (the square root is taken by eigenvalues).
"""

from __future__ import annotations

import itertools

import numpy as np

from .._common.linalg import psd_sqrt
from .._common.validation import validate_covariance, validate_int, validate_vector

__all__ = ["gauss_hermite_gaussian"]


def gauss_hermite_gaussian(mean, cov, n_per_dim):
    """Nodes ``(m**d, d)`` and weights ``(m**d,)`` of the Gauss-Hermite rule for N(mean, cov)."""
    mean = validate_vector(mean, "mean")
    cov = validate_covariance(cov, "cov", d=mean.size)
    m = validate_int(n_per_dim, "n_per_dim", minimum=1)
    d = mean.size
    if m**d > 5_000_000:
        raise ValueError(f"`n_per_dim`**d = {m**d} nodes is too many; lower `n_per_dim`.")
    z, w = np.polynomial.hermite_e.hermegauss(m)
    w = w / w.sum()
    Z = np.array(list(itertools.product(z, repeat=d)))
    W = np.prod(np.array(list(itertools.product(w, repeat=d))), axis=1)
    return mean + Z @ psd_sqrt(cov).T, W
