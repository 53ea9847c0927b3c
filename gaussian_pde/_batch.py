r"""Many covariance trajectories at once: a vectorised, per-trajectory adaptive integrator.

The factor-form covariance equation (MATH.md section 3),

.. math:: L_b' = M_b(\Sigma_b)\,L_b,\qquad \Sigma_b = L_bL_b^T,\qquad b = 1, \dots, B,

is integrated for a stack of ``B`` trajectories with one vectorised right-hand side per
Runge-Kutta stage: the generated functions in :mod:`gaussian_pde._generated` broadcast
over leading axes, of the state and of stacked weights ``Q, K, V`` of shape
``(B, k, d)``. Every trajectory has its own time, step size and step control (the
Dormand-Prince 8(5,3) pair of :func:`scipy.integrate.solve_ivp`'s ``DOP853``, with the same
error norm and step-size rule), its own events (blow-up with a time estimate, steady
state, rank collapse, the same definitions as :func:`gaussian_pde.solve`) and its own
status. Finished trajectories leave the active stack, so a trajectory that blows up early
costs nothing afterwards, and one that needs many steps only costs its own rows.

Differences from :func:`gaussian_pde.solve`, all documented on :func:`solve_batch`: the
covariance only (no mean); the blow-up time is estimated at the end of the step that
passed the threshold instead of at the located crossing; steady-state and rank-collapse
events are located by bisection on the dense output to ``2**-30`` of the step.
"""

# The event helpers defined inside the integration loop are called within the same
# iteration only, so binding the loop variables late is intended:
# ruff: noqa: B023

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.integrate._ivp import dop853_coefficients as _dop

from ._attention import Attention, SingleHeadAttention
from ._linalg import psd_sqrt
from ._multihead import MultiHead
from ._registry import get_attention
from ._solve import _MAX_GROWTH, MomentSolution, Status, _validate_t_eval
from ._validation import (
    validate_array,
    validate_covariance,
    validate_int,
    validate_positive,
    validate_t_span,
    validate_tolerance,
)

__all__ = ["BatchSolution", "solve_batch"]

# DOP853 tableau (Hairer, Norsett and Wanner; the coefficients SciPy uses)
_NS = _dop.N_STAGES
_A = _dop.A[:_NS, :_NS]
_B = _dop.B
_C = _dop.C[:_NS]
_E3, _E5 = _dop.E3, _dop.E5
_D = _dop.D
_A_EXTRA = _dop.A[_NS + 1:]
_C_EXTRA = _dop.C[_NS + 1:]
_SAFETY, _MIN_FACTOR, _MAX_FACTOR = 0.9, 0.2, 10.0
_ERR_EXP = -1.0 / 8.0
_BISECT = 30


# ----------------------------------------------------------------------------------------
# the vectorised field
# ----------------------------------------------------------------------------------------

def _signature(att):
    if isinstance(att, MultiHead):
        return ("multihead",) + tuple(_signature(h) for h in att.heads)
    if isinstance(att, SingleHeadAttention) and att._generated is not None:
        return (type(att), att.k, att.d)
    raise TypeError(f"`attentions_or_weights` holds an attention type that cannot be batched: "
                    f"{att!r} (softmax, L2, Sinkhorn and MultiHead of those can).")


def _heads(att):
    return att.heads if isinstance(att, MultiHead) else (att,)


