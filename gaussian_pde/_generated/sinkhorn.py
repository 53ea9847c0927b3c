# ----------------------------------------------------------------------------------
# GENERATED FILE - DO NOT EDIT.
# Written by derivations/sinkhorn.py through derivations/generate.py.
# Regenerate with:  python derivations/generate.py
# A test (tests/test_generated.py) regenerates this file and fails on any difference.
# ----------------------------------------------------------------------------------
"""Sinkhorn attention: Gaussian moment equations generated from derivations/sinkhorn.py.

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


def _cross_phi(B):
    r"""Cross term :math:`B\varphi(B^TB) = U\operatorname{diag}(s\varphi(s^2))W^T` from the SVD
    :math:`B = U\operatorname{diag}(s)W^T`, with :math:`s\varphi(s^2) = \frac{2 s}{\sqrt{4 s^{2} + 1} + 1}` (derived; printed from SymPy).
    Leading axes broadcast.
    """
    U, s, Wt = np.linalg.svd(B)
    f = 2*s/(np.sqrt(4*s**2 + 1) + 1)
    return (U * f[..., None, :]) @ Wt


def field_matrix(Q, K, V, scale, Sigma):
    r"""Sinkhorn attention: :math:`M = V C \Sigma^{+}` with :math:`C = S B\varphi(B^TB)S`, :math:`S = \Sigma^{1/2}`, :math:`B = SAS`;
    computed as :math:`V S B\varphi(B^TB) S^{+}`.

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
    A = (scale * (_T(K) @ Q))
    R = _psd_sqrt(Sigma)
    B = (R @ A @ R)
    BPhi = _cross_phi(B)
    Rp = np.linalg.pinv(R, rcond=1e-12, hermitian=True)
    M = (V @ R @ BPhi @ Rp)
    return M


def field_offset(Q, K, V, scale, alpha, Sigma):
    r"""Sinkhorn attention: :math:`b = (V - M)\alpha`, so that :math:`\Gamma(\alpha) = V\alpha`.

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
    M = field_matrix(Q, K, V, scale, Sigma)
    return ((V @ alpha[..., None]) - (M @ alpha[..., None]))[..., 0]


def moment_rhs(Q, K, V, scale, alpha, Sigma):
    r"""Sinkhorn attention: :math:`\alpha' = V\alpha`, :math:`\Sigma' = VC + C^TV^T`.

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
    A = (scale * (_T(K) @ Q))
    R = _psd_sqrt(Sigma)
    B = (R @ A @ R)
    BPhi = _cross_phi(B)
    C = (R @ BPhi @ R)
    VC = (V @ C)
    return (V @ alpha[..., None])[..., 0], (VC + _T(VC))


def cov_rhs(Q, K, V, scale, Sigma):
    r"""Sinkhorn attention: :math:`\Sigma' = VC + C^TV^T`, :math:`C = S B\varphi(B^TB)S`.

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
    A = (scale * (_T(K) @ Q))
    R = _psd_sqrt(Sigma)
    B = (R @ A @ R)
    BPhi = _cross_phi(B)
    C = (R @ BPhi @ R)
    VC = (V @ C)
    return (VC + _T(VC))


def factor_rhs(Q, K, V, scale, L):
    r"""Sinkhorn attention, factor form: :math:`L' = V L B\varphi(B^TB)`, :math:`B = L^TAL`.

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
    A = (scale * (_T(K) @ Q))
    B = (_T(L) @ A @ L)
    BPhi = _cross_phi(B)
    return (V @ L @ BPhi)
