r"""The one source of the key-norm softmax field in factor form.

:func:`keynorm_field` is plain Python over flat arrays: Numba compiles it for the
integrators of ``gaussian_pde`` (:func:`compiled_kernels`), and the tests also run it
uncompiled against the closed form and the quadrature of the definition. Its signature
is the one ``gaussian_pde.attention.compiled_signatures()`` fixes for every type:

``keynorm_field(P, d, m, y, out, ws)``
    ``y`` is the flat state :math:`Z = [L \mid \alpha]` (``d x m``, row-major; ``m = d``
    without the mean, ``d + 1`` with it), ``out`` receives :math:`Z'`, ``ws`` is scratch
    of :func:`scratch_size` entries, ``P = [\gamma, A, V]`` (``A = cK^TQ`` and ``V``
    row-major).

With :math:`H = I + \gamma L^TL` (symmetric positive definite for :math:`\gamma \ge 0`),

.. math::

    L' = VLH^{-1}L^T\,AL, \qquad
    \alpha' = VLH^{-1}L^T(A\alpha - \gamma\alpha) + V\alpha,

which is :math:`L' = ML`, :math:`\alpha' = M\alpha + b` with
:math:`M = V(I + \gamma\Sigma)^{-1}\Sigma A` and :math:`b = V(I + \gamma\Sigma)^{-1}\alpha`
by the push-through identity :math:`(I + \gamma LL^T)^{-1}L = LH^{-1}`
(``keynorm_plugin.derivation``). One Cholesky factorisation of :math:`H` per call; a
non-finite trial state gives NaN, so the integrator rejects the step.
"""

from __future__ import annotations

import functools
import math

__all__ = ["keynorm_field", "keynorm_jacobian", "scratch_size", "pack", "compiled_kernels"]


def scratch_size(d):
    """Scratch entries :func:`keynorm_field` needs for dimension ``d`` (``m = d + 1``)."""
    return 3 * d * (d + 1) + d * d


def pack(gamma, A, V):
    """The parameter vector ``[gamma, A, V]`` (float64)."""
    import numpy as np

    return np.concatenate([[float(gamma)], np.ravel(A), np.ravel(V)]).astype(np.float64)


def keynorm_field(P, d, m, y, out, ws):
    """Write :math:`Z'` of the flat state ``y`` into ``out`` (see the module docstring)."""
    g = P[0]
    a0 = 1
    v0 = 1 + d * d
    W = 0                    # W = A Z, its mean column A alpha - gamma alpha   (d x m)
    U = d * m                # U = L^T W, then H^{-1} U                        (d x m)
    Y = 2 * d * m            # Y = L H^{-1} L^T W                               (d x m)
    H = 3 * d * m            # H = I + gamma L^T L, then its Cholesky factor    (d x d)
    for i in range(d):
        for j in range(m):
            acc = 0.0
            for p in range(d):
                acc += P[a0 + i * d + p] * y[p * m + j]
            ws[W + i * m + j] = acc
    if m > d:
        for i in range(d):
            ws[W + i * m + d] -= g * y[i * m + d]
    for i in range(d):                           # H = I + gamma L^T L (lower half)
        for j in range(i + 1):
            acc = 0.0
            for p in range(d):
                acc += y[p * m + i] * y[p * m + j]
            ws[H + i * d + j] = g * acc + (1.0 if i == j else 0.0)
    for i in range(d):                           # U = L^T W
        for j in range(m):
            acc = 0.0
            for p in range(d):
                acc += y[p * m + i] * ws[W + p * m + j]
            ws[U + i * m + j] = acc
    for j in range(d):                           # Cholesky H = R R^T, in place
        s = ws[H + j * d + j]
        for p in range(j):
            s -= ws[H + j * d + p] * ws[H + j * d + p]
        if not s > 0.0:                          # NaN or overflow: a non-finite state
            for i in range(d * m):
                out[i] = math.nan
            return
        s = math.sqrt(s)
        ws[H + j * d + j] = s
        for i in range(j + 1, d):
            t = ws[H + i * d + j]
            for p in range(j):
                t -= ws[H + i * d + p] * ws[H + j * d + p]
            ws[H + i * d + j] = t / s
    for c in range(m):                           # U <- H^{-1} U
        for i in range(d):
            t = ws[U + i * m + c]
            for p in range(i):
                t -= ws[H + i * d + p] * ws[U + p * m + c]
            ws[U + i * m + c] = t / ws[H + i * d + i]
        for i in range(d - 1, -1, -1):
            t = ws[U + i * m + c]
            for p in range(i + 1, d):
                t -= ws[H + p * d + i] * ws[U + p * m + c]
            ws[U + i * m + c] = t / ws[H + i * d + i]
    for i in range(d):                           # Y = L U
        for j in range(m):
            acc = 0.0
            for p in range(d):
                acc += y[i * m + p] * ws[U + p * m + j]
            ws[Y + i * m + j] = acc
    if m > d:                                    # + alpha: V (Y + [0 | alpha])
        for i in range(d):
            ws[Y + i * m + d] += y[i * m + d]
    for i in range(d):                           # Z' = V Y
        for j in range(m):
            acc = 0.0
            for p in range(d):
                acc += P[v0 + i * d + p] * ws[Y + p * m + j]
            out[i * m + j] = acc


def keynorm_jacobian(P, d, m, y, J, ws):
    """No closed-form Jacobian: the integrators take differences of :func:`keynorm_field`."""
    return False


@functools.cache
def compiled_kernels():
    """``(field, jacobian)`` compiled by Numba with ``gaussian_pde``'s kernel signatures.

    Compiled at the first request and cached on disk (Numba's cache, which honours
    ``NUMBA_CACHE_DIR``).
    """
    from numba import njit

    from gaussian_pde.attention import compiled_signatures

    rhs_sig, jac_sig = compiled_signatures()
    opts = dict(cache=True, error_model="numpy", boundscheck=False)
    return (njit(rhs_sig, _nrt=False, **opts)(keynorm_field),
            njit(jac_sig, _nrt=False, **opts)(keynorm_jacobian))
