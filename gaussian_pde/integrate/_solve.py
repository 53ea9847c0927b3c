r"""Adaptive integration of the Gaussian moment ODEs with events.

The covariance is integrated in factor form (MATH.md section 3): with
:math:`\Sigma = LL^T`,

.. math:: L' = M(\Sigma)\,L,\qquad \alpha' = b(\alpha, \Sigma) + M(\Sigma)\,\alpha,

so :math:`\Sigma(t) = F(t)\Sigma_0F(t)^T` with :math:`F` invertible: the covariance is
symmetric positive semi-definite and keeps its rank exactly, at every step, whatever the
integration error. Events add what :func:`scipy.integrate.solve_ivp` lacks:

* **blow-up**: :math:`\operatorname{tr}\Sigma` passes ``blowup_threshold`` times its
  initial value; the blow-up time is extrapolated from
  :math:`u = 1/\operatorname{tr}\Sigma`, which tends to zero linearly at a finite-time
  singularity: :math:`t^* \approx t - u/u'`. Growth that is not finite-time (``u`` not
  linear, e.g. exponential) is followed further instead of being called a blow-up, and
  an estimate is only reported once a second one, after the trace has grown 100 times
  more, agrees with it (accelerating exponential growth can look locally like a
  singularity, but its estimates drift);
* **steady state**: :math:`\|\Sigma'\|_F \le` ``steady_tol`` :math:`\|\Sigma\|_F` +
  ``steady_atol``;
* **rank collapse**: an eigenvalue of :math:`\Sigma/\operatorname{tr}\Sigma` that was
  above ``rank_tol`` falls below it.

The steps are taken by ``gaussian_pde.integrate._loop``: SciPy's solver classes in a lean loop,
or Hairer's Fortran DOP853/DOPRI5 for ``"DOP853"``/``"RK45"``; event semantics are those of
:func:`scipy.integrate.solve_ivp`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
import warnings

import numpy as np
from scipy.integrate import OdeSolver
from scipy.integrate._ivp.ivp import METHODS

from .._common.linalg import psd_sqrt
from .._common.validation import (
    validate_covariance,
    validate_int,
    validate_positive,
    validate_t_eval,
    validate_t_span,
    validate_tolerance,
    validate_vector,
)
from ..attention._moments import validate_attention
from ._loop import accepts_jac, integrate, integrate_compiled, use_compiled

__all__ = ["Status", "MomentSolution", "solve"]

#: the largest trace ratio followed before giving up on a growing solution
_MAX_GROWTH = 1e200
#: a blow-up estimate is confirmed after the trace grows this much further, when the new
#: estimate of t* moves by at most _CONFIRM_TOL times the time that was left to t*
_CONFIRM_GROWTH = 100.0
_CONFIRM_TOL = 0.01


class Status(str, enum.Enum):
    """How an integration ended (compares equal to its string value)."""

    FINISHED = "finished"
    BLOWUP = "blowup"
    STEADY = "steady"
    RANK_COLLAPSE = "rank_collapse"
    EVENT = "event"
    FAILED = "failed"

    def __str__(self):
        return self.value


@dataclasses.dataclass(frozen=True)
class MomentSolution:
    """Result of :func:`solve`.

    Attributes
    ----------
    t : ndarray, shape (T,)
        Output times (``t_eval`` up to the stopping time, or the solver's steps).
    mean : ndarray, shape (T, d) or None
        Means; ``None`` in covariance-only mode (``mean0=None``).
    cov : ndarray, shape (T, d, d)
        Covariances, symmetric PSD with the rank of ``cov0``.
    factor : ndarray, shape (T, d, d)
        Factors ``L`` with ``cov = L L^T``.
    status : Status
        ``"finished"``, ``"blowup"``, ``"steady"``, ``"rank_collapse"``, ``"event"``
        (a user's terminal event) or ``"failed"``.
    message : str
        Human-readable reason.
    t_blowup : float or None
        Estimated finite-time blow-up time.
    t_final, mean_final, cov_final
        Time and state where the integration stopped (an event time need not be in ``t``).
    t_events : dict
        Times of every event, by name (``"blowup"``, ``"steady"``, ``"rank_collapse"``,
        and the user's events by their ``__name__``).
    nfev : int
        Number of right-hand-side evaluations.
    """

    t: np.ndarray
    mean: np.ndarray | None
    cov: np.ndarray
    factor: np.ndarray
    status: Status
    message: str
    t_blowup: float | None
    t_final: float
    mean_final: np.ndarray | None
    cov_final: np.ndarray
    t_events: dict
    nfev: int

    @property
    def success(self) -> bool:
        """``False`` only when the solver failed."""
        return self.status != Status.FAILED


class _System:
    """State packing and right-hand side of the factor-form moment ODE."""

    def __init__(self, attention, with_mean, max_nfev=None):
        self.att = attention
        self.d = attention.d
        self.with_mean = with_mean
        self.nfev = 0
        self.max_nfev = max_nfev
        self.kernel = attention.factor_kernel()
        #: the right-hand side handed to the solver
        self.fun = self.__call__
        if not with_mean:   # the hot path: one small matrix kernel per evaluation
            d, kernel = self.d, self.kernel

            def fun(t, y):
                self.nfev += 1
                return kernel(y.reshape(d, d)).ravel()

            self.fun = fun

    def unpack(self, y):
        d = self.d
        if self.with_mean:
            return y[:d], y[d:].reshape(d, d)
        return None, y.reshape(d, d)

    def pack(self, mean, L):
        return L.ravel() if mean is None else np.concatenate([mean, L.ravel()])

    def __call__(self, t, y):
        self.nfev += 1
        mean, L = self.unpack(y)
        dL = self.kernel(L)
        if mean is None:
            return dL.ravel()
        cov = L @ L.T
        dmean = self.att.field_offset(mean, cov) + self.att.field_matrix(cov) @ mean
        return np.concatenate([dmean, dL.ravel()])

    def cov_and_rate(self, y):
        """Covariance and its time derivative at a packed state."""
        _, L = self.unpack(y)
        dL = self.kernel(L)
        cov = L @ L.T
        dcov = dL @ L.T
        return cov, dcov + dcov.T


def _factor_jacobian(attention):
    """Exact Jacobian ``jac(t, y)`` of the covariance-only factor form, or ``None``.

    The one-row field of :func:`gaussian_pde.integrate._batch.solve_batch` and its analytic
    Jacobian, available when every head is softmax or L2; the implicit methods
    (``Radau``, ``BDF``, ``LSODA``) then need no finite differences.
    """
    from ._batch import _analytic_jacobian, _build_field

    field, d = _build_field(attention, 1)
    if not field.analytic_jacobian:
        return None
    row = np.zeros(1, dtype=int)

    def jac(t, y):
        return _analytic_jacobian(field, row, y.reshape(1, d, d))[0]

    return jac


def _validate_steps(max_step, first_step, t_span):
    """Checked ``max_step`` (positive, ``inf`` allowed) and ``first_step`` (None or in span).

    The Fortran codes would take a NaN or negative step without complaint.
    """
    if isinstance(max_step, bool) or not isinstance(max_step, numbers.Real):
        raise TypeError(f"`max_step` must be a real number, got {type(max_step).__name__}.")
    max_step = float(max_step)
    if not max_step > 0:     # also rejects NaN
        raise ValueError(f"`max_step` must be positive (np.inf for no limit), got {max_step!r}.")
    if first_step is not None:
        first_step = validate_positive(first_step, "first_step")
        t0, t1 = validate_t_span(t_span)
        if first_step > t1 - t0:
            raise ValueError(f"`first_step` must not exceed the length of `t_span`, "
                             f"{t1 - t0!r}; got {first_step!r}.")
    return max_step, first_step


def _validate_method(method):
    if isinstance(method, str):
        if method not in METHODS:
            raise ValueError(f"`method` must be one of {sorted(METHODS)}, 'rosenbrock' or an "
                             f"OdeSolver subclass, got {method!r}.")
        return method
    if isinstance(method, type) and issubclass(method, OdeSolver):
        return method
    raise TypeError(f"`method` must be a string or an OdeSolver subclass, got {method!r}.")


def _event(fun, terminal, direction, name):
    fun.terminal = terminal
    fun.direction = direction
    fun.__name__ = name
    return fun


def _user_event(system, ev, i):
    if not callable(ev):
        raise TypeError(f"`events[{i}]` must be callable as event(t, mean, cov).")

    def wrapped(t, y):
        mean, L = system.unpack(y)
        return ev(t, mean, L @ L.T)

    return _event(wrapped, bool(getattr(ev, "terminal", False)),
                  float(getattr(ev, "direction", 0.0)),
                  getattr(ev, "__name__", f"event{i}"))


def _blowup_estimate(system, t, y):
    """Extrapolate the blow-up time from ``u = 1/tr(Sigma)`` near the singularity.

    Near a finite-time blow-up ``u = C (t* - t)^beta`` with ``beta > 0``; then
    ``p = u u'' / u'^2 = (beta - 1)/beta < 1`` and ``t* = t - u / (u' (1 - p))`` (exact for a
    power law; ``beta = 1``, ``p = 0`` for the Riccati blow-up of softmax). Exponential
    growth has ``p = 1`` and polynomial growth ``p > 1``: those are not blow-ups.
    ``u''`` is a finite difference along the flow over ``1e-4`` of the remaining time.
    Returns ``(t_star, finite)``.
    """
    cov, dcov = system.cov_and_rate(y)
    tr, dtr = np.trace(cov), np.trace(dcov)
    if not dtr > 0:
        return None, False
    u, du = 1.0 / tr, -dtr / tr**2
    h = 1e-4 * u / -du
    y2 = y + h * system(t, y)
    cov2, dcov2 = system.cov_and_rate(y2)
    du2 = -np.trace(dcov2) / np.trace(cov2) ** 2
    p = u * (du2 - du) / h / du**2
    if not p < 0.9:
        return None, False
    return t - u / (du * (1.0 - p)), True


def solve(attention, mean0, cov0, t_span, *, t_eval=None, method="DOP853", rtol=1e-10,
          atol=1e-12, blowup_threshold=1e8, steady_tol=None, steady_atol=0.0, rank_tol=None,
          events=(), max_step=np.inf, first_step=None, max_nfev=100_000):
    r"""Integrate the Gaussian moment ODEs of a Gaussian-preserving attention type.

    .. math::

        \alpha' = b + M\alpha,\qquad L' = ML,\qquad \Sigma = LL^T,

    with :math:`b + Mx` the attention's affine field against
    :math:`\mathcal N(\alpha,\Sigma)` (MATH.md section 3).

    Parameters
    ----------
    attention : Attention
        ``Softmax``, ``L2``, ``Sinkhorn`` or ``MultiHead``.
    mean0 : array_like, shape (d,), or None
        Initial mean. ``None`` integrates the covariance alone (its equation does not
        involve the mean), which keeps an exponentially growing mean from spoiling the
        step size.
    cov0 : array_like, shape (d, d)
        Initial covariance, symmetric positive semi-definite (any rank).
    t_span : (float, float)
        Interval of integration, increasing.
    t_eval : array_like, optional
        Times at which to store the solution (within ``t_span``, increasing).
    method : str or OdeSolver subclass
        Any :func:`scipy.integrate.solve_ivp` method; default ``"DOP853"``. The strings
        ``"DOP853"`` and ``"RK45"`` are stepped by Hairer's Fortran codes (through
        :class:`scipy.integrate.ode`, see ``gaussian_pde.integrate._loop``), several times
        faster on these small systems, when ``t_eval`` is None or holds at most two
        times after ``t_span[0]`` (the Fortran codes land on each output time, where
        SciPy's Python solver interpolates for free); pass the class
        (``scipy.integrate.DOP853``) to always step in Python. ``"LSODA"``, ``"Radau"``
        and ``"BDF"`` get the exact Jacobian for softmax and L2 heads in
        covariance-only mode. Or ``"rosenbrock"``: the
        L-stable linearly implicit RODAS4 of :func:`gaussian_pde.integrate._batch.solve_batch`
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
        :math:`\|\Sigma\|_F` + ``steady_atol``. Off when ``steady_tol`` is ``None``.
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
    max_step, first_step = _validate_steps(max_step, first_step, t_span)
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
    t0, t1 = validate_t_span(t_span)
    t_eval = validate_t_eval(t_eval, t0, t1)
    method = _validate_method(method)
    rtol = validate_tolerance(rtol, "rtol")
    atol = validate_positive(atol, "atol")
    blowup_threshold = validate_positive(blowup_threshold, "blowup_threshold")
    if blowup_threshold <= 1:
        raise ValueError(f"`blowup_threshold` must be greater than 1, got {blowup_threshold}.")
    if steady_tol is not None:
        steady_tol = validate_positive(steady_tol, "steady_tol")
    steady_atol = validate_positive(steady_atol, "steady_atol", allow_zero=True)
    if rank_tol is not None:
        rank_tol = validate_tolerance(rank_tol, "rank_tol")
    if callable(events):
        events = (events,)
    try:
        events = tuple(events)
    except TypeError:
        raise TypeError("`events` must be a callable or a sequence of callables.") from None

    if max_nfev is not None:
        max_nfev = validate_int(max_nfev, "max_nfev", minimum=1)
    system = _System(attention, with_mean, max_nfev)
    y0 = system.pack(mean0, psd_sqrt(cov0))
    solver_cls = METHODS[method] if isinstance(method, str) else method
    compiled = use_compiled(method, t_eval, t0)
    jac = None if with_mean or not accepts_jac(solver_cls) else _factor_jacobian(attention)
    budget = None if max_nfev is None else (lambda: system.nfev <= max_nfev)
    tr0 = max(float(np.trace(cov0)), np.finfo(float).tiny)

    def make_events(limit):
        evs = []

        log_limit, off = math.log(limit * tr0), d if with_mean else 0

        def blowup(t, y):   # log tr(Sigma) - log(limit tr(Sigma_0)), tr(Sigma) = |L|_F^2
            L = y[off:]
            return math.log(max(float(L @ L), 1e-300)) - log_limit

        evs.append(_event(blowup, True, 1.0, "blowup"))
        if steady_tol is not None:
            def steady(t, y):
                cov, dcov = system.cov_and_rate(y)
                lhs = np.linalg.norm(dcov) + 1e-300
                return np.log(lhs) - np.log(steady_tol * np.linalg.norm(cov) + steady_atol
                                            + 1e-300)

            evs.append(_event(steady, True, -1.0, "steady"))
        if rank_tol is not None:
            w0 = np.linalg.eigvalsh(cov0) / tr0
            first = int(np.sum(w0 <= rank_tol))  # index (ascending) of the smallest kept one
            if first < d:
                def rank_collapse(t, y):
                    cov, _ = system.cov_and_rate(y)
                    w = np.linalg.eigvalsh(cov)
                    return w[first] / max(w.sum(), 1e-300) - rank_tol

                evs.append(_event(rank_collapse, True, -1.0, "rank_collapse"))
        evs += [_user_event(system, ev, i) for i, ev in enumerate(events)]
        return evs

    ts, ys, t_events = [], [], {}
    t_start, y_start, limit = t0, y0, blowup_threshold
    status, message, t_blowup = Status.FINISHED, "reached the end of t_span", None
    suspected = None   # (t*, t) of a blow-up estimate awaiting confirmation
    while True:
        evs = make_events(limit)
        # a restarted segment stores only times strictly after the restart time
        seg_eval = None if t_eval is None else t_eval[
            (t_eval > t_start) | ((t_eval == t_start) & (not ts))]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if compiled:
                res = integrate_compiled(system.fun, method, t_start, t1, y_start, rtol=rtol,
                                         atol=atol, max_step=max_step, first_step=first_step,
                                         t_eval=seg_eval, events=evs, budget=budget)
            else:
                res = integrate(system.fun, solver_cls, t_start, t1, y_start, rtol=rtol,
                                atol=atol, max_step=max_step, first_step=first_step, jac=jac,
                                t_eval=seg_eval, events=evs, budget=budget)
        keep = slice(1, None) if t_eval is None and ts else slice(None)  # no repeated restart
        ts.append(res.t[keep])
        ys.append(res.y[keep])
        for ev, te in zip(evs, res.t_events):
            t_events.setdefault(ev.__name__, []).extend(te.tolist())
        t_final, y_final = res.t_final, res.y_final
        if res.status == -1:
            status, message = Status.FAILED, res.message
            break
        if res.status == 0:
            break
        name = "max_nfev" if res.status == 2 else evs[res.fired].__name__
        if name == "blowup":
            t_star, finite = _blowup_estimate(system, t_final, y_final)
            verdict, detail = _blowup_verdict(t_star, finite, t_final, limit, suspected)
            if verdict == Status.BLOWUP:
                status, message, t_blowup = verdict, detail, float(t_star)
                break
            if verdict == Status.FAILED:
                status, message = verdict, detail
                break
            suspected, new_limit = detail
            t_start, y_start, limit = t_final, y_final, new_limit
            continue
        if name == "max_nfev":
            status = Status.FAILED
            message = (f"gave up after {max_nfev} right-hand-side evaluations at "
                       f"t = {t_final:.10g} (stiff or nearly singular dynamics; try "
                       "method='LSODA' or a larger max_nfev)")
            break
        status = {"steady": Status.STEADY, "rank_collapse": Status.RANK_COLLAPSE}.get(
            name, Status.EVENT)
        message = f"terminal event {name!r} at t = {t_final:.10g}"
        break

    t_all = np.concatenate(ts) if ts else np.empty(0)
    y_all = np.concatenate(ys, axis=0) if ys else np.empty((0, y0.size))
    Ls = y_all[:, -d * d:].reshape(-1, d, d)
    covs = Ls @ np.swapaxes(Ls, -1, -2)
    means = y_all[:, :d] if with_mean else None
    mean_f, L_f = system.unpack(np.asarray(y_final))
    return MomentSolution(
        t=t_all, mean=means, cov=covs, factor=Ls, status=status, message=message,
        t_blowup=t_blowup, t_final=float(t_final),
        mean_final=None if mean_f is None else mean_f.copy(), cov_final=L_f @ L_f.T,
        t_events={k: np.asarray(v) for k, v in t_events.items()}, nfev=system.nfev)


def _blowup_verdict(t_star, finite, t, limit, suspected):
    """What a passed blow-up threshold means (shared by :func:`solve` and ``solve_batch``).

    ``(t_star, finite)`` is :func:`_blowup_estimate` at time ``t``, where the trace passed
    ``limit`` times its start; ``suspected`` is ``(t*, t)`` of an earlier finite estimate
    awaiting confirmation, or None. A first finite estimate is confirmed
    ``_CONFIRM_GROWTH`` times further up: accelerating exponential growth also looks
    locally like a singularity, but its estimates drift. Returns ``(Status.BLOWUP,
    message)``, ``(Status.FAILED, message)`` or ``(None, (suspected, next_limit))`` to go
    on.
    """
    if finite and suspected is not None and (
            abs(t_star - suspected[0]) <= _CONFIRM_TOL * (suspected[0] - suspected[1])):
        return Status.BLOWUP, (f"finite-time blow-up: tr(cov) passed "
                               f"{limit / _CONFIRM_GROWTH:.3g} x its initial value at "
                               f"t = {suspected[1]:.10g} and {limit:.3g} x at t = {t:.10g}; "
                               f"estimated blow-up time t* = {t_star:.12g}")
    grow = _CONFIRM_GROWTH if finite else 1e8
    if limit * grow > _MAX_GROWTH:
        return Status.FAILED, ("the covariance grows without bound but not as a finite-time "
                               f"blow-up; stopped at tr(cov) = {limit:.3g} x initial")
    return None, ((t_star, t) if finite else None, limit * grow)


def _solve_rosenbrock(attention, mean0, cov0, t_span, *, t_eval, rtol, atol, blowup_threshold,
                      steady_tol, steady_atol, rank_tol, events, max_step, first_step,
                      max_nfev):
    """``solve(..., method="rosenbrock")``: one trajectory of the batched RODAS4."""
    from ._batch import solve_batch

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
    if steady_tol is not None:
        steady_tol = validate_positive(steady_tol, "steady_tol")
    # solve's steady event is on only with steady_tol; solve_batch's also with steady_atol
    steady_atol = 0.0 if steady_tol is None else steady_atol
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
