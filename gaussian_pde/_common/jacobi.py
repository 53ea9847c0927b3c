r"""One-sided Jacobi SVD of a small matrix, written once for the compiled integrator.

The compiled integrator needs the singular values (and right singular vectors) of
``d x d`` factors, ``d`` a few, in two rare places: the factor's re-orthogonalisation
and the rank event. One-sided Jacobi (Hestenes) rotates pairs of columns of
:math:`A` (``r x c``) until they are orthogonal,

.. math::

   A V = U\Sigma, \qquad V^TV = I,

each rotation :math:`(p, q)` chosen so that the new columns are orthogonal: with
:math:`\alpha = \|a_p\|^2`, :math:`\beta = \|a_q\|^2`, :math:`\gamma = a_p^Ta_q`,
:math:`\zeta = (\beta - \alpha)/(2\gamma)`, :math:`t = \operatorname{sign}(\zeta)/
(|\zeta| + \sqrt{1 + \zeta^2})`, :math:`c = 1/\sqrt{1 + t^2}`, :math:`s = ct`,
:math:`a_p \leftarrow ca_p - sa_q`, :math:`a_q \leftarrow sa_p + ca_q` (and the same on
the columns of :math:`V`). The sweeps stop when every pair satisfies
:math:`|\gamma| \le \varepsilon\sqrt{\alpha\beta}`; the singular values are then the
column norms :math:`\sigma_j = \|a_j\|`, accurate to a few units of rounding relative
to each :math:`\sigma_j` (J. Demmel and K. Veselić, SIAM J. Matrix Anal. Appl. 13, 1992).
The eigenvalues of :math:`AA^T` are :math:`\sigma_j^2`.

Plain Python over scalar loops: the compiled integrator compiles it with Numba beside its
own helpers (a call into LAPACK through NumPy would compile NumPy's SVD in every process
on a machine with an empty cache).
"""

from __future__ import annotations

import math

__all__ = ["jacobi_svd"]

#: sweeps at most (a handful suffice at the sizes here: convergence is quadratic)
MAX_SWEEPS = 60

#: the orthogonality a pair of columns is rotated to (a unit of rounding, double)
_EPS = 2.220446049250313e-16


def jacobi_svd(A, s, V):
    r"""The SVD :math:`A_0 = U\Sigma V^T` of ``A`` (``r x c``, ``r >= c``), in place.

    On return ``A`` holds :math:`U\Sigma` (orthogonal columns), ``s`` (``c``) the singular
    values in decreasing order and ``V`` (``c x c``) the right singular vectors as its
    columns, in the order of ``s``. Returns False where an entry of ``A`` is not finite
    (then ``s`` and ``V`` are not set).
    """
    r, c = A.shape
    for i in range(r):
        for j in range(c):
            if not math.isfinite(A[i, j]):
                return False
    for i in range(c):
        for j in range(c):
            V[i, j] = 1.0 if i == j else 0.0
    for _ in range(MAX_SWEEPS):
        rotated = False
        for p in range(c - 1):
            for q in range(p + 1, c):
                alpha = 0.0
                beta = 0.0
                gamma = 0.0
                for i in range(r):
                    alpha += A[i, p] * A[i, p]
                    beta += A[i, q] * A[i, q]
                    gamma += A[i, p] * A[i, q]
                if not abs(gamma) > _EPS * math.sqrt(alpha) * math.sqrt(beta):
                    continue
                rotated = True
                zeta = (beta - alpha) / (2.0 * gamma)
                if abs(zeta) > 1e150:           # (1 + zeta^2 would overflow): t ~ 1/(2 zeta)
                    t = 0.5 / zeta
                else:
                    t = math.copysign(1.0, zeta) / (abs(zeta) + math.sqrt(1.0 + zeta * zeta))
                cs = 1.0 / math.sqrt(1.0 + t * t)
                sn = cs * t
                for i in range(r):
                    ap = A[i, p]
                    aq = A[i, q]
                    A[i, p] = cs * ap - sn * aq
                    A[i, q] = sn * ap + cs * aq
                for i in range(c):
                    vp = V[i, p]
                    vq = V[i, q]
                    V[i, p] = cs * vp - sn * vq
                    V[i, q] = sn * vp + cs * vq
        if not rotated:
            break
    for j in range(c):
        acc = 0.0
        for i in range(r):
            acc += A[i, j] * A[i, j]
        s[j] = math.sqrt(acc)
    for j in range(1, c):          # decreasing order (insertion: c is small), V alike
        i = j
        while i > 0 and s[i - 1] < s[i]:
            s[i - 1], s[i] = s[i], s[i - 1]
            for a in range(c):
                V[a, i - 1], V[a, i] = V[a, i], V[a, i - 1]
            for a in range(r):
                A[a, i - 1], A[a, i] = A[a, i], A[a, i - 1]
            i -= 1
    return True
