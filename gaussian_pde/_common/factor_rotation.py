r"""Re-factoring the factor during a run: :math:`L \mapsto LW`, :math:`W` orthogonal.

The factor-form flow :math:`L' = M(LL^T)\,L` (docs/math.md section 10.1) is equivariant
under right multiplication by a constant orthogonal :math:`W`: :math:`LW` has the same
covariance :math:`LW(LW)^T = LL^T`, hence the same :math:`M`, and
:math:`(LW)' = M\,(LW)`. So the factor may be replaced by :math:`LW` at any time, and
its rate by :math:`L'W`, without changing the trajectory of :math:`\Sigma`.

Why it is needed: from :math:`L_0`, the flow gives :math:`L = FL_0`, and once the
covariance's eigenvalues spread over many orders of magnitude every column of
:math:`FL_0` lies close to the growing directions. A small eigenvalue of :math:`\Sigma`
is then a cancellation between long columns: with singular values
:math:`s_1 \ge s_2 \ge \dots` of :math:`L` and column norms sorted the same way,
:math:`c_1 \ge c_2 \ge \dots`, direction :math:`j` is held only to the rounding
:math:`\varepsilon c_j` of the columns, while the solver asks for
:math:`\text{atol} + \text{rtol}\,s_j` on it. Once the rounding comes near that
tolerance the computed field is noise at the scale of the error test and the steps
shrink to nothing (a 6-D run of two L2 heads spent ``max_nfev`` at :math:`t \approx 6`,
:math:`\lambda_{\min}/\lambda_{\max} \approx 10^{-15}`, where
:math:`c_j/s_j \approx 10^6`). With :math:`W` the right singular vectors of :math:`L`,
:math:`LW = U\operatorname{diag}(s)` has orthogonal columns of norms :math:`s_j`: each
direction of :math:`\Sigma` is one column, held to its own relative precision.

The solvers re-factor when the rounding reaches ``REFACTOR_ABOVE`` of the tolerance,

.. math::

    \max_{j:\ c_j > 10 s_j}
    \frac{\varepsilon\,c_j}{\text{atol} + \text{rtol}\,s_j} > \texttt{REFACTOR\_ABOVE},

(:func:`cancellation_excess`). A direction whose column lies below ``atol`` (a stiff
collapse towards a lower rank, whose vanishing column turns towards the growing
directions at the stiff rate) never asks for a re-factoring: its precision is not
tested, and re-factoring for it would only restart a stiff solver again and again.
Columns that are exactly zero (a rank-deficient :math:`\Sigma_0`, see
:func:`gaussian_pde._common.linalg.psd_factor`) are left out and never rotated, so the
flow keeps them zero and the rank stays exact.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["REFACTOR_ABOVE", "REFACTOR_ABOVE_RESTART", "REFACTOR_EVERY", "cancellation_excess",
           "cancellation_exceeds", "rotation"]

_EPS = np.finfo(float).eps
#: ``solve_batch`` re-factors once the rounding of a cancelling direction reaches this
#: fraction of the solver's tolerance on it: it rotates a row in place, rate included,
#: and steps on with the same step size
REFACTOR_ABOVE = 1e-3
#: ``solve``'s event loop waits until the rounding reaches this larger fraction: each
#: re-factoring restarts ``solve_ivp``, which finds its step size (and LSODA its order)
#: again (at 1e-3 a K = -Q run to t = 1e8 at rtol 1e-11 restarted until its
#: budget was spent)
REFACTOR_ABOVE_RESTART = 0.1
#: a direction counts as cancelling where its column is this many times longer than it
#: (after a re-factoring, c_j = s_j: no direction counts, whatever the tolerances)
_CANCELS = 10.0
#: the solvers look every this many accepted steps: the cancellation builds up over many
#: steps, and a look (an SVD, ~100 us) costs about as much as a small system's step; at
#: 16, 1.06 x the CPU time of runs without the looks (8: 1.2 x), the same steps on the
#: 6-D L2 run as every 8 steps (every 64: 20 % more evaluations)
REFACTOR_EVERY = 16


def cancellation_excess(L, atol, rtol):
    r""":math:`\max_j \varepsilon c_j/(\text{atol} + \text{rtol}\,s_j)` over cancelling directions.

    ``0`` for orthogonal columns (and for a zero factor); NaN where ``L`` is not finite.
    Stacks ``(..., d, d)`` broadcast.
    """
    L = np.asarray(L, dtype=float)
    if L.ndim == 2:      # one factor: the fewest NumPy calls (it runs in the step loop)
        try:
            s = np.linalg.svd(L, compute_uv=False)
        except np.linalg.LinAlgError:   # not finite
            return float("nan")
        if not np.isfinite(s[0]):
            return float("nan")
        c = np.sqrt((L * L).sum(axis=0))
        c.sort()
        c = c[::-1]
        ex = np.where(c > _CANCELS * s, _EPS * c / (atol + rtol * s), 0.0)
        return float(ex.max())
    finite = np.isfinite(L).all(axis=(-2, -1))
    L = np.where(finite[..., None, None], L, 0.0)
    c = -np.sort(-np.sqrt(np.einsum("...ij,...ij->...j", L, L)), axis=-1)
    s = np.linalg.svd(L, compute_uv=False)
    ex = np.where(c > _CANCELS * s, _EPS * c / (atol + rtol * s), 0.0).max(axis=-1)
    return np.where(finite, ex, np.nan)


def cancellation_exceeds(L, atol, rtol, level, fro2=None):
    r"""Whether :func:`cancellation_excess` of one factor is above ``level``.

    Every cancelling direction has
    :math:`\varepsilon c_j/(\text{atol} + \text{rtol}\,s_j) \le \varepsilon c_j/\text{atol}
    \le \varepsilon\lVert L\rVert_F/\text{atol}`, so where that bound is at most
    ``level`` the answer is ``False`` without the SVD (on a run whose factor stays
    below :math:`0.1\,\text{atol}/\varepsilon`, 450 at the default ``atol``, every
    look). ``fro2``: :math:`\lVert L\rVert_F^2` if known. Not finite: ``False``, as
    the comparison of :func:`cancellation_excess`'s NaN is.
    """
    if atol > 0:
        if fro2 is None:
            L = np.asarray(L, dtype=float)
            fro2 = float(np.einsum("ij,ij->", L, L))
        if _EPS * math.sqrt(fro2) <= level * atol:   # NaN fails and goes on to the SVD
            return False
    return bool(cancellation_excess(L, atol, rtol) > level)


def rotation(L):
    r"""Orthogonal :math:`W` (``d x d``) with orthogonal columns in :math:`LW`.

    :math:`W` rotates the non-zero columns of ``L`` among themselves onto the right
    singular vectors of that block (zero columns map to themselves), so
    :math:`LW = [U\operatorname{diag}(s) \mid 0]` up to the column order.
    """
    L = np.asarray(L, dtype=float)
    d = L.shape[-1]
    nz = np.flatnonzero(np.sum(L * L, axis=-2) > 0)
    W = np.eye(d)
    if nz.size >= 2:
        _, _, Vt = np.linalg.svd(L[:, nz], full_matrices=False)
        W[np.ix_(nz, nz)] = Vt.T
    return W