class _Field:
    """Stacked weights grouped by structure; evaluates ``L'`` for any subset of rows."""

    def __init__(self, groups, n):
        # groups: list of (global indices or None for all, [(gen, Q, K, V, scale), ...])
        self.groups = groups
        self.n = n
        self.group_of = np.empty(n, dtype=int)
        self.local = np.empty(n, dtype=int)
        for g, (idx, _) in enumerate(groups):
            idx = np.arange(n) if idx is None else idx
            self.group_of[idx] = g
            self.local[idx] = np.arange(idx.size)
        self.calls = 0
        self._cache_key = None

    def _plan(self, idx):
        plan = []
        for g, (_, heads) in enumerate(self.groups):
            rows = np.flatnonzero(self.group_of[idx] == g)
            if rows.size == 0:
                continue
            loc = self.local[idx[rows]]
            params = [(gen, Q if Q.shape[0] == 1 else Q[loc], K if K.shape[0] == 1 else K[loc],
                       V if V.shape[0] == 1 else V[loc], s if s.shape[0] == 1 else s[loc])
                      for gen, Q, K, V, s in heads]
            plan.append((None if rows.size == idx.size else rows, params))
        return plan

    def set_active(self, idx):
        self._active = self._plan(idx)

    @staticmethod
    def _eval(params, L):
        out = None
        for gen, Q, K, V, s in params:
            term = gen.factor_rhs(Q, K, V, s, L)
            out = term if out is None else out + term
        return out

    def __call__(self, L, plan=None):
        """``L'`` for a stack aligned with the active rows (or with ``plan``'s rows)."""
        self.calls += 1
        plan = self._active if plan is None else plan
        if len(plan) == 1 and plan[0][0] is None:
            return self._eval(plan[0][1], L)
        out = np.empty_like(L)
        for rows, params in plan:
            out[rows] = self._eval(params, L[rows])
        return out

    def at(self, idx, L):
        """``L'`` at rows ``idx`` (global trajectory indices)."""
        return self(L, self._plan(idx))


def _stack_heads(atts):
    """[(gen, Q, K, V, scale)] with leading batch axes for attentions of one signature."""
    per_head = list(zip(*[_heads(a) for a in atts]))
    out = []
    for heads in per_head:
        gen = heads[0]._generated
        Q = np.stack([h.Q for h in heads])
        K = np.stack([h.K for h in heads])
        V = np.stack([h.V for h in heads])
        s = np.array([h.scale for h in heads])[:, None, None]
        if len(heads) > 1 and all(h is heads[0] for h in heads):
            Q, K, V, s = Q[:1], K[:1], V[:1], s[:1]
        out.append((gen, Q, K, V, s))
    return out


def _build_field(attentions_or_weights, n):
    """A :class:`_Field` from one attention, a sequence of them, or stacked weights."""
    obj = attentions_or_weights
    if isinstance(obj, Attention):
        _signature(obj)
        return _Field([(None, _stack_heads([obj]))], n), obj.d
    if isinstance(obj, Mapping):
        return _field_from_weights(obj, n)
    if isinstance(obj, (str, bytes)) or not isinstance(obj, Sequence):
        raise TypeError("`attentions_or_weights` must be an attention, a sequence of "
                        "attentions or a mapping of stacked weights, got "
                        f"{type(obj).__name__}.")
    atts = list(obj)
    if len(atts) != n:
        raise ValueError(f"`attentions_or_weights` has {len(atts)} attentions but `cov0s` "
                         f"has {n} covariances; they must match.")
    for i, a in enumerate(atts):
        if not isinstance(a, Attention):
            raise TypeError(f"`attentions_or_weights[{i}]` must be an attention, "
                            f"got {type(a).__name__}.")
    dims = {a.d for a in atts}
    if len(dims) != 1:
        raise ValueError(f"all attentions must have the same dimension d, got {sorted(dims)}.")
    by_sig = {}
    for i, a in enumerate(atts):
        by_sig.setdefault(_signature(a), []).append(i)
    groups = []
    for idxs in by_sig.values():
        idxs = np.asarray(idxs)
        groups.append((idxs, _stack_heads([atts[i] for i in idxs])))
    return _Field(groups, n), dims.pop()


