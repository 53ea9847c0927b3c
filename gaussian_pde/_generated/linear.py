# ----------------------------------------------------------------------------------
# GENERATED FILE - DO NOT EDIT.
# Written by derivations/linear.py through derivations/generate.py.
# Regenerate with:  python derivations/generate.py
# A test (tests/test_generated.py) regenerates this file and fails on any difference.
# ----------------------------------------------------------------------------------
"""Linear attention: Gaussian moment equations generated from derivations/linear.py.

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

__all__ = ["field_matrix", "moment_rhs", "factor_rhs", "second_moment_rhs"]


def field_matrix(Q, K, V, scale, alpha, Sigma):
    r"""Linear attention: linear part of the affine field, :math:`M = c V \Sigma K^{T} Q + c V \alpha \alpha^{T} K^{T} Q` (the offset is zero).

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    alpha : ndarray, shape (..., d)
        Mean.
    Sigma : ndarray, shape (..., d, d)
        Covariance.
    """
    alpha = alpha[..., None]
    M = ((scale * (V @ Sigma @ _T(K) @ Q)) + (scale * (V @ alpha @ _T(alpha) @ _T(K) @ Q)))
    return M


def moment_rhs(Q, K, V, scale, alpha, Sigma):
    r"""Linear attention: :math:`\alpha' = \left(c V \Sigma K^{T} Q + c V \alpha \alpha^{T} K^{T} Q\right) \alpha`, :math:`\Sigma' = \left(c V \Sigma K^{T} Q + c V \alpha \alpha^{T} K^{T} Q\right) \Sigma + \Sigma \left(c Q^{T} K \alpha \alpha^{T} V^{T} + c Q^{T} K \Sigma^{T} V^{T}\right)`, :math:`M = c V \Sigma K^{T} Q + c V \alpha \alpha^{T} K^{T} Q`.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    alpha : ndarray, shape (..., d)
        Mean.
    Sigma : ndarray, shape (..., d, d)
        Covariance.
    """
    alpha = alpha[..., None]
    M = ((scale * (V @ Sigma @ _T(K) @ Q)) + (scale * (V @ alpha @ _T(alpha) @ _T(K) @ Q)))
    dalpha = (M @ alpha)
    dSigma = ((M @ Sigma) + (Sigma @ _T(M)))
    return dalpha[..., 0], dSigma


def factor_rhs(Q, K, V, scale, Z):
    r"""Linear attention: factor form :math:`Z' = \left(\left(c V Z\right) \left(K Z\right)^{T}\right) \left(Q Z\right)` of :math:`Z = [L \mid \alpha]`
    (:math:`ZZ^T = \Sigma + \alpha\alpha^T`): :math:`[ML \mid M\alpha]` in one product.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    Z : ndarray, shape (..., d, d + 1)
        The factor and the mean.
    """
    dZ = (((scale * (V @ Z)) @ _T((K @ Z))) @ (Q @ Z))
    return dZ


def second_moment_rhs(Q, K, V, scale, P):
    r"""Linear attention: :math:`P' = c P Q^{T} K P^{T} V^{T} + c V P K^{T} Q P` of the second moment :math:`P = \Sigma + \alpha\alpha^T`.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    P : ndarray, shape (..., d, d)
        Second moment.
    """
    M = (scale * (V @ P @ _T(K) @ Q))
    return M @ P + P @ _T(M)
