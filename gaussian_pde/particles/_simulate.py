r"""Particle Monte Carlo for the Transformer PDE (docs/math.md sections 1 and 8).

The PDE :math:`\partial_t\mu + \nabla\cdot(\mu\,\Gamma[\mu]) = 0` is the mean-field limit
of the particle system

.. math:: \dot x_i = \Gamma[\mu_n](x_i),\qquad \mu_n = \frac1n\sum_{j=1}^n \delta_{x_j},

with :math:`x_i(0)` drawn i.i.d. from :math:`\mathcal N(\alpha_0, \Sigma_0)`
(:func:`sample_gaussian`). :func:`simulate_particles` integrates it with an adaptive SciPy
Runge-Kutta method or fixed-step RK4, using the attention's blocked
``particle_velocity`` (no ``n x n`` array above the chunk size), and records the
particles' moments, the effective sample size of the attention weights and, for Sinkhorn,
the marginal error.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import warnings

import numpy as np
from scipy.integrate import DOP853, RK23, RK45
from scipy.special import ndtri

from .._common.linalg import psd_sqrt
from .._common.runge_kutta import equal_steps, rk4_step
from .._common.validation import (
    validate_allocation,
    validate_covariance,
    validate_flag,
    validate_int,
    validate_particles,
    validate_positions,
    validate_positive,
    validate_seed,
    validate_t_eval,
    validate_t_span,
    validate_tolerance,
    validate_vector,
)
from ..attention import (
    ParticleDiagnostics,
    SinkhornConvergenceWarning,
    default_positions,
    make_options,
    validate_attention,
)
from ..integrate import (
    Status,
    blowup_extrapolate,
    blowup_probe_step,
    blowup_verdict,
    event_options,
    rank_first,
    rank_gap,
    steady_gap,
)

_EPS = np.finfo(float).eps

__all__ = [
    "ParticleSolution",
    "ParticleDegeneracyWarning",
    "SinkhornConvergenceWarning",
    "ParticleDiagnostics",
    "sample_gaussian",
    "simulate_particles",
    "excess_kurtosis",
    "sliced_wasserstein_to_gaussian",
    "particle_moments",
]

_ADAPTIVE = {"RK45": RK45, "RK23": RK23, "DOP853": DOP853}
#: the ``method`` values of :func:`simulate_particles`
PARTICLE_METHODS = (*sorted(_ADAPTIVE), "rk4")


class ParticleDegeneracyWarning(UserWarning):
    r"""The attention weights degenerated: the particles no longer track the mean field.

    Raised when the median effective sample size of the attention weights falls below
    ``ess_threshold``: each query then averages over only a handful of tokens, the
    Monte Carlo error of its velocity is of order :math:`1/\sqrt{\mathrm{ESS}}`, not
    :math:`1/\sqrt n`, and the particle moments leave the Gaussian ODE solution.
    """


@dataclasses.dataclass(frozen=True)
class ParticleSolution:
    r"""Result of :func:`simulate_particles`.

    Attributes
    ----------
    t : ndarray, shape (T,)
        Output times reached (``t_eval`` up to the stopping time).
    x : ndarray, shape (T, n, d) or None
        Token positions at ``t``; ``None`` with ``keep_positions=False``.
    mean : ndarray, shape (T, d)
        Particle means :math:`\frac1n\sum_i x_i`.
    cov : ndarray, shape (T, d, d)
        Particle covariances :math:`\frac1n\sum_i (x_i - \bar x)(x_i - \bar x)^T`
        (the covariance of the empirical measure).
    ess : ndarray, shape (T, 2)
        Minimum and median over queries of the effective sample size
        :math:`(\sum_j w_{ij})^2/\sum_j w_{ij}^2` of the attention weights.
    sinkhorn_error : ndarray, shape (T,) or None
        Sinkhorn column marginal error :math:`\max_j|n\sum_i\pi_{ij} - 1|` at ``t``.
    kurtosis : ndarray, shape (T,)
        Largest absolute excess kurtosis along the principal directions
        (:func:`excess_kurtosis`; 0 for a Gaussian, Monte Carlo error about
        :math:`\sqrt{24/n}`).
    status : Status
        ``"finished"``, ``"blowup"`` (a confirmed finite-time signature of the empirical
        covariance, the rule of :func:`gaussian_pde.solve`), ``"steady"``,
        ``"rank_collapse"`` or ``"failed"`` (non-finite state, solver failure,
        ``max_steps``, or growth without a finite-time signature): docs/math.md section
        10. The events are checked at step ends.
    message : str
        Human-readable reason.
    t_final : float
        Time of the last state (need not be in ``t``).
    x_final : ndarray, shape (n, d)
        Last state.
    positions : ndarray, shape (n,) or None
        Sequence positions (masked attention).
    nfev : int
        Velocity evaluations for the time integration (diagnostic evaluations at the
        output times not included).
    sinkhorn_max_error : float or None
        Largest Sinkhorn marginal error over all evaluations.
    t_blowup : float or None
        The blow-up time estimated from the empirical covariance, when confirmed.
    """

    t: np.ndarray
    x: np.ndarray | None
    mean: np.ndarray
    cov: np.ndarray
    ess: np.ndarray
    sinkhorn_error: np.ndarray | None
    kurtosis: np.ndarray
    status: Status
    message: str
    t_final: float
    x_final: np.ndarray
    positions: np.ndarray | None
    nfev: int
    sinkhorn_max_error: float | None
    t_blowup: float | None = None

    @property
    def success(self) -> bool:
        """``False`` only when the integration failed."""
        return Status(self.status).success

    @property
    def ess_min(self):
        """Minimum effective sample size over queries, shape (T,)."""
        return self.ess[:, 0]

    @property
    def ess_median(self):
        """Median effective sample size over queries, shape (T,)."""
        return self.ess[:, 1]

    @property
    def n(self) -> int:
        """Number of tokens."""
        return self.x_final.shape[0]


def sample_gaussian(mean, cov, n, *, seed=None, positions=None):
    r"""Draw tokens :math:`x_i \sim \mathcal N(\alpha(\tau_i), \Sigma)`, i.i.d.

    Parameters
    ----------
    mean : array_like, shape (d,), or callable
        The mean :math:`\alpha`; or a function ``mean(positions) -> (n, d)`` giving a
        position-dependent mean :math:`\alpha(\tau)` (for masked attention).
    cov : array_like, shape (d, d)
        Covariance, symmetric positive semi-definite (any rank: samples lie in
        :math:`\alpha + \operatorname{range}\Sigma`).
    n : int
        Number of tokens, at least 2.
    seed : int, sequence of int, numpy.random.Generator or None
        Seed: the same seed gives the same tokens.
    positions : array_like, shape (n,), optional
        Sequence positions in ``[0, 1]`` passed to a callable ``mean``; default
        :math:`(i + 1/2)/n`, the default of :func:`simulate_particles`.

    Returns
    -------
    ndarray, shape (n, d)
        :math:`x_i = \alpha(\tau_i) + \Sigma^{1/2} z_i`, :math:`z_i \sim \mathcal N(0, I)`.

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> gp.sample_gaussian(np.zeros(2), np.eye(2), n=1000, seed=0).shape
    (1000, 2)
    """
    n = validate_int(n, "n", minimum=2)
    cov = validate_covariance(cov, "cov")
    d = cov.shape[0]
    validate_allocation(n * d, "n")
    if callable(mean):
        tau = default_positions(n) if positions is None else validate_positions(positions, n)
        mu = validate_particles(mean(tau), "mean(positions)", d=d, min_count=n)
        if mu.shape[0] != n:
            raise ValueError(f"`mean(positions)` must have shape ({n}, {d}), got {mu.shape}.")
    else:
        if positions is not None:
            validate_positions(positions, n)
        mu = validate_vector(mean, "mean", size=d)
    z = validate_seed(seed).standard_normal((n, d))
    return mu + z @ psd_sqrt(cov)


def particle_moments(x):
    r"""Mean and covariance of the empirical measure, :math:`\frac1n\sum_i` (not ``n - 1``)."""
    x = np.asarray(x, dtype=float)
    m = x.mean(axis=-2)
    xc = x - m[..., None, :]
    cov = np.swapaxes(xc, -1, -2) @ xc / x.shape[-2]
    return m, 0.5 * (cov + np.swapaxes(cov, -1, -2))


def _principal(x, rtol=1e-8):
    m, cov = particle_moments(x)
    w, U = np.linalg.eigh(cov)
    keep = w > rtol * max(w[-1], 1e-300)
    return m, w[keep], U[:, keep]


def excess_kurtosis(x, rtol=1e-8):
    r"""Largest absolute excess kurtosis of the tokens along their principal directions.

    With :math:`u_k` the eigenvectors of the particle covariance (eigenvalues
    :math:`\lambda_k` above ``rtol`` times the largest) and
    :math:`z_{ik} = u_k^T(x_i - \bar x)/\sqrt{\lambda_k}`,

    .. math:: \kappa = \max_k \Big|\frac1n\sum_i z_{ik}^4 - 3\Big| ,

    zero for a Gaussian up to Monte Carlo error (standard deviation :math:`\sqrt{24/n}`).
    """
    m, w, U = _principal(x, rtol)
    if w.size == 0:
        return 0.0
    z = (x - m) @ U / np.sqrt(w)
    return float(np.max(np.abs(np.mean(z**4, axis=0) - 3.0)))


def sliced_wasserstein_to_gaussian(x, n_directions=64, seed=0, rtol=1e-8):
    r"""Sliced Wasserstein-2 distance of the whitened tokens to the standard Gaussian.

    The tokens are whitened with their own mean and covariance on its range (rank ``r``),
    :math:`z_i = \Lambda^{-1/2}U^T(x_i - \bar x)`, and projected on ``n_directions``
    random unit vectors :math:`\theta` of :math:`\mathbb R^r`; in one dimension
    :math:`W_2` to :math:`\mathcal N(0,1)` is the distance of the sorted projections to the
    normal quantiles :math:`\Phi^{-1}((i - 1/2)/n)`:

    .. math::

        SW_2 = \Big(\frac{1}{L}\sum_{\ell}\frac1n\sum_{i}
        \big(\theta_\ell^T z_{(i)} - \Phi^{-1}(\tfrac{i - 1/2}{n})\big)^2\Big)^{1/2}.

    It is scale-free (0 for a Gaussian cloud up to a Monte Carlo floor of order
    :math:`n^{-1/2}`, the value at ``t = 0``) and sees non-Gaussian shape that the moments
    miss.
    """
    m, w, U = _principal(x, rtol)
    if w.size == 0:
        return 0.0
    z = (x - m) @ U / np.sqrt(w)
    theta = np.random.default_rng(seed).standard_normal((w.size, n_directions))
    theta /= np.linalg.norm(theta, axis=0)
    proj = np.sort(z @ theta, axis=0)
    n = x.shape[0]
    q = ndtri((np.arange(n) + 0.5) / n)
    return float(np.sqrt(np.mean((proj - q[:, None]) ** 2)))


class _Run:
    """One particle integration: the velocity, the recorded moments and the events."""

    def __init__(self, attention, n, d, opts, diag_opts, ev, x0, keep_positions):
        self.att, self.n, self.d = attention, n, d
        self.opts, self.diag_opts, self.ev = opts, diag_opts, ev
        self.keep_positions = keep_positions
        self.counters = {"nfev": 0, "max_err": None, "unconverged": None}
        self.rec = {"t": [], "x": [], "mean": [], "cov": [], "ess": [], "err": [], "kurt": []}
        cov0 = particle_moments(x0)[1]
        self.tr0 = max(float(np.trace(cov0)), np.finfo(float).tiny)
        self.first = None if ev.rank_tol is None else int(rank_first(cov0, ev.rank_tol))
        self.blow = {"limit": ev.blowup_threshold, "suspected": None, "t_blowup": None,
                     "steady": None}
        if ev.steady_on:
            c1, dc1, _ = self.cov_and_rate(None, x0.ravel())
            self.blow["steady"] = float(steady_gap(c1, dc1, ev.steady_tol, ev.steady_atol))

    def note(self, diag):
        c = self.counters
        err = diag.marginal_error
        if err is not None:
            c["max_err"] = err if c["max_err"] is None else max(c["max_err"], err)
            if not diag.converged and c["unconverged"] is None:
                c["unconverged"] = err

    def fun(self, t, y):
        self.counters["nfev"] += 1
        v, diag = self.att.particle_kernel(y.reshape(self.n, self.d), self.opts)
        self.note(diag)
        return v.ravel()

    def record(self, t, y):
        x = y.reshape(self.n, self.d)
        m, c = particle_moments(x)
        _, diag = self.att.particle_kernel(x, self.diag_opts)
        self.note(diag)
        rec = self.rec
        rec["t"].append(t)
        rec["mean"].append(m)
        rec["cov"].append(c)
        rec["ess"].append((np.min(diag.ess), np.median(diag.ess)))
        rec["err"].append(np.nan if diag.marginal_error is None else diag.marginal_error)
        if getattr(self, "progress", None) is not None:
            self.progress(f"particles: t = {t:.6g} of {self.t1:.6g} "
                          f"({self.counters['nfev']} evaluations, "
                          f"{time.perf_counter() - self.start:.1f} s)")
        rec["kurt"].append(excess_kurtosis(x))
        if self.keep_positions:
            rec["x"].append(x.copy())

    def unresolved_scores(self, t, y):
        r"""The message of a state whose attention weights are rounding noise, or None.

        A score :math:`s_{ij}` (:func:`score_bound`) is computed to
        :math:`\varepsilon|s_{ij}|` in absolute terms, so once
        :math:`\varepsilon\max|s_{ij}| \ge 1` the weights :math:`e^{s_{ij}}` are wrong by
        factors of order :math:`e`: the field is an argmax of rounding, discontinuous at
        the resolution of the positions (its transition layers, of relative width
        :math:`1/|s|`, lie below :math:`\varepsilon`), and an adaptive solver chatters
        across them with ever smaller steps (tokens of :math:`10^{150}`: ``max_steps``
        after tens of seconds). No solver can follow such a state: the run stops there.
        """
        bound = score_bound(self.att, y.reshape(self.n, self.d))
        if bound is None or not _EPS * bound >= 1.0:
            return None
        return (f"the attention scores reach {bound:.3g} at t = {t:.10g}: beyond 1/eps = "
                f"{1 / _EPS:.3g} their rounding exceeds 1, so the attention weights are "
                "rounding noise (an argmax that switches at the resolution of the "
                "positions) and no solver can follow the tokens; rescale the tokens or "
                "the weights")

    def cov_and_rate(self, t, y):
        r"""Empirical :math:`\Sigma_n`, its rate and the velocities.

        :math:`\Sigma_n' = \frac1n\sum_i (x_i - m)(v_i - \bar v)^T + (\cdot)^T`.
        """
        n, d = self.n, self.d
        x = y.reshape(n, d)
        v = self.fun(t, y).reshape(n, d)
        xc, vc = x - x.mean(0), v - v.mean(0)
        C = xc.T @ vc / n
        return xc.T @ xc / n, C + C.T, v.ravel()

    def check(self, t, y):
        """The package's events at a step end (docs/math.md section 10): None to go on."""
        if not np.all(np.isfinite(y)):
            return Status.FAILED, (f"non-finite token positions at t = {t:.10g}: the state "
                                   "left the floating-point range")
        unresolved = self.unresolved_scores(t, y)
        if unresolved is not None:
            return Status.FAILED, unresolved
        ev, blow = self.ev, self.blow
        with np.errstate(over="ignore", invalid="ignore"):
            cov = particle_moments(y.reshape(self.n, self.d))[1]
        if not np.all(np.isfinite(cov)):
            return Status.FAILED, (f"the covariance of the tokens overflows float64 at "
                                   f"t = {t:.10g}: the state left the floating-point range")
        if float(np.trace(cov)) > blow["limit"] * self.tr0:
            # one verdict per step: the same state never confirms itself
            c1, dc1, v = self.cov_and_rate(t, y)
            tr1, dtr1 = float(np.trace(c1)), float(np.trace(dc1))
            finite, t_star = False, None
            if dtr1 > 0:
                h = float(blowup_probe_step(tr1, dtr1))
                c2, dc2, _ = self.cov_and_rate(t, y + h * v)
                t_star, finite = blowup_extrapolate(t, tr1, dtr1, float(np.trace(c2)),
                                                    float(np.trace(dc2)), h)
            verdict, detail = blowup_verdict(t_star, finite, t, blow["limit"], blow["suspected"])
            if verdict == Status.BLOWUP:
                blow["t_blowup"] = float(t_star)
                return verdict, detail
            if verdict == Status.FAILED:
                return verdict, detail
            blow["suspected"], blow["limit"] = detail
        if ev.steady_on:
            c1, dc1, _ = self.cov_and_rate(t, y)
            g = float(steady_gap(c1, dc1, ev.steady_tol, ev.steady_atol))
            if blow["steady"] is not None and blow["steady"] > 0 >= g:
                return Status.STEADY, f"terminal event 'steady' at t = {t:.10g}"
            blow["steady"] = g
        if (self.first is not None and self.first < self.d
                and rank_gap(cov, self.first, ev.rank_tol) <= 0):
            return Status.RANK_COLLAPSE, f"terminal event 'rank_collapse' at t = {t:.10g}"
        return None


