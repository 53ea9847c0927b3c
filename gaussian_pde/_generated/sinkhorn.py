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

__all__ = ["field_matrix", "field_offset", "moment_rhs", "cov_rhs", "factor_rhs", "field_body"]

# The compiled head (field_body, field_parts): plain Python printed from the derivation's
# programs by derivations._symbolic.LoopPrinter, compiled by Numba at first use
# (gaussian_pde.attention._compiled_fields).
from .._common import kernels as _kernels
from .._common.compiled import compiled_later as _compiled_later


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


@_compiled_later(counted=True)
def field_body(data, k, d, m, y, out, ws):
    r"""Sinkhorn attention: the compiled head's :math:`Z' = [L' \mid \alpha']`.

    :math:`L' = (VL)\,B\varphi(B^TB)`, :math:`B = L^T(AL)`, from the SVD
    :math:`B = U\operatorname{diag}(s)W^T` as :math:`U\operatorname{diag}(s\varphi(s^2))W^T`;
    :math:`\alpha' = V\alpha`. NaN where :math:`B` is not finite. ``data = [A, V]``
    (row-major, :math:`A = cK^TQ`); ``y``: the state :math:`Z = [L \mid \alpha]` (``d x m``,
    row-major); ``ws``: scratch. Plain Python, compiled by Numba
    (``gaussian_pde.attention._compiled_fields``).
    """
    o_AL = np.uint64(0)
    o_B = np.uint64(o_AL + d * d)
    o_BPhi = np.uint64(o_B + d * d)
    o_VL = np.uint64(o_BPhi + d * d)
    b0 = np.uint64(d * d)
    k, d, m = np.uint64(k), np.uint64(d), np.uint64(m)
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += data[i * d + p] * y[p * m + j]
            ws[o_AL + i * d + j] = acc
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += y[i + p * m] * ws[o_AL + p * d + j]
            ws[o_B + i * d + j] = acc
    if not _kernels.finite(ws[o_B:o_B + d * d].reshape((d, d))):
        for i in range(d * m):
            out[i] = np.nan
        return
    U, sv, Wt = np.linalg.svd(ws[o_B:o_B + d * d].reshape((d, d)))
    for j in range(d):
        f = 2*sv[j]/(np.sqrt(4*sv[j]**2 + 1) + 1)
        for i in range(d):
            U[i, j] *= f
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += U[i, p] * Wt[p, j]
            ws[o_BPhi + i * d + j] = acc
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += data[b0 + i * d + p] * y[p * m + j]
            ws[o_VL + i * d + j] = acc
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += ws[o_VL + i * d + p] * ws[o_BPhi + p * d + j]
            out[i * m + j] = acc
    if m > d:
        for i in range(d):
            out[d + i * m] = 0.0
        for p in range(d):
            yp = y[d + p * m]
            for i in range(d):
                out[d + i * m] += data[b0 + i * d + p] * yp
