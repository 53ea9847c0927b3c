r"""A lean step loop over SciPy's ODE solvers, with events and dense output on demand.

:func:`integrate_scipy` does what :func:`scipy.integrate.solve_ivp` does (same solver classes,
hence the same steps; same event semantics: a sign change between step ends, located by
Brent's method on the step's dense output to :math:`4\varepsilon`), with less work per
step, which matters when one step of a small system costs a few microseconds:

* the dense output of a step is built only when that step holds an output time or an
  event's sign change (``solve_ivp`` builds it at every step once events are given);
* an evaluation budget (``max_nfev``) is a plain check after each step instead of an
  event function;
* no per-step bookkeeping beyond what the caller asked for.

:func:`integrate_fortran` lets Hairer's Fortran DOP853 or DOPRI5 take the steps
(``scipy.integrate.ode``): the stages never return to Python, a callback checks events at
step ends, and a step with an event sign change is replayed by :func:`integrate_scipy`. It
lands on every output time, so :func:`use_fortran` reserves it for runs with at most
``MAX_LANDINGS`` output times.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import warnings

import numpy as np
from scipy.integrate import BDF, LSODA, Radau, ode
from scipy.optimize import brentq

from ._options import METHODS
from ._results import overflow_message

__all__ = ["FORTRAN_CODES", "Segment", "accepts_jac", "integrate_fortran", "integrate_scipy",
           "use_fortran"]

_EPS = np.finfo(float).eps
_TINY = np.finfo(float).tiny


@dataclasses.dataclass
class Segment:
    """Outcome of :func:`integrate_scipy` (the fields of ``solve_ivp``'s result that we use).

    ``status``: ``0`` end of the interval, ``1`` a terminal event, ``2`` the evaluation
    budget is spent (stopped at the end of the step that spent it), ``3`` given up
    (``give_up``: a stiff solver on trial that is slower than the explicit steps it
    replaced), ``-1`` the solver failed. ``t_final``/``y_final``: where it stopped.
    """

    t: np.ndarray
    y: np.ndarray            # (T, n)
    status: int
    message: str
    t_events: list           # one array per event
    y_events: list
    t_final: float
    y_final: np.ndarray
    fired: int | None = None  # index of the terminal event that stopped the run
    stiff_from: float | None = None  # where the run handed over to the stiff solver


def integrate_scipy(fun, solver_cls, t0, t1, y0, *, rtol, atol, max_step=np.inf, first_step=None,
              jac=None, t_eval=None, events=(), budget=None, stiff=None, give_up=None,
              t_offset=0.0):
    """Integrate ``y' = fun(t, y)`` over ``(t0, t1)`` with a SciPy ``OdeSolver`` class.

    Parameters
    ----------
    fun : callable
        ``fun(t, y) -> ndarray``.
    solver_cls : type
        A :class:`scipy.integrate.OdeSolver` subclass (``DOP853``, ``LSODA``, ...).
    t0, t1 : float
        Interval, ``t0 < t1``.
    y0 : ndarray, shape (n,)
        Initial state.
    rtol, atol, max_step, first_step
        Passed to the solver.
    jac : callable, optional
        Exact Jacobian ``jac(t, y)``, passed to implicit solvers only.
    t_eval : ndarray, optional
        Output times in ``[t0, t1]``, increasing; ``None`` stores every step.
    events : sequence of callables
        ``g(t, y)`` with ``terminal`` and ``direction`` attributes, as in ``solve_ivp``.
    budget : callable, optional
        ``budget(t, y) -> bool``, called after every step with its end state (the
        caller's evaluation budget, or any other reason to stop there); ``False`` stops
        with status 2 at the end of that step.
    stiff : OdeSolver subclass, optional
        ``method="auto"`` (``solver_cls`` is then ``DOP853``): step with
        :class:`~gaussian_pde.integrate._stiffness.StiffnessDOP853` and, once Hairer's
        stiffness test fires, continue from the end of that step with ``stiff`` (given
        ``jac``); ``Segment.stiff_from`` records where.
    give_up : callable, optional
        ``give_up(t, y) -> bool``, called after every accepted step that does not end the
        run; ``True`` stops with status 3 (the stiff solver of ``method="auto"`` on
        trial, see :func:`stiff_trial`).
    t_offset : float
        The time at which this run's clock reads 0 (``t`` here is time since then), for
        the times written in messages only.

    Returns
    -------
    Segment
    """
    solver, stiff_cls, stiff_kwargs, stiff_from = _first_solver(
        fun, solver_cls, t0, t1, y0, rtol=rtol, atol=atol, max_step=max_step,
        first_step=first_step, jac=jac, stiff=stiff)
    ts, ys, i_eval = _stored_start(t0, y0, t_eval)
    g_old = [float(g(t0, y0)) for g in events]
    dirs = [getattr(g, "direction", 0.0) for g in events]
    t_events = [[] for _ in events]
    y_events = [[] for _ in events]
    status, message, fired = None, "", None
    t_final, y_final = t0, np.array(y0, dtype=float)

    while status is None:
        msg = solver.step()
        if solver.status == "failed":
            status, message = -1, msg or "the solver failed"
            break
        t_old, t, y = solver.t_old, solver.t, solver.y
        if not np.isfinite(y).all():
            # an accepted step that left the floating-point range (an implicit method can
            # accept one): stop at the last finite state, never store inf or NaN
            status, message = -1, overflow_message(t_offset + t_old, t_offset + t)
            break
        dense = None
        t_stop, y_stop = t, y
        if events:
            g_old, dense, hit = _step_events(events, g_old, dirs, solver, t_old, t, y,
                                             t_events, y_events)
            if hit is not None:
                status, message = 1, "a termination event occurred"
                fired, t_stop, y_stop = hit
        if status is None and budget is not None and not budget(t, y):
            status, message = 2, "evaluation budget spent"
        i_eval = _store_outputs(solver, dense, t_eval, i_eval, t_stop, y_stop, ts, ys)
        # the solvers make a new state array every step: no copy until the end
        t_final, y_final = t_stop, y_stop
        if status is None and solver.status == "finished":
            status, message = 0, "the solver reached the end of the interval"
        if status is None and give_up is not None and give_up(t_final, y_final):
            status, message = 3, "the stiff solver was slower than the explicit steps"
        if status is None and stiff_from is None and stiff is not None and solver.stiff:
            # the same trajectory goes on from the end of this step with the stiff solver
            stiff_from = t_final
            solver = stiff_cls(fun, t_final, np.array(y_final, dtype=float), t1,
                               **stiff_kwargs,
                               first_step=handover_step(t_final - t_old, t_final, t1))
    return _segment(ts, ys, np.size(y0), status, message, t_events, y_events, t_final,
                    y_final, fired, stiff_from)


def _first_solver(fun, solver_cls, t0, t1, y0, *, rtol, atol, max_step, first_step, jac, stiff):
    """The solver of :func:`integrate_scipy`'s first step, and the stiff one's settings.

    Returns ``(solver, stiff_cls, stiff_kwargs, stiff_from)``: with ``stiff``
    (``method="auto"``) the explicit steps are :class:`StiffnessDOP853`'s, and
    ``stiff_cls(fun, t, y, t1, **stiff_kwargs, first_step=...)`` takes over once the
    run is stiff (``stiff_from`` is None: not yet).
    """
    kwargs = dict(rtol=rtol, atol=atol, max_step=max_step)
    stiff_cls = stiff_kwargs = None
    if stiff is not None:
        from ._stiffness import StiffnessDOP853

        solver_cls, stiff_cls = StiffnessDOP853, stiff
        stiff_kwargs = dict(kwargs)
        if jac is not None and accepts_jac(stiff_cls):
            stiff_kwargs["jac"] = jac
    if first_step is not None:
        kwargs["first_step"] = first_step
    if jac is not None and accepts_jac(solver_cls):
        kwargs["jac"] = jac
    return solver_cls(fun, t0, y0, t1, **kwargs), stiff_cls, stiff_kwargs, None


def _stored_start(t0, y0, t_eval):
    """The stored start of :func:`integrate_scipy`: ``(ts, ys, i_eval)``.

    The initial state, once per output time at ``t0`` (once without ``t_eval``), and
    the index of the next output time.
    """
    ts, ys = [], []
    if t_eval is None:
        ts.append(t0)
        ys.append(np.array(y0, dtype=float))
        return ts, ys, 0
    i_eval = int(np.searchsorted(t_eval, t0, side="left"))
    while i_eval < t_eval.size and t_eval[i_eval] == t0:
        ts.append(t0)
        ys.append(np.array(y0, dtype=float))
        i_eval += 1
    return ts, ys, i_eval


def _step_events(events, g_old, dirs, solver, t_old, t, y, t_events, y_events):
    """The events' sign changes in the step from ``t_old`` to ``t``, located and recorded.

    A sign change in an event's direction (``dirs``; either for direction 0) is located on the
    step's dense output (:func:`_root`) and appended to ``t_events``/``y_events``, in time
    order up to the first terminal event. Returns ``(g_new, dense, hit)``: the events'
    values at ``t``, the dense output (``None`` when no event needed it) and
    ``(index, t_e, y_e)`` of that terminal event (``None`` without one).
    """
    dense = None
    g_new = [float(g(t, y)) for g in events]
    hits = []
    for i, g in enumerate(events):
        a, b, s = g_old[i], g_new[i], dirs[i]
        # a crossing in the event's direction (both for direction 0)
        if (s >= 0 and a <= 0 <= b) or (s <= 0 and a >= 0 >= b):
            if dense is None:
                dense = solver.dense_output()
            te = _root(g, dense, t_old, t, g_old[i], g_new[i])
            hits.append((te, i))
    hits.sort()
    for te, i in hits:
        ye = dense(te)
        t_events[i].append(te)
        y_events[i].append(ye)
        if getattr(events[i], "terminal", False):
            return g_new, dense, (i, te, ye)
    return g_new, dense, None


def _store_outputs(solver, dense, t_eval, i_eval, t_stop, y_stop, ts, ys):
    """Append the outputs of a step that stops at ``t_stop``; the next output's index.

    Every step end without ``t_eval``; else the output times from ``t_eval[i_eval]``
    up to ``t_stop``, on the step's dense output (``dense``, built here if ``None``).
    """
    if t_eval is None:
        ts.append(t_stop)
        ys.append(np.array(y_stop, dtype=float))
        return i_eval
    n_eval = t_eval.size
    if i_eval < n_eval and t_eval[i_eval] <= t_stop:
        j = i_eval
        while j < n_eval and t_eval[j] <= t_stop:
            j += 1
        if j > i_eval:
            if dense is None:
                dense = solver.dense_output()
            for tk in t_eval[i_eval:j]:
                ts.append(tk)
                ys.append(y_stop.copy() if tk == t_stop else np.asarray(dense(tk)))
            i_eval = j
    return i_eval


def _segment(ts, ys, n, status, message, t_events, y_events, t_final, y_final, fired,
             stiff_from):
    """The :class:`Segment` of a run's stored outputs and events (lists), ``n`` unknowns."""
    return Segment(t=np.array(ts, dtype=float), y=np.array(ys, dtype=float).reshape(len(ys), n),
                   status=status, message=message,
                   t_events=[np.array(v, dtype=float) for v in t_events],
                   y_events=[np.array(v, dtype=float).reshape(len(v), n) for v in y_events],
                   t_final=float(t_final), y_final=np.array(y_final, dtype=float),
                   fired=fired, stiff_from=stiff_from)


def _root(g, dense, t_old, t, g_lo, g_hi):
    """The crossing of ``g`` in ``[t_old, t]`` (Brent's method on the dense output)."""
    if g_lo == 0:
        return t_old
    if g_hi == 0:
        return t
    def f(s):
        return g(s, dense(s))

    a, b = f(t_old), f(t)
    if a == 0 or b == 0:
        return t_old if a == 0 else t
    if (a > 0) == (b > 0):
        # the sign change is between the step's ends, but the dense output's ends differ
        # from them by rounding and show none: the crossing lies within that rounding of
        # an end (brentq would raise "f(a) and f(b) must have different signs")
        return t if abs(b) <= abs(a) else t_old
    # the absolute tolerance scales with the step: an absolute 4 eps exceeds the whole
    # step near a singularity at t* ~ 1e-4, and the root would land on t_old (a repeated
    # time in the output)
    xtol = max(4 * _EPS * (t - t_old), _TINY)
    te = brentq(f, t_old, t, xtol=xtol, rtol=4 * _EPS)
    return min(max(te, float(np.nextafter(t_old, t))), t)



def handover_step(h_last, t, t1):
    """The first step of the stiff solver that takes over at ``t``: the last explicit step.

    SciPy's LSODA left to choose its own first step can stall at a stiff hand-over
    state: order 1, Adams, the same tiny step for thousands of steps; given a step (even a
    smaller one) it raises its order and switches to BDF within a few dozen steps.
    """
    if h_last is None or not h_last > 0:
        return None
    return min(h_last, t1 - t) if t1 > t else None


def accepts_jac(solver_cls):
    """Whether the SciPy solver class uses a Jacobian (the implicit ones)."""
    return issubclass(solver_cls, (Radau, BDF, LSODA))


#: string methods stepped by Hairer's Fortran codes (``scipy.integrate.ode``)
FORTRAN_CODES = {"DOP853": "dop853", "RK45": "dopri5"}
#: the Fortran codes land on every output time (a restart and a shortened step each: ~30
#: evaluations); with more output times than this after t0, the Python solver's dense
#: output is cheaper
MAX_LANDINGS = 2


def use_fortran(method, t_eval, t0):
    """Whether :func:`integrate_fortran` should take the steps (see ``MAX_LANDINGS``)."""
    if not (isinstance(method, str) and method in FORTRAN_CODES):
        return False
    if t_eval is None:
        return True
    t_eval = np.asarray(t_eval)
    return t_eval.size <= MAX_LANDINGS or int(np.count_nonzero(t_eval > t0)) <= MAX_LANDINGS


#: ``method="auto"`` on the Fortran path: this many rejected DOP853 steps among the last
#: ``REJECT_WINDOW`` accepted ones suggest a stability-limited (stiff) run, which the
#: stiffness test of ``dop853.f`` can miss when ``h |lambda|`` hovers at its threshold;
#: the run is stiff if also ``h rho(J) >= STIFF_H_RHO`` (spectral radius of the exact
#: Jacobian; DOP853's stability interval on the negative real axis is about 6). Frequent
#: rejections alone also come with fast growth (a blow-up), where ``h rho(J) ~ 0.1``.
REJECT_WINDOW, REJECT_STIFF, STIFF_H_RHO = 20, 5, 2.0
#: right-hand-side evaluations of an accepted and of a rejected DOP853 step
_DOP853_ACCEPTED, _DOP853_REJECTED = 12, 11
#: the stiff solver is on trial (:func:`stiff_trial`): from its ``TRIAL_STEPS``-th step on,
#: every ``TRIAL_WINDOW`` steps up to ``TRIAL_MAX_STEPS``, its cost per unit time over the
#: last ``TRIAL_WINDOW`` steps is compared with DOP853's over its last ``REJECT_WINDOW``
#: accepted steps before the switch (scaled by the stiffness); costs in evaluations, a
#: stiff step (SciPy's step loop around one LSODA step) counting ``STEP_COST`` and an
#: exact Jacobian ``JAC_COST`` (both measured on the d = 5 paper workload, with the
#: mean), an explicit step ``EXPLICIT_STEP_COST`` (the step-end checks)
TRIAL_STEPS, TRIAL_WINDOW, TRIAL_MAX_STEPS = 60, 20, 200
STEP_COST, JAC_COST, EXPLICIT_STEP_COST = 6.0, 12.0, 1.0
#: after a failed trial the stiffness tests wait ``TRIAL_BACKOFF`` accepted DOP853 steps,
#: twice as many after every further failed trial
TRIAL_BACKOFF = 50
#: and DOP853 resumes with Hairer's stabilised step-size control (``dop853.f``'s
#: ``BETA``, 0 by default, at most 0.1), which damps the rejections of stability-limited
#: steps: from the switch of seed 5 of ``benchmarks/bench_solve.py`` (t = 16.1) to its
#: end it takes 541 evaluations instead of 880 (LSODA: 616 in 347 steps), on seed 8
#: 542 instead of 672. The restarted code's first step is the last accepted one (its own
#: initial guess, 16 times smaller on seed 5, took four steps to grow back: 1,570
#: evaluations instead of 1,521 for the whole run)
STABILIZED_BETA = 0.08
#: accepted steps of the stabilised DOP853 before its stiffness tests start
STABILIZED_WAIT = 20
#: and every this many accepted steps (twice as many after each lost trial) the
#: stabilised DOP853 looks at ``h rho(J)`` itself: its step-size control keeps a
#: stability-bound run below Hairer's test (``h |lambda| > 6.1``) and nearly free of
#: rejections, so neither test fires on a run that crawls at ``h rho(J)`` of 3 to 5 for
#: tens of thousands of evaluations (LSODA alone crosses such runs in a few thousand);
#: the paper workload's stabilised tails take tens of steps
STABILIZED_PROBE = 200


class _Watch:
    """Step-end checks of :func:`integrate_fortran`, called by the Fortran code.

    With ``nfev`` (the evaluation count) and ``jac`` (``method="auto"``), the rejected
    steps between two accepted ones are counted from ``nfev``; ``REJECT_STIFF`` of them
    among the last ``REJECT_WINDOW`` accepted steps, confirmed by
    ``h rho(jac) >= STIFF_H_RHO`` at the step end, stop the run as stiff (``self.stiff``).
    """

    def __init__(self, t0, y0, events, budget, ts=None, ys=None, nfev=None, jac=None,
                 stiff_after=0, probe_every=None):
        self.t_prev, self.y_prev = t0, np.array(y0, dtype=float)
        self.events, self.budget = events, budget
        self.ts, self.ys = ts, ys     # every step end is stored when given
        self.g_prev = [float(g(t0, y0)) for g in events]
        self.dirs = [getattr(g, "direction", 0.0) for g in events]
        # an event whose value is log(max(z.z, 1e-300)) - offset says so, with z = y or
        # z = y[entries] (the blow-up event: tr(Sigma) = |L|_F^2, L alone or beside the
        # mean): one event evaluation less per step
        self.square_norm_offset = (getattr(events[0], "square_norm_offset", None)
                                   if len(events) == 1 else None)
        self.square_norm_entries = (getattr(events[0], "square_norm_entries", None)
                                    if len(events) == 1 else None)
        self.hit = None               # end of a step with an event sign change
        self.spent = False
        self.nfev = nfev if jac is not None else None
        self.jac = jac
        self.stiff = False
        self.rejects = [0] * REJECT_WINDOW   # rejected steps before each accepted one
        self.n_rejects = 0                   # their sum
        self.n_accepted = 0
        self.h_last = None            # the last accepted step
        self.stiff_after = stiff_after  # no rejection test before this many accepted steps
        self.probe_every = probe_every  # and h rho(J) looked at every this many (or never)
        self.recent = collections.deque(maxlen=REJECT_WINDOW + 1)  # (t, nfev) at step ends
        self.overflow = None          # end of an accepted step with a non-finite state

    def __call__(self, t, y):
        # called at every accepted step (a few microseconds of a step of a small system):
        # locals instead of repeated attribute lookups, the same decisions
        t_prev = self.t_prev
        if t <= t_prev:               # the initial call
            if self.nfev is not None:
                self.n_prev = self.nfev()
                self.recent.append((t, self.n_prev))
            return 0
        # left the floating-point range: stop before it (a finite sum of squares has only
        # finite terms, so the entry-wise test runs only where that sum is not finite)
        yy = y.dot(y)
        if not math.isfinite(yy) and not np.isfinite(y).all():
            self.overflow = t
            return -1
        events = self.events
        if len(events) == 1:          # most runs: the blow-up event alone
            c = self.square_norm_offset
            if c is None:
                b = float(events[0](t, y))
            else:
                entries = self.square_norm_entries
                if entries is not None:
                    z = y[entries]
                    yy = float(z.dot(z))
                b = math.log(max(yy, 1e-300)) - c
            a, s = self.g_prev[0], self.dirs[0]
            if (s >= 0 and a <= 0 <= b) or (s <= 0 and a >= 0 >= b):
                self.hit = t
                return -1
            self.g_prev = [b]
        elif events:
            g_new = [float(g(t, y)) for g in events]
            for a, b, s in zip(self.g_prev, g_new, self.dirs):
                # a crossing in the event's direction (both for direction 0)
                if (s >= 0 and a <= 0 <= b) or (s <= 0 and a >= 0 >= b):
                    self.hit = t      # replay [t_prev, t] with dense output
                    return -1
            self.g_prev = g_new
        self.h_last = h_last = t - t_prev
        y_prev = y.copy()             # the Fortran code reuses its buffer
        self.t_prev, self.y_prev = t, y_prev
        if self.ts is not None:
            self.ts.append(t)
            self.ys.append(y_prev)
        budget = self.budget
        if budget is not None and not budget(t, y_prev):
            self.spent = True
            return -1
        nfev = self.nfev
        if nfev is not None:
            n = nfev()
            extra = n - self.n_prev - _DOP853_ACCEPTED
            self.n_prev = n
            self.recent.append((t, n))
            r = (2 * extra + _DOP853_REJECTED) // (2 * _DOP853_REJECTED) if extra > 0 else 0
            n_accepted = self.n_accepted
            rejects = self.rejects
            i = n_accepted % REJECT_WINDOW
            self.n_rejects = n_rejects = self.n_rejects + r - rejects[i]
            rejects[i] = r
            self.n_accepted = n_accepted + 1
            if n_rejects >= REJECT_STIFF and n_accepted + 1 >= self.stiff_after:
                if step_radius_at_least(self.jac(t, y_prev), h_last, STIFF_H_RHO):
                    self.stiff = True
                    return -1
                self.rejects = [0] * REJECT_WINDOW   # not stiff: count afresh
                self.n_rejects = 0
            probe = self.probe_every
            if (probe is not None and (n_accepted + 1) % probe == 0
                    and n_accepted + 1 >= self.stiff_after
                    and step_radius_at_least(self.jac(t, y_prev), h_last, STIFF_H_RHO)):
                # a long stabilised run held at its stability bound without rejections
                self.stiff = True
                return -1
        return 0

    def explicit_cost(self):
        """DOP853's cost per unit time over its last accepted steps, or None (too few)."""
        if len(self.recent) < 6:
            return None
        (ta, na), (tb, nb) = self.recent[0], self.recent[-1]
        if not tb > ta:
            return None
        return (nb - na + EXPLICIT_STEP_COST * (len(self.recent) - 1)) / (tb - ta)


def stiff_trial(explicit_cost, nfev, njev, stiffness=None, y0=None):
    r"""``give_up(t, y)`` for :func:`integrate_scipy`: whether the stiff solver costs more than DOP853.

    ``method="auto"`` hands a run over to the stiff solver on a guess (Hairer's test, or
    frequent rejections): a run whose explicit steps are only mildly stability-limited is
    slower with LSODA, which restarts at order 1, may stay on its Adams formulas, and
    costs about ``STEP_COST`` evaluations of overhead a step. The trial compares costs per
    unit time, in evaluations: the stiff solver's over its last ``TRIAL_WINDOW`` steps,
    :math:`(\Delta\text{nfev} + \texttt{STEP\_COST}\,\Delta\text{steps} +
    \texttt{JAC\_COST}\,\Delta\text{njev})/\Delta t`, against DOP853's before the
    switch, ``explicit_cost``, scaled to the current state by the stiffness
    :math:`\sigma = \max(0, -\min\operatorname{Re}\lambda(J))` (a stability-limited
    explicit step is proportional to :math:`1/\sigma`): ``stiffness(y)`` gives
    :math:`\sigma`, ``y0`` is the state at the switch. At every ``TRIAL_WINDOW``-th step
    from ``TRIAL_STEPS`` to ``TRIAL_MAX_STEPS`` (LSODA's start-up takes tens to a hundred
    steps, and the cost per unit time of a run that turns stiffer falls for longer):
    cheaper, the stiff solver stays (no more checks); still dearer at
    ``TRIAL_MAX_STEPS``, give up (the caller resumes DOP853). On the paper workload of
    ``benchmarks/bench_solve.py`` the ratio of the two costs wanders between 1.6 and 5
    for 200 steps on runs that LSODA does not speed up, and falls below 1 within 100 to
    180 steps on those it does. ``nfev``, ``njev``: callables giving the evaluation and Jacobian counts.
    """
    sigma0 = None if stiffness is None else stiffness(y0)
    marks = []
    done = [False]

    def give_up(t, y):
        if done[0]:
            return False
        marks.append((t, nfev(), njev()))
        k = len(marks)
        if k < TRIAL_STEPS or k % TRIAL_WINDOW:
            return False
        (ta, na, ja), (tb, nb, jb) = marks[-1 - TRIAL_WINDOW], marks[-1]
        if not tb > ta:
            done[0] = True
            return True
        cost = (nb - na + STEP_COST * TRIAL_WINDOW + JAC_COST * (jb - ja)) / (tb - ta)
        explicit = explicit_cost
        if sigma0 is not None and sigma0 > 0:
            explicit = explicit_cost * stiffness(y) / sigma0
        if cost <= explicit:
            done[0] = True          # the stiff solver pays: it stays
            return False
        if k >= TRIAL_MAX_STEPS:
            done[0] = True
            return True
        return False

    return give_up


def step_radius_at_least(J, h, level):
    r"""Whether :math:`h\rho(J) \ge` ``level``, as ``eigvals`` says, mostly without it.

    Bounds decide first (a 25 x 25 ``eigvals`` costs about as much as 30 evaluations of
    the paper workload's field): :math:`\rho \le s = \min(\lVert J\rVert_1,
    \lVert J\rVert_\infty)`, and with :math:`P = (J/s)^8` (three squarings),
    :math:`s(|\operatorname{tr}P|/n)^{1/8} \le \rho \le s\lVert P\rVert_1^{1/8}`
    (:math:`|\operatorname{tr}P| = |\sum\lambda_i^8|/s^8 \le n\rho^8/s^8`, and Gelfand).
    A bound decides only with a relative margin of ``1e-6`` (the lower one only where
    :math:`|\operatorname{tr}P|` is not a cancellation); the eigenvalues decide the rest.
    """
    margin = 1e-6
    n = J.shape[0]
    a = np.abs(J)
    s = min(float(a.sum(axis=0).max()), float(a.sum(axis=1).max()))
    if math.isfinite(s) and s > 0:
        if h * s < level * (1 - margin):
            return False
        P = J / s
        for _ in range(3):
            P = P @ P
        p1 = float(np.abs(P).sum(axis=0).max())
        if h * s * p1 ** 0.125 < level * (1 - margin):
            return False
        tr = abs(float(np.trace(P)))
        if tr > 1e-6 * p1 and h * s * (tr / n) ** 0.125 >= level * (1 + margin):
            return True
    return bool(h * np.max(np.abs(np.linalg.eigvals(J))) >= level)


def stiffness_of(jac):
    r""":math:`\sigma(y) = \max(0, -\min\operatorname{Re}\lambda(J(y)))` for :func:`stiff_trial`."""
    def sigma(y):
        with np.errstate(all="ignore"):
            try:
                w = np.linalg.eigvals(jac(0.0, y))
            except (np.linalg.LinAlgError, ValueError):
                return float("nan")
        return max(0.0, -float(np.min(w.real)))

    return sigma


def _merge(seg, ts, ys, t_events, y_events, skip_first):
    """Append a Python segment's output and events (its first row repeats our last)."""
    ts.extend(seg.t[1:] if skip_first else seg.t)
    ys.extend(seg.y[1:] if skip_first else seg.y)
    for i in range(len(t_events)):
        t_events[i].extend(seg.t_events[i].tolist())
        y_events[i].extend(list(seg.y_events[i]))


def _landing_times(t0, t1, y0, t_eval):
    """``(ts, ys, targets, record)``: the stored start and the output times to land on.

    ``targets`` are the times after ``t0`` (Python floats: a short run is mostly this
    bookkeeping), ``record`` whether each is stored (``t1`` is landed on without being
    stored when ``t_eval`` stops short).
    """
    ts, ys = [], []
    if t_eval is None:
        ts.append(t0)
        ys.append(np.array(y0, dtype=float))
        return ts, ys, [t1], [False]
    times = t_eval.tolist()
    ts += [t0] * times.count(t0)
    ys += [np.array(y0, dtype=float) for _ in ts]
    targets = [tk for tk in times if tk > t0]
    record = [True] * len(targets)
    if not targets or targets[-1] < t1:   # integrate to t1 as solve_ivp does
        targets.append(t1)
        record.append(False)
    return ts, ys, targets, record


def _fortran_solver(fun, method, watch, t, y, *, rtol, atol, max_step, first_step,
                    stabilized, nstiff):
    """Hairer's code for ``method`` from ``(t, y)``, ``watch`` called at every step end.

    ``stabilized`` turns on DOP853's stabilised step-size control (``beta``); ``nstiff``
    (``IWORK(4)``), when given, is the accepted step from which the stiffness test runs
    after every step.
    """
    solver = ode(fun).set_integrator(
        FORTRAN_CODES[method], rtol=rtol, atol=atol, nsteps=2**31 - 1,
        beta=STABILIZED_BETA if stabilized else 0.0,
        max_step=0.0 if not np.isfinite(max_step) else float(max_step),
        first_step=0.0 if first_step is None else float(first_step))
    solver.set_solout(watch)
    solver.set_initial_value(y, t)
    if nstiff is not None:
        solver._integrator.iwork[3] = nstiff
    return solver


def _fortran_stop(watch, solver, method, t1):
    """Why the Fortran code stopped: ``(python_to, failure)``.

    ``python_to``: the Python solver takes over up to this time (an event's step, or the
    rest of the run once the code found the problem stiff); ``failure``: the message of
    a failed run; both None when neither applies.
    """
    if watch.hit is not None:
        return watch.hit, None
    if watch.stiff:
        return t1, None
    if solver.successful():
        return None, None
    code = solver.get_return_code()
    if code == -4:
        # Hairer's stiffness test stopped the Fortran code; SciPy's DOP853 has no such
        # test and keeps going (within max_nfev), so "DOP853" means the same on both
        # paths: the Python solver finishes the run
        return t1, None
    return None, f"{FORTRAN_CODES[method]}: " + {
        -1: "input is not consistent", -2: "larger nsteps is needed",
        -3: "step size becomes too small"}.get(code, f"failed (code {code})")


def integrate_fortran(fun, method, t0, t1, y0, *, rtol, atol, max_step=np.inf,
                       first_step=None, t_eval=None, events=(), budget=None, stiff=None,
                       jac=None, nfev=None, t_offset=0.0, fortran_fun=None):
    """:func:`integrate_scipy` with the steps taken by Hairer's Fortran DOP853 or DOPRI5.

    The Fortran code (``scipy.integrate.ode``) runs the Runge-Kutta stages without
    returning to Python; a callback checks the events and the budget at the end of every
    step. The solver lands exactly on each output time, so no interpolation is needed.
    A step in which an event changes sign is replayed from its start by the Python
    solver of the same method (:func:`integrate_scipy`), whose dense output locates the root
    exactly as ``solve_ivp`` would; then the Fortran code resumes.

    ``method`` is ``"DOP853"`` or ``"RK45"``; other arguments (``t_offset`` too) as in
    :func:`integrate_scipy`. ``fortran_fun``, if given, is the same right-hand side for the
    Fortran code alone: it may return a buffer that it overwrites at every call (the
    code copies the result at once), which spares an allocation per evaluation; the
    Python solvers, which keep the arrays ``fun`` returns, get ``fun``.
    Hairer's stiffness test (``h |lambda| > 6.1`` on 15 accepted steps) stops the Fortran
    code; by default it starts at every 1000th accepted step (``dop853.f``'s ``NSTIFF``)
    and the Python solver of the same method finishes the run. With ``stiff`` (an
    ``OdeSolver`` subclass: ``method="auto"``) it runs after every accepted step and
    ``stiff`` (given ``jac``) finishes the run; ``Segment.stiff_from`` records where.
    With ``stiff``, ``jac`` and ``nfev`` (a callable giving the evaluation count),
    frequent rejected steps (``REJECT_STIFF`` among ``REJECT_WINDOW``) with
    ``h rho(jac) >= STIFF_H_RHO`` hand over too.
    """
    n = np.size(y0)
    t_events = [[] for _ in events]
    y_events = [[] for _ in events]
    ts, ys, targets, record = _landing_times(t0, t1, y0, t_eval)
    n_targets = len(targets)
    store = (ts, ys) if t_eval is None else (None, None)
    t_cur, y_cur = t0, np.array(y0, dtype=float)
    status, message, fired = None, "", None
    stiff_from = None
    auto = stiff is not None and method == "DOP853"
    njev = [0]
    trial = None   # method="auto" with a Jacobian: the stiff solver's trial needs its count
    if auto and jac is not None:
        trial = (lambda: njev[0], jac)
        jac = _counted(jac, njev)

    failed_trials = 0
    stabilized = False
    resume_step = None   # the first step of the stabilised restart
    k = 0
    while status is None:
        if k >= n_targets:
            status, message = 0, "the solver reached the end of the interval"
            break
        wait = (TRIAL_BACKOFF * 2 ** (failed_trials - 1) if failed_trials
                else STABILIZED_WAIT if stabilized else 0)
        watch = _Watch(t_cur, y_cur, events, budget, *store, nfev=nfev if auto else None,
                       jac=jac if auto else None, stiff_after=wait,
                       probe_every=(STABILIZED_PROBE * 2 ** failed_trials if stabilized
                                    else None))
        solver = _fortran_solver(fun if fortran_fun is None else fortran_fun, method,
                                 watch, t_cur, y_cur, rtol=rtol, atol=atol,
                                 max_step=max_step, stabilized=stabilized,
                                 first_step=resume_step if resume_step is not None
                                 else first_step,
                                 nstiff=None if stiff is None else max(wait, 1))
        resume_step = None
        while k < n_targets:
            with warnings.catch_warnings():   # failures are reported in the result
                warnings.simplefilter("ignore", UserWarning)
                y_k = solver.integrate(targets[k])
            if (watch.hit is not None or watch.spent or watch.stiff
                    or not solver.successful()):
                break
            if record[k]:
                ts.append(targets[k])
                ys.append(np.array(y_k, dtype=float))
            k += 1
        t_cur, y_cur = watch.t_prev, watch.y_prev
        if watch.spent:
            status, message = 2, "evaluation budget spent"
        elif watch.overflow is not None:
            status, message = -1, overflow_message(t_offset + t_cur,
                                                    t_offset + watch.overflow)
        python_to = None   # the Python solver takes over up to this time
        if auto and not stabilized and status is None and watch.hit is None and (
                watch.stiff or (not solver.successful() and solver.get_return_code() == -4)):
            # the first sign of stiffness: DOP853 goes on with the stabilised step-size
            # control; the stiff solver takes over at the next sign
            stabilized = True
            resume_step = watch.h_last
            continue
        python_to, failure = _fortran_stop(watch, solver, method, t1)
        if failure is not None:
            status, message = -1, failure
        if python_to is not None and status is None:
            j = _next_target(targets, k, python_to)
            cls, seg_jac, seg_first, give_up = METHODS[method], None, None, None
            if stiff is not None and watch.hit is None:
                cls, seg_jac, stiff_from = stiff, jac, t_cur
                seg_first, give_up = _stiff_handover(watch, t_cur, y_cur, t1, nfev, trial)
            seg = integrate_scipy(fun, cls, t_cur, python_to, y_cur, rtol=rtol, jac=seg_jac,
                            atol=atol, max_step=max_step, events=events, budget=budget,
                            first_step=seg_first, give_up=give_up, t_offset=t_offset,
                            t_eval=None if t_eval is None else np.array(
                                [tk for tk, r in zip(targets[k:j], record[k:j]) if r],
                                dtype=float))
            _merge(seg, ts, ys, t_events, y_events, skip_first=t_eval is None)
            t_cur, y_cur = seg.t_final, seg.y_final
            if seg.status in (1, 2, -1):
                status, message, fired = seg.status, seg.message, seg.fired
            if seg.status == 3:
                # the stiff solver lost its trial: DOP853 resumes where it stopped, its
                # stiffness tests held back for a while (longer after every lost trial)
                stiff_from = None
                failed_trials += 1
                k = _next_target(targets, k, t_cur)
                continue
            k = j
    return _segment(ts, ys, n, status, message, t_events, y_events, t_cur, y_cur, fired,
                    stiff_from)


def _counted(jac, njev):
    """``jac`` that counts its calls in ``njev[0]``."""
    def counted(t, y):
        njev[0] += 1
        return jac(t, y)

    return counted


def _next_target(targets, k, t):
    """The index of the first of ``targets[k:]`` after ``t`` (``len(targets)``: none)."""
    while k < len(targets) and targets[k] <= t:
        k += 1
    return k


def _stiff_handover(watch, t, y, t1, nfev, trial):
    """The stiff solver's first step at ``t`` and its trial ``give_up`` (or ``None``).

    The first step is the last explicit one (:func:`handover_step`). With ``trial``,
    ``(njev, jac)`` (the Jacobian count and the uncounted Jacobian), and an evaluation
    count ``nfev``, the stiff solver is on trial against DOP853's cost before the switch
    (:func:`stiff_trial`), when ``watch`` saw enough steps to measure it.
    """
    first = handover_step(watch.h_last, t, t1)
    rate = watch.explicit_cost() if nfev is not None else None
    if trial is not None and rate is not None:
        return first, stiff_trial(rate, nfev, trial[0], stiffness_of(trial[1]), y)
    return first, None
