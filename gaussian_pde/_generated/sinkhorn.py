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

__all__ = ["field_matrix", "field_offset", "moment_rhs", "cov_rhs", "factor_rhs", "factor_weights", "factor_apply", "factor_kernel"]


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


def factor_weights(Q, K, V, scale):
    r"""Sinkhorn attention: the weight-only products of :math:`L' = V L B\varphi(B^TB),\ B = L^TAL`.

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
    _w0 = (scale * (_T(K) @ Q))
    _w1 = V
    return (_w0, _w1)


def factor_apply(weights, L):
    r"""Sinkhorn attention: :math:`L' = V L B\varphi(B^TB),\ B = L^TAL` from the products of ``factor_weights``.

    Same numbers as ``factor_rhs`` up to rounding (the order of the products differs).

    Parameters
    ----------
    weights : tuple of ndarray
        ``factor_weights(Q, K, V, scale)``.
    L : ndarray, shape (..., d, d)
        Factor of the covariance.
    """
    _w0, _w1 = weights
    B = (_T(L) @ (_w0 @ L))
    return (_w1 @ (L @ _cross_phi(B)))


def factor_kernel(Q, K, V, scale):
    r"""Sinkhorn attention: fast closure ``kernel(L) -> L'`` for one unbatched ``L``.

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
    _w0, _w1 = factor_weights(Q, K, V, scale)
    _dot = np.dot

    def kernel(L):
        B = _dot(L.T, _dot(_w0, L))
        return _dot(_w1, _dot(L, _cross_phi(B)))

    return kernel
