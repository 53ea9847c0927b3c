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

__all__ = ["field_matrix", "field_offset", "moment_rhs", "cov_rhs", "factor_rhs", "field_body", "field_parts"]

# The compiled head (field_body, field_parts): plain Python printed from the derivation's
# programs by derivations._symbolic.LoopPrinter, compiled by Numba at first use
# (gaussian_pde.attention._compiled_fields).
from .._common import kernels as _kernels
from .._common.compiled import compiled_later as _compiled_later


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


@_compiled_later(counted=True)
def field_body(data, k, d, m, y, out, ws):
    r"""L2 attention: the compiled head's :math:`Z' = [L' \mid \alpha']`.

    :math:`L' = (sVL)\,(G\,QL)`, :math:`\alpha' = (sVL)\,G(Q - K)\alpha + (sV\alpha)/s`,
    :math:`G = (I + B^TB)^{-1}B^T` of :math:`B = sKL` (``gain``: a Cholesky solve while
    :math:`\|B\|_F^2 < 10^3`, Householder QR beyond), :math:`s = \sqrt{2c}`. NaN where
    :math:`B` is not finite. ``data = [c, s, sV, sK, Q, V, K]`` (row-major); ``y``: the state
    :math:`Z = [L \mid \alpha]` (``d x m``, row-major); ``ws``: scratch. Plain Python,
    compiled by Numba (``gaussian_pde.attention._compiled_fields``).
    """
    s = data[1]
    o_B = np.uint64(0)
    o_G = np.uint64(o_B + k * d)
    o_t0 = np.uint64(o_G + d * k)
    o_t1 = np.uint64(o_t0 + k * k)
    o_X = np.uint64(o_t1 + k * d)
    o_GQ = np.uint64(o_X + d * d)
    o_t2 = np.uint64(o_GQ + d * d)
    o_QmK = np.uint64(o_t2 + k * d)
    o_QKa = np.uint64(o_QmK + k * d)
    o_Xa = np.uint64(o_QKa + k)
    o_Ga = np.uint64(o_Xa + d)
    b0 = np.uint64(2 + d * d)
    b1 = np.uint64(0)
    b2 = np.uint64(2)
    b3 = np.uint64(2 + d * d + k * d)
    b4 = np.uint64(2 + d * d + k * d + k * d + d * d)
    k, d, m = np.uint64(k), np.uint64(d), np.uint64(m)
    _kernels.product(data, b0, d, y, b1, m, ws, o_B, d, k, d, d)
    if not _kernels.gain(ws[o_B:o_B + k * d].reshape((k, d)), ws[o_G:o_G + d * k].reshape((d, k)), ws[o_t0:o_t0 + k * k].reshape((k, k)), ws[o_t1:o_t1 + k * d].reshape((k, d)), ws[o_t0:o_t0 + k * k].reshape((k, k)), False):
        for i in range(d * m):
            out[i] = np.nan
        return
    _kernels.product(data, b2, d, y, b1, m, ws, o_X, d, d, d, d)
    _kernels.product(data, b3, d, y, b1, m, ws, o_t2, d, k, d, d)
    _kernels.product(ws, o_G, k, ws, o_t2, d, ws, o_GQ, d, d, d, k)
    _kernels.product(ws, o_X, d, ws, o_GQ, d, out, b1, m, d, d, d)
    if m > d:
        for i in range(k):
            for j in range(d):
                ws[o_QmK + i * d + j] = data[b3 + i * d + j] - data[b4 + i * d + j]
        for i in range(k):
            ws[o_QKa + i] = 0.0
        for p in range(d):
            yp = y[d + p * m]
            for i in range(k):
                ws[o_QKa + i] += ws[o_QmK + i * d + p] * yp
        for i in range(d):
            ws[o_Xa + i] = 0.0
        for p in range(d):
            yp = y[d + p * m]
            for i in range(d):
                ws[o_Xa + i] += data[b2 + i * d + p] * yp
        for i in range(d):
            ws[o_Ga + i] = 0.0
        for p in range(k):
            yp = ws[o_QKa + p]
            for i in range(d):
                ws[o_Ga + i] += ws[o_G + i * k + p] * yp
        for i in range(d):
            out[d + i * m] = 0.0
        for p in range(d):
            yp = ws[o_Ga + p]
            for i in range(d):
                out[d + i * m] += ws[o_X + i * d + p] * yp
        for i in range(d):
            out[d + i * m] = out[d + i * m] + ws[o_Xa + i] / s