def score_bound(attention, x):
    r"""A bound on the attention scores :math:`|s_{ij}|` of the tokens ``x``, or None.

    For every head with query and key matrices,
    :math:`c\,(\max_i|Qx_i| + \max_j|Kx_j|)^2`, which bounds both the bilinear score
    :math:`c\langle Qx_i, Kx_j\rangle` (softmax, Sinkhorn, sigmoid, masked) and the L2
    score :math:`-c|Qx_i - Kx_j|^2`, and also the rounding of either as computed
    (:func:`~gaussian_pde.attention._kernels.softmax_features`,
    :func:`~gaussian_pde.attention._kernels.l2_features`); the largest over the heads.
    ``None`` for a type without them.
    """
    heads = attention.heads
    bound = None
    with np.errstate(over="ignore", invalid="ignore"):
        for h in heads:
            proj = getattr(h, "_projections", None)
            scale = getattr(h, "scale", None)
            if proj is None or scale is None:
                continue
            qx, kx = proj(x)
            r = (np.sqrt(np.max(np.einsum("ij,ij->i", qx, qx), initial=0.0))
                 + np.sqrt(np.max(np.einsum("ij,ij->i", kx, kx), initial=0.0)))
            b = abs(float(scale)) * r * r
            bound = b if bound is None else max(bound, b)
    return bound