def _field_from_weights(w, n):
    unknown = set(w) - {"kind", "Q", "K", "V", "scale"}
    if unknown or not {"kind", "Q", "K", "V"} <= set(w):
        raise ValueError("stacked weights must be a mapping with keys 'kind', 'Q', 'K', 'V' "
                         f"and optionally 'scale', got keys {sorted(w)}.")
    cls = get_attention(w["kind"])
    if not (issubclass(cls, SingleHeadAttention) and cls._generated is not None):
        raise ValueError(f"stacked weights need a single-head kind, got {w['kind']!r}.")
    Q = validate_array(w["Q"], "Q", ndim=(2, 3))
    Q = Q[None] if Q.ndim == 2 else Q
    k, d = Q.shape[-2:]
    K = validate_array(w["K"], "K", ndim=(2, 3))
    V = validate_array(w["V"], "V", ndim=(2, 3))
    K, V = (K[None] if K.ndim == 2 else K), (V[None] if V.ndim == 2 else V)
    if K.shape[-2:] != (k, d) or V.shape[-2:] != (d, d):
        raise ValueError(f"stacked weights must have Q, K of shape (B, {k}, {d}) and V of "
                         f"shape (B, {d}, {d}), got K {K.shape}, V {V.shape}.")
    scale = w.get("scale")
    scale = np.full(1, 1.0 / np.sqrt(k)) if scale is None else validate_array(
        scale, "scale", ndim=(0, 1)).reshape(-1)
    if np.any(scale <= 0):
        raise ValueError("`scale` must be positive.")
    for name, arr in (("Q", Q), ("K", K), ("V", V), ("scale", scale)):
        if arr.shape[0] not in (1, n):
            raise ValueError(f"stacked `{name}` must have 1 or {n} (= len(cov0s)) entries "
                             f"along its first axis, got {arr.shape[0]}.")
    return _Field([(None, [(cls._generated, Q, K, V, scale[:, None, None])])], n), d


# ----------------------------------------------------------------------------------------
# result
# ----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BatchSolution:
    """Result of :func:`solve_batch`; ``B`` trajectories.

    Attributes
    ----------
    t : ndarray, shape (T,), or None
        ``t_eval``.
    cov : ndarray, shape (B, T, d, d), or None
        Covariances at ``t``; NaN after a trajectory stopped.
    t_final : ndarray, shape (B,)
        Where each trajectory stopped.
    cov_final, factor_final : ndarray, shape (B, d, d)
        Final covariance and factor (``cov = L L^T``).
    status : ndarray of Status, shape (B,)
        As :attr:`gaussian_pde.MomentSolution.status`.
    t_blowup : ndarray, shape (B,)
        Estimated blow-up time; NaN where there is none.
    message : list of str
        Per trajectory.
    nfev : ndarray of int, shape (B,)
        Right-hand-side evaluations per trajectory.
    nsteps : ndarray of int, shape (B,)
        Accepted steps per trajectory.
    ncalls : int
        Vectorised right-hand-side calls for the whole batch.
    """

    t: np.ndarray | None
    cov: np.ndarray | None
    t_final: np.ndarray
    cov_final: np.ndarray
    factor_final: np.ndarray
    status: np.ndarray
    t_blowup: np.ndarray
    message: list
    nfev: np.ndarray
    nsteps: np.ndarray
    ncalls: int

    def __len__(self):
        return self.t_final.size

    def trajectory(self, i):
        """Trajectory ``i`` as a :class:`gaussian_pde.MomentSolution` (covariance only)."""
        i = validate_int(i, "i")
        if not -len(self) <= i < len(self):
            raise IndexError(f"trajectory index {i} out of range for {len(self)} trajectories.")
        if self.t is None:
            t = np.array([self.t_final[i]])
            cov = self.cov_final[i][None]
        else:
            keep = np.isfinite(self.cov[i, :, 0, 0])
            t, cov = self.t[keep], self.cov[i, keep]
        tb = None if np.isnan(self.t_blowup[i]) else float(self.t_blowup[i])
        return MomentSolution(
            t=t, mean=None, cov=cov, factor=psd_sqrt(cov), status=self.status[i],
            message=self.message[i], t_blowup=tb, t_final=float(self.t_final[i]),
            mean_final=None, cov_final=self.cov_final[i], t_events={},
            nfev=int(self.nfev[i]))


