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
from .._common.linalg import l2_gain as _l2_gain
from .._common.linalg import psd_sqrt as _psd_sqrt
from .._common.linalg import sinkhorn_cross as _sinkhorn_cross
from .._common.linalg import sinkhorn_phi as _sinkhorn_phi
from .._common.linalg import solve as _solve

__all__ = ["field_matrix", "field_offset", "moment_rhs", "cov_rhs", "factor_rhs"]


def field_matrix(Q, K, V, scale, Sigma):
    r"""L2 attention: linear part of the affine field, :math:`M = 2 c V \left(2 c \Sigma K^{T} K + \mathbb{I}\right)^{-1} \Sigma K^{T} Q`,
    computed as :math:`M = \sqrt{2c}\,VRGQ` with :math:`G = (I + B^TB)^{-1}B^T` from ``l2_gain`` of :math:`B = \sqrt{2c}\,KR`,
    :math:`R = \Sigma^{1/2}` (no solve with the ill-conditioned :math:`I + 2c\,\Sigma K^TK`).

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
    R = _psd_sqrt(Sigma)
    B = (np.sqrt(2)*np.sqrt(scale) * (K @ R))
    G = _l2_gain(B)
    M = (np.sqrt(2)*np.sqrt(scale) * (V @ R @ G @ Q))
    return M


def field_offset(Q, K, V, scale, alpha, Sigma):
    r"""L2 attention: constant part of the affine field, :math:`b = V \left(2 c \Sigma K^{T} K + \mathbb{I}\right)^{-1} \alpha`,
    computed as :math:`b = V(\alpha - \sqrt{2c}\,RGK\alpha)` with :math:`G = (I + B^TB)^{-1}B^T` from ``l2_gain`` of :math:`B = \sqrt{2c}\,KR`,
    :math:`R = \Sigma^{1/2}` (no solve with the ill-conditioned :math:`I + 2c\,\Sigma K^TK`).

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
    R = _psd_sqrt(Sigma)
    B = (np.sqrt(2)*np.sqrt(scale) * (K @ R))
    G = _l2_gain(B)
    return ((V @ alpha[..., None]) + (-np.sqrt(2)*np.sqrt(scale) * (V @ R @ G @ K @ alpha[..., None])))[..., 0]


def moment_rhs(Q, K, V, scale, alpha, Sigma):
    r"""L2 attention: :math:`\alpha' = M \alpha + b`, :math:`\Sigma' = M \Sigma + \Sigma M^{T}`;
    :math:`M` and :math:`b` as in ``field_matrix`` and ``field_offset``, :math:`M\Sigma = (MR)R^T`.

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
    R = _psd_sqrt(Sigma)
    B = (np.sqrt(2)*np.sqrt(scale) * (K @ R))
    G = _l2_gain(B)
    M = (np.sqrt(2)*np.sqrt(scale) * (V @ R @ G @ Q))
    MR = (M @ R)
    return ((M @ alpha[..., None]) + (V @ alpha[..., None]) + (-np.sqrt(2)*np.sqrt(scale) * (V @ R @ G @ K @ alpha[..., None])))[..., 0], ((MR @ _T(R)) + (R @ _T(MR)))


def cov_rhs(Q, K, V, scale, Sigma):
    r"""L2 attention: covariance equation :math:`\Sigma' = M \Sigma + \Sigma M^{T}`, :math:`M\Sigma = (MR)R^T`.

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
    R = _psd_sqrt(Sigma)
    B = (np.sqrt(2)*np.sqrt(scale) * (K @ R))
    G = _l2_gain(B)
    M = (np.sqrt(2)*np.sqrt(scale) * (V @ R @ G @ Q))
    MR = (M @ R)
    return ((MR @ _T(R)) + (R @ _T(MR)))


def factor_rhs(Q, K, V, scale, L):
    r"""L2 attention: factor form :math:`L' = M L` with :math:`\Sigma = LL^T`, computed as :math:`L' = \sqrt{2c}\,VL\,G\,QL`,
    :math:`G = (I + B^TB)^{-1}B^T` from ``l2_gain`` of :math:`B = \sqrt{2c}\,KL`;
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
    B = (np.sqrt(2)*np.sqrt(scale) * (K @ L))
    G = _l2_gain(B)
    QL = (Q @ L)
    X = (G @ QL)
    return (np.sqrt(2)*np.sqrt(scale) * (V @ L @ X))