def _run_rk4(run, t_cur, y, t_eval, h_max, max_steps):
    """Classical RK4 between output times, equal steps no longer than ``h_max``."""
    status, message, steps, stop = Status.FINISHED, "reached the end of t_span", 0, None
    fun = run.fun
    for te in t_eval:
        m_steps, h = equal_steps(te - t_cur, h_max, slack=1e-9)
        for k in range(m_steps):
            y_new = rk4_step(fun, t_cur, y, h)
            t_new = te if k == m_steps - 1 else t_cur + h
            steps += 1
            stop = run.check(t_new, y_new)
            if stop is not None and stop[0] == Status.FAILED:
                break       # left the sane range: end at the last state within it, as the
                            # adaptive schemes do
            t_cur, y = t_new, y_new
            if stop is None and steps >= max_steps and t_cur < t_eval[-1]:
                stop = Status.FAILED, f"gave up after `max_steps` = {max_steps} steps"
            if stop is not None:
                break
        if stop is not None:
            status, message = stop
            if status == Status.BLOWUP and t_cur == te:
                run.record(te, y)
            break
        run.record(te, y)
    return status, message, t_cur, y


def _run_adaptive(run, solver, t_eval, idx, max_steps):
    """A SciPy Runge-Kutta solver's steps, with the events at step ends."""
    status, message, steps = Status.FINISHED, "reached the end of t_span", 0
    t_cur, y = solver.t, solver.y
    while idx < t_eval.size and solver.status == "running":
        solver.step()
        steps += 1
        if solver.status == "failed":
            return Status.FAILED, f"solver failed: {solver.status}", t_cur, y
        stop = run.check(solver.t, solver.y)
        if stop is not None and stop[0] == Status.FAILED:
            return (*stop, t_cur, y)
        sol = solver.dense_output()
        while idx < t_eval.size and t_eval[idx] <= solver.t:
            ye = sol(t_eval[idx])
            if stop is not None and run.check(t_eval[idx], ye) is not None:
                break
            run.record(t_eval[idx], ye)
            idx += 1
        t_cur, y = solver.t, solver.y
        if stop is not None:
            return (*stop, t_cur, y)
        if steps >= max_steps and idx < t_eval.size:
            return (Status.FAILED, f"gave up after `max_steps` = {max_steps} steps", t_cur, y)
    return status, message, solver.t, solver.y