# ----------------------------------------------------------------------------------------
# the integrator
# ----------------------------------------------------------------------------------------

def _rms(x):
    return np.sqrt(np.mean(x * x, axis=-1))


def _dense_coeffs(field, idx, y_old, y_new, f_old, f_new, K, h, d):
    """DOP853 dense-output coefficients ``F`` (7, m, n) for rows ``idx`` (SciPy's formula)."""
    m, n = y_old.shape
    Kx = np.empty((_dop.N_STAGES_EXTENDED, m, n))
    Kx[:_NS + 1] = K
    for s, (a, _c) in enumerate(zip(_A_EXTRA, _C_EXTRA), start=_NS + 1):
        dy = np.tensordot(a[:s], Kx[:s], axes=(0, 0)) * h[:, None]
        Kx[s] = field.at(idx, (y_old + dy).reshape(m, d, d)).reshape(m, n)
    F = np.empty((_dop.INTERPOLATOR_POWER, m, n))
    dy = y_new - y_old
    F[0] = dy
    F[1] = h[:, None] * f_old - dy
    F[2] = 2 * dy - h[:, None] * (f_new + f_old)
    F[3:] = h[None, :, None] * np.tensordot(_D, Kx, axes=(1, 0))
    return F


def _dense_eval(F, y_old, x):
    """Evaluate the dense output at fractions ``x`` (m,) of each row's step."""
    y = np.zeros_like(y_old)
    for i, f in enumerate(F[::-1]):
        y += f
        y *= (x if i % 2 == 0 else 1.0 - x)[:, None]
    return y + y_old


def _cov_rate(L, dL):
    cov = L @ np.swapaxes(L, -1, -2)
    dcov = dL @ np.swapaxes(L, -1, -2)
    return cov, dcov + np.swapaxes(dcov, -1, -2)


