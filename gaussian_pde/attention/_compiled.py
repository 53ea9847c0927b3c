r"""The softmax factor field compiled (Numba).

It serves the Fortran steppers' right-hand side (:func:`softmax_field`).

A single softmax head's field on the flattened state :math:`Z = [L \mid \alpha]`
(``d x m``, row-major; ``m = d`` without the mean) is three products,

.. math::

    P = \begin{bmatrix} cV \\ K \\ Q\end{bmatrix} Z, \qquad
    G = (KZ)^T (QZ), \qquad Z' = (cVZ)\,G,

with, when the state holds the mean, the last row of :math:`G` replaced by
:math:`[0, \dots, 0, 1/c]` so that the last column of :math:`Z'` is
:math:`M\alpha + V\alpha` (docs/math.md 10.1). In NumPy the three products of these
small matrices cost about 0.3 us each in call overhead; compiled, one call does all of
them in about 0.15 us plus Numba's dispatch.

The loops are written here as plain Python and compiled at their first request through
:func:`kernel`, so that importing this module (and ``gaussian_pde``) does not import
Numba (about 0.1 s); the compilation is cached on disk (``cache=True``).
"""

import functools


@functools.cache
def kernel(name):
    """The loop ``name`` of this module compiled by Numba, or None without Numba."""
    try:
        from numba import njit
    except ImportError:         # pragma: no cover - numba is a dependency
        return None
    return njit(cache=True)(globals()[name])


def softmax_field(y, W, ws, out):
    """Write the field of the flat state ``y`` into the flat ``out``.

    ``W`` is ``[cV; K; Q]`` (``(d + 2k) x d``); ``ws`` is scratch of shape
    ``(d + 2k + m + 1, m)`` whose last row holds ``[0, ..., 0, 1/c]`` when ``m = d + 1``.
    """
    r, d = W.shape
    k = (r - d) // 2
    m = ws.shape[1]
    for i in range(r):                      # P = W Z
        for j in range(m):
            acc = 0.0
            for p in range(d):
                acc += W[i, p] * y[p * m + j]
            ws[i, j] = acc
    for a in range(m):                      # G = (KZ)^T QZ
        for b in range(m):
            acc = 0.0
            for p in range(k):
                acc += ws[d + p, a] * ws[d + k + p, b]
            ws[r + a, b] = acc
    if m > d:                               # the mean's row: V alpha
        for b in range(m):
            ws[r + d, b] = ws[r + m, b]
    for i in range(d):                      # Z' = (cVZ) G
        for j in range(m):
            acc = 0.0
            for p in range(m):
                acc += ws[i, p] * ws[r + p, j]
            out[i * m + j] = acc
