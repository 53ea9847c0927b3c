# ----------------------------------------------------------------------------------
# GENERATED FILE - DO NOT EDIT.
# Written by derivations/biased_softmax.py through derivations/generate.py.
# Regenerate with:  python derivations/generate.py
# A test (tests/test_generated.py) regenerates this file and fails on any difference.
# ----------------------------------------------------------------------------------
"""Biased softmax attention: Gaussian moment equations generated from derivations/biased_softmax.py.

State layout: mean ``alpha`` of shape (..., d); covariance ``Sigma`` and its factor
``L`` (``Sigma = L L^T``) of shape (..., d, d); leading axes broadcast.
"""

import numpy as np

from .._common.linalg import T as _T
from .._common.linalg import l2_gain as _l2_gain
from .._common.linalg import psd_sqrt as _psd_sqrt
from .._common.linalg import sinkhorn_cross as _sinkhorn_cross
from .._common.linalg import sinkhorn_phi as _sinkhorn_phi
from .._common.linalg import solve as _solve

__all__ = ["field_matrix", "field_offset", "moment_rhs", "cov_rhs", "factor_rhs"]


def field_matrix(Q, K, V, scale, q, k_b, Sigma):
    r"""Biased softmax attention: linear part of the affine field, :math:`M = c V \Sigma K^{T} Q`.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    q, k_b : ndarray, shape (..., k, 1)
        Query and key biases (the key bias cancels).
    Sigma : ndarray, shape (..., d, d)
        Covariance.
    """
    M = (scale * (V @ Sigma @ _T(K) @ Q))
    return M


def field_offset(Q, K, V, scale, q, k_b, alpha, Sigma):
    r"""Biased softmax attention: constant part of the affine field, :math:`b = c V \Sigma K^{T} q + V \alpha`.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    q, k_b : ndarray, shape (..., k, 1)
        Query and key biases (the key bias cancels).
    alpha : ndarray, shape (..., d)
        Mean.
    Sigma : ndarray, shape (..., d, d)
        Covariance.
    """
    alpha = alpha[..., None]
    b = ((V @ alpha) + (scale * (V @ Sigma @ _T(K) @ q)))
    return b[..., 0]


def moment_rhs(Q, K, V, scale, q, k_b, alpha, Sigma):
    r"""Biased softmax attention: :math:`\alpha' = M \alpha + b`, :math:`\Sigma' = M \Sigma + \Sigma M^{T}`.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    q, k_b : ndarray, shape (..., k, 1)
        Query and key biases (the key bias cancels).
    alpha : ndarray, shape (..., d)
        Mean.
    Sigma : ndarray, shape (..., d, d)
        Covariance.
    """
    alpha = alpha[..., None]
    M = (scale * (V @ Sigma @ _T(K) @ Q))
    b = ((V @ alpha) + (scale * (V @ Sigma @ _T(K) @ q)))
    dalpha = ((M @ alpha) + b)
    dSigma = ((M @ Sigma) + (Sigma @ _T(M)))
    return dalpha[..., 0], dSigma


def cov_rhs(Q, K, V, scale, q, k_b, Sigma):
    r"""Biased softmax attention: covariance equation :math:`\Sigma' = M \Sigma + \Sigma M^{T}`.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    q, k_b : ndarray, shape (..., k, 1)
        Query and key biases (the key bias cancels).
    Sigma : ndarray, shape (..., d, d)
        Covariance.
    """
    M = (scale * (V @ Sigma @ _T(K) @ Q))
    dSigma = ((M @ Sigma) + (Sigma @ _T(M)))
    return dSigma


def factor_rhs(Q, K, V, scale, q, k_b, L):
    r"""Biased softmax attention: factor form :math:`L' = M L` with :math:`\Sigma = LL^T`;
    it keeps :math:`\Sigma` symmetric PSD and its rank.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    q, k_b : ndarray, shape (..., k, 1)
        Query and key biases (the key bias cancels).
    L : ndarray, shape (..., d, d)
        Factor of the covariance.
    """
    M = (scale * (V @ (L @ _T(L)) @ _T(K) @ Q))
    return M @ L