#: evaluations per step of each method (FSAL counted once)
_EVALS_PER_STEP = {"rk4": 4, "RK23": 3, "RK45": 6, "DOP853": 12}
#: a run estimated to take longer than this (seconds) says so when it starts
_ANNOUNCE_S = 60.0


def _validate_progress(progress):
    if progress is None or progress is False:
        return None
    if progress is True:
        def to_stderr(line):
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
        return to_stderr
    if not callable(progress):
        raise TypeError(f"`progress` must be a callable, True or None, got "
                        f"{type(progress).__name__}.")
    return progress


def _announce(seconds, n, d, method, t_eval, t0, t1, dt, progress):
    """Warn (and tell ``progress``) when the run is estimated to take a minute or more.

    ``seconds`` is the time of one evaluation (the check of the initial state); the
    fewest evaluations are those of the RK4 steps, or of one step per output interval of
    an adaptive method, plus one per output time.
    """
    per_step = _EVALS_PER_STEP.get(method, 6)
    gaps = np.diff(np.r_[t0, t_eval])
    gaps = gaps[gaps > 0]
    if method == "rk4":
        h = (t1 - t0) / 100 if dt is None else dt
        steps = int(np.sum(np.maximum(1, np.ceil(gaps / h - 1e-9))))
    else:
        steps = max(1, gaps.size)
    evals = per_step * steps + t_eval.size
    estimate = seconds * evals
    if estimate < _ANNOUNCE_S:
        return
    line = (f"simulate_particles: n = {n} tokens in d = {d}: one evaluation takes about "
            f"{seconds:.3g} s here, and {method} needs at least {evals} evaluations: about "
            f"{estimate / 60:.2g} min or more (the cost grows like n^2 d).")
    warnings.warn(line, UserWarning, stacklevel=3)
    if progress is not None:
        progress(line)


