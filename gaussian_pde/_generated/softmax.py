# ----------------------------------------------------------------------------------
# GENERATED FILE - DO NOT EDIT.
# Written by derivations/softmax.py through derivations/generate.py.
# Regenerate with:  python derivations/generate.py
# A test (tests/test_generated.py) regenerates this file and fails on any difference.
# ----------------------------------------------------------------------------------
"""Softmax attention: Gaussian moment equations generated from derivations/softmax.py.

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

__all__ = ["field_matrix", "field_offset", "moment_rhs", "cov_rhs", "factor_rhs", "factor_weights", "factor_apply", "factor_kernel"]


def field_matrix(Q, K, V, scale, Sigma):
    r"""Softmax attention: linear part of the affine field, :math:`M = c V \Sigma K^{T} Q`.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    Sigma : ndarray, shape (..., d, d)
        Covariance.
    """
    M = (scale * (V @ Sigma @ _T(K) @ Q))
    return M


def field_offset(Q, K, V, scale, alpha, Sigma):
    r"""Softmax attention: constant part of the affine field, :math:`b = V \alpha`.

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
    b = (V @ alpha)
    return b[..., 0]


def moment_rhs(Q, K, V, scale, alpha, Sigma):
    r"""Softmax attention: :math:`\alpha' = M \alpha + b`, :math:`\Sigma' = M \Sigma + \Sigma M^{T}`.

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
    M = (scale * (V @ Sigma @ _T(K) @ Q))
    b = (V @ alpha)
    dalpha = ((M @ alpha) + b)
    dSigma = ((M @ Sigma) + (Sigma @ _T(M)))
    return dalpha[..., 0], dSigma


def cov_rhs(Q, K, V, scale, Sigma):
    r"""Softmax attention: covariance equation :math:`\Sigma' = M \Sigma + \Sigma M^{T}`.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    Sigma : ndarray, shape (..., d, d)
        Covariance.
    """
    M = (scale * (V @ Sigma @ _T(K) @ Q))
    dSigma = ((M @ Sigma) + (Sigma @ _T(M)))
    return dSigma


def factor_rhs(Q, K, V, scale, L):
    r"""Softmax attention: factor form :math:`L' = M L` with :math:`\Sigma = LL^T`;
    it keeps :math:`\Sigma` symmetric PSD and its rank.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    L : ndarray, shape (..., d, d)
        Factor of the covariance.
    """
    M = (scale * (V @ (L @ _T(L)) @ _T(K) @ Q))
    return M @ L


def factor_weights(Q, K, V, scale):
    r"""Softmax attention: the weight-only products of :math:`L' = c V L L^{T} K^{T} Q L`.

    Computed once per set of weights (leading axes broadcast) and passed to
    ``factor_apply``.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    """
    _w0 = np.concatenate([(scale * V), K, Q], axis=-2)
    return (_w0,)


def factor_apply(weights, L):
    r"""Softmax attention: :math:`L' = c V L L^{T} K^{T} Q L` from the products of ``factor_weights``.

    Same numbers as ``factor_rhs`` up to rounding (the order of the products differs).

    Parameters
    ----------
    weights : tuple of ndarray
        ``factor_weights(Q, K, V, scale)``.
    L : ndarray, shape (..., d, d)
        Factor of the covariance.
    """
    _w0, = weights
    P = (_w0 @ L)
    _d = L.shape[-1]
    _k = (P.shape[-2] - _d) // 2
    return ((P[..., :_d, :] @ _T(P[..., _d:_d + _k, :])) @ P[..., _d + _k:, :])


def factor_kernel(Q, K, V, scale):
    r"""Softmax attention: fast closure ``kernel(L) -> L'`` for one unbatched ``L``.

    The weight-only products are computed once here; the closure maps a ``(d, d)``
    factor to ``L'`` with 2-D products only.

    Parameters
    ----------
    Q, K : ndarray, shape (k, d)
        Query and key matrices.
    V : ndarray, shape (d, d)
        Value matrix.
    scale : float
        Score scale.
    """
    _w0, = factor_weights(Q, K, V, scale)
    _d = V.shape[-1]
    _k = K.shape[-2]
    _dot = np.dot

    def kernel(L):
        P = _dot(_w0, L)
        return _dot(_dot(P[:_d], P[_d:_d + _k].T), P[_d + _k:])

    return kernel
