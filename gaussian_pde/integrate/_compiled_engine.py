r"""The compiled engine: every trajectory's steps, events and output in Numba.

The one integrator of :func:`gaussian_pde.solve_batch` and of :func:`gaussian_pde.solve`'s
default (:func:`integrate_one`, one trajectory, the same code and bits): the loop over
trajectories runs in compiled code, in parallel over trajectories (threads, each on a
slice of the rows); each trajectory takes

* DOP853 steps with Hairer's stiffness test (:math:`h|\lambda| > 6.1` on 15 accepted
  steps) and a second one for DOP853 crawling at its stability limit and, with
  ``method="auto"``, the switch for good to RODAS4P2 (the steppers:
  :mod:`gaussian_pde.integrate._steppers`);
* the events of :mod:`gaussian_pde.integrate._events`: the blow-up look at the end of
  the step that passed the trace threshold (probe step, extrapolation of
  :math:`1/\operatorname{tr}\Sigma`, confirmation 100 times further up, the clock
  restarted there), steady state, rank collapse and a field's own events
  (``CoreOptions.gaps``: the mixture closure's merges) (bisection on the dense output to
  ``2**-30`` of the step), the evaluation budget, a step below rounding, overflow;
* re-factoring :math:`L \mapsto LW` every 16th accepted step where the columns cancel
  (:mod:`gaussian_pde._common.factor_rotation`);
* dense output at ``t_eval`` (DOP853's 7th-order interpolant, three more evaluations in
  a step that needs it; RODAS4P2's order-3 continuous extension): the covariance (and
  mean) of a batch, the state of a single trajectory, which also records every step
  end without ``t_eval`` and keeps where the trace passed each blow-up threshold
  (located on the dense output to rounding at every blow-up look).

The field is the attention type's :class:`~gaussian_pde.attention._compiled_fields.CompiledField`:
``rhs`` and ``jac`` arrive as first-class functions of fixed signature, so the
integrator is compiled once (cached on disk) for every type. Its large pieces (the
steppers, the dense output, the events, an accepted step, a trajectory) are compiled
once each too and called through their addresses (:func:`_call`): a callee called by
name would be compiled into each of its callers again. The state is
:math:`Z = [L \mid \alpha]` (``d x m``), with the mean where one is given; or a plain
state (:func:`integrate_states`, the certified limits' log-time field), with RODAS4P2 from
the first step, steps landing on ``t_eval``, and instead of the factor events a growth
stop on a measure the field supplies (``CoreOptions.plain``); or a plain state whose field
supplies a factor of a covariance (:func:`integrate_one` with ``cov``, the mixture closure),
on which the factor events run (``CoreOptions.cov_rows``).

The trajectory's outcome comes back as codes and numbers; :func:`_messages` words the
statuses and messages (through :func:`~gaussian_pde.integrate._events.blowup_verdict`
for the blow-up), for both callers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import math
import threading
import typing
import warnings

import numpy as np

from .._common.compiled import (
    ResolvedKernel,
    address_and_signature,
    address_caller,
    imported_sources,
    sources_stamp,
    stamped,
)
from .._common.factor_rotation import _CANCELS, REFACTOR_ABOVE, REFACTOR_EVERY
from ..attention import compiled_field_of
from . import _steppers
from ._events import _NONFINITE_GROWTH, _P_FINITE, _PROBE, CONFIRM_GROWTH, CONFIRM_TOL, MAX_GROWTH
from ._steppers import (
    _EPS,
    _NS,
    _STIFF_STEPS,
    _copy,
    _crawl_counts,
    _dop_eval,
    _finite,
    _next_step_size,
    _nmin,
    _ros_eval,
    _stiffness_counts,
)

__all__ = ["integrate_batch", "integrate_states"]

# outcome codes
FINISHED, BLOWUP, STEADY, RANK, FIELD0, SMALL, SMALL_OVERFLOW, OVERFLOW, GROWTH, NFEV = range(10)
#: a single trajectory's record of states is full (:func:`integrate_one` runs it again
#: with more room)
FULL = 10
#: a plain state with a covariance whose field has no closed-form Jacobian turned stiff:
#: stopped where the stiffness test fired (a Rosenbrock step would cost ``2n + 6``
#: evaluations, its Jacobian by central differences at every step)
STIFF = 11
#: one of the field's own events (``CoreOptions.gaps``) fired, terminal
EVENT = 12

# a trajectory's outcome, one row of ``ires`` (integers) and one of ``fres`` (floats)
#: ``ires``: the outcome code, the evaluations, the accepted steps, and whether the run
#: ended on RODAS4P2 (0 or 1)
I_CODE, I_NFEV, I_NSTEPS, I_IMPLICIT = range(4)
I_SIZE = 4
#: ``fres``: the time the run stopped at and the blow-up time (NaN: none)
F_T, F_T_BLOWUP = 0, 1
#: the time an event, the budget or an overflow stopped the run at (the message's), and
#: for an overflow the end of the step that left the range
F_T_STOP, F_T_NEXT = 2, 3
#: the last blow-up look: the estimate t*, its time, the limit passed, the suspicion
#: ``(s0, s1)`` to confirm, and whether t* is finite (1.0 or 0.0); written over by the
#: stop's slots above, which share their places (a run that stops needs no next look)
F_TSTAR, F_T_LOOK, F_LIMIT, F_S0, F_S1, F_FINITE = range(2, 8)
#: the time from which RODAS4P2 took the steps (``method="auto"``; NaN: never)
F_STIFF_FROM = 8
F_SIZE = 9
#: a single trajectory (a row of ``F_CROSS + MAX_CROSSINGS``, more with the field's own
#: events): the count of blow-up crossings, and their times from ``F_CROSS`` on
F_NCROSS, F_CROSS = 9, 10
#: room for this many blow-up crossings (each passes a limit at least 100 times the last
#: one, up to ``MAX_GROWTH``)
MAX_CROSSINGS = 128
#: then the count of the field's events that fired (``CoreOptions.gaps``), and their
#: times from ``F_GAP_TIMES`` on, as many as the row has room for
F_NGAPS = F_CROSS + MAX_CROSSINGS
F_GAP_TIMES = F_NGAPS + 1



class CoreOptions(typing.NamedTuple):
    r"""The solver options as the compiled driver :func:`_drive` reads them.

    A named tuple of scalars: Numba passes it by value, each field a scalar of its
    own (``float``: float64, ``int``: int64, ``bool``: boolean), the type of
    :func:`_core`'s explicit signature. Built by :func:`_core_options`.

    Attributes
    ----------
    atol, rtol, max_step, blowup_threshold, steady_tol, steady_atol, rank_tol, t0, t1, max_nfev
        Those of :class:`~gaussian_pde.integrate._options.SolverOptions` and its
        :class:`~gaussian_pde.integrate._events.EventOptions`, with a negative number
        for None (``steady_tol``: 0).
    method : int
        0 ``"auto"`` (DOP853, RODAS4P2 once stiff), 1 DOP853, 2 RODAS4P2.
    steady_on : bool
        Whether the steady-state event is on.
    ws_size : int
        The field's scratch size (floats).
    plain : bool
        A plain state (:func:`integrate_states`) rather than :math:`Z = [L \mid \alpha]`:
        no blow-up look and no re-factoring; a row stops with ``GROWTH`` where the
        field's measure of the state (``ws[0]`` after ``rhs`` at it) passes ``tr0``
        times ``blowup_threshold``; the steps land on ``t_eval``, whose output is the
        whole state.
    cov_rows, cov_cols : int
        A plain state with a covariance (``cov_rows > 0``): its field's ``rhs`` leaves in
        ``ws`` the trace of the covariance (``ws[0]``), a factor :math:`F` of it
        (``cov_rows x cov_cols``, row-major, from ``ws[1]``) and its rate :math:`F'` after
        it; called with ``m = 0`` it leaves the trace and :math:`F` only (no rate, no
        evaluation counted). The factor events then run on :math:`\Sigma = FF^T` as on
        :math:`LL^T`: the blow-up look, steady state and rank collapse, located on the
        dense output; the steps do not land on ``t_eval`` and there is no growth stop;
        where the stiffness test fires and the field has no closed-form Jacobian, the run
        stops there (``STIFF``). Zero: none (the growth stop above).
    gaps : int
        A plain state with a covariance whose field has events of its own: called with
        ``m = -1`` its ``rhs`` leaves the measures above and these ``gaps`` values after
        the room of :math:`F'` (from ``ws[1 + 2 cov_rows cov_cols]``). Each is an event
        that fires where its value falls to zero or below, located on the dense output
        as the steady state is; its times are kept (:func:`integrate_one`). Zero: none.
    gaps_terminal : bool
        The first of them to fire stops the run (``EVENT``).
    """

    atol: float
    rtol: float
    max_step: float
    blowup_threshold: float
    steady_tol: float
    steady_atol: float
    rank_tol: float
    t0: float
    t1: float
    max_nfev: int
    method: int
    steady_on: bool
    ws_size: int
    plain: bool
    cov_rows: int
    cov_cols: int
    gaps: int
    gaps_terminal: bool


class Field(typing.NamedTuple):
    r"""The field of one trajectory and the engine's table of pieces.

    Attributes
    ----------
    rhs, jac : first-class functions
        The field :math:`f(Z)` and its closed-form Jacobian (False where none holds
        there), the attention type's compiled kernels.
    P : ndarray
        The trajectory's parameters, as the kernels read them.
    d, m : int
        The state's shape, :math:`Z` is ``d x m`` (``n = d m`` entries).
    fns : ndarray of int
        The addresses of the :data:`_PIECES` (:func:`_call`).
    """

    rhs: object
    jac: object
    P: np.ndarray
    d: int
    m: int
    fns: np.ndarray


class Work(typing.NamedTuple):
    r"""The scratch of one trajectory, cut once from the driver's buffers (:func:`_drive`).

    Attributes
    ----------
    ws : ndarray
        The field's scratch.
    f, fnew, ynew : ndarray, (n,)
        The rate at the step's start, the rate at its end, and its end.
    tmp, tmp2, xa, xb : ndarray, (n,)
        Stage states and rates; ``xa`` takes the dense output.
    K, Kx, F : ndarray, (13, n), (16, n), (7, n)
        DOP853's stages, with the three of the dense output, and its dense-output
        coefficients.
    U, J, W : ndarray, (6, n), (n, n), (n, n)
        RODAS4P2's stages, the Jacobian and :math:`I/(\gamma h) - J` (its LU factors).
    ev : ndarray, (2,) or more
        The steady-state and rank-collapse events' last values; then (a plain state with
        a covariance, ``CoreOptions.cov_rows``) the field's measures at the step's end
        (``ws[0]`` to ``ws[2 cov_rows cov_cols]``) and its own events' last values
        (``CoreOptions.gaps``).
    piv, have, p_out : ndarray of int, (n,), (1,), (1,)
        The LU factors' pivots; 1 where ``F`` holds the current step's coefficients; the
        next output time's index in ``t_eval``.
    """

    ws: np.ndarray
    f: np.ndarray
    fnew: np.ndarray
    ynew: np.ndarray
    tmp: np.ndarray
    tmp2: np.ndarray
    xa: np.ndarray
    xb: np.ndarray
    K: np.ndarray
    Kx: np.ndarray
    F: np.ndarray
    U: np.ndarray
    J: np.ndarray
    W: np.ndarray
    ev: np.ndarray
    piv: np.ndarray
    have: np.ndarray
    p_out: np.ndarray


class Batch(typing.NamedTuple):
    r"""The rows of a batch and where their outcomes go (:func:`_drive` reads a row each).

    Attributes
    ----------
    Y : ndarray, (B, n)
        The initial states, overwritten with the final ones.
    t_eval : ndarray
        The output times (none: no columns).
    p0 : int
        The first output time after ``t0`` (those at ``t0`` are the caller's).
    tr0 : ndarray, (B,)
        The initial traces (a plain state: the growth stop's measure limits).
    first : ndarray of int, (B,)
        The rank event's first eigenvalue index.
    ires, fres : ndarray, (B, I_SIZE) and (B, F_SIZE or more)
        The outcomes (indices ``I_*`` and ``F_*``).
    cov_out, mean_out : ndarray, (B, T, d, d) and (B, T, d)
        A batch's output at ``t_eval`` (a plain state's: ``mean_out``, ``(B, T, n)``).
    rec_t, rec_y, nrec : ndarray, (B, R), (B, R, n), (B,)
        A single trajectory's record of states (a batch: no columns).
    """

    Y: np.ndarray
    t_eval: np.ndarray
    p0: int
    tr0: np.ndarray
    first: np.ndarray
    ires: np.ndarray
    fres: np.ndarray
    cov_out: np.ndarray
    mean_out: np.ndarray
    rec_t: np.ndarray
    rec_y: np.ndarray
    nrec: np.ndarray


class Row(typing.NamedTuple):
    """One trajectory of a :class:`Batch`: its state, its start and its outcome's places.

    ``y`` is the running state (the batch's row, overwritten); ``tr0`` and ``first`` its
    initial trace and the rank event's index; ``nrec`` a one-entry view; the rest the
    row's slices of the batch's arrays of the same names.
    """

    y: np.ndarray
    t_eval: np.ndarray
    tr0: float
    first: int
    ires: np.ndarray
    fres: np.ndarray
    cov_out: np.ndarray
    mean_out: np.ndarray
    rec_t: np.ndarray
    rec_y: np.ndarray
    nrec: np.ndarray


class Clock(typing.NamedTuple):
    """The running scalars of a trajectory, handed to and back from :func:`_accepted`.

    ``t``: the time; ``tau``, ``base``: the time as ``base + tau`` (a blow-up look
    restarts ``tau`` at 0); ``limit``: the next blow-up threshold (times ``tr0``);
    ``susp``, ``s0``, ``s1``: a blow-up suspicion to confirm (the estimate and the time
    of its look); ``nfev``, ``nsteps``: the evaluations and accepted steps; ``fresh``:
    whether ``J`` is the Jacobian at the current state.
    """

    t: float
    tau: float
    base: float
    limit: float
    susp: bool
    s0: float
    s1: float
    nfev: int
    nsteps: int
    fresh: bool


_BISECT = 30
#: a single trajectory's blow-up crossings are located to rounding
_BISECT_FINE = 64


# ----------------------------------------------------------------------------------------
# the events' measures of a flat state (plain Python, compiled by _core())
# ----------------------------------------------------------------------------------------

def _l_trace(Z, d):
    """``tr(Sigma) = |L|_F^2`` of the state ``Z = [L | mean]``."""
    acc = 0.0
    for i in range(d):
        for j in range(d):
            acc += Z[i, j] * Z[i, j]
    return acc


def _f_rate(F, dF):
    """``2 <F, F'>``: the rate of ``tr(FF^T)`` (flat factors)."""
    acc = 0.0
    for i in range(F.size):
        acc += F[i] * dF[i]
    return 2.0 * acc


def _l_dot(Z, dZ, d):
    """The rate of the trace, ``2 <L, L'>``."""
    acc = 0.0
    for i in range(d):
        for j in range(d):
            acc += Z[i, j] * dZ[i, j]
    return 2.0 * acc


def _cov_entry(Z, i, j, d):
    """``Sigma[i, j] = (L L^T)[i, j]`` of the state ``Z = [L | mean]``."""
    acc = 0.0
    for p in range(d):
        acc += Z[i, p] * Z[j, p]
    return acc


def _steady_gap(y, f, d, m, cols, tol, atol):
    r""":func:`~gaussian_pde.integrate._events.steady_gap` of a flat state ``y`` and rate ``f``.

    On :math:`\Sigma = ZZ^T` over the first ``cols`` columns of ``Z`` (``d``: the factor's;
    a plain state's covariance factor: all of them).
    """
    Z = y.reshape((d, m))
    dZ = f.reshape((d, m))
    nc = 0.0
    nd = 0.0
    for i in range(d):
        for j in range(d):
            c = _cov_entry(Z, i, j, cols)
            e = 0.0
            for p in range(cols):
                e += dZ[i, p] * Z[j, p] + Z[i, p] * dZ[j, p]
            nc += c * c
            nd += e * e
    return math.log(math.sqrt(nd) + 1e-300) - math.log(tol * math.sqrt(nc) + atol + 1e-300)


def _rank_gap(y, d, m, cols, first, rank_tol):
    r""":func:`~gaussian_pde.integrate._events.rank_gap` of a flat state ``y``.

    On :math:`\Sigma = ZZ^T` over the first ``cols`` columns of ``Z`` (as :func:`_steady_gap`).
    """
    Z = y.reshape((d, m))
    S = np.empty((d, d))
    for i in range(d):
        for j in range(d):
            S[i, j] = _cov_entry(Z, i, j, cols)
    if not _finite(S.ravel()):
        return np.nan
    w = np.linalg.eigvalsh(S)
    j = min(first, d - 1)
    return w[j] / max(w.sum(), 1e-300) - rank_tol


# ----------------------------------------------------------------------------------------
# one trajectory (its steps are those of ._steppers)
# ----------------------------------------------------------------------------------------

def _dense_at(fld, y, h, imp, x, wk):
    """The state at fraction ``x`` of the step into ``wk.xa``; returns the evaluations it cost."""
    if imp:
        _ros_eval(y, wk.ynew, wk.U, x, wk.xa)
        return 0
    extra = 0
    if wk.have[0] == 0:     # three more evaluations, only when output or an event needs it
        _call(fld.fns, DOP_DENSE, fld, y, h, wk)
        wk.have[0] = 1
        extra = 3
    _dop_eval(wk.F, y, x, wk.xa)
    return extra


def _gap_at(fld, opt, wk, row, kind, j):
    """Event ``kind``'s value at the dense point ``wk.xa``: ``(gap, evaluations)``.

    ``kind``: 1 steady state, 2 rank collapse, 3 the field's own event ``j``
    (``CoreOptions.gaps``; its ``rhs`` called with ``m = -1``: measures, not counted).
    A plain state with a covariance reads the field's factor :math:`F` and rate
    :math:`F'` from ``ws`` (``m = 0``: the factor alone).
    """
    d, m, xa, xb, ws = fld.d, fld.m, wk.xa, wk.xb, wk.ws
    c, q = opt.cov_rows, opt.cov_cols
    cq = c * q
    if kind == 1:
        fld.rhs(fld.P, d, m, xa, xb, ws)
        if c > 0:
            return _steady_gap(ws[1:1 + cq], ws[1 + cq:1 + 2 * cq], c, q, q, opt.steady_tol,
                               opt.steady_atol), 1
        return _steady_gap(xa, xb, d, m, d, opt.steady_tol, opt.steady_atol), 1
    if kind == 2:
        if c > 0:
            fld.rhs(fld.P, d, 0, xa, xb, ws)
            return _call(fld.fns, RANK_GAP, ws[1:1 + cq], c, q, q, row.first, opt.rank_tol), 1
        return _call(fld.fns, RANK_GAP, xa, d, m, d, row.first, opt.rank_tol), 1
    fld.rhs(fld.P, d, -1, xa, xb, ws)
    return ws[1 + 2 * cq + j], 0


def _bisect(fld, opt, wk, row, h, imp, kind, j):
    """Where in the step event ``kind`` (:func:`_gap_at`) falls to zero: ``(x, evaluations)``.

    Bisection on the dense output to ``2**-_BISECT`` of the step; ``x``: the fraction of
    the step where the value is zero or below.
    """
    lo, hi = 0.0, 1.0
    extra = 0
    for _ in range(_BISECT):
        mid = 0.5 * (lo + hi)
        extra += _call(fld.fns, DENSE_AT, fld, row.y, h, imp, mid, wk)
        gap, spent = _gap_at(fld, opt, wk, row, kind, j)
        extra += spent
        if gap > 0:
            lo = mid
        else:
            hi = mid
    return hi, extra


def _located(fld, row, opt, wk, t, h, imp):
    """The events that fire in the step: ``(kind, t_stop, nfev)`` of the first terminal one.

    ``kind``: 0 none, 1 steady state, 2 rank collapse, 3 one of the field's own events
    (``CoreOptions.gaps``), whose times, where they are not terminal, go into ``row.fres``
    (:func:`_note`) up to the stop. Each event's value at the step's end is kept in
    ``wk.ev`` for the next step.
    """
    d, m, ynew, ev, ws = fld.d, fld.m, wk.ynew, wk.ev, wk.ws
    # a plain state with a covariance: the events read the field's factor F and rate F'
    # (saved at the step's end in ev[3:], fresh in ws after a call at a dense point)
    c, q = opt.cov_rows, opt.cov_cols
    cq = c * q
    stop_t = np.inf
    kind = 0
    extra = 0
    # the kinds and slots reach _bisect and _note as run-time integers: one compiled
    # _bisect, _gap_at and _note serve every call (a constant argument would compile one
    # of each per constant)
    steady, rank, own, j0 = np.int64(1), np.int64(2), np.int64(3), np.int64(0)
    gaps_at = np.int64(F_NGAPS)
    if opt.steady_on:
        if c > 0:
            g_new = _steady_gap(ev[3:3 + cq], ev[3 + cq:3 + 2 * cq], c, q, q, opt.steady_tol,
                                opt.steady_atol)
        else:
            g_new = _steady_gap(ynew, wk.fnew, d, m, d, opt.steady_tol, opt.steady_atol)
        if ev[0] > 0 and g_new <= 0:
            x, spent = _bisect(fld, opt, wk, row, h, imp, steady, j0)
            extra += spent
            stop_t = t + x * h
            kind = 1
        ev[0] = g_new
    if opt.rank_tol >= 0:
        if c > 0:
            g_new = _call(fld.fns, RANK_GAP, ev[3:3 + cq], c, q, q, row.first, opt.rank_tol)
        else:
            g_new = _call(fld.fns, RANK_GAP, ynew, d, m, d, row.first, opt.rank_tol)
        if ev[1] > 0 and g_new <= 0 and row.first < (c if c > 0 else d):
            x, spent = _bisect(fld, opt, wk, row, h, imp, rank, j0)
            extra += spent
            if t + x * h < stop_t:
                stop_t = t + x * h
                kind = 2
        ev[1] = g_new
    if opt.gaps > 0:
        fld.rhs(fld.P, d, -1, ynew, wk.xb, ws)
        new = wk.tmp2                  # (ws is the dense points' from here on)
        for j in range(opt.gaps):
            new[j] = ws[1 + 2 * cq + j]
        fired = stop_t
        for j in range(opt.gaps):
            if ev[3 + 2 * cq + j] > 0 and new[j] <= 0:
                x, spent = _bisect(fld, opt, wk, row, h, imp, own, j)
                extra += spent
                if not opt.gaps_terminal and t + x * h <= stop_t:
                    _note(row.fres, gaps_at, row.fres.size, t + x * h)
                fired = min(fired, t + x * h)
            ev[3 + 2 * cq + j] = new[j]
        if opt.gaps_terminal and fired < stop_t:
            stop_t = fired
            kind = 3
            _note(row.fres, gaps_at, row.fres.size, fired)
    return kind, stop_t, extra


def _store(y, d, m, cov_out, mean_out, j):
    """A batch's output at ``t_eval[j]``: the covariance (and mean) of the state ``y``."""
    Z = y.reshape((d, m))
    for i in range(d):
        for k in range(d):
            cov_out[j, i, k] = _cov_entry(Z, i, k, d)
        if m > d:
            mean_out[j, i] = Z[i, d]


def _blowup_look(fld, opt, t, wk):
    """:func:`~gaussian_pde.integrate._events.blowup_extrapolate` at the step end: ``(t*, finite)``.

    The trace and its rate: of :math:`LL^T`, or (a plain state with a covariance) the
    field's measures, at the step's end (``wk.ev``) and at the probe (``wk.ws``).
    """
    d, m, ynew, fnew, tmp, tmp2 = fld.d, fld.m, wk.ynew, wk.fnew, wk.tmp, wk.tmp2
    cq = opt.cov_rows * opt.cov_cols
    if cq > 0:
        tr = wk.ev[2]
        dtr = _f_rate(wk.ev[3:3 + cq], wk.ev[3 + cq:3 + 2 * cq])
    else:
        Z = ynew.reshape((d, m))
        tr = _l_trace(Z, d)
        dtr = _l_dot(Z, fnew.reshape((d, m)), d)
    hh = _PROBE * tr / (dtr if dtr > 0 else 1.0)
    for i in range(ynew.size):
        tmp[i] = ynew[i] + hh * fnew[i]
    fld.rhs(fld.P, d, m, tmp, tmp2, wk.ws)
    if cq > 0:
        tr2 = wk.ws[0]
        dtr2 = _f_rate(wk.ws[1:1 + cq], wk.ws[1 + cq:1 + 2 * cq])
    else:
        Z2 = tmp.reshape((d, m))
        tr2 = _l_trace(Z2, d)
        dtr2 = _l_dot(Z2, tmp2.reshape((d, m)), d)
    u = 1.0 / tr
    du = -(dtr / tr) / tr
    du2 = (-(dtr2 / tr2) / tr2 - du) / hh
    p = u * du2 / du ** 2
    tstar = t - u / (du * (1.0 - p))
    finite = (du < 0 and p < _P_FINITE and math.isfinite(tstar) and dtr > 0
              and math.isfinite(du2))
    return tstar, finite


def _refactor(fns, y, f, d, m, atol, rtol):
    """Re-factor ``L -> LW`` (rate too) where the columns cancel; True where it did."""
    Z = y.reshape((d, m))
    for i in range(d):
        for j in range(d):
            if not math.isfinite(Z[i, j]):
                return False
    # every direction's excess eps c_j / (atol + rtol s_j) is at most eps max_j c_j / atol:
    # where that bound is within the rule, no SVD is needed to know it does not re-factor
    top = 0.0
    for j in range(d):
        top = max(top, math.sqrt(_col_sq(Z, j, d)))
    if atol > 0 and not _EPS * top / atol > REFACTOR_ABOVE:
        return False
    return _call(fns, REFACTOR_SVD, Z, f.reshape((d, m)), d, atol, rtol)


def _refactor_svd(Z, dZ, d, atol, rtol):
    """:func:`_refactor` past its cheap bound: the singular values decide."""
    L = Z[:, :d].copy()            # (a copy: Z is overwritten below)
    # (full_matrices as below: one compiled SVD for both; L is square, the same values)
    s = np.linalg.svd(L, full_matrices=False)[1]
    c = np.empty(d)
    for j in range(d):
        acc = 0.0
        for i in range(d):
            acc += L[i, j] * L[i, j]
        c[j] = math.sqrt(acc)
    for j in range(1, d):          # in decreasing order (insertion: d is small, and
        v = c[j]                   # np.sort would compile a quicksort)
        i = j
        while i > 0 and c[i - 1] < v:
            c[i] = c[i - 1]
            i -= 1
        c[i] = v
    ex = 0.0
    for j in range(d):
        if c[j] > _CANCELS * s[j]:
            ex = max(ex, _EPS * c[j] / (atol + rtol * s[j]))
    if not ex > REFACTOR_ABOVE:
        return False
    nz = np.empty(d, dtype=np.int64)
    q = 0
    for j in range(d):
        if _col_sq(L, j, d) > 0:
            nz[q] = j
            q += 1
    W = np.eye(d)
    if q >= 2:
        sub = np.empty((d, q))
        for a in range(q):
            for i in range(d):
                sub[i, a] = L[i, nz[a]]
        Vt = np.linalg.svd(sub, full_matrices=False)[2]
        for a in range(q):
            for b in range(q):
                W[nz[a], nz[b]] = Vt[b, a]
    Ld = dZ[:, :d].copy()
    for i in range(d):
        for j in range(d):
            acc = 0.0
            acd = 0.0
            for p in range(d):
                acc += L[i, p] * W[p, j]
                acd += Ld[i, p] * W[p, j]
            Z[i, j] = acc
            dZ[i, j] = acd
    return True


def _col_sq(L, j, rows):
    acc = 0.0
    for i in range(rows):
        acc += L[i, j] * L[i, j]
    return acc


def _attempt(fld, y, h, imp, fresh, wk, atol, rtol):
    r"""One attempted step of size ``h`` from ``y`` (``wk.f = f(y)``) with the current method.

    RODAS4P2 (``imp``; the Jacobian evaluated first unless ``fresh``) or DOP853 (the
    stages in ``wk.K``, ``wk.Kx`` as scratch). Returns ``(err, hlamb, nfev, err_exp,
    max_factor, fresh)``: the error norm (inf: reject), Hairer's :math:`h|\lambda|`
    (0 for RODAS4P2), the evaluations spent, the step-size rule's exponent and largest
    factor, and whether ``wk.J`` is the Jacobian at ``y``.
    """
    if imp:
        nfev = 0
        if not fresh:
            nfev += _call(fld.fns, JACOBIAN, fld, y, wk)
            fresh = True
        err = _call(fld.fns, ROS_ATTEMPT, fld, y, h, wk, atol, rtol)
        return err, 0.0, nfev + 5, -0.25, 6.0, fresh
    _copy(wk.K[0], wk.f)
    err, hlamb = _call(fld.fns, DOP_ATTEMPT, fld, y, h, wk, atol, rtol)
    return err, hlamb, _NS, -0.125, 10.0, fresh


def _steps(fld, row, opt, wk):
    """:func:`_drive`'s work for one trajectory ``row``, in the scratch ``wk``.

    ``wk.p_out`` arrives at the first output index, ``wk.have`` and ``wk.piv`` zeroed.
    Compiled without reference counting, as the driver and the helpers are (see
    :func:`_core`).
    """
    d, m, y, t_eval, ires, fres = fld.d, fld.m, row.y, row.t_eval, row.ires, row.fres
    atol, rtol, max_step, t0, t1 = opt.atol, opt.rtol, opt.max_step, opt.t0, opt.t1
    max_nfev, method = opt.max_nfev, opt.method
    f = wk.f
    wk.ev[0], wk.ev[1] = 0.0, 0.0
    fld.rhs(fld.P, d, m, y, f, wk.ws)
    nfev = 1
    fres[F_T], fres[F_T_BLOWUP], fres[F_STIFF_FROM] = t1, np.nan, np.nan
    if not _finite(f):
        ires[I_CODE], ires[I_NFEV], fres[F_T] = FIELD0, nfev, t0
        return
    if t_eval.size == 0 and row.rec_t.size > 0:
        _record(t0, y, row.rec_t, row.rec_y, row.nrec)
    c, q, ws = opt.cov_rows, opt.cov_cols, wk.ws
    cq = c * q
    if opt.steady_on:
        if c > 0:
            wk.ev[0] = _steady_gap(ws[1:1 + cq], ws[1 + cq:1 + 2 * cq], c, q, q, opt.steady_tol,
                                   opt.steady_atol)
        else:
            wk.ev[0] = _steady_gap(y, f, d, m, d, opt.steady_tol, opt.steady_atol)
    if opt.rank_tol >= 0:
        if c > 0:
            wk.ev[1] = _call(fld.fns, RANK_GAP, ws[1:1 + cq], c, q, q, row.first, opt.rank_tol)
        else:
            wk.ev[1] = _call(fld.fns, RANK_GAP, y, d, m, d, row.first, opt.rank_tol)
    if opt.gaps > 0:                   # the field's own events (measures: not counted)
        fld.rhs(fld.P, d, -1, y, wk.xb, ws)
        for j in range(opt.gaps):
            wk.ev[3 + 2 * cq + j] = ws[1 + 2 * cq + j]
    imp = method == 2
    h_abs = _call(fld.fns, INITIAL_STEP, fld, y, wk, opt, -0.25 if imp else -0.125)
    nfev += 1
    t, base, tau = t0, 0.0, t0
    # np.bool_ and np.int64: a bare constant would be typed as a literal, and the helpers
    # it is passed to compiled once more for that literal
    limit, susp, s0, s1 = opt.blowup_threshold, np.bool_(False), np.nan, np.nan
    rejected, fresh = False, np.bool_(False)
    iasti, nonsti, nsteps = 0, 0, np.int64(0)
    block, crawl = 0, 0
    code = -1
    while code < 0:
        min_step = 10 * abs(np.nextafter(tau, np.inf) - tau)
        if h_abs < min_step:
            h_abs = min_step
        if h_abs > max_step:
            h_abs = max_step
        h = _nmin(h_abs, (t1 - base) - tau)
        if opt.plain and c == 0 and wk.p_out[0] < t_eval.size:   # lands on t_eval
            h = _nmin(h, t_eval[wk.p_out[0]] - t)
        err, hlamb, spent, err_exp, max_factor, fresh = _attempt(fld, y, h, imp, fresh, wk,
                                                                 atol, rtol)
        nfev += spent
        acc = err < 1
        h_abs = _next_step_size(h_abs, err, acc, rejected, err_exp, max_factor)
        rejected = not acc
        if not acc and not h_abs >= min_step:
            code, fres[F_T] = (SMALL if _finite(wk.ynew) else SMALL_OVERFLOW), t
            break
        if acc:
            clock = Clock(t, tau, base, limit, susp, s0, s1, nfev, nsteps, fresh)
            code, clock = _call(fld.fns, ACCEPTED, fld, row, opt, wk, clock, h, imp)
            t, tau, base, limit, susp, s0, s1, nfev, nsteps, fresh = clock
            if code >= 0:
                break
        if method == 0 and not imp:      # Hairer's stiffness test on the explicit steps
            iasti, nonsti = _stiffness_counts(acc, hlamb, iasti, nonsti)
            block, crawl, crawling = _crawl_counts(acc, hlamb, block, crawl)
            if iasti >= _STIFF_STEPS and opt.cov_rows > 0 and not fld.jac(fld.P, d, m, y,
                                                                           wk.J, wk.ws):
                code, fres[F_T], fres[F_STIFF_FROM] = STIFF, t, t
                break
            if iasti >= _STIFF_STEPS:    # Rosenbrock steps from here on, for good
                imp = True
                fresh = False
                fres[F_STIFF_FROM] = t
            elif crawling and fld.jac(fld.P, d, m, y, wk.J, wk.ws):
                # the second test, where the closed form holds: its Jacobian at y is the
                # first Rosenbrock step's
                imp = True
                fresh = True
                nfev += 1
                fres[F_STIFF_FROM] = t
        if max_nfev >= 0 and nfev > max_nfev:
            code, fres[F_T], fres[F_T_STOP] = NFEV, t, t
    ires[I_CODE], ires[I_NFEV], ires[I_NSTEPS], ires[I_IMPLICIT] = code, nfev, nsteps, imp


def _accepted(fld, row, opt, wk, clock, h, imp):
    """An accepted step: its rate, events, output, blow-up look, advance and re-factoring.

    Returns the outcome code (negative: go on) and the updated :class:`Clock`. The
    output goes into ``row.cov_out``/``row.mean_out`` at ``t_eval`` (a batch) or, where
    ``row.rec_t`` has room (a single trajectory, :func:`integrate_one`), as states into
    ``row.rec_y`` at ``row.rec_t``: at ``t_eval``, or at every step end without it
    (``FULL`` where no room is left).
    """
    t, tau, base, limit, susp, s0, s1, nfev, nsteps, fresh = clock
    y, f, ynew, fnew, fres, tr0 = row.y, wk.f, wk.ynew, wk.fnew, row.fres, row.tr0
    tau_new = tau + h
    t_new = base + tau_new
    p, t1 = wk.p_out[0], opt.t1
    if opt.plain and opt.cov_rows == 0 and p < row.t_eval.size and h == row.t_eval[p] - t:
        t_new = row.t_eval[p]          # landed: its output is the step's end, ynew
        tau_new = t_new - base
    elif t1 - t_new < 4 * abs(np.nextafter(t1, np.inf) - t1):
        t_new = t1
        tau_new = t1 - base
    else:
        t_new = min(t_new, t1)
    if imp:
        fld.rhs(fld.P, fld.d, fld.m, ynew, fnew, wk.ws)
        nfev += 1
    else:
        _copy(fnew, wk.K[_NS])
    # a plain state's measure: the field leaves it in ws[0], and its last call was at ynew
    measure = wk.ws[0] if opt.plain else 0.0
    cq = opt.cov_rows * opt.cov_cols
    for i in range(1 + 2 * cq if cq > 0 else 0):     # kept for the events (_located)
        wk.ev[2 + i] = wk.ws[i]
    if not (_finite(fnew) and _finite(ynew)):
        fres[F_T], fres[F_T_STOP], fres[F_T_NEXT] = t, t, t_new
        return OVERFLOW, Clock(t, tau, base, limit, susp, s0, s1, nfev, nsteps, fresh)
    steps = row.rec_t.size > 0 and row.t_eval.size == 0        # every step end is recorded
    if steps and row.nrec[0] >= row.rec_t.size:
        fres[F_T] = t
        return FULL, Clock(t, tau, base, limit, susp, s0, s1, nfev, nsteps, fresh)
    nsteps += 1
    wk.have[0] = 0
    kind, stop_t, extra = _call(fld.fns, LOCATED, fld, row, opt, wk, t, h, imp)
    nfev += extra
    if row.t_eval.size:
        nfev += _output(fld, row, opt, wk, t, h, imp, min(t_new, stop_t))
    if kind > 0:
        nfev += _call(fld.fns, DENSE_AT, fld, y, h, imp, (stop_t - t) / h, wk)
        _copy(y, wk.xa)
        fres[F_T], fres[F_T_STOP] = stop_t, stop_t
        if steps:
            _record(stop_t, y, row.rec_t, row.rec_y, row.nrec)
        code = STEADY if kind == 1 else (RANK if kind == 2 else EVENT)
        return code, Clock(t, tau, base, limit, susp, s0, s1, nfev, nsteps, fresh)
    looked = False
    if opt.plain and cq == 0:
        if not measure <= limit * tr0:
            _copy(y, ynew)
            fres[F_T] = t_new
            return GROWTH, Clock(t, tau, base, limit, susp, s0, s1, nfev, nsteps, fresh)
    elif (wk.ev[2] if cq > 0 else _l_trace(ynew.reshape((fld.d, fld.m)), fld.d)) > limit * tr0:
        # where the trace passed the limit (kept by a single trajectory; located in a
        # batch too, so that both count the same evaluations)
        xc, extra = _call(fld.fns, CROSSING, fld, opt, y, h, imp, wk, math.log(limit * tr0))
        nfev += extra
        # (run-time integers, as in _located: one compiled _note for both)
        _note(fres, np.int64(F_NCROSS), np.int64(F_CROSS + MAX_CROSSINGS), t + xc * h)
        tstar, finite = _call(fld.fns, BLOWUP_LOOK, fld, opt, t_new, wk)
        nfev += 1
        code, limit_, susp_, s0_, s1_ = _look_verdict(tstar, finite, t_new, limit, susp,
                                                      s0, s1, fres)
        if code >= 0:
            _copy(y, ynew)
            if steps:
                _record(t_new, y, row.rec_t, row.rec_y, row.nrec)
            return code, Clock(t, tau, base, limit, susp, s0, s1, nfev, nsteps, fresh)
        limit, susp, s0, s1 = limit_, susp_, s0_, s1_
        looked = True
    t, tau = t_new, tau_new
    _copy(y, ynew)
    _copy(f, fnew)
    if looked:      # a blow-up look restarts the clock
        base, tau = t_new, 0.0
    fresh = False
    if steps:
        _record(t, y, row.rec_t, row.rec_y, row.nrec)
    if nsteps % REFACTOR_EVERY == 0 and not opt.plain:
        _call(fld.fns, REFACTOR, fld.fns, y, f, fld.d, fld.m, opt.atol, opt.rtol)
    code = FINISHED if t_new >= t1 else -1
    return code, Clock(t, tau, base, limit, susp, s0, s1, nfev, nsteps, fresh)


def _output(fld, row, opt, wk, t, h, imp, t_end):
    """The output at the times of ``row.t_eval`` in the step up to ``t_end``; the evaluations.

    The state there (the dense output) goes into ``row.rec_y`` (a single trajectory),
    whole into ``row.mean_out`` (a plain state), or as covariance and mean into
    ``row.cov_out`` and ``row.mean_out`` (a batch).
    """
    t_eval, xa = row.t_eval, wk.xa
    nfev = 0
    j = wk.p_out[0]
    while j < t_eval.size and t_eval[j] <= t_end:
        x = min(max((t_eval[j] - t) / h, 0.0), 1.0)
        nfev += _call(fld.fns, DENSE_AT, fld, row.y, h, imp, x, wk)
        if row.rec_t.size > 0:
            row.rec_t[j] = t_eval[j]
            _copy(row.rec_y[j], xa)
        elif opt.plain:
            _copy(row.mean_out[j], xa)
        else:
            _store(xa, fld.d, fld.m, row.cov_out, row.mean_out, j)
        j += 1
    wk.p_out[0] = j
    return nfev


def _look_verdict(tstar, finite, t, limit, susp, s0, s1, fres):
    """The verdict of a blow-up look at ``t`` (:func:`~gaussian_pde.integrate._events.blowup_verdict`).

    Writes the look's numbers into ``fres[F_TSTAR:F_FINITE + 1]`` (and ``fres[F_T]``,
    ``fres[F_T_BLOWUP]`` at the end of the run). Returns ``(code, limit, susp, s0, s1)``:
    ``BLOWUP`` (confirmed), ``GROWTH`` (no finite-time signature within ``MAX_GROWTH``),
    or -1 with the next limit and the suspicion ``(s0, s1)`` to confirm.
    """
    fres[F_TSTAR], fres[F_T_LOOK], fres[F_LIMIT], fres[F_S0], fres[F_S1] = tstar, t, limit, s0, s1
    fres[F_FINITE] = 1.0 if finite else 0.0
    if finite and susp and abs(tstar - s0) <= CONFIRM_TOL * (s0 - s1):
        fres[F_T], fres[F_T_BLOWUP] = t, tstar
        return BLOWUP, limit, susp, s0, s1
    grow = CONFIRM_GROWTH if finite else _NONFINITE_GROWTH
    if limit * grow > MAX_GROWTH:
        fres[F_T] = t
        return GROWTH, limit, susp, s0, s1
    if finite:
        s0, s1 = tstar, t
    return -1, limit * grow, finite, s0, s1


def _record(t, y, rec_t, rec_y, nrec):
    """Append the state ``y`` at ``t`` to a single trajectory's record of step ends."""
    k = nrec[0]
    rec_t[k] = t
    _copy(rec_y[k], y)
    nrec[0] = k + 1


def _note(fres, at, end, t_c):
    """Keep a time ``t_c`` in a single trajectory's row: ``fres[at]`` counts, the times follow.

    The blow-up crossings (``at = F_NCROSS``, up to ``F_CROSS + MAX_CROSSINGS``, which
    they cannot fill) and the field's own events (``at = F_NGAPS``, up to the row's end:
    where they fill it, the count goes on and :func:`integrate_one` runs the trajectory
    again with more room). Nothing where the row ends before ``at`` (a batch's).
    """
    if fres.size <= at:
        return
    k = int(fres[at])
    if at + 1 + k < min(end, fres.size):
        fres[at + 1 + k] = t_c
    fres[at] = k + 1


def _crossing(fld, opt, y, h, imp, wk, level):
    """The fraction of the step where ``log tr(Sigma)`` passes ``level``: ``(x, nfev)``.

    Bisection on the dense output to rounding (the time of the blow-up event in the
    trajectory's ``t_events``); the state there has passed the level. A plain state with a
    covariance takes the trace from its field's measures (``m = 0``: not counted).
    """
    lo, hi = 0.0, 1.0
    extra = 0
    for _ in range(_BISECT_FINE):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        extra += _call(fld.fns, DENSE_AT, fld, y, h, imp, mid, wk)
        if opt.cov_rows > 0:
            fld.rhs(fld.P, fld.d, 0, wk.xa, wk.xb, wk.ws)
            lt = math.log(max(wk.ws[0], 1e-300))
        else:
            lt = math.log(max(_l_trace(wk.xa.reshape((fld.d, fld.m)), fld.d), 1e-300))
        if lt >= level:
            hi = mid
        else:
            lo = mid
    return hi, extra


def _drive(rhs, jac, fns, params, d, m, batch, opt, lo, hi, fbuf, ibuf):
    r"""Integrate the rows ``lo`` to ``hi - 1`` of the :class:`Batch` ``batch``, one by one.

    Each row's state is overwritten with its trajectory's final state, its outcome goes
    into ``ires`` (code, nfev, nsteps, implicit; indices ``I_*``) and ``fres`` (t_final,
    t_blowup and the numbers the message needs; indices ``F_*``). ``params``: the field's
    parameters, one row for all or one per trajectory; ``opt``: a :class:`CoreOptions`.
    ``fbuf`` and ``ibuf``: scratch of the sizes :func:`_scratch_sizes` gives, cut once into
    the :class:`Work` that each trajectory uses in turn (:func:`_steps` runs one); the
    caller allocates it, so that the driver allocates nothing and is compiled without
    reference counting. A single trajectory (:func:`integrate_one`) also records its
    states: at every step end (the initial one first, an event's stop last), or at
    ``t_eval``; a batch's ``rec_t`` has no columns.
    """
    n = d * m
    ws = fbuf[:opt.ws_size]
    o = opt.ws_size
    vec = fbuf[o:o + 7 * n].reshape((7, n))
    o += 7 * n
    K = fbuf[o:o + (_NS + 1) * n].reshape((_NS + 1, n))
    o += (_NS + 1) * n
    Kx = fbuf[o:o + 16 * n].reshape((16, n))
    o += 16 * n
    F = fbuf[o:o + 7 * n].reshape((7, n))
    o += 7 * n
    U = fbuf[o:o + 6 * n].reshape((6, n))
    o += 6 * n
    J = fbuf[o:o + n * n].reshape((n, n))
    o += n * n
    W = fbuf[o:o + n * n].reshape((n, n))
    o += n * n
    wk = Work(ws, vec[0], vec[1], vec[2], vec[3], vec[4], vec[5], vec[6], K, Kx, F, U, J, W,
              fbuf[o:fbuf.size], ibuf[2:2 + n], ibuf[1:2], ibuf[0:1])
    for b in range(lo, hi):
        p = b if params.shape[0] > 1 else 0
        for i in range(ibuf.size):
            ibuf[i] = 0
        ibuf[0] = batch.p0
        row = Row(batch.Y[b], batch.t_eval, batch.tr0[b], batch.first[b], batch.ires[b],
                  batch.fres[b], batch.cov_out[b], batch.mean_out[b], batch.rec_t[b],
                  batch.rec_y[b], batch.nrec[b:b + 1])
        _call(fns, STEPS, Field(rhs, jac, params[p], d, m, fns), row, opt, wk)


def _scratch_sizes(n, opt):
    """The float and integer scratch (entries) :func:`_drive` needs at state size ``n``."""
    cq = opt.cov_rows * opt.cov_cols
    return (opt.ws_size + (7 + _NS + 1 + 16 + 7 + 6) * n + 2 * n * n + 2
            + (1 + 2 * cq if cq > 0 else 0) + opt.gaps, 2 + n)


#: inlined into their callers (Numba IR), where the loop bounds and arrays are known
_INLINED = ("_copy", "_cov_entry", "_guard", "_combine", "_dop_errors", "_attempt",
            "_next_step_size", "_stiffness_counts", "_crawl_counts", "_output")
#: the helpers that allocate (compiled with Numba's reference counting; see _core())
_ALLOCATING = ("_rank_gap", "_refactor_svd")
#: the engine's large pieces, each compiled once and called through its address (see
#: :func:`_call`), callees before their callers
_PIECES = ("_rank_gap", "_jacobian", "_dop_attempt", "_ros_attempt", "_initial_step",
           "_dop_dense", "_dense_at", "_blowup_look", "_refactor_svd", "_refactor",
           "_located", "_crossing", "_accepted", "_steps")
#: their places in the table of addresses ``fns``
(RANK_GAP, JACOBIAN, DOP_ATTEMPT, ROS_ATTEMPT, INITIAL_STEP, DOP_DENSE, DENSE_AT, BLOWUP_LOOK,
 REFACTOR_SVD, REFACTOR, LOCATED, CROSSING, ACCEPTED, STEPS) = range(len(_PIECES))
#: the helpers the pieces and the driver call as compiled globals (linked into each caller)
_HELPERS = ("_copy", "_cov_entry", "_finite", "_l_trace", "_l_dot", "_f_rate", "_guard",
            "_steady_gap", "_lu", "_lu_solve", "_combine", "_dop_errors", "_dop_eval",
            "_ros_eval", "_nmin", "_store", "_col_sq", "_look_verdict",
            "_record", "_note", "_gap_at", "_bisect", "_attempt",
            "_next_step_size", "_stiffness_counts", "_crawl_counts", "_output")


def _call(fns, which, *args):
    """Call the piece ``_PIECES[which]`` of the engine through its address ``fns[which]``.

    Compiled (:func:`_core`), the intrinsic of
    :func:`~gaussian_pde._common.compiled.address_caller`: a piece is compiled once, in
    its own library, where a callee called by name would be linked into each caller's
    library and optimised again there. In plain Python: the function itself, called.
    """
    return _function(_PIECES[which])(*args)


def _function(name):
    """The engine's function ``name``: this module's or the steppers' (:mod:`._steppers`)."""
    return globals()[name] if name in globals() else vars(_steppers)[name]


#: the signature of each piece (its place in ``fns``), known once it is compiled
_PIECE_SIGNATURES = {}


def _argument_types(rhs_sig, jac_sig):
    """The Numba type of each argument of the pieces and the driver, by its name."""
    from numba import types as T

    vec, mat, ivec = T.float64[::1], T.float64[:, ::1], T.int64[::1]
    scalar = {float: T.float64, int: T.int64, bool: T.boolean}
    arrays = {"ws f fnew ynew tmp tmp2 xa xb ev y t_eval fres rec_t P": vec,
              "K Kx F U J W Y rec_y mean_out": mat, "piv have p_out nrec fns ires": ivec}
    by_field = {name: ty for names, ty in arrays.items() for name in names.split()}

    def named(cls, **types):
        """``cls`` (a named tuple) as a Numba type; ``types``: fields not in ``by_field``."""
        fields = typing.get_type_hints(cls)
        return T.NamedTuple([types[k] if k in types else by_field.get(k, scalar.get(fields[k]))
                             for k in fields], cls)

    kinds = {
        T.FunctionType(rhs_sig): "rhs",
        T.FunctionType(jac_sig): "jac",
        named(CoreOptions): "opt",
        named(Field, rhs=T.FunctionType(rhs_sig), jac=T.FunctionType(jac_sig)): "fld",
        named(Work): "wk",
        named(Row, cov_out=T.float64[:, :, ::1]): "row",
        named(Batch, tr0=vec, first=ivec, fres=mat, cov_out=T.float64[:, :, :, ::1],
              mean_out=T.float64[:, :, ::1], rec_t=mat, rec_y=T.float64[:, :, ::1],
              ires=T.int64[:, ::1]): "batch",
        named(Clock): "clock",
        T.float64: "h t x atol rtol err_exp level rank_tol",
        T.int64: "d m cols first lo hi",
        T.boolean: "imp",
        vec: "y f fbuf",
        mat: "Z dZ params",
        ivec: "fns ibuf",
    }
    return {name: ty for ty, names in kinds.items() for name in names.split()}


@functools.cache
def _core():
    """The compiled driver :func:`_drive` and its table of pieces (Numba, cached on disk).

    Returns ``(drive, fns)``: ``fns`` holds the addresses of the :data:`_PIECES`, each
    compiled once with the argument types of :func:`_argument_types` and called
    through its address (:func:`_call`), so that no caller compiles its code again;
    the small helpers are linked into their callers, those in :data:`_INLINED`
    inlined. The driver releases the GIL. The pieces and the helpers that are not
    inlined are called from compiled code only: they are compiled without the wrappers
    that would let Python or C call them (a tenth of the compilation), but for those
    that allocate: Numba compiles the overloads they call (``np.linalg``, ``np.empty``)
    once for each set of flags, and with the wrappers theirs are the other modules'.

    :func:`_run` spreads a batch's trajectories over threads that each call it on a
    slice of the rows.

    Only the helpers in :data:`_ALLOCATING` (those that allocate) are compiled with
    Numba's reference counting (``_nrt``); the driver's scratch comes from its caller.
    Every array the others see belongs to a caller that holds it for the whole call, and
    the counting would cost an atomic increment and decrement per array, view and call:
    measured, about 40 % of a step at d = 3. A helper without it that allocated would fail
    to compile, not leak.
    """
    import inspect

    import numba
    from numba import types as T

    from ..attention import compiled_signatures as signatures

    # called from compiled code only: no wrapper for calls from Python or C
    no_wrappers = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}

    def compiled(name, **options):
        """``name`` compiled once, in place of the plain function wherever code calls it."""
        fn = _function(name)
        if not hasattr(fn, "py_func"):
            fn = numba.njit(cache=True, error_model="numpy", _nrt=name in _ALLOCATING,
                            **options)(stamped(fn, engine_stamp()))
        for space in (globals(), vars(_steppers)):
            if name in space:
                space[name] = fn
        return fn

    for name in _HELPERS:
        inline = name in _INLINED
        compiled(name, inline="always" if inline else "never", **({} if inline else no_wrappers))
    if numba.config.DISABLE_JIT:     # plain Python throughout: _call calls the functions
        return _drive, np.zeros(len(_PIECES), dtype=np.int64)
    types = _argument_types(*signatures())
    globals()["_call"] = address_caller(_PIECE_SIGNATURES)
    fns = np.zeros(len(_PIECES), dtype=np.int64)
    with warnings.catch_warnings():   # first-class function types are "experimental"
        warnings.simplefilter("ignore", numba.NumbaExperimentalFeatureWarning)
        for place, name in enumerate(_PIECES):
            plain = getattr(_function(name), "py_func", _function(name))
            args = tuple(types[a] for a in inspect.signature(plain).parameters)
            piece = compiled(name, signature_or_function=[args],
                             **({} if name in _ALLOCATING else no_wrappers))
            fns[place], _PIECE_SIGNATURES[place] = address_and_signature(piece)
        sig = T.void(*(types[a] for a in inspect.signature(_drive).parameters))
        drive = numba.njit(sig, cache=True, nogil=True, error_model="numpy", _nrt=False,
                           no_cfunc_wrapper=True)(stamped(_drive, engine_stamp()))
    return drive, fns


@functools.cache
def engine_stamp():
    """The stamp of the engine's sources in the names of its compiled functions.

    :func:`~gaussian_pde._common.compiled.sources_stamp` of this module, the steppers
    and every module of ``integrate`` and ``_common`` they import (the tableaux, the LU,
    the events' constants...): Numba's disk cache reads only the file of the function
    it compiles, so an edit of the tableaux alone would otherwise load the engine
    compiled with the old coefficients.
    """
    return sources_stamp(imported_sources([__name__, _steppers.__name__],
                                          ("gaussian_pde.integrate", "gaussian_pde._common")))


def compile_kernels():
    """Compile the driver and the fields' generic kernels now (or load them from the cache).

    For a caller about to fork workers: compiled once here, the forked processes inherit
    them, where each would otherwise compile them again on a machine with an empty cache.
    False without Numba.
    """
    from ..attention import compiled_field_kernels

    if compiled_field_kernels() is None:
        return False
    _core()
    return True


@functools.cache
def _resolved(kernel, which):
    """:class:`~gaussian_pde._common.compiled.ResolvedKernel` of ``rhs`` (``which`` 0) or ``jac`` (1).

    Made once per kernel; the kernel itself where that fails.
    """
    from ..attention import compiled_signatures

    try:
        return ResolvedKernel(kernel, compiled_signatures()[which])
    except Exception:       # a Numba without the protocol: the dispatcher itself serves
        return kernel


# ----------------------------------------------------------------------------------------
# the Python side: the fields, the call, the statuses and messages
# ----------------------------------------------------------------------------------------

#: a single-head shape (type, ``d``, ``k``) asked for at least this many trajectories in
#: this process (one batch, or the solves of a loop) runs its type's kernel compiled for
#: its ``d`` and ``k`` (``CompiledField.specialised``, the same bits): about half a second
#: to compile at the first request of a shape on a machine, then loaded from Numba's disk
#: cache in milliseconds; a shape asked for less takes the generic kernel. The saving is
#: at most some hundreds of microseconds a trajectory at ``d = 2``, so it repays that
#: compilation from about a thousand trajectories on (the main job, some hundreds of a
#: shape, runs the generic kernels: a fresh machine does not compile a shape for it)
SPECIALISE_FROM = 1024
#: ... and from this many where Numba's disk cache holds that kernel already (compiled by
#: an earlier run on this machine: loading it costs milliseconds, and it saves about a
#: third of a short trajectory's time at ``d = 2`` to ``5``)
SPECIALISE_CACHED_FROM = 64

#: trajectories asked of each single-head shape ``(kernel, d, heads, size, k)`` in this process
_DEMAND = collections.Counter()


def compiled_fields(attentions, n=1):
    """``(rhs, jac, params (1 or B, p), ws_size)`` of attentions, or None.

    None where one of them has no compiled field (``compiled_field()`` is None) or
    where they do not share one pair of kernels. ``attentions``: one attention (for
    every trajectory) or a list of one per trajectory; ``n``: the trajectories. Where
    all have one head of one type and shape, and that shape has been asked for
    :data:`SPECIALISE_FROM` trajectories in this process (these ``n`` included), its
    kernel compiled for that shape; from :data:`SPECIALISE_CACHED_FROM` where Numba's
    disk cache holds that kernel already.
    """
    single = not isinstance(attentions, list)
    seen = {}
    fields = []
    for att in ([attentions] if single else attentions):
        cf = seen.get(id(att))
        if cf is None:
            cf = compiled_field_of(att)
            if cf is None:
                return None
            seen[id(att)] = cf
        fields.append(cf)
    rhs, jac = fields[0].rhs, fields[0].jac
    if any(cf.rhs is not rhs or cf.jac is not jac for cf in fields):
        return None
    size = max(cf.params.size for cf in fields)
    params = np.zeros((len(fields), size))
    for i, cf in enumerate(fields):
        params[i, :cf.params.size] = cf.params
    if not single and len(seen) == 1:
        params = params[:1]
    # one kernel (the type), and (heads, size, k): one shape for all
    if np.all(params[:, :3] == params[0, :3]):
        shape = (id(rhs), fields[0].d, *params[0, :3].tolist())
        _DEMAND[shape] += n
        if _DEMAND[shape] >= SPECIALISE_FROM:
            rhs = fields[0].specialised().rhs
        elif _DEMAND[shape] >= SPECIALISE_CACHED_FROM:
            rhs = fields[0].specialised(compile=False).rhs
    return rhs, jac, params, max(cf.ws_size for cf in fields)


def _messages(code, fres, t0, max_nfev, event="event"):
    """Status and message of one trajectory from its outcome (the event loop's words).

    ``event``: the name of the field's own events (``EVENT``).
    """
    from ._events import blowup_verdict
    from ._results import Status, overflow_message

    if code == FINISHED:
        return Status.FINISHED, "reached the end of t_span"
    if code in (BLOWUP, GROWTH):
        tstar, t, limit, s0, s1, finite = fres[F_TSTAR:F_FINITE + 1]
        verdict, message = blowup_verdict(float(tstar), bool(finite), float(t), float(limit),
                                          (float(s0), float(s1)) if code == BLOWUP else None)
        return verdict, message
    if code == EVENT:
        return Status.EVENT, f"terminal event {event!r} at t = {fres[F_T_STOP]:.10g}"
    if code in (STEADY, RANK):
        name = "steady" if code == STEADY else "rank_collapse"
        status = Status.STEADY if code == STEADY else Status.RANK_COLLAPSE
        return status, f"terminal event {name!r} at t = {fres[F_T_STOP]:.10g}"
    if code == FIELD0:
        return Status.FAILED, (f"the field is not finite at t = {t0:.10g}: the rate of the "
                               "initial covariance overflows float64")
    if code == STIFF:
        return Status.FAILED, (f"stiff at t = {fres[F_T]:.10g}, where the field has no "
                               "closed-form Jacobian")
    if code in (SMALL, SMALL_OVERFLOW):
        return Status.FAILED, ("step size too small (required step below rounding)"
                               + ("; the trial states leave the floating-point range "
                                  "(overflow)" if code == SMALL_OVERFLOW else ""))
    if code == OVERFLOW:
        return Status.FAILED, overflow_message(fres[F_T_STOP], fres[F_T_NEXT])
    return Status.FAILED, (f"gave up after {max_nfev} right-hand-side evaluations near "
                           f"t = {fres[F_T_STOP]:.10g} (stiff or nearly singular dynamics)")


def _core_options(opts, method, ws_size):
    """The :class:`CoreOptions` of validated solver options (a factor state)."""
    ev = opts.events
    return CoreOptions(
        atol=float(opts.atol), rtol=float(opts.rtol), max_step=float(opts.max_step),
        blowup_threshold=float(ev.blowup_threshold),
        steady_tol=0.0 if ev.steady_tol is None else float(ev.steady_tol),
        steady_atol=float(ev.steady_atol),
        rank_tol=-1.0 if ev.rank_tol is None else float(ev.rank_tol),
        t0=float(opts.t0), t1=float(opts.t1),
        max_nfev=-1 if opts.max_nfev is None else int(opts.max_nfev),
        method=("auto", "DOP853", "rosenbrock").index(method),
        steady_on=bool(ev.steady_on), ws_size=int(ws_size), plain=False, cov_rows=0,
        cov_cols=0, gaps=0, gaps_terminal=False)


def record_rows(opts, n):
    """Rows :func:`integrate_one` first allots to the record of a run's states.

    With ``t_eval``, its times. Otherwise every step end: an accepted step costs at
    least 7 evaluations (RODAS4P2: a closed-form Jacobian, 5 stages and the rate at the
    step end; DOP853 12), so a run within ``max_nfev`` records at most
    ``max_nfev // 7 + 3`` states (the initial one and the step that spends the budget
    among them); at most :data:`RECORD_BYTES` of them, or that without a budget
    (:func:`integrate_one` runs a trajectory again with 4 times the room where it fills).
    """
    if opts.t_eval is not None:
        return opts.t_eval.size
    cap = max(RECORD_BYTES // (8 * n), 16)
    return cap if opts.max_nfev is None else min(int(opts.max_nfev) // 7 + 3, cap)


#: the most memory :func:`integrate_one` first takes for its record of states
RECORD_BYTES = 64 * 2**20
#: room :func:`integrate_one` first makes for the times of a field's own events, per event
GAP_ROOM = 4


def integrate_one(fields, y0, d, m, tr0, first, opts, cov=None, gaps=None):
    r"""One trajectory of :func:`gaussian_pde.solve` (``method="auto"``) in the core.

    The steps, events, verdicts and evaluations of :func:`gaussian_pde.solve_batch`'s
    ``"auto"`` for that trajectory, bit for bit; besides, the states at every step end
    (or at ``t_eval``) and, in ``t_events["blowup"]``, the times where the trace passed
    each blow-up threshold, located on the dense output to rounding. ``y0``: the flat
    state ``[L | mean]`` (``d x m``) in the solver's units; ``tr0``, ``first``: the initial
    trace and the first eigenvalue index of the rank event. ``cov``: ``(rows, cols)`` of
    the factor of the covariance that the field leaves in its scratch, for a plain state
    (``d = n``, ``m = 1``; ``CoreOptions.cov_rows``), whose events then run on that
    covariance. ``gaps``: ``(count, terminal, name)`` of such a field's own events
    (``CoreOptions.gaps``), whose times go into ``t_events[name]``; a terminal one that
    fires stops the run with status ``"event"``. Returns a
    :class:`~gaussian_pde.integrate._results.Run` (``stiff_stop``: such a state stopped
    where the stiffness test fired, ``STIFF``).
    """
    from ._results import Run, Status

    rhs, jac, params, ws_size = fields
    n = d * m
    rows = record_rows(opts, n)
    t_eval = opts.t_eval
    te = np.zeros(0) if t_eval is None else np.ascontiguousarray(t_eval, dtype=float)
    p0 = int(np.searchsorted(te, opts.t0, side="right"))
    opt = _core_options(opts, "auto", ws_size)
    if cov is not None:
        opt = opt._replace(plain=True, cov_rows=int(cov[0]), cov_cols=int(cov[1]))
    room = 0             # for the times of the field's own events
    if gaps is not None and gaps[0] > 0:
        if cov is None or gaps[0] > n:
            raise ValueError("`gaps` needs a plain state with a covariance (`cov`) and at "
                             f"most {n} events, got {gaps[0]}.")
        need = 1 + 2 * int(cov[0]) * int(cov[1]) + int(gaps[0])
        if ws_size < need:
            raise ValueError(f"`fields` declares {ws_size} floats of scratch, fewer than the "
                             f"measures and {gaps[0]} events need ({need}).")
        opt = opt._replace(gaps=int(gaps[0]), gaps_terminal=bool(gaps[1]))
        room = max(int(GAP_ROOM * gaps[0]), 1)
    while True:
        # written before they are read (the first ``kept`` rows): not zeroed, since the
        # room for a whole budget's steps is megabytes at d = 8
        rec_t = np.empty((1, rows))
        rec_y = np.empty((1, rows, n))
        nrec = np.zeros(1, dtype=np.int64)
        if t_eval is not None:       # the output times at t0 hold the initial state
            rec_t[0, :p0] = te[:p0]
            rec_y[0, :p0] = y0
        Y = np.array(y0, dtype=float).reshape(1, n)
        ires = np.zeros((1, I_SIZE), dtype=np.int64)
        fres = np.zeros((1, F_CROSS + MAX_CROSSINGS + (1 + room if room else 0)))
        _run(rhs, jac, np.ascontiguousarray(params), d, m, opt,
             Batch(Y, te, p0, np.array([float(tr0)]), np.array([first], dtype=np.int64), ires,
                   fres, np.zeros((1, 0, d, d)), np.zeros((1, 0, d)), rec_t, rec_y, nrec))
        code = int(ires[0, I_CODE])
        if room and fres[0, F_NGAPS] > room:
            room = 2 * int(fres[0, F_NGAPS])       # the same steps again, with room
            continue
        if code != FULL:
            break
        rows *= 4        # the same steps again (the same bits), with room for them
    t = float(fres[0, F_T]) if code != FINISHED else float(opts.t1)
    kept = (int(nrec[0]) if t_eval is None
            else int(np.searchsorted(te, t, side="right")))
    status, message = _messages(code, fres[0], opts.t0, opt.max_nfev,
                                event=gaps[2] if room else "event")
    t_events = {"blowup": fres[0, F_CROSS:F_CROSS + int(fres[0, F_NCROSS])].copy()}
    if room:
        t_events[gaps[2]] = fres[0, F_GAP_TIMES:F_GAP_TIMES + int(fres[0, F_NGAPS])].copy()
    if opt.steady_on:
        t_events["steady"] = np.empty(0)
    if first < (d if cov is None else int(cov[0])):
        t_events["rank_collapse"] = np.empty(0)
    if status in (Status.STEADY, Status.RANK_COLLAPSE):
        t_events[str(status)] = np.array([t])
    stiff_from = float(fres[0, F_STIFF_FROM])
    stiff_from = None if math.isnan(stiff_from) else stiff_from
    if stiff_from is not None and code != STIFF:
        message += f"; stiff from t = {stiff_from:.6g} on: RODAS4P2"
    return Run(t=rec_t[0, :kept].copy(), y=rec_y[0, :kept].copy(), status=status,
               message=message, t_blowup=(float(fres[0, F_T_BLOWUP]) if status == Status.BLOWUP
                                          else None),
               t_final=t, y_final=Y[0], t_events=t_events, nfev=int(ires[0, I_NFEV]),
               stiff_from=stiff_from, stiff_stop=code == STIFF)


def integrate_batch(fields, cov0s, mean0s, opts, method, mean_units=True):
    """:func:`gaussian_pde.solve_batch` on the compiled path; a :class:`BatchSolution`.

    ``mean_units``: hold the mean in the units of :func:`gaussian_pde.solve`
    (:func:`~gaussian_pde.integrate._moment_field.mean_scale`; only where the mean's
    equation is linear and homogeneous, ``Attention.mean_is_linear``); otherwise in its own
    units.
    """
    from .._common.linalg import psd_factor
    from ._events import rank_first, rank_notes
    from ._moment_field import mean_scales
    from ._results import BatchSolution, Status

    rhs, jac, params, ws_size = fields
    nb, d = cov0s.shape[0], cov0s.shape[-1]
    m = d if mean0s is None else d + 1
    t0, t_eval = opts.t0, opts.t_eval
    ev = opts.events
    Y = np.zeros((nb, d, m))
    Y[:, :, :d] = psd_factor(cov0s)
    scale = None
    if mean0s is not None:
        scale = (mean_scales(mean0s, opts.rtol, opts.atol) if mean_units
                 else np.ones(nb))
        Y[:, :, d] = mean0s / scale[:, None]
    Y = Y.reshape(nb, d * m)
    tr0 = np.maximum(np.trace(cov0s, axis1=1, axis2=2), np.finfo(float).tiny)
    first = (np.zeros(nb, dtype=np.int64) if ev.rank_tol is None
             else np.asarray(rank_first(cov0s, ev.rank_tol), dtype=np.int64))
    opt = _core_options(opts, method, ws_size)
    te = np.zeros(0) if t_eval is None else np.ascontiguousarray(t_eval, dtype=float)
    nt = te.size
    cov_out = np.full((nb, nt, d, d), np.nan)
    mean_out = np.full((nb, nt if m > d else 0, d), np.nan)
    ires = np.zeros((nb, I_SIZE), dtype=np.int64)
    fres = np.zeros((nb, F_SIZE))
    p0 = int(np.searchsorted(te, t0, side="right"))
    _run(rhs, jac, np.ascontiguousarray(params), d, m, opt,
         Batch(Y, te, p0, tr0, first, ires, fres, cov_out, mean_out, np.zeros((nb, 0)),
               np.zeros((nb, 0, d * m)), np.zeros(nb, dtype=np.int64)))
    status = np.full(nb, Status.FINISHED, dtype=object)
    message = ["reached the end of t_span"] * nb
    for b in np.flatnonzero(ires[:, I_CODE] != FINISHED):
        status[b], message[b] = _messages(int(ires[b, I_CODE]), fres[b], t0, opt.max_nfev)
    Z = Y.reshape(nb, d, m)
    L_final = Z[:, :, :d].copy()
    cov_final = L_final @ np.swapaxes(L_final, -1, -2)
    for b, note in rank_notes(cov0s, cov_final, status):
        message[b] += note
    mean = mean_final = None
    if t_eval is not None:
        cov_out[:, t_eval == t0] = cov0s[:, None]
    if mean0s is not None:
        mean_final = Z[:, :, d] * scale[:, None]
        if t_eval is not None:
            mean = mean_out * scale[:, None, None]
            mean[:, t_eval == t0] = mean0s[:, None]
    return BatchSolution(t=t_eval, cov=None if t_eval is None else cov_out,
                         t_final=fres[:, F_T].copy(), cov_final=cov_final,
                         factor_final=L_final, status=status,
                         t_blowup=fres[:, F_T_BLOWUP].copy(), message=message,
                         nfev=ires[:, I_NFEV].astype(int), nsteps=ires[:, I_NSTEPS].astype(int),
                         ncalls=1, implicit=ires[:, I_IMPLICIT] != 0, mean=mean,
                         mean_final=mean_final, path="compiled")


#: how a row of :func:`integrate_states` ended, by the engine's outcome code
STATE_STOPS = {FINISHED: "finished", GROWTH: "growth", NFEV: "budget", SMALL: "small step",
               SMALL_OVERFLOW: "small step", OVERFLOW: "overflow", FIELD0: "not finite"}


def integrate_states(fields, y0, t_eval, limit, *, rtol, atol, max_nfev):
    r"""Plain states in the core: RODAS4P2 from the first step, output at ``t_eval``.

    Each row :math:`y_b` of ``y0`` follows :math:`\dot y = f(y)`, the autonomous field
    ``rhs`` of ``fields`` (``(rhs, jac, params, ws_size)``, :func:`compiled_fields`'s
    form, ``params`` one row or one per row), from ``t_eval[0]`` to ``t_eval[-1]``, on
    the engine's steps (cut to land on each time of ``t_eval``), error control and
    budget (``d = n``, ``m = 1``: a layout the field reads from its ``params``, not a
    factor). No factor events run: a row stops
    where the field's measure :math:`g(y)` of an accepted step's end (``rhs`` leaves it
    in ``ws[0]``) is not :math:`\le` ``limit[b]``.

    Returns
    -------
    states : ndarray, shape (nb, len(t_eval), n)
        The states at ``t_eval``, where the steps land (NaN where not reached).
    stop : ndarray of str
        How each row ended (:data:`STATE_STOPS`): ``"finished"``, ``"growth"`` (the
        measure passed its limit), ``"budget"`` (more than ``max_nfev`` evaluations),
        ``"small step"`` (a step below rounding), ``"overflow"`` or ``"not finite"``
        (the field at the start).
    nsteps : ndarray of int
        Accepted steps.
    t_final : ndarray
        Where each row stopped.
    """
    rhs, jac, params, ws_size = fields
    y0 = np.array(y0, dtype=float, order="C")
    nb, n = y0.shape
    te = np.ascontiguousarray(t_eval, dtype=float)
    opt = CoreOptions(atol=float(atol), rtol=float(rtol), max_step=np.inf, blowup_threshold=1.0,
                      steady_tol=0.0, steady_atol=0.0, rank_tol=-1.0, t0=float(te[0]),
                      t1=float(te[-1]), max_nfev=int(max_nfev), method=2, steady_on=False,
                      ws_size=max(int(ws_size), 1), plain=True, cov_rows=0, cov_cols=0,
                      gaps=0, gaps_terminal=False)
    states = np.full((nb, te.size, n), np.nan)
    p0 = int(np.searchsorted(te, te[0], side="right"))
    states[:, :p0] = y0[:, None]
    ires = np.zeros((nb, I_SIZE), dtype=np.int64)
    fres = np.zeros((nb, F_SIZE))
    _run(rhs, jac, np.ascontiguousarray(params, dtype=float), n, 1, opt,
         Batch(y0, te, p0, np.ascontiguousarray(limit, dtype=float), np.zeros(nb, dtype=np.int64),
               ires, fres, np.zeros((nb, 0, 0, 0)), states, np.zeros((nb, 0)),
               np.zeros((nb, 0, n)), np.zeros(nb, dtype=np.int64)))
    stop = np.array([STATE_STOPS[c] for c in ires[:, I_CODE]], dtype=object)
    return states, stop, ires[:, I_NSTEPS].copy(), fres[:, F_T].copy()


#: fewer trajectories than this run on the calling thread: starting threads costs more
#: than a short trajectory
SERIAL_BELOW = 4
#: each thread takes this many slices of the rows in turn, so that threads whose
#: trajectories end early take over the rest (trajectories differ in length by far more)
_SLICES_PER_THREAD = 8


def _run(rhs, jac, params, d, m, opt, batch):
    """The compiled driver over the rows of the :class:`Batch` ``batch``.

    On the calling thread for fewer than :data:`SERIAL_BELOW` trajectories, else over
    Numba's thread count (``NUMBA_NUM_THREADS``, the cores) of threads, each taking the
    next slice of rows until none is left, with scratch of its own (each trajectory the
    same code, the same bits, whichever thread runs it). Threads rather than Numba's
    ``prange``: a parallel loop is compiled a second time, with the whole integrator
    inside, which doubled the first compilation.
    """
    import numba

    drive, fns = _core()
    rhs, jac = _resolved(rhs, 0), _resolved(jac, 1)
    nb = batch.Y.shape[0]
    args = (fns, params, d, m, batch, opt)
    fsize, isize = _scratch_sizes(d * m, opt)
    workers = 1 if nb < SERIAL_BELOW else min(max(1, int(numba.config.NUMBA_NUM_THREADS)), nb)
    if workers == 1:
        drive(rhs, jac, *args, 0, nb, np.empty(fsize), np.empty(isize, dtype=np.int64))
        return
    size = max(1, -(-nb // (workers * _SLICES_PER_THREAD)))
    starts = iter(range(0, nb, size))
    lock = threading.Lock()

    def work():
        fbuf, ibuf = np.empty(fsize), np.empty(isize, dtype=np.int64)
        while True:
            with lock:
                lo = next(starts, None)
            if lo is None:
                return
            drive(rhs, jac, *args, lo, min(lo + size, nb), fbuf, ibuf)

    with concurrent.futures.ThreadPoolExecutor(workers - 1) as pool:
        others = [pool.submit(work) for _ in range(workers - 1)]
        work()
        for f in others:
            f.result()
