r"""The event loop: :func:`scipy.integrate.solve_ivp` with the package's events.

:func:`integrate_system` integrates any state that has a covariance (the moment ODEs of
:func:`~gaussian_pde.solve`, and the closure solvers' states) with the events of
:mod:`gaussian_pde.integrate._events` as ``solve_ivp``'s event functions, so that every
solver stops at the same events with the same verdicts, for the method a user names;
its ``"auto"`` is LSODA.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
from scipy.integrate import BDF, LSODA, Radau, solve_ivp

from .._common.factor_rotation import REFACTOR_ABOVE_RESTART, REFACTOR_EVERY
from ._events import blowup_extrapolate, blowup_probe_step, blowup_verdict, rank_first, rank_gap, steady_gap
from ._options import METHODS
from ._results import Run, Status, overflow_message

__all__ = ["integrate_system", "AUTO_METHOD", "strictly_increasing"]

_TINY = np.finfo(float).tiny

#: the event loop's ``method="auto"``: LSODA switches between Adams and BDF steps by
#: itself, so a run that turns stiff needs no hand-over (given the exact Jacobian where
#: the field has one); SciPy's LSODA serves one problem at a time in a process (in
#: threads, name an explicit method)
AUTO_METHOD = "LSODA"


def _event(fun, terminal, direction, name):
    fun.terminal = terminal
    fun.direction = direction
    fun.__name__ = name
    return fun


def _user_event(system, ev, i, base=0.0):
    """A user's ``ev(t, mean, cov)`` as an event of the solver's state.

    The solver's time runs from ``base`` (the segment's start, see
    :func:`integrate_system`); the user's event sees the time itself.
    """
    def wrapped(t, y):
        mean, cov = system.mean_and_cov(y)
        try:
            value = ev(base + t, mean, cov)
        except Exception as exc:
            raise _UserEventError(i, exc) from exc
        return value

    return _event(wrapped, bool(getattr(ev, "terminal", False)),
                  float(getattr(ev, "direction", 0.0)),
                  getattr(ev, "__name__", f"event{i}"))


class _UserEventError(Exception):
    def __init__(self, i, exc):
        super().__init__(i, exc)
        self.i, self.exc = i, exc


def _blowup_estimate(system, t, y):
    """:func:`blowup_extrapolate` at a state: ``u''`` from a probe step along the flow."""
    cov, dcov = system.cov_and_rate(y)
    tr, dtr = float(np.trace(cov)), float(np.trace(dcov))
    if not (dtr > 0 and math.isfinite(dtr) and math.isfinite(tr)):
        return None, False
    h = float(blowup_probe_step(tr, dtr))
    cov2, dcov2 = system.cov_and_rate(y + h * system(t, y))
    return blowup_extrapolate(t, tr, dtr, float(np.trace(cov2)), float(np.trace(dcov2)), h)


def accepts_jac(solver_cls):
    """Whether the SciPy solver class uses a Jacobian (the implicit ones)."""
    return issubclass(solver_cls, (Radau, BDF, LSODA))


def integrate_system(system, y0, opts, method, *, user_events=(), jac=None):
    """Integrate ``system`` from ``y0`` with the package's events, by ``solve_ivp``.

    One :func:`scipy.integrate.solve_ivp` call a segment, with blow-up, steady state,
    rank collapse and the user's events as its event functions, and one more that stops
    at the end of the step that spends ``max_nfev``, leaves the system's range, overflows
    or asks for a re-factoring (:class:`_StepEnd`). A segment ends at ``t_span``'s end,
    at a terminal event, or at such a step end; a blow-up threshold passed before the
    blow-up is confirmed, or a re-factoring, starts the next one (on its own clock).

    Parameters
    ----------
    system : object
        ``fun(t, y)`` (counting ``system.nfev``), ``trace(y)``, ``cov_and_rate(y)``
        (covariance and its rate) and ``mean_and_cov(y)`` (for user events); optionally
        ``out_of_range(y)`` (a message where the field cannot be computed, else None) and
        ``cancellation``/``refactor`` (:class:`gaussian_pde.integrate._solve._System`).
    y0 : ndarray, shape (n,)
        The initial state.
    opts : SolverOptions
        Validated by :func:`gaussian_pde.integrate._options.solver_options`.
    method : str or OdeSolver subclass
        Validated; a :func:`scipy.integrate.solve_ivp` method, or ``"auto"``:
        :data:`AUTO_METHOD`.
    user_events : tuple of callables
        ``event(t, mean, cov)``, with optional ``terminal`` and ``direction``.
    jac : callable, optional
        Exact Jacobian, handed to the implicit methods only.

    Returns
    -------
    Run
    """
    t0, t1, t_eval = opts.t0, opts.t1, opts.t_eval
    if isinstance(method, str) and method == "auto":
        method = AUTO_METHOD
    solver_cls = METHODS[method] if isinstance(method, str) else method
    if not accepts_jac(solver_cls):
        jac = None
    reason = _no_step_from(system, y0)
    if reason is not None:
        # no step can be taken: the initial state alone, with the reason
        keep = np.array([t0]) if t_eval is None else t_eval[t_eval == t0]
        return Run(t=keep, y=np.repeat(np.asarray(y0, dtype=float)[None], keep.size, 0),
                   status=Status.FAILED, message=f"{reason} at t = {t0:.10g}",
                   t_blowup=None, t_final=float(t0), y_final=np.asarray(y0), t_events={},
                   nfev=system.nfev)
    loop = _EventLoop(system, opts, solver_cls, jac, user_events, y0)
    ts, ys, t_events = [], [], {}
    t_start, y_start, limit = t0, y0, opts.events.blowup_threshold
    suspected = None   # (t*, t) of a blow-up estimate awaiting confirmation
    while True:
        # a restarted segment runs on its own clock, tau = t - t_start from 0 (the
        # dynamics are autonomous): near a blow-up at t*, the steps that resolve the time
        # t* - t left are far below the rounding of t itself (ulp(t) ~ 1e-23 at t ~ 5e-8),
        # but not of tau; the first segment runs on t itself, as solve_ivp does
        base = 0.0 if t_start == t0 else t_start
        evs = loop.events(limit, base)
        # a restarted segment stores only times strictly after the restart time
        seg_eval = None if t_eval is None else t_eval[
            (t_eval > t_start) | ((t_eval == t_start) & (not ts))]
        seg = loop.segment(evs, t_start, y_start, base, seg_eval)
        keep = slice(1, None) if t_eval is None and ts else slice(None)   # no repeated restart
        ts.append(seg.t[keep])
        ys.append(seg.y[keep])
        for ev, te in zip(evs, seg.t_events):
            if ev is not evs[-1]:      # the step-end stop is no event of the run
                t_events.setdefault(ev.__name__, []).extend(np.minimum(base + te, t1).tolist())
        end = loop.outcome(seg, evs, limit, suspected)
        if end[0] == "restart":
            t_start, y_start, limit, suspected = end[1:]
            continue
        status, message, t_blowup = end[1:]
        break
    t_all = np.concatenate(ts) if ts else np.empty(0)
    y_all = np.concatenate(ys, axis=0) if ys else np.empty((0, y0.size))
    t_all, y_all = strictly_increasing(t_all, y_all)
    return Run(t=t_all, y=y_all, status=status, message=message, t_blowup=t_blowup,
               t_final=float(seg.t_final), y_final=np.asarray(seg.y_final),
               t_events={k: np.asarray(v) for k, v in t_events.items()}, nfev=system.nfev)


def _no_step_from(system, y0):
    """Why no step can be taken from ``y0`` (None: one can).

    The system's own ``out_of_range(y0)``, or a right-hand side that is not finite there:
    SciPy's first-step estimate is then NaN, and its explicit solvers reject NaN steps
    without end.
    """
    out_of_range = getattr(system, "out_of_range", None)
    if out_of_range is not None and out_of_range(y0) is not None:
        return out_of_range(y0)
    with np.errstate(all="ignore"):
        if not np.isfinite(system.fun(0.0, y0)).all():
            return "the right-hand side overflows (inf or NaN) at the initial state"
    return None


@dataclasses.dataclass
class _Segment:
    """One ``solve_ivp`` call of :func:`integrate_system`, on the run's clock.

    ``t``/``y``: the stored times and states (``(T, n)``); ``t_events``: one array per
    event, on the segment's clock; ``fired``: the terminal event that stopped it (None:
    ``solve_ivp``'s status 0 or -1, in ``status`` and ``message``); ``t_final``,
    ``y_final``: where it stopped.
    """

    t: np.ndarray
    y: np.ndarray
    status: int
    message: str
    t_events: list
    fired: int | None
    t_final: float
    y_final: np.ndarray


class _StepEnd:
    """An event function that stops ``solve_ivp`` at the end of a step, and why.

    ``solve_ivp`` calls its events with each accepted step's end state; this one returns
    1 until ``reason(t, y)`` gives a reason to stop there (not None), and
    :math:`t_s - t` from then on, so that the sign change lands on that step end
    :math:`t_s` exactly (Brent's method returns an end where the function vanishes). It
    keeps the last step end that gave no reason (``t_last``, ``y_last``: where a run
    that ends with ``solve_ivp``'s own status stands) and the state at the stop.
    """

    terminal, direction, __name__ = True, -1.0, "step_end"

    def __init__(self, reason, t0, y0):
        self.reason_at, self.reason = reason, None
        self.looked = False
        self.t_last, self.y_last = t0, np.array(y0, dtype=float)
        self.t_stop = self.y_stop = None

    def __call__(self, t, y):
        if self.t_stop is None:
            if not self.looked:      # solve_ivp's look at the initial state
                self.looked = True
                return 1.0
            self.reason = self.reason_at(t, y)
            if self.reason is None:
                self.t_last, self.y_last = t, np.array(y, dtype=float)
                return 1.0
            self.t_stop, self.y_stop = t, np.array(y, dtype=float)
        return self.t_stop - t


class _EventLoop:
    """The pieces of :func:`integrate_system`'s loop.

    The reasons to stop at a step end, the events of a segment, one segment's
    ``solve_ivp`` call, and what its end means.
    """

    def __init__(self, system, opts, solver_cls, jac, user_events, y0):
        self.system, self.opts = system, opts
        self.solver_cls, self.jac = solver_cls, jac
        self.user_events = user_events
        # re-factor L -> LW when its columns cancel (gaussian_pde._common.factor_rotation):
        # looked at every REFACTOR_EVERY-th step end (the cancellation builds up over many
        # steps; an SVD at every step would cost as much as the step), the run then goes
        # on from the rotated factor; a re-factoring restarts the solver, so after each
        # one the look waits twice as many steps: a run whose spread keeps growing
        # (K = -Q to t = 1e8) restarts O(log steps) times, not every REFACTOR_EVERY steps
        self.refactor = getattr(system, "refactor", None)
        self.out_of_range = getattr(system, "out_of_range", None)
        self.due = {"steps": 0, "every": REFACTOR_EVERY}
        self.tr0 = max(system.trace(y0), _TINY)
        self.first = self.d = None
        rank_tol = opts.events.rank_tol
        if rank_tol is not None:
            cov0 = system.mean_and_cov(y0)[1]
            self.first, self.d = int(rank_first(cov0, rank_tol)), cov0.shape[-1]

    def stop_reason(self, t, y):
        """Why the run stops at this step end (None: it goes on).

        ``("overflow",)``, ``("budget",)``, ``("range", message)`` or ``("refactor",)``.
        """
        system, due, max_nfev = self.system, self.due, self.opts.max_nfev
        if not np.isfinite(y).all():
            # an accepted step that left the floating-point range (an implicit method can
            # accept one): the run ends at the last finite state
            return ("overflow",)
        if max_nfev is not None and system.nfev > max_nfev:
            return ("budget",)
        if self.out_of_range is not None:
            message = self.out_of_range(y)
            if message is not None:
                return ("range", message)
        if self.refactor is not None:
            due["steps"] += 1
            if due["steps"] >= due["every"]:
                due["steps"] = 0
                if system.cancellation(y, self.opts.atol, self.opts.rtol,
                                       REFACTOR_ABOVE_RESTART):
                    due["every"] *= 2
                    return ("refactor",)
        return None

    def events(self, limit, base):
        """The segment's events: blow-up, steady state, rank collapse and the user's.

        Blow-up past ``limit`` times tr(Sigma_0); the user's events see the time on the
        segment's clock from ``base``. :meth:`segment` appends the step-end stop.
        """
        system, ev_opts, first, d = self.system, self.opts.events, self.first, self.d
        log_limit = math.log(limit * self.tr0)

        def blowup(t, y):   # log tr(Sigma) - log(limit tr(Sigma_0))
            return math.log(max(system.trace(y), 1e-300)) - log_limit

        evs = [_event(blowup, True, 1.0, "blowup")]
        if ev_opts.steady_on:
            def steady(t, y):
                cov, dcov = system.cov_and_rate(y)
                return float(steady_gap(cov, dcov, ev_opts.steady_tol, ev_opts.steady_atol))

            evs.append(_event(steady, True, -1.0, "steady"))
        if first is not None and first < d:
            def rank_collapse(t, y):
                return float(rank_gap(system.mean_and_cov(y)[1], first, ev_opts.rank_tol))

            evs.append(_event(rank_collapse, True, -1.0, "rank_collapse"))
        evs += [_user_event(system, ev, i, base) for i, ev in enumerate(self.user_events)]
        return evs

    def segment(self, evs, t_start, y_start, base, seg_eval):
        """``solve_ivp`` from ``t_start`` until ``t1``, an event or a step-end stop."""
        opts, system = self.opts, self.system
        watch = _StepEnd(self.stop_reason, t_start - base, y_start)
        evs.append(watch)
        kw = dict(rtol=opts.rtol, atol=opts.atol, max_step=opts.max_step)
        if opts.first_step is not None:
            kw["first_step"] = opts.first_step
        if self.jac is not None:
            kw["jac"] = self.jac
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                res = solve_ivp(system.fun, (t_start - base, opts.t1 - base), y_start,
                                method=self.solver_cls, events=evs,
                                t_eval=None if seg_eval is None else seg_eval - base, **kw)
        except _UserEventError as err:
            raise ValueError(f"`events[{err.i}]` raised {type(err.exc).__name__}: "
                             f"{err.exc}") from err.exc
        return _segment_of(res, evs, watch, base, opts.t1, seg_eval)

    def outcome(self, seg, evs, limit, suspected):
        """What a segment's end means: go on from ``(t, y)``, or stop.

        ``("restart", t, y, limit, suspected)`` or ``("stop", status, message, t_blowup)``.
        """
        t_final, y_final = seg.t_final, seg.y_final
        if seg.fired is None:
            if seg.status == 0:
                return "stop", Status.FINISHED, "reached the end of t_span", None
            return "stop", Status.FAILED, seg.message, None
        name = evs[seg.fired].__name__
        if seg.fired == len(evs) - 1:        # the step-end stop
            name = evs[-1].reason[0]
        if name == "overflow":
            return "stop", Status.FAILED, seg.message, None
        if name == "range":
            return "stop", Status.FAILED, f"{evs[-1].reason[1]} at t = {t_final:.10g}", None
        if name == "refactor":
            return "restart", t_final, self.refactor(y_final), limit, suspected
        if name == "blowup":
            t_star, finite = _blowup_estimate(self.system, t_final, y_final)
            verdict, detail = blowup_verdict(t_star, finite, t_final, limit, suspected)
            if verdict == Status.BLOWUP:
                return "stop", verdict, detail, float(t_star)
            if verdict == Status.FAILED:
                return "stop", verdict, detail, None
            suspected, new_limit = detail
            return "restart", t_final, y_final, new_limit, suspected
        if name == "budget":
            return "stop", Status.FAILED, _gave_up(self.opts.max_nfev, t_final,
                                                   accepts_jac(self.solver_cls)), None
        status = {"steady": Status.STEADY, "rank_collapse": Status.RANK_COLLAPSE}.get(
            name, Status.EVENT)
        return "stop", status, f"terminal event {name!r} at t = {t_final:.10g}", None


def _segment_of(res, evs, watch, base, t1, seg_eval):
    """The :class:`_Segment` of a ``solve_ivp`` result, on the run's clock.

    Where it stopped: the fired terminal event's time and state (the step-end stop's
    exact step end, or, past an overflow, the last finite step end, with the stored
    states after it dropped), else ``t1`` or the last step end.
    """
    # (solve_ivp returns empty lists where no output time was passed)
    t = base + np.asarray(res.t, dtype=float)
    y = np.reshape(res.y, (watch.y_last.size, -1)).T
    fired = next((i for i, ev in enumerate(evs)
                  if getattr(ev, "terminal", False) and len(res.t_events[i])), None)
    message = res.message
    if fired is None:
        t_final, y_final = (t1, watch.y_last) if res.status == 0 else (
            base + watch.t_last, watch.y_last)
    elif fired == len(evs) - 1:
        t_final, y_final = base + watch.t_stop, watch.y_stop
        if watch.reason[0] == "overflow":
            message = overflow_message(base + watch.t_last, t_final)
            t_final, y_final = base + watch.t_last, watch.y_last
            keep = t <= t_final
            t, y = t[keep], y[keep]
        elif seg_eval is None:
            y = y.copy()
            y[-1] = y_final          # the step end itself, not its dense output
    else:
        t_final, y_final = base + res.t_events[fired][-1], res.y_events[fired][-1]
    if seg_eval is not None:
        t = seg_eval[:t.size]        # the output times themselves, not base + tau
    else:
        # the solver's last step lands on tau1 exactly; base + tau1 may round past t1
        t = np.minimum(t, t1)
        if res.status == 0 and t.size:
            t[-1] = t1
    return _Segment(t=t, y=y, status=res.status, message=message, t_events=res.t_events,
                    fired=fired, t_final=min(float(t_final), t1), y_final=y_final)


def _gave_up(max_nfev, t, implicit):
    """The message of a run that spent its evaluation budget at ``t``."""
    advice = "a larger max_nfev" if implicit else "method='LSODA' or a larger max_nfev"
    return (f"gave up after {max_nfev} right-hand-side evaluations at t = {t:.10g} "
            f"(stiff or nearly singular dynamics; try {advice})")


def strictly_increasing(t, y):
    """Drop a stored row whose time repeats the one before it (an event at a step end).

    The loop stores each step end once and an event time strictly inside its step
    (``solve_ivp`` and the compiled engine alike), so this keeps the invariant of the
    result (``t`` strictly increasing) against rounding only.
    """
    if t.size < 2:
        return t, y
    keep = np.ones(t.size, dtype=bool)
    keep[1:] = np.diff(t) > 0
    if keep.all():
        return t, y
    return t[keep], y[keep]
