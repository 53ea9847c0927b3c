"""Small dense kernels the compiled heads share: products, the L2 gain, checks.

Plain Python marked by :func:`~gaussian_pde._common.compiled.compiled_later`, compiled
by Numba when a field first needs them (``gaussian_pde.attention._compiled_fields``);
here, below the attention types and the generated modules, so that the head bodies
printed into ``gaussian_pde/_generated`` can call them.
"""

from __future__ import annotations

import math

import numpy as np

from .compiled import compiled_later

__all__ = ["SPREAD_MAX", "cholesky_solve", "copy2", "fill_nan", "finite", "gain", "gain_qr",
           "inverse_gram_qr", "mm", "spread_ok", "upper_solve"]

#: ||B||_F^2 below which the L2 gain takes the Cholesky solve (linalg.GAIN_SOLVE_MAX)
_GAIN_SOLVE_MAX = 1e3
#: the closed-form Jacobian of a head whose parts hold only while the column norms of
#: ``L`` span less than this (gaussian_pde._common.differences.JACOBIAN_SPREAD_MAX)
SPREAD_MAX = 1e4


@compiled_later()
def mm(A, B, C):
    """``C = A @ B`` for small 2-D arrays."""
    r, q = A.shape
    c = B.shape[1]
    for i in range(r):
        for j in range(c):
            acc = 0.0
            for p in range(q):
                acc += A[i, p] * B[p, j]
            C[i, j] = acc


@compiled_later()
def product(X, xo, xr, Y, yo, yr, T, to, tr, n, c, q):
    r"""``T = X Y`` on flat row-major buffers, each entry summed over ``p`` in increasing order from 0.0.

    Entry ``(i, j)`` of ``X`` is ``X[xo + i xr + j]`` (likewise ``Y``, ``T``); ``T`` is
    ``n x c``, the sums of ``q`` terms. Offsets, strides and sizes unsigned.
    """
    for i in range(n):
        for j in range(c):
            acc = 0.0
            for p in range(q):
                acc += X[xo + i * xr + p] * Y[yo + p * yr + j]
            T[to + i * tr + j] = acc


@compiled_later()
def copy2(dst, src):
    """``dst[:, :] = src`` (2-D) as loops.

    An array assignment would compile its shape check's error message, and with it
    Numba's string formatting: some forty functions on a machine with an empty cache.
    """
    for i in range(dst.shape[0]):
        for j in range(dst.shape[1]):
            dst[i, j] = src[i, j]


@compiled_later()
def cholesky_solve(H, X):
    """Solve ``H Y = X`` in place (``H`` symmetric positive definite, overwritten)."""
    k = H.shape[0]
    for j in range(k):
        s = H[j, j]
        for p in range(j):
            s -= H[j, p] * H[j, p]
        if not s > 0.0:
            return False
        s = math.sqrt(s)
        H[j, j] = s
        for i in range(j + 1, k):
            t = H[i, j]
            for p in range(j):
                t -= H[i, p] * H[j, p]
            H[i, j] = t / s
    c = X.shape[1]
    for col in range(c):
        for i in range(k):               # forward
            t = X[i, col]
            for p in range(i):
                t -= H[i, p] * X[p, col]
            X[i, col] = t / H[i, i]
        for i in range(k - 1, -1, -1):   # backward
            t = X[i, col]
            for p in range(i + 1, k):
                t -= H[p, i] * X[p, col]
            X[i, col] = t / H[i, i]
    return True


@compiled_later(counted=True)
def finite(A):
    """Whether every entry of ``A`` is finite."""
    for x in A.ravel():
        if not math.isfinite(x):
            return False
    return True


@compiled_later()
def upper_solve(R, X):
    """Solve ``R Y = X`` in place, ``R`` upper triangular (square)."""
    n = R.shape[0]
    for col in range(X.shape[1]):
        for i in range(n - 1, -1, -1):
            t = X[i, col]
            for p in range(i + 1, n):
                t -= R[i, p] * X[p, col]
            X[i, col] = t / R[i, i]