def solve_batch(attentions_or_weights, cov0s, t_span, *, t_eval=None, rtol=1e-10, atol=1e-12,
                blowup_threshold=1e8, steady_tol=None, steady_atol=0.0, rank_tol=None,
                max_step=np.inf, max_nfev=100_000):
    r"""Integrate many covariance trajectories at once, each with its own steps and events.

    .. math:: L_b' = M_b(\Sigma_b)L_b,\qquad \Sigma_b = L_bL_b^T,\qquad b = 1..B

    Parameters
    ----------
    attentions_or_weights : Attention, sequence of Attention, or mapping
        One attention for every trajectory; or ``B`` attentions (any mix of softmax, L2,
        Sinkhorn and MultiHead of the same dimension: trajectories with the same
        structure share one vectorised call); or stacked single-head weights
        ``{"kind": "softmax", "Q": (B, k, d), "K": (B, k, d), "V": (B, d, d),
        "scale": (B,)}`` (any entry may be unstacked, ``scale`` defaults to
        :math:`1/\sqrt{k}`).
    cov0s : array_like, shape (B, d, d)
        Initial covariances, symmetric PSD (any rank).
    t_span : (float, float)
        Common interval of integration.
    t_eval : array_like, optional
        Common output times; ``cov[b, j]`` is NaN once trajectory ``b`` has stopped.
    rtol, atol, blowup_threshold, steady_tol, steady_atol, rank_tol, max_step, max_nfev
        As in :func:`gaussian_pde.solve` (per trajectory). The steady-state event is on
        when ``steady_tol`` is given or ``steady_atol`` is positive (``steady_tol=None``
        with ``steady_atol > 0`` stops at :math:`\|\Sigma'\|_F \le` ``steady_atol``, the
        paper's criterion).

    Returns
    -------
    BatchSolution

    Notes
    -----
    Each step of each trajectory is a DOP853 step with SciPy's error norm and step-size
    rule, so a batch trajectory follows the same steps as ``solve(..., method="DOP853")``
    up to rounding. The blow-up event is checked at step ends; the blow-up time comes from
    the same extrapolation of :math:`1/\operatorname{tr}\Sigma` as in
    :func:`gaussian_pde.solve`, evaluated at the end of the first step past the threshold.

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> from gaussian_pde._batch import solve_batch
    >>> att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=0.5)
    >>> sol = solve_batch(att, [np.eye(2), 2 * np.eye(2)], (0, 2))
    >>> np.round(sol.t_blowup, 6)           # exact 1/lambda_max(Sigma0^1/2 (A + A^T) Sigma0^1/2)
    array([1. , 0.5])
    """
    cov0s = validate_array(cov0s, "cov0s", ndim=None)
    if cov0s.ndim != 3:
        raise ValueError(f"`cov0s` must have shape (B, d, d), got {cov0s.shape}.")
    if cov0s.shape[0] == 0:
        raise ValueError("`cov0s` must not be empty.")
    cov0s = validate_covariance(cov0s, "cov0s", batch=True)
    nb, d = cov0s.shape[0], cov0s.shape[-1]
    field, fd = _build_field(attentions_or_weights, nb)
    if fd != d:
        raise ValueError(f"`cov0s` must be {fd} x {fd} to match the attention's dimension, "
                         f"got shape {cov0s.shape}.")
    t0, t1 = validate_t_span(t_span)
    t_eval = _validate_t_eval(t_eval, t0, t1)
    rtol = validate_tolerance(rtol, "rtol")
    atol = validate_positive(atol, "atol")
    blowup_threshold = validate_positive(blowup_threshold, "blowup_threshold")
    if blowup_threshold <= 1:
        raise ValueError(f"`blowup_threshold` must be greater than 1, got {blowup_threshold}.")
    steady_atol = validate_positive(steady_atol, "steady_atol", allow_zero=True)
    if steady_tol is not None:
        steady_tol = validate_positive(steady_tol, "steady_tol")
    steady_on = steady_tol is not None or steady_atol > 0
    steady_rtol = 0.0 if steady_tol is None else steady_tol
    if rank_tol is not None:
        rank_tol = validate_tolerance(rank_tol, "rank_tol")
    max_step = validate_positive(max_step, "max_step") if np.isfinite(max_step) else np.inf
    max_nfev = None if max_nfev is None else validate_int(max_nfev, "max_nfev", minimum=1)

    n = d * d
    # outputs
    status = np.full(nb, Status.FINISHED, dtype=object)
    message = ["reached the end of t_span"] * nb
    t_final = np.full(nb, t1)
    L_final = np.empty((nb, d, d))
    t_blowup = np.full(nb, np.nan)
    nfev = np.zeros(nb, dtype=int)
    nsteps = np.zeros(nb, dtype=int)
    cov_out = None
    if t_eval is not None:
        cov_out = np.full((nb, t_eval.size, d, d), np.nan)

    # state of the active rows
    idx = np.arange(nb)
    field.set_active(idx)
    L0 = psd_sqrt(cov0s)
    y = L0.reshape(nb, n).copy()
    tr0 = np.maximum(np.trace(cov0s, axis1=1, axis2=2), np.finfo(float).tiny)
    t = np.full(nb, t0)
    limit = np.full(nb, blowup_threshold)
    rejected = np.zeros(nb, dtype=bool)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        f = field(y.reshape(nb, d, d)).reshape(nb, n)
        nfev += 1
        if t_eval is not None:
            at0 = t_eval == t0
            if at0.any():
                cov_out[:, at0] = cov0s[:, None]

        def steady_g(L, dL):
            cov, dcov = _cov_rate(L, dL)
            lhs = np.linalg.norm(dcov, axis=(-2, -1)) + 1e-300
            rhs = steady_rtol * np.linalg.norm(cov, axis=(-2, -1)) + steady_atol + 1e-300
            return np.log(lhs) - np.log(rhs)

        first = None
        if rank_tol is not None:
            w0 = np.linalg.eigvalsh(cov0s) / tr0[:, None]
            first = np.sum(w0 <= rank_tol, axis=1)   # per trajectory; == d: event off

        def rank_g(L, rows):
            cov = L @ np.swapaxes(L, -1, -2)
            w = np.linalg.eigvalsh(cov)
            j = np.minimum(first[rows], d - 1)
            return (w[np.arange(len(rows)), j] / np.maximum(w.sum(-1), 1e-300) - rank_tol)

        g_steady = steady_g(y.reshape(nb, d, d), f.reshape(nb, d, d)) if steady_on else None
        g_rank = rank_g(y.reshape(nb, d, d), idx) if rank_tol is not None else None

        # initial step (Hairer, Norsett and Wanner II.4, as SciPy's select_initial_step)
        scale = atol + np.abs(y) * rtol
        d0, d1 = _rms(y / scale), _rms(f / scale)
        h0 = np.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / np.maximum(d1, 1e-300))
        h0 = np.minimum(h0, t1 - t0)
        f1 = field(y.reshape(nb, d, d) + h0[:, None, None] * f.reshape(nb, d, d)).reshape(nb, n)
        nfev += 1
        d2 = _rms((f1 - f) / scale) / h0
        h1 = np.where((d1 <= 1e-15) & (d2 <= 1e-15), np.maximum(1e-6, h0 * 1e-3),
                      (0.01 / np.maximum(np.maximum(d1, d2), 1e-300)) ** (1.0 / 8.0))
        h_abs = np.minimum.reduce([100 * h0, h1, np.full(nb, t1 - t0), np.full(nb, max_step)])

        Kst = np.empty((_NS + 1, nb, n))
        while idx.size:
            m = idx.size
            min_step = 10 * np.abs(np.nextafter(t, np.inf) - t)
            h_abs = np.clip(h_abs, min_step, max_step)
            h = np.minimum(h_abs, t1 - t)
            # one DOP853 attempt for every active row
            K = Kst[:, :m]
            K[0] = f
            for s in range(1, _NS):
                dy = np.tensordot(_A[s, :s], K[:s], axes=(0, 0)) * h[:, None]
                K[s] = field((y + dy).reshape(m, d, d)).reshape(m, n)
            y_new = y + h[:, None] * np.tensordot(_B, K[:_NS], axes=(0, 0))
            f_new = field(y_new.reshape(m, d, d)).reshape(m, n)
            K[_NS] = f_new
            nfev[idx] += _NS
            sc = atol + np.maximum(np.abs(y), np.abs(y_new)) * rtol
            err5 = np.tensordot(_E5, K, axes=(0, 0)) / sc
            err3 = np.tensordot(_E3, K, axes=(0, 0)) / sc
            e5, e3 = np.sum(err5 * err5, -1), np.sum(err3 * err3, -1)
            denom = e5 + 0.01 * e3
            err = np.where(denom > 0, h * e5 / np.sqrt(np.where(denom > 0, denom, 1.0) * n), 0.0)
            err = np.where(np.isfinite(err), err, np.inf)
            acc = err < 1
            fac = np.where(err == 0, _MAX_FACTOR,
                           np.minimum(_MAX_FACTOR, _SAFETY * np.where(err > 0, err, 1.0) ** _ERR_EXP))
            fac_acc = np.where(rejected, np.minimum(1.0, fac), fac)
            fac_rej = np.maximum(_MIN_FACTOR, _SAFETY * np.where(np.isfinite(err) & (err > 0),
                                                                  err, 1e300) ** _ERR_EXP)
            h_abs = np.where(acc, h_abs * fac_acc, h_abs * fac_rej)
            rejected = ~acc
            done = np.zeros(m, dtype=bool)
            too_small = ~acc & (h_abs < min_step)
            if too_small.any():
                for r in np.flatnonzero(too_small):
                    status[idx[r]] = Status.FAILED
                    message[idx[r]] = "step size too small (required step below rounding)"
                t_final[idx[too_small]] = t[too_small]
                L_final[idx[too_small]] = y[too_small].reshape(-1, d, d)
                done |= too_small

            a = np.flatnonzero(acc)
            if a.size:
                t_old, y_old, f_old = t[a], y[a], f[a]
                t_new = t_old + h[a]
                t_new = np.where(t1 - t_new < 4 * np.abs(np.nextafter(t1, np.inf) - t1),
                                 t1, t_new)
                Ln = y_new[a].reshape(-1, d, d)
                dLn = f_new[a].reshape(-1, d, d)
                nsteps[idx[a]] += 1
                stop_t = np.full(a.size, np.inf)        # located event time within the step
                stop_kind = np.zeros(a.size, dtype=int)  # 1 steady, 2 rank
                F = None

                def dense(sel):
                    nonlocal F
                    if F is None:
                        F = _dense_coeffs(field, idx[a], y_old, y_new[a], f_old, f_new[a],
                                          K[:, a], h[a], d)
                        nfev[idx[a]] += 3
                    return F[:, sel]

                def locate(sel, gfun):
                    """Bisection for the downward crossing of ``gfun`` within the step."""
                    Fs = dense(sel)
                    lo, hi = np.zeros(sel.size), np.ones(sel.size)
                    for _ in range(_BISECT):
                        mid = 0.5 * (lo + hi)
                        ym = _dense_eval(Fs, y_old[sel], mid)
                        g = gfun(ym, sel)
                        nfev[idx[a[sel]]] += 1
                        lo, hi = np.where(g > 0, mid, lo), np.where(g > 0, hi, mid)
                    return hi

                if steady_on:
                    g_new = steady_g(Ln, dLn)
                    fired = np.flatnonzero((g_steady[idx[a]] > 0) & (g_new <= 0))
                    if fired.size:
                        def gs(ym, sel):
                            Lm = ym.reshape(-1, d, d)
                            return steady_g(Lm, field.at(idx[a[sel]], Lm))
                        x = locate(fired, gs)
                        stop_t[fired] = t_old[fired] + x * h[a][fired]
                        stop_kind[fired] = 1
                    g_steady[idx[a]] = g_new
                if rank_tol is not None:
                    g_new = rank_g(Ln, idx[a])
                    fired = np.flatnonzero((g_rank[idx[a]] > 0) & (g_new <= 0) & (first[idx[a]] < d))
                    if fired.size:
                        x = locate(fired, lambda ym, sel: rank_g(ym.reshape(-1, d, d),
                                                                 idx[a[sel]]))
                        tr_ = t_old[fired] + x * h[a][fired]
                        earlier = tr_ < stop_t[fired]
                        stop_t[fired[earlier]] = tr_[earlier]
                        stop_kind[fired[earlier]] = 2
                    g_rank[idx[a]] = g_new
                # output at t_eval up to the stop time
                if t_eval is not None:
                    t_end = np.minimum(t_new, stop_t)
                    lo_i = np.searchsorted(t_eval, t_old, side="right")
                    hi_i = np.searchsorted(t_eval, t_end, side="right")
                    cnt = hi_i - lo_i
                    if cnt.any():
                        sel = np.repeat(np.arange(a.size), cnt)
                        j = np.concatenate([np.arange(p, q) for p, q in zip(lo_i, hi_i) if q > p])
                        Fs = dense(np.arange(a.size))
                        x = (t_eval[j] - t_old[sel]) / h[a][sel]
                        ys = _dense_eval(Fs[:, sel], y_old[sel], x)
                        Ls = ys.reshape(-1, d, d)
                        cov_out[idx[a[sel]], j] = Ls @ np.swapaxes(Ls, -1, -2)
                # located events stop the trajectory
                ev = np.flatnonzero(np.isfinite(stop_t))
                if ev.size:
                    x = (stop_t[ev] - t_old[ev]) / h[a][ev]
                    ye = _dense_eval(dense(ev), y_old[ev], x)
                    for r, kind, te in zip(ev, stop_kind[ev], stop_t[ev]):
                        g = idx[a[r]]
                        name = "steady" if kind == 1 else "rank_collapse"
                        status[g] = Status.STEADY if kind == 1 else Status.RANK_COLLAPSE
                        message[g] = f"terminal event {name!r} at t = {te:.10g}"
                    t_final[idx[a[ev]]] = stop_t[ev]
                    L_final[idx[a[ev]]] = ye.reshape(-1, d, d)
                    done[a[ev]] = True
                # blow-up: tr(Sigma) past limit * tr0 at the step end
                live = ~done[a]
                trn = np.sum(Ln * Ln, axis=(1, 2))
                over = np.flatnonzero(live & (trn > limit[a] * tr0[idx[a]]))
                if over.size:
                    rows = idx[a[over]]
                    Lb, dLb = Ln[over], dLn[over]
                    cov, dcov = _cov_rate(Lb, dLb)
                    tr_, dtr = np.trace(cov, axis1=1, axis2=2), np.trace(dcov, axis1=1, axis2=2)
                    u, du = 1.0 / tr_, -dtr / tr_**2
                    hh = 1e-4 * u / np.where(du < 0, -du, 1.0)
                    L2 = Lb + hh[:, None, None] * dLb
                    cov2, dcov2 = _cov_rate(L2, field.at(rows, L2))
                    nfev[rows] += 1
                    du2 = -np.trace(dcov2, axis1=1, axis2=2) / np.trace(cov2, axis1=1, axis2=2) ** 2
                    p = u * (du2 - du) / hh / du**2
                    finite = (dtr > 0) & (p < 0.9)
                    tstar = t_new[over] - u / (du * (1.0 - p))
                    for q, r in enumerate(over):
                        g = rows[q]
                        if finite[q]:
                            status[g] = Status.BLOWUP
                            t_blowup[g] = tstar[q]
                            message[g] = (f"finite-time blow-up: tr(cov) passed "
                                          f"{limit[a[r]]:.3g} x its initial value at "
                                          f"t = {t_new[r]:.10g}; estimated blow-up time "
                                          f"t* = {tstar[q]:.12g}")
                        elif limit[a[r]] * 1e8 > _MAX_GROWTH:
                            status[g] = Status.FAILED
                            message[g] = ("the covariance grows without bound but not as a "
                                          "finite-time blow-up; stopped at tr(cov) = "
                                          f"{limit[a[r]]:.3g} x initial")
                        else:
                            limit[a[r]] *= 1e8
                            continue
                        t_final[g] = t_new[r]
                        L_final[g] = Ln[r]
                        done[a[r]] = True
                # advance the accepted rows that go on
                t[a], y[a], f[a] = t_new, y_new[a], f_new[a]
                end = ~done[a] & (t_new >= t1)
                if end.any():
                    L_final[idx[a[end]]] = Ln[end]
                    done[a[end]] = True
            if max_nfev is not None:
                over_n = ~done & (nfev[idx] > max_nfev)
                for r in np.flatnonzero(over_n):
                    status[idx[r]] = Status.FAILED
                    message[idx[r]] = (f"gave up after {max_nfev} right-hand-side evaluations "
                                       f"near t = {t[r]:.10g} (stiff or nearly singular "
                                       "dynamics)")
                t_final[idx[over_n]] = t[over_n]
                L_final[idx[over_n]] = y[over_n].reshape(-1, d, d)
                done |= over_n
            if done.any():
                keep = ~done
                idx, t, y, f = idx[keep], t[keep], y[keep], f[keep]
                h_abs, rejected, limit = h_abs[keep], rejected[keep], limit[keep]
                field.set_active(idx)

    cov_final = L_final @ np.swapaxes(L_final, -1, -2)
    return BatchSolution(t=t_eval, cov=cov_out, t_final=t_final, cov_final=cov_final,
                         factor_final=L_final, status=status, t_blowup=t_blowup,
                         message=message, nfev=nfev, nsteps=nsteps, ncalls=field.calls)
