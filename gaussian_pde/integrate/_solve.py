r""":func:`solve`: one trajectory of the Gaussian moment ODEs.

The covariance is integrated in factor form (docs/math.md section 3): with
:math:`\Sigma = LL^T`,

.. math:: L' = M(\Sigma)\,L,\qquad \alpha' = b(\alpha, \Sigma) + M(\Sigma)\,\alpha,

so :math:`\Sigma(t) = F(t)\Sigma_0F(t)^T` with :math:`F` invertible: the covariance is
symmetric positive semi-definite and keeps its rank exactly, at every step, whatever the
integration error. The events (blow-up, steady state, rank collapse) are those of
:mod:`gaussian_pde.integrate._events`.

Two paths. The default ``"auto"``, where the attention has a compiled field (and without
user ``events`` or ``first_step``), is one trajectory of the compiled engine
(:func:`~gaussian_pde.integrate._compiled_engine.integrate_one`), the same steps and
verdicts as :func:`~gaussian_pde.solve_batch`'s. Every other run takes the event loop
(:func:`~gaussian_pde.integrate._event_loop.integrate_system`: ``solve_ivp`` with the
events, for the method a user names; its ``"auto"`` is LSODA).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._common.factor_rotation import cancellation_exceeds, rotation
from .._common.linalg import psd_factor, psd_sqrt
from .._common.validation import validate_covariance, validate_t_span, validate_vector
from .._exact import linear_mean
from ..attention import require_mean, validate_attention
from ._batch import solve_batch
from ._event_loop import integrate_system, strictly_increasing
from ._events import rank_first, rank_note
from ._moment_field import max_abs, mean_scale, moment_jacobian, state_field
from ._options import solver_options, validate_method, validate_user_events
from ._results import MomentSolution, Status

__all__ = ["solve", "integrate_covariance_state"]

_TINY = np.finfo(float).tiny


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
        return self._mean(Z), np.ascontiguousarray(Z[..., :self.d])

    def _mean(self, Z):
        """The mean (zeros, or None without one) of a state ``Z`` ``(..., d, m)``, a new array."""
        if self.zero_mean:
            return np.zeros(Z.shape[:-1])
        if not self.with_mean:
            return None
        # a mean that grew past the floating-point range in its own units (the solver's
        # are a power of 2 smaller) is inf, as it is; the run's message says why it stopped
        with np.errstate(over="ignore"):
            return Z[..., self.d] * self.mean_scale

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
        return self._mean(Z), L @ L.T

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


def _solve_compiled(system, y0, opts):
    """``method="auto"`` in the compiled engine (a :class:`Run`); None where it does not apply.

    It applies where the attention has a compiled field and no ``first_step`` is given
    (the caller sends user events to the event loop).
    """
    from . import _compiled_engine as core

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
    run.t, run.y = strictly_increasing(run.t, run.y)
    return run


def integrate_covariance_state(fields, y0, cov, tr0, first, opts, gaps=None):
    r"""A plain state whose field leaves a factor of its covariance, on the engine.

    ``method="auto"`` of :func:`solve` for a state that is not a factor
    (:func:`gaussian_pde.integrate._compiled_engine.integrate_one` with ``cov``: the field
    ``fields`` leaves the trace, a ``cov[0] x cov[1]`` factor :math:`F` of the covariance
    and its rate in its scratch, ``CoreOptions.cov_rows``): DOP853 steps, the blow-up
    look, steady state and rank collapse on :math:`FF^T` (``tr0`` its initial trace,
    ``first`` the rank event's index), the budget, overflow, the statuses and messages of
    :func:`solve`. The mixture closure's (:func:`gaussian_pde.solve_mixture`). ``gaps``:
    ``(count, terminal, name)`` of the field's own events (its ``rhs`` called with
    ``m = -1`` leaves their values after the rate of :math:`F`; each fires where its value
    falls to zero or below, and its times go into ``t_events[name]``).

    Returns
    -------
    run : Run or None
        None where Hairer's stiffness test fired and the field has no closed-form
        Jacobian: the engine stops there, for the caller to hand the run to the event
        loop (RODAS4P2 would take central differences at every step).
    nfev : int
        The evaluations spent (those of ``run``, or up to the stop).
    t_stiff : float or None
        Where the stiffness test fired (None: it did not).
    """
    from . import _compiled_engine as core

    run = core.integrate_one(fields, y0, y0.size, 1, tr0, first, opts, cov=cov, gaps=gaps)
    if run.stiff_stop:
        return None, run.nfev, run.t_final
    run.t, run.y = strictly_increasing(run.t, run.y)
    return run, run.nfev, None


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
        ``"auto"`` (default): where the attention has a compiled field and neither user
        ``events`` nor ``first_step`` are given, :func:`~gaussian_pde.solve_batch`'s
        ``"auto"`` for the one trajectory, in the same compiled engine: DOP853 steps,
        RODAS4P2 to the end once the stiffness tests fire (see there), the same steps,
        events, verdicts, evaluations and messages (the ``message`` then ends with
        ``"; stiff from t = ... on: RODAS4P2"``; ``t_events["blowup"]`` holds where the
        trace passed each threshold, located on the dense output to rounding).
        Otherwise the event loop runs :func:`scipy.integrate.solve_ivp` with
        ``"LSODA"``, which switches between Adams and BDF steps itself, given the exact
        Jacobian of the factor form and of the mean where the type has one. Or any
        :func:`scipy.integrate.solve_ivp` method, stepped by ``solve_ivp`` itself;
        ``"LSODA"``, ``"Radau"`` and ``"BDF"`` get the exact Jacobian in covariance-only
        mode. Or ``"rosenbrock"``: one trajectory of :func:`~gaussian_pde.solve_batch`'s
        RODAS4P2, for stiff runs to a steady state; covariance only (``mean0=None``),
        without user ``events`` or ``first_step``; ``t`` holds ``t_eval`` (up to the
        stop) or, without it, the initial and final times; right-hand-side counts
        include the Jacobian's.
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
