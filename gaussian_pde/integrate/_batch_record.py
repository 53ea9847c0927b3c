"""What the batch integrator and :func:`gaussian_pde.solve` share below them.

The per-trajectory record of a batch (statuses, messages, final factors, counts) that the
compiled integrator fills, and the units of the mean in a solver's state. A leaf of the
integrate package: it imports no integrator.
"""

from __future__ import annotations

import math

import numpy as np

from .._common.linalg import numerical_rank
from ._events import rank_note
from ._results import BatchSolution, Status

__all__ = ["BatchRecord", "max_abs", "mean_scale", "mean_scales"]


class BatchRecord:
    """Per-trajectory outcome, indexed by global trajectory number."""

    def __init__(self, nb, d, t1, t_eval, method):
        self.status = np.full(nb, Status.FINISHED, dtype=object)
        self.message = ["reached the end of t_span"] * nb
        self.t_final = np.full(nb, t1)
        self.L_final = np.empty((nb, d, d))
        self.t_blowup = np.full(nb, np.nan)
        self.nfev = np.zeros(nb, dtype=int)
        self.nsteps = np.zeros(nb, dtype=int)
        self.implicit = np.full(nb, method == "rosenbrock")
        self.cov = None if t_eval is None else np.full((nb, t_eval.size, d, d), np.nan)

    def note_rank(self, cov0s):
        """Say in the messages where a covariance lost rank in rounding (``rank_note``)."""
        cov_final = self.L_final @ np.swapaxes(self.L_final, -1, -2)
        # the ranks of the whole stack in two batched eigvalsh calls; rank_note words
        # the few rows whose rank fell
        finite = np.all(np.isfinite(cov_final), axis=(-2, -1))
        fell = np.zeros(finite.shape, dtype=bool)
        if finite.any():
            fell[finite] = (numerical_rank(cov_final[finite])
                            < numerical_rank(cov0s[finite]))
        for b in np.flatnonzero(fell):
            self.message[b] += rank_note(cov0s[b], cov_final[b], self.status[b])

    def result(self, t_eval, ncalls):
        cov_final = self.L_final @ np.swapaxes(self.L_final, -1, -2)
        return BatchSolution(t=t_eval, cov=self.cov, t_final=self.t_final, cov_final=cov_final,
                             factor_final=self.L_final, status=self.status,
                             t_blowup=self.t_blowup, message=self.message, nfev=self.nfev,
                             nsteps=self.nsteps, ncalls=ncalls, implicit=self.implicit)


def mean_scale(mean0, rtol, atol):
    r"""Units of the mean in the solver's state for ``method="auto"``.

    A power of 2 near :math:`(\text{rtol}/\text{atol})\max_i|\alpha_{0,i}|`. The
    solvers control the error of every entry :math:`y_i` to
    :math:`\text{atol} + \text{rtol}\,|y_i|`; for the scaled mean that is
    :math:`\text{rtol}\,(\max_i|\alpha_{0,i}| + |\alpha_i|)` in the mean's own units:
    relative to the mean's size as a vector, whatever its scale, instead of the absolute
    ``atol`` (made for the entries of ``L``) on entries of the mean that pass near zero,
    which made the mean dictate the step size (up to 1.3 times the evaluations of the
    covariance alone, for errors far below ``rtol``). Identity (1) without a mean or for
    a zero mean; only for a type whose mean equation is linear
    (:func:`~gaussian_pde.integrate._moment_field.mean_is_linear`, checked by the caller).
    Computed on Python floats (a short solve spends microseconds, not tens, on it).
    """
    if mean0 is None:
        return 1.0
    return _units(max_abs(mean0), rtol, atol)


def mean_scales(mean0s, rtol, atol):
    """:func:`mean_scale` of every row of ``mean0s`` (``(B, d)``), as an array.

    The sizes of a finite stack in one NumPy reduction (the same numbers: a maximum of
    absolute values is exact), then the units as :func:`mean_scale` takes them.
    """
    if np.isfinite(mean0s).all():
        sizes = np.max(np.abs(mean0s), axis=1, initial=0.0).tolist()
    else:
        sizes = [max_abs(mu) for mu in mean0s]
    return np.array([_units(size, rtol, atol) for size in sizes])


def _units(size, rtol, atol):
    if not (size > 0 and math.isfinite(size)):
        return 1.0
    exponent = round(math.log2(rtol / atol) + math.log2(size))
    return 2.0 ** min(max(exponent, -1000), 1000)


def max_abs(vector):
    r""":math:`\max_i |v_i|` of a 1-D float array, as a Python float."""
    return max(map(abs, vector.tolist()), default=0.0)
