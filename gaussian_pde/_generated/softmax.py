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

__all__ = ["field_matrix", "field_offset", "moment_rhs", "cov_rhs", "factor_rhs", "field_body", "field_parts"]

# The compiled head (field_body, field_parts): plain Python printed from the derivation's
# programs by derivations._symbolic.LoopPrinter, compiled by Numba at first use
# (gaussian_pde.attention._compiled_fields).
from .._common import kernels as _kernels
from .._common.compiled import compiled_later as _compiled_later


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
    M = (scale * ((V @ (Sigma @ _T(K))) @ Q))
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


@_compiled_later()
def field_body(data, k, d, m, y, out, ws):
    r"""Softmax attention: the compiled head's :math:`Z' = [L' \mid \alpha']`.

    :math:`L' = \big((cVL)(KL)^T\big)(QL)`, :math:`\alpha' = B(Q\alpha) + (cV\alpha)/c`
    with :math:`B = (cVL)(KL)^T`. ``data = [c, cV, K, Q]`` (row-major); ``y``: the state
    :math:`Z = [L \mid \alpha]` (``d x m``, row-major, ``m = d`` without the mean); ``out``
    receives :math:`Z'`; ``ws``: scratch. Plain Python, compiled by Numba
    (``gaussian_pde.attention._compiled_fields``).
    """
    c = data[0]
    o_P = np.uint64(0)
    o_B = np.uint64(o_P + (d + 2 * k) * d)
    o_Pa = np.uint64(o_B + d * k)
    b0 = np.uint64(d + 2 * k)
    b1 = np.uint64(1)
    b2 = np.uint64(o_P + d * d)
    b3 = np.uint64(o_P + (d + k) * d)
    b4 = np.uint64(o_Pa + d + k)
    k, d, m = np.uint64(k), np.uint64(d), np.uint64(m)
    for i in range(b0):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += data[b1 + i * d + p] * y[p * m + j]
            ws[o_P + i * d + j] = acc
    for i in range(d):
        for j in range(k):
            acc = 0.0
            for p in range(d):
                acc += ws[o_P + i * d + p] * ws[b2 + p + j * d]
            ws[o_B + i * k + j] = acc
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(k):
                acc += ws[o_B + i * k + p] * ws[b3 + p * d + j]
            out[i * m + j] = acc
    if m > d:
        for i in range(b0):
            ws[o_Pa + i] = 0.0
        for p in range(d):
            yp = y[d + p * m]
            for i in range(b0):
                ws[o_Pa + i] += data[b1 + i * d + p] * yp
        for i in range(d):
            out[d + i * m] = 0.0
        for p in range(k):
            yp = ws[b4 + p]
            for i in range(d):
                out[d + i * m] += ws[o_B + i * k + p] * yp
        for i in range(d):
            out[d + i * m] = out[d + i * m] + ws[o_Pa + i] / c


@_compiled_later(counted=True)
def field_parts(data, k, d, m, Z, A, C, M, N, r):
    r"""Softmax attention: the parts of the compiled head's Jacobian.

    :math:`A = cV`, :math:`C = K^TQ` (:math:`dM[d\Sigma] = A\,d\Sigma\,C`),
    :math:`M = A(LL^T)C`; with the mean (``m > d``) :math:`N = A/c + M = V + M`
    (:math:`\partial\alpha'/\partial\alpha`) and :math:`r = C\alpha`
    (:math:`d\alpha'[d\Sigma] = A\,d\Sigma\,r`). ``Z``: the state as a ``d x m`` array.
    """
    c = data[0]
    b0 = np.uint64(1)
    b1 = np.uint64(1 + d * d)
    b2 = np.uint64(1 + (d + k) * d)
    k, d, m = np.uint64(k), np.uint64(d), np.uint64(m)
    for i in range(d):
        for j in range(d):
            A[i, j] = data[b0 + i * d + j]
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(k):
                acc += data[b1 + i + p * d] * data[b2 + p * d + j]
            C[i, j] = acc
    S = np.empty((d, d))
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += Z[i, p] * Z[j, p]
            S[i, j] = acc
    t0 = np.empty((d, d))
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += A[i, p] * S[p, j]
            t0[i, j] = acc
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += t0[i, p] * C[p, j]
            M[i, j] = acc
    if m > d:
        for i in range(d):
            for j in range(d):
                N[i, j] = A[i, j] / c + M[i, j]
        for i in range(d):
            r[i] = 0.0
        for p in range(d):
            yp = Z[p, d]
            for i in range(d):
                r[i] += C[i, p] * yp
    return True
