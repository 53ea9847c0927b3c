# ----------------------------------------------------------------------------------
# GENERATED FILE - DO NOT EDIT.
# Written by derivations/l2.py through derivations/generate.py.
# Regenerate with:  python derivations/generate.py
# A test (tests/test_generated.py) regenerates this file and fails on any difference.
# ----------------------------------------------------------------------------------
"""L2 attention: Gaussian moment equations generated from derivations/l2.py.

State layout: mean ``alpha`` of shape (..., d); covariance ``Sigma`` and its factor
``L`` (``Sigma = L L^T``) of shape (..., d, d); leading axes broadcast.
"""

import numpy as np

from .._common.linalg import T as _T
from .._common.linalg import psd_sqrt as _psd_sqrt
from .._common.linalg import sinkhorn_cross as _sinkhorn_cross
from .._common.linalg import sinkhorn_phi as _sinkhorn_phi
from .._common.linalg import solve as _solve

__all__ = ["field_matrix", "field_offset", "moment_rhs", "cov_rhs", "factor_rhs", "factor_weights", "factor_apply", "factor_kernel"]


def field_matrix(Q, K, V, scale, Sigma):
    r"""L2 attention: linear part of the affine field, :math:`M = 2 c V \left(2 c \Sigma K^{T} K + \mathbb{I}\right)^{-1} \Sigma K^{T} Q`.

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
    _eye = np.eye(Sigma.shape[-1])
    M = (2*scale * (V @ _solve(((2*scale * (Sigma @ _T(K) @ K)) + _eye), (Sigma @ _T(K) @ Q))))
    return M


def field_offset(Q, K, V, scale, alpha, Sigma):
    r"""L2 attention: constant part of the affine field, :math:`b = V \left(2 c \Sigma K^{T} K + \mathbb{I}\right)^{-1} \alpha`.

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
    _eye = np.eye(Sigma.shape[-1])
    alpha = alpha[..., None]
    b = (V @ _solve(((2*scale * (Sigma @ _T(K) @ K)) + _eye), alpha))
    return b[..., 0]


def moment_rhs(Q, K, V, scale, alpha, Sigma):
    r"""L2 attention: :math:`\alpha' = M \alpha + b`, :math:`\Sigma' = M \Sigma + \Sigma M^{T}`.

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
    _eye = np.eye(Sigma.shape[-1])
    alpha = alpha[..., None]
    M = (2*scale * (V @ _solve(((2*scale * (Sigma @ _T(K) @ K)) + _eye), (Sigma @ _T(K) @ Q))))
    b = (V @ _solve(((2*scale * (Sigma @ _T(K) @ K)) + _eye), alpha))
    dalpha = ((M @ alpha) + b)
    dSigma = ((M @ Sigma) + (Sigma @ _T(M)))
    return dalpha[..., 0], dSigma


def cov_rhs(Q, K, V, scale, Sigma):
    r"""L2 attention: covariance equation :math:`\Sigma' = M \Sigma + \Sigma M^{T}`.

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
    _eye = np.eye(Sigma.shape[-1])
    M = (2*scale * (V @ _solve(((2*scale * (Sigma @ _T(K) @ K)) + _eye), (Sigma @ _T(K) @ Q))))
    dSigma = ((M @ Sigma) + (Sigma @ _T(M)))
    return dSigma


def factor_rhs(Q, K, V, scale, L):
    r"""L2 attention: factor form :math:`L' = M L` with :math:`\Sigma = LL^T`;
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
    _eye = np.eye(L.shape[-1])
    M = (2*scale * (V @ _solve(((2*scale * ((L @ _T(L)) @ _T(K) @ K)) + _eye), ((L @ _T(L)) @ _T(K) @ Q))))
    return M @ L


def factor_weights(Q, K, V, scale):
    r"""L2 attention: the weight-only products of :math:`L' = 2 c V \left(2 c L L^{T} K^{T} K + \mathbb{I}\right)^{-1} L L^{T} K^{T} Q L`.

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
    _w0 = _T(K)
    _w1 = Q
    _w2 = (2*scale * _T(K))
    _w3 = K
    _w4 = (2*scale * V)
    return (_w0, _w1, _w2, _w3, _w4)


def factor_apply(weights, L):
    r"""L2 attention: :math:`L' = 2 c V \left(2 c L L^{T} K^{T} K + \mathbb{I}\right)^{-1} L L^{T} K^{T} Q L` from the products of ``factor_weights``.

    Same numbers as ``factor_rhs`` up to rounding (the order of the products differs).

    Parameters
    ----------
    weights : tuple of ndarray
        ``factor_weights(Q, K, V, scale)``.
    L : ndarray, shape (..., d, d)
        Factor of the covariance.
    """
    _w0, _w1, _w2, _w3, _w4 = weights
    _eye = np.eye(L.shape[-1])
    return (_w4 @ _solve(((((L @ _T(L)) @ _w2) @ _w3) + _eye), ((((L @ _T(L)) @ _w0) @ _w1) @ L)))


def factor_kernel(Q, K, V, scale):
    r"""L2 attention: fast closure ``kernel(L) -> L'`` for one unbatched ``L``.

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
    _w0, _w1, _w2, _w3, _w4 = factor_weights(Q, K, V, scale)
    _eye = np.eye(V.shape[-1])
    _dot = np.dot
    _solve2 = np.linalg.solve

    def kernel(L):
        return _dot(_w4, _solve2((_dot(_dot(_dot(L, L.T), _w2), _w3) + _eye), _dot(_dot(_dot(_dot(L, L.T), _w0), _w1), L)))

    return kernel
