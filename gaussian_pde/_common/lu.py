r"""Dense LU with partial pivoting, written once for the compiled stiff steppers.

The Rosenbrock steps (RODAS4P2) of the compiled engine, for the Gaussians' factors and
for the certified limits' plain states alike, solve :math:`(I/(\gamma h) - J)\,u = r` for the stages of every step:
:math:`n` is small (the factor's entries, at most a few hundred), so a textbook
in-place factorisation :math:`PW = LU` (unit lower :math:`L` below the diagonal, :math:`U`
on and above it) beats a call into LAPACK per step. Both functions are plain Python
over scalar loops; the compiled integrators compile them with Numba (``njit``) beside
their own helpers, and call them from compiled code only.
"""

from __future__ import annotations

__all__ = ["lu_factor", "lu_solve"]


def lu_factor(W, piv):
    """Factor ``W`` (n x n) in place, the row swaps into ``piv``; False where singular.

    Column :math:`k` takes as pivot its largest entry on or below the diagonal; the
    multipliers are formed with the pivot's reciprocal. A zero or NaN pivot (a singular
    or non-finite matrix) stops the factorisation and answers False.
    """
    n = W.shape[0]
    for k in range(n):
        p = k
        big = abs(W[k, k])
        for i in range(k + 1, n):
            if abs(W[i, k]) > big:
                big = abs(W[i, k])
                p = i
        piv[k] = p
        if not big > 0.0:
            return False
        if p != k:
            for j in range(n):
                W[k, j], W[p, j] = W[p, j], W[k, j]
        inv = 1.0 / W[k, k]
        for i in range(k + 1, n):
            W[i, k] *= inv
            lik = W[i, k]
            if lik != 0.0:
                for j in range(k + 1, n):
                    W[i, j] -= lik * W[k, j]
    return True


def lu_solve(W, piv, x):
    """Solve ``W0 x = b`` in place (``x`` holds ``b``) with the factors of :func:`lu_factor`."""
    n = W.shape[0]
    for k in range(n):
        p = piv[k]
        if p != k:
            x[k], x[p] = x[p], x[k]
    for i in range(n):
        acc = x[i]
        for j in range(i):
            acc -= W[i, j] * x[j]
        x[i] = acc
    for i in range(n - 1, -1, -1):
        acc = x[i]
        for j in range(i + 1, n):
            acc -= W[i, j] * x[j]
        x[i] = acc / W[i, i]