@compiled_later(counted=True)
def gain_qr(B, G):
    """``G = R^{-1} Q_1^T`` from the QR of ``[B; I_d]`` (any finite scale)."""
    k, d = B.shape
    Bh = np.zeros((k + d, d))
    for i in range(k):
        for j in range(d):
            Bh[i, j] = B[i, j]
    for i in range(d):
        Bh[k + i, i] = 1.0
    Q, R = np.linalg.qr(Bh)
    Y = np.ascontiguousarray(Q[:k].T)
    upper_solve(R, Y)
    copy2(G, Y)


@compiled_later(counted=True)
def inverse_gram_qr(B, E):
    """``E = (I_k + BB^T)^{-1} = R_2^{-1}R_2^{-T}`` from the QR of ``[B^T; I_k]``."""
    k, d = B.shape
    Bh = np.zeros((d + k, k))
    for i in range(d):
        for j in range(k):
            Bh[i, j] = B[j, i]
    for i in range(k):
        Bh[d + i, i] = 1.0
    _, R = np.linalg.qr(Bh)
    Ri = np.eye(k)
    upper_solve(R, Ri)
    mm(Ri, np.ascontiguousarray(Ri.T), E)


@compiled_later(inline=True, counted=True)
def gain(B, G, H, X, E, want_E):
    r"""The L2 gain :math:`G = (I + B^TB)^{-1}B^T` (``d x k``) of ``B``, and :math:`E`.

    :math:`E = (I_k + BB^T)^{-1}`; False where ``B`` is not finite. A Cholesky solve
    with :math:`I_k + BB^T` while :math:`\|B\|_F^2 < 10^3`, Householder QR of
    :math:`[B; I_d]` beyond, as :func:`gaussian_pde._common.linalg.l2_gain`.
    """
    k, d = B.shape
    n2 = 0.0
    for x in B.ravel():
        n2 += x * x
    if not math.isfinite(n2):
        if not finite(B):
            return False
    if k == 1 and n2 < 1e300 and not want_E:
        for i in range(d):
            G[i, 0] = B[0, i] / (1.0 + n2)
        return True
    if n2 < _GAIN_SOLVE_MAX:
        for i in range(k):
            for j in range(k):
                acc = 1.0 if i == j else 0.0
                for p in range(d):
                    acc += B[i, p] * B[j, p]
                H[i, j] = acc
        if want_E:                        # E = H^{-1}, G = B^T E
            for i in range(k):
                for j in range(k):
                    E[i, j] = 1.0 if i == j else 0.0
            if cholesky_solve(H, E):
                for i in range(d):
                    for j in range(k):
                        acc = 0.0
                        for p in range(k):
                            acc += B[p, i] * E[p, j]
                        G[i, j] = acc
                return True
        else:                             # X = H^{-1} B, G = X^T
            copy2(X, B)
            if cholesky_solve(H, X):
                for i in range(d):
                    for j in range(k):
                        G[i, j] = X[j, i]
                return True
    gain_qr(np.ascontiguousarray(B), G)
    if want_E:
        inverse_gram_qr(np.ascontiguousarray(B), E)
    return True


@compiled_later()
def fill_nan(out):
    """``out[:] = NaN``: a field that does not exist there (the integrator rejects the step)."""
    for i in range(out.size):
        out[i] = np.nan


@compiled_later()
def spread_ok(Z, d):
    """Whether the non-zero column norms of ``L = Z[:, :d]`` span less than :data:`SPREAD_MAX`."""
    cmax = 0.0
    cmin = np.inf
    for j in range(d):
        s = 0.0
        for i in range(d):
            s += Z[i, j] * Z[i, j]
        c = math.sqrt(s)
        if c > cmax:
            cmax = c
        if c > 0 and c < cmin:
            cmin = c
    return not (cmax > SPREAD_MAX * cmin)