@_compiled_later(counted=True)
def field_parts(data, k, d, m, Z, A, C, M, N, r):
    r"""L2 attention: the parts of the compiled head's Jacobian.

    With :math:`G` the gain of :math:`B = sKL`, :math:`E = (I_k + BB^T)^{-1}` and
    :math:`\Xi = I - sLGK`: :math:`A = 2cV\Xi`, :math:`C = K^TEQ`
    (:math:`dM[d\Sigma] = A\,d\Sigma\,C`), :math:`M = (2c/s)\,VLGQ`, :math:`N = A/(2c) + M`,
    :math:`r = K^TE(Q - K)\alpha`. False where the column norms of :math:`L` span
    ``SPREAD_MAX`` or more (the closed form loses its digits) or :math:`B` is not finite.
    """
    if not _kernels.spread_ok(Z, d):
        return False
    c = data[0]
    s = data[1]
    b0 = np.uint64(2 + d * d)
    b1 = np.uint64(2 + d * d + k * d + k * d + d * d)
    b2 = np.uint64(2 + d * d + k * d)
    b3 = np.uint64(2 + d * d + k * d + k * d)
    k, d, m = np.uint64(k), np.uint64(d), np.uint64(m)
    B = np.empty((k, d))
    for i in range(k):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += data[b0 + i * d + p] * Z[p, j]
            B[i, j] = acc
    G = np.empty((d, k))
    t0 = np.empty((k, k))
    E = np.empty((k, k))
    if not _kernels.gain(B, G, t0, t0, E, True):
        return False
    LG = np.empty((d, k))
    for i in range(d):
        for j in range(k):
            acc = 0.0
            for p in range(d):
                acc += Z[i, p] * G[p, j]
            LG[i, j] = acc
    LGK = np.empty((d, d))
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(k):
                acc += LG[i, p] * data[b1 + p * d + j]
            LGK[i, j] = acc
    Xi = np.empty((d, d))
    for i in range(d):
        for j in range(d):
            Xi[i, j] = (1.0 if i == j else 0.0) - LGK[i, j] * s
    LGQ = np.empty((d, d))
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(k):
                acc += LG[i, p] * data[b2 + p * d + j]
            LGQ[i, j] = acc
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += data[b3 + i * d + p] * Xi[p, j]
            A[i, j] = acc * (2.0 * c)
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += data[b3 + i * d + p] * LGQ[p, j]
            M[i, j] = acc * (2.0 * c / s)
    EQ = np.empty((k, d))
    for i in range(k):
        for j in range(d):
            acc = 0.0
            for p in range(k):
                acc += E[i, p] * data[b2 + p * d + j]
            EQ[i, j] = acc
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(k):
                acc += data[b1 + i + p * d] * EQ[p, j]
            C[i, j] = acc
    if m > d:
        for i in range(d):
            for j in range(d):
                N[i, j] = A[i, j] / (2.0 * c) + M[i, j]
        QmK = np.empty((k, d))
        for i in range(k):
            for j in range(d):
                QmK[i, j] = data[b2 + i * d + j] - data[b1 + i * d + j]
        QKa = np.empty((k, 1))
        for i in range(k):
            QKa[i, 0] = 0.0
        for p in range(d):
            yp = Z[p, d]
            for i in range(k):
                QKa[i, 0] += QmK[i, p] * yp
        Eq = np.empty((k, 1))
        for i in range(k):
            Eq[i, 0] = 0.0
        for p in range(k):
            yp = QKa[p, 0]
            for i in range(k):
                Eq[i, 0] += E[i, p] * yp
        for i in range(d):
            r[i] = 0.0
        for p in range(k):
            yp = Eq[p, 0]
            for i in range(d):
                r[i] += data[b1 + i + p * d] * yp
    return True
