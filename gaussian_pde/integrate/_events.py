r"""The events every solver of the package stops at: one definition of each.

docs/math.md section 10 states them; every solver (:func:`gaussian_pde.solve`,
:func:`gaussian_pde.solve_batch`, :func:`gaussian_pde.solve_closure`,
:func:`gaussian_pde.solve_masked_closure`, :func:`gaussian_pde.simulate_particles`)
evaluates them through the functions here, vectorised over leading axes.

* **Blow-up.** :math:`\operatorname{tr}\Sigma` passes ``blowup_threshold`` times its
  initial value. Near a finite-time singularity :math:`u = 1/\operatorname{tr}\Sigma`
  vanishes like :math:`C(t^* - t)^\beta`, :math:`\beta > 0`; then
  :math:`p = uu''/u'^2 = (\beta - 1)/\beta < 1` and

  .. math:: t^* = t - \frac{u}{u'(1 - p)}

  (exact for a power law; :math:`\beta = 1`, :math:`p = 0` for the Riccati blow-up of
  softmax). Exponential growth has :math:`p = 1` and polynomial growth :math:`p > 1`:
  those are not blow-ups and are followed further. A first finite estimate is confirmed
  after the trace has grown ``CONFIRM_GROWTH`` times more, when the new estimate moves by
  at most ``CONFIRM_TOL`` times the time that was left: an accelerating exponential looks
  locally like a singularity, but its estimates drift.
* **Steady state.** :math:`\|\Sigma'\|_F \le` ``steady_tol``
  :math:`\|\Sigma\|_F` + ``steady_atol``; on when ``steady_tol`` is given or
  ``steady_atol`` is positive.
* **Rank collapse.** An eigenvalue of :math:`\Sigma/\operatorname{tr}\Sigma` that
  started above ``rank_tol`` falls below it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._common.linalg import has_full_numerical_rank, numerical_rank
from .._common.validation import validate_positive, validate_tolerance
from ._results import Status

__all__ = ["EventOptions", "event_options", "rank_note", "rank_notes", "blowup_probe_step",
           "blowup_signature", "blowup_extrapolate", "blowup_verdict", "steady_gap",
           "rank_first", "rank_gap", "MAX_GROWTH", "CONFIRM_GROWTH", "CONFIRM_TOL"]

#: the largest trace ratio followed before giving up on a growing solution
MAX_GROWTH = 1e200
#: a blow-up estimate is confirmed after the trace grows this much further, when the new
#: estimate of t* moves by at most CONFIRM_TOL times the time that was left to t*
CONFIRM_GROWTH = 100.0
CONFIRM_TOL = 0.01
#: the growth to follow next when an estimate shows no finite-time signature
_NONFINITE_GROWTH = 1e8
#: ``p`` below this is a finite-time signature
_P_FINITE = 0.9
#: the probe step for ``u''``, as a fraction of the time ``u / |u'|`` left at that rate
_PROBE = 1e-4


@dataclasses.dataclass(frozen=True)
class EventOptions:
    r"""The validated event settings shared by every solver.

    Attributes
    ----------
    blowup_threshold : float
        Blow-up when :math:`\operatorname{tr}\Sigma` passes this multiple of its initial
        value (greater than 1).
    steady_tol, steady_atol : float or None, float
        The steady-state test :math:`\|\Sigma'\|_F \le` ``steady_tol``
        :math:`\|\Sigma\|_F` + ``steady_atol``.
    rank_tol : float or None
        The rank-collapse threshold on eigenvalues of :math:`\Sigma/\operatorname{tr}\Sigma`.
    """

    blowup_threshold: float = 1e8
    steady_tol: float | None = None
    steady_atol: float = 0.0
    rank_tol: float | None = None

    @property
    def steady_on(self) -> bool:
        """Whether the steady-state event is on."""
        return self.steady_tol is not None or self.steady_atol > 0


def event_options(blowup_threshold=1e8, steady_tol=None, steady_atol=0.0, rank_tol=None):
    """Checked :class:`EventOptions` (errors name the argument)."""
    blowup_threshold = validate_positive(blowup_threshold, "blowup_threshold")
    if not blowup_threshold > 1:
        raise ValueError(f"`blowup_threshold` must be greater than 1, got {blowup_threshold}.")
    if steady_tol is not None:
        steady_tol = validate_positive(steady_tol, "steady_tol")
    steady_atol = validate_positive(steady_atol, "steady_atol", allow_zero=True)
    if rank_tol is not None:
        rank_tol = validate_tolerance(rank_tol, "rank_tol")
    return EventOptions(blowup_threshold, steady_tol, steady_atol, rank_tol)


# ----------------------------------------------------------------------------------------
# blow-up
# ----------------------------------------------------------------------------------------

def blowup_probe_step(tr, dtr):
    r"""The step ``h`` along the flow at which ``u'`` is sampled again for ``u''``.

    ``_PROBE`` of the time :math:`u/|u'| = \operatorname{tr}\Sigma/(\operatorname{tr}\Sigma)'`
    left at the present rate; 1 where the trace is not growing (no estimate then).
    """
    tr, dtr = np.asarray(tr, dtype=float), np.asarray(dtr, dtype=float)
    return _PROBE * tr / np.where(dtr > 0, dtr, 1.0)


def blowup_signature(t, u, du, du2):
    r"""The finite-time signature of :math:`u = 1/\operatorname{tr}\Sigma` and its blow-up time.

    :math:`p = uu''/u'^2` and :math:`t^* = t - u/(u'(1 - p))`; finite where
    :math:`u' < 0` and :math:`p < 0.9`. Every estimate of the package (the solvers' from
    the field, :func:`gaussian_pde.classify_trajectory`'s from samples) goes through here.

    Returns
    -------
    t_star, p, finite : ndarray or float, ndarray or float, ndarray of bool or bool
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        p = u * du2 / du**2
        t_star = t - u / (du * (1.0 - p))
        finite = (np.asarray(du) < 0) & (p < _P_FINITE) & np.isfinite(t_star)
    if np.ndim(finite) == 0:
        return float(t_star), float(p), bool(finite)
    return t_star, p, finite


def blowup_extrapolate(t, tr, dtr, tr2, dtr2, h):
    r"""Blow-up time from the trace and its rate at ``t`` and ``h`` further along the flow.

    With :math:`u = 1/\operatorname{tr}\Sigma`, :math:`u' = -(\operatorname{tr}\Sigma)'/
    (\operatorname{tr}\Sigma)^2` at both points and :math:`u'' \approx (u'_2 - u'_1)/h`,
    :func:`blowup_signature`.

    Returns
    -------
    t_star : ndarray or float
        The estimate (meaningful where ``finite``).
    finite : ndarray of bool or bool
        Where the trace grows with a finite-time signature (:math:`p < 0.9`).
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # (dtr / tr) / tr, not dtr / tr**2: the square of a trace past 1e154 overflows
        tr, dtr, tr2, dtr2 = (np.asarray(x, dtype=float) for x in (tr, dtr, tr2, dtr2))
        u, du = 1.0 / tr, -(dtr / tr) / tr
        du2 = (-(dtr2 / tr2) / tr2 - du) / h
    t_star, _, finite = blowup_signature(t, u, du, du2)
    finite = finite & (dtr > 0) & np.isfinite(du2)
    if np.ndim(finite) == 0:
        return t_star, bool(finite)
    return t_star, finite


def blowup_verdict(t_star, finite, t, limit, suspected):
    """What a passed blow-up threshold means, the same for every solver.

    Parameters
    ----------
    t_star, finite : float, bool
        :func:`blowup_extrapolate` at time ``t``.
    t : float
        Where the trace passed ``limit`` times its start.
    limit : float
        The trace ratio that was passed.
    suspected : (float, float) or None
        ``(t*, t)`` of an earlier finite estimate awaiting confirmation.

    Returns
    -------
    (Status.BLOWUP, message), (Status.FAILED, message), or (None, (suspected, next_limit))
        The last: go on to ``next_limit`` and look again.
    """
    if finite and suspected is not None and (
            abs(t_star - suspected[0]) <= CONFIRM_TOL * (suspected[0] - suspected[1])):
        return Status.BLOWUP, (f"finite-time blow-up: tr(cov) passed "
                               f"{limit / CONFIRM_GROWTH:.3g} x its initial value at "
                               f"t = {suspected[1]:.10g} and {limit:.3g} x at t = {t:.10g}; "
                               f"estimated blow-up time t* = {t_star:.12g}")
    grow = CONFIRM_GROWTH if finite else _NONFINITE_GROWTH
    if limit * grow > MAX_GROWTH:
        return Status.FAILED, ("the covariance grows without bound but not as a finite-time "
                               f"blow-up; stopped at tr(cov) = {limit:.3g} x initial")
    return None, ((t_star, t) if finite else None, limit * grow)


# ----------------------------------------------------------------------------------------
# steady state and rank collapse
# ----------------------------------------------------------------------------------------

def steady_gap(cov, dcov, steady_tol, steady_atol):
    r""":math:`\log\|\Sigma'\|_F - \log(\text{steady\_tol}\,\|\Sigma\|_F + \text{steady\_atol})`.

    Negative at a steady state; the event is its downward crossing. ``steady_tol=None``
    counts as 0. Vectorised over leading axes.
    """
    rtol = 0.0 if steady_tol is None else steady_tol
    lhs = np.linalg.norm(dcov, axis=(-2, -1)) + 1e-300
    rhs = rtol * np.linalg.norm(cov, axis=(-2, -1)) + steady_atol + 1e-300
    return np.log(lhs) - np.log(rhs)


def rank_first(cov0, rank_tol):
    """Index (ascending) of the smallest eigenvalue of ``cov0 / tr cov0`` above ``rank_tol``.

    ``d`` where none is (the event is then off). Vectorised over leading axes.
    """
    cov0 = np.asarray(cov0, dtype=float)
    tr0 = np.maximum(np.trace(cov0, axis1=-2, axis2=-1), np.finfo(float).tiny)
    w0 = np.linalg.eigvalsh(cov0) / np.asarray(tr0)[..., None]
    return np.sum(w0 <= rank_tol, axis=-1)


def rank_gap(cov, first, rank_tol):
    """Eigenvalue ``first`` of ``cov / tr cov`` minus ``rank_tol``: negative after a collapse.

    Vectorised over leading axes (``first`` broadcast against them; clipped to ``d - 1``).
    """
    w = np.linalg.eigvalsh(cov)
    d = w.shape[-1]
    j = np.minimum(np.asarray(first), d - 1)
    wj = np.take_along_axis(w, np.broadcast_to(j, w.shape[:-1])[..., None], axis=-1)[..., 0]
    return wj / np.maximum(w.sum(-1), 1e-300) - rank_tol


def rank_note(cov0, cov_final, status):
    r"""What the message adds when the covariance lost rank in rounding (else ``""``).

    The factor form keeps the rank exactly, but an eigenvalue of
    :math:`\Sigma/\operatorname{tr}\Sigma` that decays (a true, asymptotic rank
    collapse) can fall below ``d * eps``, where the returned covariance no longer
    resolves it. Without ``rank_tol`` no event stops there, so the status stays what the
    dynamics gave, and the message says so.
    """
    if status == Status.RANK_COLLAPSE or not np.all(np.isfinite(cov_final)):
        return ""
    if has_full_numerical_rank(cov_final):   # most runs: nothing was lost
        return ""
    r1 = int(numerical_rank(cov_final))
    if r1 >= cov_final.shape[-1]:      # full rank after all (the quick test is one-sided)
        return ""
    r0 = int(numerical_rank(cov0))
    if r1 >= r0:
        return ""
    return (f"; the covariance's numerical rank fell from {r0} to {r1} (an eigenvalue of "
            "cov / tr(cov) decayed below d * eps, where rounding no longer resolves it; "
            "pass rank_tol to stop with status 'rank_collapse' instead)")


def rank_notes(cov0s, cov_finals, statuses):
    """``(b, note)`` for every row of a stack whose :func:`rank_note` is not empty.

    The ranks of the whole stack in two batched ``eigvalsh`` calls; :func:`rank_note`
    words the few rows whose rank fell.
    """
    finite = np.all(np.isfinite(cov_finals), axis=(-2, -1))
    fell = np.zeros(finite.shape, dtype=bool)
    if finite.any():
        fell[finite] = numerical_rank(cov_finals[finite]) < numerical_rank(cov0s[finite])
    return [(b, rank_note(cov0s[b], cov_finals[b], statuses[b])) for b in np.flatnonzero(fell)]