def _check_initial_state(attention, x0, opts):
    """Refuse tokens whose moments or velocities overflow float64 before any step.

    A non-finite velocity at the start gives SciPy's step-size control a NaN step, with
    which its step loop never ends; a non-finite covariance makes every event meaningless.
    """
    with np.errstate(all="ignore"):
        cov = particle_moments(x0)[1]
        v, _ = attention.particle_kernel(x0, opts)
    if not np.all(np.isfinite(cov)):
        raise ValueError("`x0` is too large: the covariance of the tokens overflows float64 "
                         f"(largest |entry| {np.max(np.abs(x0)):.3g}); rescale the tokens.")
    if not np.all(np.isfinite(v)):
        raise ValueError("`x0` and `attention` give non-finite velocities at the initial tokens "
                         "(the attention scores overflow float64); rescale the tokens or the "
                         "weights.")


def simulate_particles(attention, x0, t_span, *, t_eval=None, method="RK45", dt=None,
                       rtol=1e-6, atol=1e-8, positions=None, chunk_size=None,
                       dtype=np.float64, keep_positions=True, blowup_threshold=1e8,
                       steady_tol=None, steady_atol=0.0, rank_tol=None, max_steps=10_000,
                       sinkhorn_tol=None, sinkhorn_max_iter=1000,
                       ess_threshold=10.0, warn=True, progress=None):
    r"""Integrate the particle system :math:`\dot x_i = \Gamma[\mu_n](x_i)`.

    **Cost.** Every evaluation of the velocity lets all ``n`` tokens attend to all ``n``:
    about :math:`n^2(2k + 2d)` multiply-adds and :math:`n^2` exponentials (``k`` rows of
    ``Q``; Sinkhorn repeats the scaling sweeps until converged), in tiles of
    ``chunk_size`` rows, so memory stays :math:`O(n\,\texttt{chunk\_size})`. A step
    takes 4 evaluations (``"rk4"``), 3 (``"RK23"``), 6 (``"RK45"``) or 12
    (``"DOP853"``), and every output time one more (the diagnostics). So a run costs
    about :math:`n^2 d` times the number of evaluations: at n = 20,000 and d = 2 one
    evaluation is about a second on two cores, and an adaptive run to a horizon of a few
    units hundreds of them. A run estimated at a minute or more says so when it starts
    (a ``UserWarning``, from the time of the first evaluation and the fewest
    evaluations the method can take); ``progress`` reports every output time.

    Parameters
    ----------
    attention : Attention
        Any attention type (softmax, L2, Sinkhorn, multi-head, sigmoid, masked).
    x0 : array_like, shape (n, d)
        Initial tokens (:func:`sample_gaussian`), finite, ``n >= 2``.
    t_span : (float, float)
        Interval of integration.
    t_eval : array_like, optional
        Output times within ``t_span``, increasing; default 51 equally spaced times.
    method : {"RK45", "RK23", "DOP853", "rk4"}
        An adaptive explicit SciPy Runge-Kutta method, or classical fixed-step RK4.
    dt : float, optional
        RK4 step (default ``(t1 - t0)/100``); each interval between output times is cut
        into equal steps no longer than ``dt``. For adaptive methods: the largest step.
    rtol, atol : float
        Tolerances of the adaptive methods on the token coordinates.
    positions : array_like, shape (n,), optional
        Sequence positions in ``[0, 1]`` (masked attention); default :math:`(i+1/2)/n`.
    chunk_size : int, optional
        Query rows per attention tile (default 512), at least 1.
    dtype : numpy.float64 or numpy.float32
        Precision of the attention tiles (the state is always float64).
    keep_positions : bool
        Store the tokens at every output time (``(T, n, d)`` floats).
    blowup_threshold, steady_tol, steady_atol, rank_tol : float
        The events of :func:`gaussian_pde.solve` on the empirical covariance
        :math:`\Sigma_n`, checked at the end of every step: the blow-up time is
        extrapolated from :math:`1/\operatorname{tr}\Sigma_n` when the trace passes
        ``blowup_threshold`` times its start and confirmed 100 times further up (a
        finite particle system grows at most exponentially, so particles report
        ``"blowup"`` only while they still follow a finite-time signature).
    max_steps : int
        Give up (status ``"failed"``) after this many time steps.
    sinkhorn_tol, sinkhorn_max_iter : float, int
        Sinkhorn scaling tolerance on the column marginal error and iteration cap; a
        :class:`SinkhornConvergenceWarning` reports the achieved error when the cap is hit.
    ess_threshold : float
        Warn (:class:`ParticleDegeneracyWarning`) when the median effective sample size
        of the attention weights falls below this number of tokens.
    warn : bool
        Issue the warnings above (``compare`` collects them itself).
    progress : callable, True or None
        Called with one short line at every output time (``t``, evaluations so far,
        seconds elapsed), and with the start-up estimate of a long run; ``True`` prints
        these lines on stderr.

    Returns
    -------
    ParticleSolution
        ``t``, ``x``, ``mean``, ``cov``, ``ess``, ``status``, ``message``, ...

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> att = gp.Softmax(np.eye(2), -np.eye(2), np.eye(2))
    >>> x0 = gp.sample_gaussian(np.zeros(2), np.eye(2), n=200, seed=0)
    >>> ps = gp.simulate_particles(att, x0, (0, 1), t_eval=[0, 0.5, 1], method="rk4", dt=0.1)
    >>> ps.status, ps.mean.shape, ps.cov.shape
    (<Status.FINISHED: 'finished'>, (3, 2), (3, 2, 2))
    """
    validate_attention(attention, gaussian=False)
    d = attention.d
    x0 = validate_particles(x0, "x0", d=d)
    n = x0.shape[0]
    t0, t1 = validate_t_span(t_span)
    t_eval = validate_t_eval(t_eval, t0, t1)
    if t_eval is None:
        t_eval = np.linspace(t0, t1, 51)
    if not isinstance(method, str) or method not in (*_ADAPTIVE, "rk4"):
        raise ValueError(f"`method` must be one of {sorted(_ADAPTIVE) + ['rk4']}, "
                         f"got {method!r}.")
    if dt is not None:
        dt = validate_positive(dt, "dt")
    rtol = validate_tolerance(rtol, "rtol")
    atol = validate_positive(atol, "atol")
    ev = event_options(blowup_threshold, steady_tol, steady_atol, rank_tol)
    max_steps = validate_int(max_steps, "max_steps", minimum=1)
    if dt is not None and (t1 - t0) / dt > max_steps:
        raise ValueError(f"`dt` = {dt!r} needs at least {(t1 - t0) / dt:.3g} steps over "
                         f"`t_span`, more than `max_steps` = {max_steps} allow.")
    ess_threshold = validate_positive(ess_threshold, "ess_threshold", allow_zero=True)
    keep_positions = validate_flag(keep_positions, "keep_positions")
    warn = validate_flag(warn, "warn")
    if positions is None and attention.uses_positions:
        positions = default_positions(n)
    state = {}
    opts = make_options(n, positions=positions, chunk_size=chunk_size, dtype=dtype,
                        state=state, sinkhorn_tol=sinkhorn_tol,
                        sinkhorn_max_iter=sinkhorn_max_iter, warn=False)
    diag_opts = dataclasses.replace(opts, want_ess=True)

    progress = _validate_progress(progress)
    start = time.perf_counter()
    _check_initial_state(attention, x0, opts)
    _announce(time.perf_counter() - start, n, d, method, t_eval, t0, t1, dt, progress)
    run = _Run(attention, n, d, opts, diag_opts, ev, x0, keep_positions)
    run.progress, run.start, run.t1 = progress, start, t1
    y = x0.ravel().copy()
    idx = 0
    if t_eval[0] == t0:
        run.record(t0, y)
        idx = 1
    unresolved = run.unresolved_scores(t0, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SinkhornConvergenceWarning)
        if unresolved is not None:   # no step can be taken (Run.unresolved_scores)
            status, message, t_cur = Status.FAILED, unresolved, t0
        elif method == "rk4":
            status, message, t_cur, y = _run_rk4(run, t0, y, t_eval[idx:],
                                                 (t1 - t0) / 100 if dt is None else dt,
                                                 max_steps)
        else:
            solver = _ADAPTIVE[method](run.fun, t0, y, t1, rtol=rtol, atol=atol,
                                       max_step=np.inf if dt is None else dt)
            status, message, t_cur, y = _run_adaptive(run, solver, t_eval, idx, max_steps)
    rec, counters, blow = run.rec, run.counters, run.blow

    ess = np.array(rec["ess"], dtype=float).reshape(-1, 2)
    is_sinkhorn = counters["max_err"] is not None
    if warn and counters["unconverged"] is not None:
        warnings.warn(
            f"Sinkhorn scaling did not converge within `sinkhorn_max_iter` = "
            f"{opts.sinkhorn_max_iter} iterations: column marginal error reached "
            f"{counters['max_err']:.3g} > `sinkhorn_tol` = {opts.sinkhorn_tol:.3g}.",
            SinkhornConvergenceWarning, stacklevel=2)
    if warn and ess.size:
        low = np.flatnonzero(ess[:, 1] < ess_threshold)
        if low.size:
            i = low[0]
            warnings.warn(
                f"the median effective sample size of the attention weights fell to "
                f"{ess[i, 1]:.3g} tokens (minimum {ess[i, 0]:.3g}) at t = {rec['t'][i]:.6g}, "
                f"below `ess_threshold` = {ess_threshold:g}: the particles no longer track "
                "the mean-field limit.", ParticleDegeneracyWarning, stacklevel=2)
    T = len(rec["t"])
    return ParticleSolution(
        t=np.array(rec["t"], dtype=float),
        x=np.array(rec["x"]).reshape(T, n, d) if keep_positions else None,
        mean=np.array(rec["mean"]).reshape(T, d),
        cov=np.array(rec["cov"]).reshape(T, d, d),
        ess=ess,
        sinkhorn_error=np.array(rec["err"]) if is_sinkhorn else None,
        kurtosis=np.array(rec["kurt"], dtype=float),
        status=status, message=message, t_final=float(t_cur), t_blowup=blow["t_blowup"],
        x_final=np.asarray(y).reshape(n, d).copy(),
        positions=None if opts.positions is None else opts.positions.copy(),
        nfev=counters["nfev"], sinkhorn_max_error=counters["max_err"])
