r"""Anisotropy and clustering of Gaussian solutions (docs/math.md sections 4 and 5).

How the shape of the token distribution :math:`\mathcal N(\alpha, \Sigma(t))` evolves:

* :func:`normalized_covariance` :math:`\Sigma/\operatorname{tr}\Sigma` and
  :func:`normalized_eigenvalues` (its spectrum, over time when given a trajectory);
* :func:`effective_rank` :math:`\exp(-\sum_i p_i\log p_i)`, :math:`p_i` the normalised
  eigenvalues, and :func:`condition_number` :math:`\lambda_{\max}/\lambda_{\min}`;
* :func:`limit_rank`, the number of eigenvalues above a relative and an absolute threshold;
* :func:`classify_trajectory` / :func:`classify_solution`: the outcome of a finished
  trajectory (:class:`Outcome`): convergence to 0, to a rank-``r`` limit, finite-time
  blow-up (with the time and the limiting normalised direction), unbounded growth that is
  not a finite-time blow-up, or *undecided*, always with the reason;
* :func:`bures_wasserstein`, the 2-Wasserstein distance between Gaussians.

All array functions act on the last two axes and broadcast over leading ones.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import numbers

import numpy as np

from ._common.gaussian import bures_wasserstein
from ._common.validation import (
    validate_array,
    validate_covariance,
    validate_positive,
    validate_threshold,
)
from .attention import Attention
from .integrate import Status, blowup_signature

__all__ = [
    "Outcome",
    "TrajectoryOutcome",
    "bures_wasserstein",
    "classify_solution",
    "classify_trajectory",
    "condition_number",
    "effective_rank",
    "limit_rank",
    "normalized_covariance",
    "normalized_eigenvalues",
]


def _covariances(cov, name="cov"):
    arr = validate_array(cov, name, ndim=None)
    if arr.ndim < 2 or arr.shape[-1] != arr.shape[-2] or arr.shape[-1] == 0:
        raise ValueError(f"`{name}` must have shape (..., d, d) with d >= 1, got {arr.shape}.")
    if arr.size == 0:
        raise ValueError(f"`{name}` must not be empty, got shape {arr.shape}.")
    # symmetric positive semi-definite, checked like every covariance argument of the
    # package (an asymmetric or indefinite matrix would give silently wrong ranks)
    return validate_covariance(arr, name, batch=True)


def _eigh_descending(cov):
    w, U = np.linalg.eigh(cov)
    return w[..., ::-1], U[..., ::-1]


def normalized_covariance(cov):
    r"""Normalised covariance :math:`\Sigma/\operatorname{tr}\Sigma` (unit trace).

    Parameters
    ----------
    cov : array_like, shape (..., d, d)
        Covariances with positive trace.

    Returns
    -------
    ndarray, shape (..., d, d)
    """
    cov = _covariances(cov)
    tr = np.trace(cov, axis1=-2, axis2=-1)
    if np.any(tr <= 0):
        raise ValueError("`cov` must have a positive trace to be normalised.")
    return cov / tr[..., None, None]


def normalized_eigenvalues(cov):
    r"""Eigenvalues of :math:`\Sigma/\operatorname{tr}\Sigma`, in decreasing order.

    For a trajectory ``cov`` of shape ``(T, d, d)`` this is the eigenvalue flow, shape
    ``(T, d)``; the values lie in ``[0, 1]`` and sum to one (rounding negatives are
    clipped to zero).
    """
    w = np.linalg.eigvalsh(normalized_covariance(cov))[..., ::-1]
    return np.clip(w, 0.0, None)


def effective_rank(cov):
    r"""Effective rank :math:`\exp\big(-\sum_i p_i \log p_i\big)`, :math:`p_i = \lambda_i/\operatorname{tr}\Sigma`.

    It equals ``r`` for a covariance with ``r`` equal non-zero eigenvalues and varies
    continuously in between (Roy and Vetterli 2007); :math:`0\log 0 = 0`.
    """
    p = normalized_eigenvalues(cov)
    logs = np.log(np.where(p > 0, p, 1.0))
    return np.exp(-np.sum(p * logs, axis=-1))


def condition_number(cov):
    r"""Condition number :math:`\lambda_{\max}(\Sigma)/\lambda_{\min}(\Sigma)`; ``inf`` when singular."""
    w = np.linalg.eigvalsh(_covariances(cov))
    lo, hi = w[..., 0], w[..., -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(lo > 0, hi / np.where(lo > 0, lo, 1.0), np.inf)
    return float(out) if out.ndim == 0 else out


def _thresholds(rtol, atol):
    rtol = validate_threshold(rtol, "rtol", upper=1.0)
    atol = validate_threshold(atol, "atol")
    return rtol, atol


def limit_rank(cov, rtol=1e-4, atol=0.0):
    r"""Number of eigenvalues above both a relative and an absolute threshold.

    .. math::

        \operatorname{rank}(\Sigma) = \#\{i : \lambda_i > \max(\texttt{atol},\;
        \texttt{rtol}\,\lambda_{\max})\}

    Parameters
    ----------
    cov : array_like, shape (..., d, d)
        Covariances.
    rtol : float in [0, 1)
        Threshold relative to the largest eigenvalue (scale-free).
    atol : float >= 0
        Absolute threshold, in the units of :math:`\Sigma`. The paper's protocol
        (docs/math.md section 9.3) counts eigenvalues above 0.1: ``rtol=0, atol=0.1``.

    Returns
    -------
    int or ndarray of int
    """
    rtol, atol = _thresholds(rtol, atol)
    w = np.linalg.eigvalsh(_covariances(cov))
    thr = np.maximum(atol, rtol * np.clip(w[..., -1:], 0.0, None))
    out = np.sum(w > thr, axis=-1)
    return int(out) if out.ndim == 0 else out


class Outcome(str, enum.Enum):
    """Where a trajectory is going: the limit it tends to (compares equal to its value).

    Not a second status vocabulary: :class:`gaussian_pde.Status` says how a run ended
    (the solver's verdict, e.g. ``"steady"`` at a stopping time), an ``Outcome`` what the
    covariance tends to (e.g. ``"rank"`` 2), read from that run by
    :func:`classify_trajectory`.
    """

    #: :math:`\Sigma(t) \to 0`
    ZERO = "zero"
    #: :math:`\Sigma(t)` converges to a non-zero limit of rank ``r``
    RANK = "rank"
    #: finite-time blow-up, with the time and the limiting normalised direction
    BLOWUP = "blowup"
    #: unbounded growth without a finite-time singularity (e.g. exponential)
    GROWS = "grows"
    #: the evidence within the horizon does not decide; the message says why
    UNDECIDED = "undecided"

    def __str__(self):
        return self.value


@dataclasses.dataclass(frozen=True)
class TrajectoryOutcome:
    r"""Result of :func:`classify_trajectory`.

    Attributes
    ----------
    outcome : Outcome
        The classification.
    rank : int or None
        Rank of the limit (``RANK``; 0 for ``ZERO``), or of the limiting normalised
        covariance (``BLOWUP``, ``GROWS``); ``None`` when undecided.
    limit : ndarray, shape (d, d), or None
        Limit covariance estimate (``RANK``: the final covariance with its vanishing
        eigen-directions removed; ``ZERO``: zeros).
    t_blowup : float or None
        Blow-up time (``BLOWUP``).
    direction : ndarray, shape (d, d), or None
        Limiting normalised covariance :math:`\Sigma/\operatorname{tr}\Sigma`
        (``BLOWUP``, ``GROWS``).
    direction_vector : ndarray, shape (d,), or None
        Its top eigenvector (sign: largest entry positive); the blow-up line when the
        limiting direction has rank one.
    t_final : float
        Time of the state that was classified.
    message : str
        The evidence, or why the outcome is undecided.
    """

    outcome: Outcome
    rank: int | None
    limit: np.ndarray | None
    t_blowup: float | None
    direction: np.ndarray | None
    direction_vector: np.ndarray | None
    t_final: float
    message: str


def _top_vector(P):
    w, U = np.linalg.eigh(P)
    v = U[:, -1]
    return v * np.sign(v[np.argmax(np.abs(v))])


def _finite_time_signature(t, tr):
    """``(t_star, p)`` from the last three samples of ``u = 1/tr`` (``None`` if unusable).

    Near a finite-time blow-up ``u = C (t* - t)^beta`` so ``p = u u''/u'^2 < 1``
    (``p = 0`` for the Riccati blow-up); exponential growth has ``p = 1``.
    """
    if t.size < 3:
        return None
    t3, u3 = t[-3:], 1.0 / tr[-3:]
    h1, h2 = t3[1] - t3[0], t3[2] - t3[1]
    if not (h1 > 0 and h2 > 0):
        return None
    d1, d2 = (u3[1] - u3[0]) / h1, (u3[2] - u3[1]) / h2
    du2 = 2.0 * (d2 - d1) / (h1 + h2)
    du = d2 + 0.5 * h2 * du2  # second-order one-sided derivative at the last sample
    if not du < 0:
        return None
    t_star, p, finite = blowup_signature(t3[2], u3[2], du, du2)
    return (t_star if finite else None), p


def _validate_t_blowup(t_blowup, t0):
    """None, NaN or inf (no blow-up), or a real blow-up time no earlier than ``t[0]``."""
    if t_blowup is None:
        return None
    if isinstance(t_blowup, (bool, np.bool_)) or not isinstance(t_blowup, (numbers.Real, np.ndarray)):
        raise TypeError(f"`t_blowup` must be a real number or None, got "
                        f"{type(t_blowup).__name__}.")
    arr = np.asarray(t_blowup)
    if arr.ndim != 0 or arr.dtype.kind not in "iuf":
        raise TypeError(f"`t_blowup` must be a real number or None, got {t_blowup!r}.")
    value = float(arr)
    if np.isfinite(value) and value < t0:
        raise ValueError(f"`t_blowup` = {value!r} lies before the first time t[0] = {t0!r}; "
                         "a blow-up time follows the start of the trajectory.")
    return value


def _classification_thresholds(settle_tol, decay_slope, zero_tol, growth_ratio):
    """The thresholds of :func:`classify_trajectory`, validated, in its order."""
    settle_tol = validate_threshold(settle_tol, "settle_tol", upper=1.0, allow_zero=False)
    decay_slope = validate_threshold(decay_slope, "decay_slope", upper=1.0 + 1e-12,
                                     allow_zero=False)
    zero_tol = validate_threshold(zero_tol, "zero_tol", upper=1.0, allow_zero=False)
    growth_ratio = validate_positive(growth_ratio, "growth_ratio")
    if growth_ratio <= 1:
        raise ValueError(f"`growth_ratio` must be greater than 1, got {growth_ratio!r}.")
    return settle_tol, decay_slope, zero_tol, growth_ratio


def _classification_inputs(t, cov, attention, status):
    """``(t, cov, status)`` of :func:`classify_trajectory`, validated against each other.

    ``status`` comes back as the string of a :class:`~gaussian_pde.Status` (or ``None``);
    ``attention``, when given, must have the dimension of ``cov`` and an exact rate.
    """
    t = validate_array(t, "t", ndim=1)
    cov = _covariances(cov)
    if cov.ndim != 3 or cov.shape[0] != t.size:
        raise ValueError(f"`cov` must have shape (T, d, d) with T = len(t) = {t.size}, "
                         f"got {cov.shape}.")
    if t.size == 0:
        raise ValueError("`t` must not be empty.")
    if np.any(np.diff(t) <= 0):
        raise ValueError("`t` must be strictly increasing.")
    if status is not None:
        names = [s.value for s in Status]
        if str(status) not in names:
            raise ValueError(f"`status` must be one of {names} (gaussian_pde.Status), "
                             f"got {status!r}.")
        status = str(status)
    if attention is not None and not isinstance(attention, Attention):
        raise TypeError("`attention` must be an attention instance (e.g. gp.Softmax(Q, K, V)), "
                        f"got {type(attention).__name__}.")
    d = cov.shape[-1]
    if attention is not None and attention.d != d:
        raise ValueError(f"`attention` has dimension d = {attention.d}, but `cov` holds "
                         f"{d} x {d} covariances.")
    if attention is not None and not attention.gaussian_preserving:
        raise TypeError(f"`attention` ({attention.name}) does not preserve Gaussians: it has "
                        "no exact covariance rate; give `rate` instead.")
    return t, cov, status


def _outcome(outcome, msg, *, cf, tr_f, tf, rank=None, limit=None, tb=None, direction=False):
    r"""The :class:`TrajectoryOutcome` of the final state ``cf`` (trace ``tr_f``) at ``tf``.

    With ``direction``, the normalised state :math:`\Sigma_f/\operatorname{tr}\Sigma_f`
    and its top eigenvector are attached.
    """
    P = cf / tr_f if direction else None
    vec = _top_vector(P) if direction else None
    return TrajectoryOutcome(outcome, rank, limit, tb, P, vec, tf, msg)


def _final_rate(t, cov, rate, attention):
    r"""The symmetrised rate :math:`\Sigma'_f` at the last time, or ``None`` if unknown.

    ``rate`` as given (checked), else the exact one of ``attention`` (whose rate does not
    involve the mean), else a backward difference of the last two samples.
    """
    d = cov.shape[-1]
    if rate is not None:
        rate = validate_array(rate, "rate", ndim=2)
        if rate.shape != (d, d):
            raise ValueError(f"`rate` must have shape ({d}, {d}), got {rate.shape}.")
    elif attention is not None and not attention.field_sees_mean:
        rate = attention.cov_rhs(cov[-1])   # (a rate that involves the mean: from the samples)
    elif t.size >= 2 and t[-1] > t[-2]:
        rate = (cov[-1] - cov[-2]) / (t[-1] - t[-2])
    else:
        return None
    return 0.5 * (rate + rate.T)


def _classify_spectrum(result, cf, rate, tf, ratio, *, rtol, atol, settle_tol, decay_slope,
                       zero_tol):
    r"""Rules 4 to 6 of :func:`classify_trajectory`: ``ZERO``, ``RANK`` or ``UNDECIDED``.

    From the eigenpairs of the final state ``cf`` and their log-log slopes
    :math:`\gamma_i = t_f\,u_i^T\Sigma'_f u_i/\lambda_i` (``rate`` is :math:`\Sigma'_f`);
    ``ratio`` is :math:`\operatorname{tr}\Sigma_f/\operatorname{tr}\Sigma_0`, ``result``
    makes the outcome (:func:`_outcome` bound to the final state).
    """
    d = cf.shape[-1]
    lam, U = _eigh_descending(cf)
    lam = np.clip(lam, 0.0, None)
    dlam = np.einsum("ji,jk,ki->i", U, rate, U)
    with np.errstate(divide="ignore", invalid="ignore"):
        gamma = np.where(lam > 0, tf * dlam / np.where(lam > 0, lam, 1.0),
                         np.where(dlam > 0, np.inf, 0.0))
    if ratio <= zero_tol and np.all(gamma <= -decay_slope):
        return result(Outcome.ZERO, f"trace fell by {1 / ratio:.3g} and every eigenvalue "
                      f"decays (log-log slopes <= {gamma.max():.3g})", rank=0,
                      limit=np.zeros((d, d)))
    thr = max(atol, rtol * lam[0])
    kept = lam > thr
    moving = kept & (np.abs(gamma) > settle_tol)
    rising = ~kept & (gamma > settle_tol)
    if not moving.any() and not rising.any():
        r = int(kept.sum())
        if r == 0:
            return result(Outcome.ZERO, f"every eigenvalue is below atol = {atol:.3g} "
                          "and none grows", rank=0, limit=np.zeros((d, d)))
        Uk = U[:, kept]
        limit = (Uk * lam[kept]) @ Uk.T
        return result(Outcome.RANK, f"{r} eigenvalue(s) settled (|t lambda'/lambda| <= "
                      f"{np.abs(gamma[kept]).max():.2g}), {d - r} below "
                      f"{thr:.3g} and not growing", rank=r, limit=limit)
    why = []
    if moving.any():
        why.append("eigenvalue(s) " + ", ".join(f"{v:.3g} (t lambda'/lambda = {g:.2g})"
                                                for v, g in zip(lam[moving], gamma[moving]))
                   + " still moving")
    if rising.any():
        why.append("eigenvalue(s) " + ", ".join(f"{v:.3g}" for v in lam[rising])
                   + " below the threshold but growing")
    return result(Outcome.UNDECIDED, f"not settled at t = {tf:.4g}: " + "; ".join(why))


def classify_trajectory(t, cov, *, rate=None, attention=None, status=None, t_blowup=None,
                        message="", rtol=1e-4, atol=0.0, settle_tol=1e-2, decay_slope=0.5,
                        zero_tol=0.1, growth_ratio=1e8):
    r"""Classify the outcome of a finished covariance trajectory.

    The final state :math:`\Sigma_f` at :math:`t_f` and its rate :math:`\Sigma'_f` are
    compared with the initial trace :math:`\operatorname{tr}\Sigma_0`. With the
    eigenpairs :math:`(\lambda_i, u_i)` of :math:`\Sigma_f` and the log-log slopes

    .. math:: \gamma_i = t_f\,\lambda_i'/\lambda_i,\qquad \lambda_i' = u_i^T\Sigma'_f u_i,

    (:math:`\gamma = 0` for a settled eigenvalue, :math:`-1` for algebraic decay
    :math:`\propto 1/t`, very negative for exponential decay), the rules are, in order:

    1. ``BLOWUP``: the solver reported a finite-time blow-up (``status="blowup"`` with a
       finite ``t_blowup``), or, without a solver status, the trace grew by
       ``growth_ratio`` and :math:`u = 1/\operatorname{tr}\Sigma` has the finite-time
       signature :math:`p = uu''/u'^2 < 0.9` (then
       :math:`t^* = t - u/(u'(1 - p))`). The direction is
       :math:`\Sigma_f/\operatorname{tr}\Sigma_f`.
    2. ``UNDECIDED`` when the solver failed (e.g. a stiff stall), whatever the state.
    3. ``GROWS``: the trace grew by ``growth_ratio`` without the finite-time signature
       and still grows at least linearly in log-log scale
       (:math:`t_f\,\operatorname{tr}'/\operatorname{tr} \ge 1`).
    4. ``ZERO``: :math:`\operatorname{tr}\Sigma_f \le` ``zero_tol``
       :math:`\operatorname{tr}\Sigma_0` and every eigenvalue decays,
       :math:`\gamma_i \le -`\ ``decay_slope``: a power law :math:`t^{\gamma_i}` with
       :math:`\gamma_i < 0` in every direction tends to zero. (Algebraic decay is slow:
       for :math:`K = -Q` the trace typically falls only like :math:`1/t`, so requiring a
       tiny trace would leave these cases undecided at any practical horizon.)
    5. ``RANK`` ``r``: the eigenvalues above :math:`\max(\texttt{atol},
       \texttt{rtol}\,\lambda_{\max})` are settled, :math:`|\gamma_i| \le`
       ``settle_tol`` (their remaining change, :math:`\approx |\gamma_i|\lambda_i` for
       algebraic convergence, is small), and those below do not grow
       (:math:`\gamma_i \le` ``settle_tol``). ``r = 0`` (everything below ``atol``)
       gives ``ZERO``.
    6. Otherwise ``UNDECIDED``, with the offending eigenvalues in the message.

    Parameters
    ----------
    t : array_like, shape (T,)
        Times, increasing.
    cov : array_like, shape (T, d, d)
        Covariances at ``t``; the last one is classified.
    rate : array_like, shape (d, d), optional
        :math:`\Sigma'` at the last time. By default it is computed from ``attention``
        when given, else by a backward difference of the last two samples.
    attention : Attention, optional
        The attention type, used for the exact rate.
    status, t_blowup, message : optional
        The solver's verdict (:class:`gaussian_pde.Status` or string), its blow-up time
        and message.
    rtol, atol : float
        Rank thresholds, see :func:`limit_rank`.
    settle_tol : float in (0, 1)
        Largest :math:`|\gamma_i|` of an eigenvalue counted as settled.
    decay_slope : float in (0, 1]
        Smallest decay :math:`-\gamma_i` of every eigenvalue for ``ZERO``.
    zero_tol : float in (0, 1)
        Trace reduction required for ``ZERO``.
    growth_ratio : float > 1
        Trace growth above which the trajectory counts as growing without bound.

    Returns
    -------
    TrajectoryOutcome
    """
    rtol, atol = _thresholds(rtol, atol)
    settle_tol, decay_slope, zero_tol, growth_ratio = _classification_thresholds(
        settle_tol, decay_slope, zero_tol, growth_ratio)
    t, cov, status = _classification_inputs(t, cov, attention, status)
    t_blowup = _validate_t_blowup(t_blowup, t[0])
    tr = np.trace(cov, axis1=-2, axis2=-1)
    tr0, tf, cf = tr[0], float(t[-1]), cov[-1]
    if not tr0 > 0:
        raise ValueError("`cov[0]` must have a positive trace.")
    result = functools.partial(_outcome, cf=cf, tr_f=tr[-1], tf=tf)

    if status == "blowup" and t_blowup is not None and np.isfinite(t_blowup):
        r = limit_rank(cf / tr[-1], rtol=rtol)
        return result(Outcome.BLOWUP, f"finite-time blow-up reported by the solver at "
                      f"t* = {t_blowup:.10g}; limiting normalised covariance of rank {r}",
                      rank=r, tb=float(t_blowup), direction=True)
    if status == "failed":
        return result(Outcome.UNDECIDED, "the solver failed before the horizon"
                      + (f" ({message})" if message else ""))
    ratio = tr[-1] / tr0
    if status is None and ratio >= growth_ratio:
        sig = _finite_time_signature(t, tr)
        if sig is not None and sig[0] is not None:
            r = limit_rank(cf / tr[-1], rtol=rtol)
            return result(Outcome.BLOWUP, f"trace grew by {ratio:.3g} and 1/tr has the "
                          f"finite-time signature p = {sig[1]:.3g} < 0.9; extrapolated "
                          f"t* = {sig[0]:.10g}", rank=r, tb=float(sig[0]), direction=True)

    rate = _final_rate(t, cov, rate, attention)
    if rate is None:
        return result(Outcome.UNDECIDED, "no rate: give `rate`, `attention` or two samples")
    tr_slope = tf * np.trace(rate) / tr[-1] if tr[-1] > 0 else 0.0

    if ratio >= growth_ratio:
        if tr_slope >= 1.0:
            r = limit_rank(cf / tr[-1], rtol=rtol)
            return result(Outcome.GROWS, f"trace grew by {ratio:.3g} without a finite-time "
                          f"signature and still grows (t tr'/tr = {tr_slope:.3g})",
                          rank=r, direction=True)
        return result(Outcome.UNDECIDED, f"trace grew by {ratio:.3g} but its growth slows "
                      f"(t tr'/tr = {tr_slope:.3g}); neither blow-up nor a limit is shown")
    return _classify_spectrum(result, cf, rate, tf, ratio, rtol=rtol, atol=atol,
                              settle_tol=settle_tol, decay_slope=decay_slope,
                              zero_tol=zero_tol)


def classify_solution(solution, attention=None, **kwargs):
    """Classify a :class:`gaussian_pde.MomentSolution` (see :func:`classify_trajectory`).

    The final state is ``solution.cov_final`` at ``solution.t_final``; the solver's
    status, blow-up time and message are used as evidence. A
    :class:`gaussian_pde.BatchSolution` (anything with ``trajectory(i)`` and a length)
    gives a list: every trajectory classified, in order, with ``attention`` one for all
    or a sequence of one per trajectory. A batch solved without ``t_eval`` kept only its
    final states: its trajectories that the solver's verdict decides (a blow-up with its
    time, a failure) are classified, any other is refused (``ValueError``: solve with
    ``t_eval`` from the initial time), as neither its initial trace nor its last steps
    are known.
    """
    if callable(getattr(solution, "trajectory", None)) and hasattr(solution, "__len__"):
        n = len(solution)
        if getattr(solution, "t", None) is None:
            for i in range(n):
                one = solution.trajectory(i)
                if not ((str(one.status) == "blowup" and one.t_blowup is not None)
                        or str(one.status) == "failed"):
                    raise ValueError(
                        "`solution` is a BatchSolution that kept only its final states "
                        f"(solve_batch without `t_eval`), and trajectory {i} ended "
                        f"{str(one.status)!r}: classifying it needs its initial state and "
                        "its last steps. Solve with `t_eval` from the initial time, e.g. "
                        "gp.solve_batch(..., t_eval=np.linspace(t0, t1, 11)), and classify "
                        "that.")
        if isinstance(attention, (list, tuple)):
            if len(attention) != n:
                raise ValueError(f"`attention` must be one attention or one per trajectory "
                                 f"({n}), got {len(attention)}.")
            attentions = list(attention)
        else:
            attentions = [attention] * n
        return [classify_solution(solution.trajectory(i), attentions[i], **kwargs)
                for i in range(n)]
    for attr in ("t", "cov", "cov_final", "t_final", "status"):
        if not hasattr(solution, attr):
            raise TypeError("`solution` must be a MomentSolution (from gaussian_pde.solve), "
                            f"got {type(solution).__name__}.")
    t, cov = np.asarray(solution.t, float), np.asarray(solution.cov, float)
    if t.size == 0 or t[-1] < solution.t_final:
        t = np.append(t, solution.t_final)
        cov = np.concatenate([cov.reshape(-1, *solution.cov_final.shape),
                              solution.cov_final[None]], axis=0)
    return classify_trajectory(t, cov, attention=attention, status=solution.status,
                               t_blowup=solution.t_blowup, message=solution.message, **kwargs)
