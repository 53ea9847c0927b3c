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

__all__ = ["field_matrix", "moment_rhs", "factor_rhs", "second_moment_rhs", "field_body", "field_parts"]

# The compiled head (field_body, field_parts): plain Python printed from the derivation's
# programs by derivations._symbolic.LoopPrinter, compiled by Numba at first use
# (gaussian_pde.attention._compiled_fields).
from .._common import kernels as _kernels
from .._common.compiled import compiled_later as _compiled_later


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


@_compiled_later()
def field_body(data, k, d, m, y, out, ws):
    r"""Linear attention: the compiled head's :math:`Z' = \big((cVZ)(KZ)^T\big)(QZ)`.

    Over the whole state :math:`Z = [L \mid \alpha]` (``d x m``, row-major in ``y``;
    :math:`ZZ^T = \Sigma + \alpha\alpha^T`), the mean in its own units (``m = d + 1``).
    ``data = [c, cV, K, Q]`` (row-major); ``out`` receives :math:`Z'`; ``ws``: scratch.
    Plain Python, compiled by Numba (``gaussian_pde.attention._compiled_fields``).
    """
    o_P = np.uint64(0)
    o_B = np.uint64(o_P + (d + 2 * k) * m)
    b0 = np.uint64(d + 2 * k)
    b1 = np.uint64(1)
    b2 = np.uint64(o_P + d * m)
    b3 = np.uint64(o_P + (d + k) * m)
    k, d, m = np.uint64(k), np.uint64(d), np.uint64(m)
    for i in range(b0):
        for j in range(m):
            acc = 0.0
            for p in range(d):
                acc += data[b1 + i * d + p] * y[p * m + j]
            ws[o_P + i * m + j] = acc
    for i in range(d):
        for j in range(k):
            acc = 0.0
            for p in range(m):
                acc += ws[o_P + i * m + p] * ws[b2 + p + j * m]
            ws[o_B + i * k + j] = acc
    for i in range(d):
        for j in range(m):
            acc = 0.0
            for p in range(k):
                acc += ws[o_B + i * k + p] * ws[b3 + p * m + j]
            out[i * m + j] = acc


@_compiled_later(counted=True)
def field_parts(data, k, d, m, Z, A, C, M, N, r):
    r"""Linear attention: the parts of the compiled head's Jacobian (``second_moment``).

    :math:`A = cV`, :math:`C = K^TQ` (:math:`dM[dP] = A\,dP\,C`, :math:`P = ZZ^T`),
    :math:`M = A(ZZ^T)C`; ``N`` and ``r`` are not used. ``Z``: the state as a ``d x m`` array.
    """
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
    P2 = np.empty((d, d))
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(m):
                acc += Z[i, p] * Z[j, p]
            P2[i, j] = acc
    t0 = np.empty((d, d))
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += A[i, p] * P2[p, j]
            t0[i, j] = acc
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += t0[i, p] * C[p, j]
            M[i, j] = acc
    return True
