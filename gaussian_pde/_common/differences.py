r"""When the closed-form Jacobian holds, and the differences that replace it where not.

The exact Jacobian of an L2 head (:func:`gaussian_pde.integrate._moment_field.moment_jacobian`,
and the compiled field's closed form, :mod:`gaussian_pde.attention._compiled_fields`) is
built from
:math:`P^{-1} = I - \sqrt{2c}\,LGK` and :math:`C = K^T(I_k + BB^T)^{-1}Q`, which the
factor multiplies on both sides. Once the columns of :math:`L` span many orders of
magnitude those products lose digits in proportion to the square of the spread: on a
6-D run of two L2 heads whose covariance grows like :math:`e^{5t}` in two directions,
the error of :math:`J\delta` for a perturbation :math:`\delta` of the size of the
solver's tolerance on each column was :math:`10^{-8}` of that tolerance at a spread of
:math:`3\cdot10^4`, :math:`6\cdot10^{-4}` at :math:`9\cdot10^6` and :math:`10^5` at
:math:`1.6\cdot10^{11}` (against an extended-precision reference), and LSODA, BDF and
Radau, whose Newton iterations and error estimates use :math:`J`, crawled there. The
field itself stays accurate per column (the L2 gain from Householder QR,
:func:`gaussian_pde._common.linalg.l2_gain`), so past ``JACOBIAN_SPREAD_MAX`` the
Jacobian is taken by central differences of the field with a step per column,
:math:`\delta_{ab} = \varepsilon^{1/3}c_b` (:math:`c_b` the norm of column :math:`b`;
a zero column takes the shortest non-zero one), whose error stays near
:math:`\varepsilon^{2/3}` of each column's scale whatever the spread (a step set by the
longest column instead, as entry-wise floors do, moves the short columns far outside
their linear range: an error of 3 tolerances at a spread of :math:`10^{11}`). Softmax
heads need no such switch: their Jacobian is a polynomial in :math:`L` without
differences.
"""

from __future__ import annotations

import numpy as np

from .linalg import JACOBIAN_SPREAD_MAX, closed_form_holds

__all__ = ["JACOBIAN_SPREAD_MAX", "closed_form_holds", "column_steps", "central_jacobian"]

_EPS3 = np.finfo(float).eps ** (1.0 / 3.0)


def column_steps(Z):
    r"""Central-difference steps :math:`\varepsilon^{1/3}c_b`, one per column ``b``.

    ``Z`` of shape ``(..., d, m)`` (a factor, or a factor with the mean's column); a zero
    column takes the step of the shortest non-zero one (``eps^(1/3)`` if all are zero).
    Returns ``(..., d, m)``.
    """
    Z = np.asarray(Z, dtype=float)
    c = np.sqrt(np.einsum("...ij,...ij->...j", Z, Z))
    shortest = np.where(c > 0, c, np.inf).min(axis=-1, keepdims=True)
    shortest = np.where(np.isfinite(shortest), shortest, 1.0)
    return np.broadcast_to((_EPS3 * np.where(c > 0, c, shortest))[..., None, :], Z.shape)


def central_jacobian(field, Z):
    """Jacobian ``(n, n)`` of ``field(Z)`` (flattened row-major) by column-scaled differences.

    ``2 n`` evaluations of ``field`` at states ``Z +- delta_ab e_a e_b^T``; the divisor is
    the perturbation actually made (rounding of ``Z + delta`` included).
    """
    Z = np.asarray(Z, dtype=float)
    d, m = Z.shape
    n = d * m
    steps = column_steps(Z)
    J = np.empty((n, n))
    for j in range(n):
        a, b = divmod(j, m)
        up, down = Z.copy(), Z.copy()
        up[a, b] += steps[a, b]
        down[a, b] -= steps[a, b]
        J[:, j] = ((np.asarray(field(up)) - np.asarray(field(down))).ravel()
                   / (up[a, b] - down[a, b]))
    return J
