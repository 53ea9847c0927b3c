r""":func:`solve`: one trajectory of the Gaussian moment ODEs, and the event loop.

The covariance is integrated in factor form (docs/math.md section 3): with
:math:`\Sigma = LL^T`,

.. math:: L' = M(\Sigma)\,L,\qquad \alpha' = b(\alpha, \Sigma) + M(\Sigma)\,\alpha,

so :math:`\Sigma(t) = F(t)\Sigma_0F(t)^T` with :math:`F` invertible: the covariance is
symmetric positive semi-definite and keeps its rank exactly, at every step, whatever the
integration error. The events (blow-up, steady state, rank collapse) are those of
:mod:`gaussian_pde.integrate._events`.

Two paths. The default ``"auto"``, where the attention has a compiled field (and without
user ``events`` or ``first_step``), is one trajectory of the compiled engine
(:func:`~gaussian_pde.integrate._compiled_batch.integrate_one`), the same steps and
verdicts as :func:`~gaussian_pde.solve_batch`'s. Every other run takes the event loop
:func:`integrate_system`: :func:`scipy.integrate.solve_ivp` through its public API, with
the events as its event functions; its ``"auto"`` is LSODA. The closure solvers run the
event loop too, so that every solver stops at the same events with the same verdicts.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
from scipy.integrate import BDF, LSODA, Radau, solve_ivp

from .._common.factor_rotation import REFACTOR_ABOVE_RESTART, REFACTOR_EVERY, cancellation_exceeds, rotation
from .._common.linalg import psd_factor, psd_sqrt
from .._common.validation import validate_covariance, validate_t_span, validate_vector
from .._exact import linear_mean
from ..attention import require_mean, validate_attention
from ._batch import solve_batch
from ._events import (
    blowup_extrapolate,
    blowup_probe_step,
    blowup_verdict,
    rank_first,
    rank_gap,
    rank_note,
    steady_gap,
)
from ._moment_field import max_abs, mean_scale, moment_jacobian, state_field
from ._options import METHODS, solver_options, validate_method, validate_user_events
from ._results import MomentSolution, Run, Status, overflow_message

__all__ = ["solve", "integrate_system", "AUTO_METHOD"]

_TINY = np.finfo(float).tiny

#: the event loop's ``method="auto"``: LSODA switches between Adams and BDF steps by
#: itself, so a run that turns stiff needs no hand-over (given the exact Jacobian where
#: the field has one); SciPy's LSODA serves one problem at a time in a process (in
#: threads, name an explicit method)
AUTO_METHOD = "LSODA"


class _System:
    """State packing and right-hand side of the factor-form moment ODE.

    The interface :func:`integrate_system` needs from any state: ``fun(t, y)`` (counting
    ``nfev``), ``trace(y)``, ``cov_and_rate(y)`` and ``mean_and_cov(y)``. The state is
    the factor ``L`` (covariance only) or the ``d x (d + 1)`` matrix
    ``[L | mean / mean_scale]``, flattened row-major, so that one kernel (the
    attention's compiled field, :func:`gaussian_pde.integrate._moment_field.state_field`)
    gives both rates. The mean's
    equation is linear and homogeneous, so the scaled mean obeys the same equation;
    ``mean_scale`` (a power of 2, exact) only sets the units in which the solver's
    tolerances apply to it (see :func:`~gaussian_pde.integrate._moment_field.mean_scale`).
    """

    def __init__(self, attention, with_mean, mean_scale=1.0, zero_mean=False):
        self.att = attention
        self.d = d = attention.d
        #: the mean is identically zero and left out of the state (see :func:`solve`)
        self.zero_mean = zero_mean
        with_mean = with_mean and not zero_mean
        self.with_mean = with_mean
        self.mean_scale = float(mean_scale)
        self.m = d + 1 if with_mean else d
        self.nfev = 0
        self.field = state_field(attention, with_mean)

    def fun(self, t, y):
        """The right-hand side handed to the solver (a new array at every call)."""
        self.nfev += 1
        return self.field(y.reshape(self.d, self.m)).reshape(-1)

    __call__ = fun

    def split(self, y):
        """``(mean, L)`` of one state ``(n,)`` or a stack ``(T, n)``; copies."""
        y = np.asarray(y)
        Z = y.reshape(y.shape[:-1] + (self.d, self.m))
        L = np.ascontiguousarray(Z[..., :self.d])
        if self.zero_mean:
            return np.zeros(L.shape[:-1]), L
        if not self.with_mean:
            return None, L
        # a mean that grew past the floating-point range in its own units (the solver's
        # are a power of 2 smaller) is inf, as it is; the run's message says why it stopped
        with np.errstate(over="ignore"):
            return Z[..., self.d] * self.mean_scale, L

    def pack(self, mean, L):
        """The flat state of ``L`` and ``mean`` (left out where the state has no mean)."""
        if not self.with_mean:
            return np.array(L, dtype=float).ravel()
        Z = np.empty((self.d, self.m))
        Z[:, :self.d] = L
        Z[:, self.d] = mean
        if self.mean_scale != 1.0:
            Z[:, self.d] /= self.mean_scale
        return Z.ravel()

    def trace(self, y):
        """``tr(Sigma) = |L|_F^2``."""
        L = y.reshape(self.d, self.m)[:, :self.d].ravel()
        return float(L.dot(L))

    def cov_and_rate(self, y):
        """Covariance and its time derivative at a packed state."""
        d = self.d
        Z = y.reshape(d, self.m)
        L = Z[:, :d]
        dL = self.field(Z)[:, :d]
        cov = L @ L.T
        dcov = dL @ L.T
        return cov, dcov + dcov.T

    def mean_and_cov(self, y):
        """``(mean, cov)`` of one state, new arrays (what the events see at every step)."""
        Z = y.reshape(self.d, self.m)
        L = Z[:, :self.d]
        if self.zero_mean:
            return np.zeros(self.d), L @ L.T
        if not self.with_mean:
            return None, L @ L.T
        with np.errstate(over="ignore"):
            return Z[:, self.d] * self.mean_scale, L @ L.T

    def cancellation(self, y, atol, rtol, level):
        """:func:`~gaussian_pde._common.factor_rotation.cancellation_exceeds` of the factor."""
        Z = y.reshape(self.d, self.m)
        return cancellation_exceeds(Z[:, :self.d], atol, rtol, level, fro2=self.trace(y))

    def refactor(self, y):
        r"""The same covariance (and mean) with the factor's columns made orthogonal.

        :math:`L \mapsto LW` (:func:`gaussian_pde._common.factor_rotation.rotation`), an
        exact symmetry of the factor-form flow; the mean's column is left as it is.
        """
        Z = np.array(y, dtype=float).reshape(self.d, self.m)
        L = Z[:, :self.d]
        Z[:, :self.d] = L @ rotation(L)
        return Z.ravel()


#: a mean larger than this, or not finite, has left the range of float64 (to a margin)
_MEAN_RANGE = 1e300


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
        ``cancellation``/``refactor`` (:class:`_System`).
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
    t_all, y_all = _strictly_increasing(t_all, y_all)
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


def _solve_compiled(system, y0, opts):
    """``method="auto"`` in the compiled engine (a :class:`Run`); None where it does not apply.

    It applies where the attention has a compiled field and no ``first_step`` is given
    (the caller sends user events to the event loop).
    """
    from . import _compiled_batch as core

    if opts.first_step is not None:
        return None
    fields = core.compiled_fields(system.att)
    if fields is None:
        return None
    ev = opts.events
    first = (system.d if ev.rank_tol is None
             else int(rank_first(system.mean_and_cov(y0)[1], ev.rank_tol)))
    run = core.integrate_one(fields, y0, system.d, system.m, max(system.trace(y0), _TINY),
                             first, opts)
    system.nfev = run.nfev
    # past a blow-up look the clock runs from there: near t* its steps can fall below
    # the rounding of t itself, and a stored time repeats
    run.t, run.y = _strictly_increasing(run.t, run.y)
    return run


def _strictly_increasing(t, y):
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


def solve(attention, mean0, cov0, t_span, *, t_eval=None, method="auto", rtol=1e-10,
          atol=1e-12, blowup_threshold=1e8, steady_tol=None, steady_atol=0.0, rank_tol=None,
          events=(), max_step=np.inf, first_step=None, max_nfev=100_000):
    r"""Integrate the Gaussian moment ODEs of a Gaussian-preserving attention type.

    .. math::

        \alpha' = b + M\alpha,\qquad L' = ML,\qquad \Sigma = LL^T,

    with :math:`b + Mx` the attention's affine field against
    :math:`\mathcal N(\alpha,\Sigma)` (docs/math.md section 3).

    Parameters
    ----------
    attention : Attention
        ``Softmax``, ``L2``, ``Sinkhorn`` or ``MultiHead``.
    mean0 : array_like, shape (d,), or None
        Initial mean. ``None`` integrates the covariance alone (its equation does not
        involve the mean), except for a type whose field matrix depends on the mean
        (``attention.field_sees_mean``: linear attention), which requires it. Where the
        mean's equation is linear in the mean (:math:`\alpha' = N(\Sigma)\alpha`), it
        rides in the same field kernel as the factor
        (:mod:`gaussian_pde.integrate._moment_field`), at about the cost of the
        covariance alone; its error is controlled like the factor's, so a mean growing
        like :math:`e^{\lambda_{\max}(V)t}` needs the steps that resolve it (and
        overflows float64 once :math:`\lambda_{\max}(V)t` passes about 700). A zero mean
        of softmax, L2 and Sinkhorn heads stays exactly zero: it is then left out of the
        state, and the run takes the steps of the covariance alone. So is a mean whose
        equation does not involve the covariance (Sinkhorn: :math:`\alpha' = V\alpha`;
        :meth:`~gaussian_pde.Attention.mean_generator`), which is then
        :math:`e^{(t - t_0)N}\alpha_0` exactly (:func:`~gaussian_pde._exact.linear_mean`),
        unless user ``events`` need it at every step; a mean past the floating-point
        range is inf there, and the message says from which stored time.
    cov0 : array_like, shape (d, d)
        Initial covariance, symmetric positive semi-definite (any rank).
    t_span : (float, float)
        Interval of integration, increasing.
    t_eval : array_like, optional
        Times at which to store the solution (within ``t_span``, increasing).
    method : str or OdeSolver subclass
        ``"auto"`` (default): DOP853 steps with Hairer's stiffness test after every
        accepted step (:math:`h|\lambda| > 6.1` on 15 steps); once it fires (or, where
        the Jacobian has a closed form, once DOP853 crawls at its stability limit: 75
        of a block of 100 accepted steps with :math:`h|\lambda| \ge 2`), RODAS4P2
        (L-stable, order 4) takes the steps to the end, with the closed-form Jacobian of
        the field where the type has one and central differences otherwise; the
        ``message`` then ends with ``"; stiff from t = ... on: RODAS4P2"``. Where the
        attention has a compiled field and neither user ``events`` nor ``first_step``
        are given, this is :func:`~gaussian_pde.solve_batch`'s ``"auto"`` for the one
        trajectory, in the same compiled engine: the same steps, events, verdicts,
        evaluations and messages (``t_events["blowup"]`` holds where the trace passed
        each threshold, located on the dense output to rounding). Otherwise (user
        ``events``, ``first_step``, a field without a compiled kernel) the event loop
        runs :func:`scipy.integrate.solve_ivp` with ``"LSODA"``, which switches between
        Adams and BDF steps itself, given the exact Jacobian of the factor form and of
        the mean where the type has one. Or any :func:`scipy.integrate.solve_ivp`
        method, stepped by ``solve_ivp`` itself; ``"LSODA"``, ``"Radau"`` and ``"BDF"``
        get the exact Jacobian in covariance-only mode. Or ``"rosenbrock"``: the
        L-stable linearly implicit RODAS4P2 of :func:`gaussian_pde.integrate._batch.solve_batch`
        (one trajectory), for stiff runs to a
        steady state; covariance only (``mean0=None``), without user ``events`` or
        ``first_step``; ``t`` holds ``t_eval`` (up to the stop) or, without it, the
        initial and final times; right-hand-side counts include the Jacobian's.
    rtol, atol : float
        Tolerances, in solver units, on the entries of the mean and of ``L``.
    blowup_threshold : float
        Blow-up event when :math:`\operatorname{tr}\Sigma` exceeds this multiple of
        :math:`\operatorname{tr}\Sigma_0`.
    steady_tol, steady_atol : float, optional
        Stop at a steady state, :math:`\|\Sigma'\|_F \le` ``steady_tol``
        :math:`\|\Sigma\|_F` + ``steady_atol``. On when ``steady_tol`` is given or
        ``steady_atol`` is positive (``steady_atol`` alone is the paper's criterion
        :math:`\|\Sigma'\|_F \le` ``steady_atol``), as in every solver.
    rank_tol : float, optional
        Stop when an eigenvalue of :math:`\Sigma/\operatorname{tr}\Sigma` that started
        above ``rank_tol`` falls below it (rank collapse). Off when ``None``.
    events : sequence of callables
        User events ``event(t, mean, cov) -> float`` with optional ``terminal`` and
        ``direction`` attributes, as in :func:`scipy.integrate.solve_ivp`.
    max_step, first_step : float, optional
        Passed to the SciPy solver.
    max_nfev : int, optional
        Give up (status ``"failed"``) after this many right-hand-side evaluations, so a
        stiff stretch never hangs an explicit method; try ``method="Radau"`` there.

    Returns
    -------
    MomentSolution
        With ``t``, ``mean``, ``cov``, ``status``, ``message``, ``t_blowup``.

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=0.5)
    >>> sol = gp.solve(att, None, np.eye(2), (0, 2))
    >>> sol.status, round(sol.t_blowup, 6)      # exact: 1/lambda_max(A + A^T) = 1
    (<Status.BLOWUP: 'blowup'>, 1.0)
    """
    validate_attention(attention)
    require_mean(attention, mean0, "mean0")
    opts = solver_options(t_span, t_eval=t_eval, rtol=rtol, atol=atol, max_step=max_step,
                          first_step=first_step, max_nfev=max_nfev,
                          blowup_threshold=blowup_threshold, steady_tol=steady_tol,
                          steady_atol=steady_atol, rank_tol=rank_tol)
    if isinstance(method, str) and method == "rosenbrock":
        return _solve_rosenbrock(attention, mean0, cov0, t_span, t_eval=t_eval, rtol=rtol,
                                 atol=atol, blowup_threshold=blowup_threshold,
                                 steady_tol=steady_tol, steady_atol=steady_atol,
                                 rank_tol=rank_tol, events=events, max_step=max_step,
                                 first_step=first_step, max_nfev=max_nfev)
    d = attention.d
    with_mean = mean0 is not None
    mean0 = validate_vector(mean0, "mean0", size=d) if with_mean else None
    cov0 = validate_covariance(cov0, "cov0", d=d)
    method = validate_method(method, extra=("rosenbrock", "auto"))
    events = validate_user_events(events)
    auto = isinstance(method, str) and method == "auto"
    # a zero mean of a type whose mean equation is linear and homogeneous
    # (alpha' = N(Sigma) alpha) stays exactly zero: it is left out of the state, so that
    # it changes neither the steps nor the cost
    linear = with_mean and attention.mean_is_linear()
    zero_mean = linear and max_abs(mean0) == 0.0
    # a mean whose equation does not involve the covariance (alpha' = N alpha: Sinkhorn)
    # is exp((t - t0) N) mean0: not integrated at all (user events, which see the mean
    # at every step, keep it in the state)
    generator = (attention.mean_generator() if with_mean and not zero_mean and not events
                 else None)
    system = _System(attention, with_mean and generator is None, zero_mean=zero_mean,
                     mean_scale=mean_scale(mean0, opts.rtol, opts.atol) if auto and linear
                     else 1.0)
    with_mean = system.with_mean
    y0 = system.pack(mean0, psd_factor(cov0))
    run = _solve_compiled(system, y0, opts) if auto and not events else None
    if run is None:
        # the exact Jacobian of the factor form (and, for "auto", of the mean's rows)
        jac = moment_jacobian(attention, with_mean) if auto or not with_mean else None
        run = integrate_system(system, y0, opts, method, user_events=events, jac=jac)
    means, Ls = system.split(run.y)
    covs = Ls @ np.swapaxes(Ls, -1, -2)
    mean_f, L_f = system.split(run.y_final)
    cov_f = L_f @ L_f.T
    message = run.message + rank_note(cov0, cov_f, run.status)
    if run.status == Status.FAILED and with_mean and not max_abs(mean_f) < _MEAN_RANGE:
        # the solver's own message ("step size becomes too small") does not say why
        message = (message.rstrip(".") + f"; the mean had left the floating-point range "
                   f"by t = {run.t_final:.10g} (|mean| = {max_abs(mean_f):.3g}; it grows "
                   "exponentially where its linear equation alpha' = N(Sigma) alpha has "
                   "eigenvalues of positive real part): mean0=None integrates the "
                   "covariance alone")
    if generator is not None:
        means, message = _exact_means(generator, mean0, run, opts.t0, message)
        mean_f = (means[-1].copy() if run.t.size and run.t[-1] == run.t_final
                  else linear_mean(generator, mean0, [run.t_final - opts.t0])[0])
    return MomentSolution(
        t=run.t, mean=means, cov=covs, factor=Ls, status=run.status, message=message,
        t_blowup=run.t_blowup, t_final=run.t_final,
        mean_final=mean_f, cov_final=cov_f,
        t_events=run.t_events, nfev=run.nfev)


def _exact_means(generator, mean0, run, t0, message):
    """The means ``exp((t - t0) N) mean0`` at the run's times, and the message.

    A mean past the floating-point range is said in the message (the covariance's
    verdict stands: that mean is exact, only not representable).
    """
    means = linear_mean(generator, mean0, run.t - t0)
    finite = np.isfinite(means).all(axis=-1)
    if not finite.all():
        message += (f"; the mean, exp((t - t0) N) mean0, is past the floating-point range "
                    f"(inf or NaN) at the stored times from t = "
                    f"{run.t[np.argmin(finite)]:.10g} on")
    return means, message


def _solve_rosenbrock(attention, mean0, cov0, t_span, *, t_eval, rtol, atol, blowup_threshold,
                      steady_tol, steady_atol, rank_tol, events, max_step, first_step,
                      max_nfev):
    """``solve(..., method="rosenbrock")``: one trajectory of the batched RODAS4P2."""
    if mean0 is not None:
        raise ValueError("`method='rosenbrock'` integrates the covariance only: pass "
                         "`mean0=None` (the covariance equation does not involve the mean), "
                         "or use a SciPy method such as 'Radau' for the mean.")
    if callable(events) or tuple(events):
        raise ValueError("`events` are not supported with `method='rosenbrock'`; use a SciPy "
                         "method such as 'Radau' for user events.")
    if first_step is not None:
        raise ValueError("`first_step` is not supported with `method='rosenbrock'`.")
    cov0 = validate_covariance(cov0, "cov0", d=attention.d)
    bs = solve_batch(attention, cov0[None], t_span, t_eval=t_eval, rtol=rtol, atol=atol,
                     blowup_threshold=blowup_threshold, steady_tol=steady_tol,
                     steady_atol=steady_atol, rank_tol=rank_tol, max_step=max_step,
                     max_nfev=max_nfev, method="rosenbrock")
    sol = bs.trajectory(0)
    t_events = {}
    if sol.status == Status.BLOWUP:
        t_events["blowup"] = np.array([sol.t_final])
    elif sol.status in (Status.STEADY, Status.RANK_COLLAPSE):
        t_events[str(sol.status)] = np.array([sol.t_final])
    if t_eval is None:   # the initial and the final state
        t0 = float(validate_t_span(t_span)[0])
        cov = np.stack([cov0, sol.cov_final])
        sol = dataclasses.replace(sol, t=np.array([t0, sol.t_final]), cov=cov,
                                  factor=psd_sqrt(cov))
    return dataclasses.replace(sol, t_events=t_events)
