r"""Many covariance trajectories at once: a vectorised, per-trajectory adaptive integrator.

The factor-form covariance equation (MATH.md section 3),

.. math:: L_b' = M_b(\Sigma_b)\,L_b,\qquad \Sigma_b = L_bL_b^T,\qquad b = 1, \dots, B,

is integrated for a stack of ``B`` trajectories with one vectorised right-hand side per
Runge-Kutta stage: the generated functions in :mod:`gaussian_pde._generated` broadcast
over leading axes, of the state and of stacked weights ``Q, K, V`` of shape
``(B, k, d)``. Every trajectory has its own time, step size and step control (the
Dormand-Prince 8(5,3) pair of :func:`scipy.integrate.solve_ivp`'s ``DOP853``, with the same
error norm and step-size rule, or, where it is stiff, the L-stable Rosenbrock method
RODAS4 with a finite-difference Jacobian: ``method="auto"`` switches per trajectory),
its own events (blow-up with a time estimate, steady
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

from .._common.linalg import psd_sqrt
from .._common.validation import (
    validate_array,
    validate_covariance,
    validate_int,
    validate_positive,
    validate_t_eval,
    validate_t_span,
    validate_tolerance,
)
from ..attention._base import Attention, SingleHeadAttention
from ..attention._multihead import MultiHead
from ..attention._registry import get_attention
from ._solve import MomentSolution, Status, _blowup_verdict

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
_SAFETY, _MIN_FACTOR = 0.9, 0.2
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
        # groups: list of (global indices or None for all, [(gen, Q, K, V, scale), ...]);
        # each head also keeps the generated weight products (factor_weights), computed
        # once here, so that an evaluation multiplies the state only
        self.groups = [(idx, [(gen, Q, K, V, s, _weight_products(gen, Q, K, V, s))
                              for gen, Q, K, V, s in heads]) for idx, heads in groups]
        self.n = n
        self.group_of = np.empty(n, dtype=int)
        self.local = np.empty(n, dtype=int)
        for g, (idx, _) in enumerate(groups):
            idx = np.arange(n) if idx is None else idx
            self.group_of[idx] = g
            self.local[idx] = np.arange(idx.size)
        self.calls = 0
        self._cache_key = None
        #: whether :func:`_analytic_jacobian` applies (every head softmax or L2)
        self.analytic_jacobian = {gen.__name__.rsplit(".", 1)[-1] for _, heads in self.groups
                                  for gen, *_ in heads} <= set(_HOLOMORPHIC)

    def _plan(self, idx, stacked=False):
        """Rows and weights of each group for trajectories ``idx``.

        ``stacked``: the states will carry one more leading axis (``(m, P, d, d)``, ``P``
        states per trajectory), so per-row weights get a broadcasting axis.
        """
        def take(w, loc):
            if w.shape[0] == 1:
                return w
            return w[loc][:, None] if stacked else w[loc]

        plan = []
        for g, (_, heads) in enumerate(self.groups):
            rows = np.flatnonzero(self.group_of[idx] == g)
            if rows.size == 0:
                continue
            loc = self.local[idx[rows]]
            params = [(gen, take(Q, loc), take(K, loc), take(V, loc), take(s, loc),
                       None if W is None else tuple(take(w, loc) for w in W))
                      for gen, Q, K, V, s, W in heads]
            plan.append((None if rows.size == idx.size else rows, params))
        return plan

    def set_active(self, idx):
        self._active = self._plan(idx)

    @staticmethod
    def _eval(params, L):
        out = None
        for gen, Q, K, V, s, W in params:
            term = gen.factor_rhs(Q, K, V, s, L) if W is None else gen.factor_apply(W, L)
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

    def at_stack(self, idx, L):
        """``L'`` for ``P`` states per trajectory: ``L`` of shape ``(len(idx), P, d, d)``.

        One vectorised call per structure group (the generated functions broadcast), used
        for the finite-difference Jacobian.
        """
        return self(L, self._plan(idx, stacked=True))


def _weight_products(gen, Q, K, V, s):
    """The generated module's hoisted weight products, or None if it has none."""
    make = getattr(gen, "factor_weights", None)
    if make is None:
        return None
    weights = tuple(make(Q, K, V, s))
    # stacked inputs (and scale of shape (B, 1, 1)) give stacked products: one per row,
    # or one for all, which _Field._plan can subset like the weights themselves
    assert all(np.ndim(w) == 3 for w in weights)
    return weights


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
    implicit : ndarray of bool, shape (B,)
        Where the trajectory ended on Rosenbrock (RODAS4) steps: every trajectory with
        ``method="rosenbrock"``, those found stiff with ``method="auto"``.
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
    implicit: np.ndarray | None = None

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


# ----------------------------------------------------------------------------------------
# the steppers: one attempted step for every active row
# ----------------------------------------------------------------------------------------
# A stepper's ``attempt(idx, y, f, h)`` returns ``(y_new, err, step)`` with ``err`` the
# scaled error norm (accept where ``err < 1``) and ``step.rate(a)`` (``L'`` at ``y_new`` of
# the accepted rows ``a``) and ``step.dense(a, y_old, f_old)`` (a callable ``(sel, x) ->
# states`` at fractions ``x`` of the step of rows ``a[sel]``). The integration loop, the
# step-size rule, the events and the output are shared by both methods.

def _wsum(c, K):
    """``sum_j c[j] K[j]`` for stacked stages ``K`` (s, m, n): one small mat-vec."""
    s = K.shape[0]
    return (c @ K.reshape(s, -1)).reshape(K.shape[1:])


def _guard(Ys, ymax, bad):
    """Mark (in ``bad``) and replace by ``y`` the stage states that are not finite or wild.

    A too-long step can produce a stage that overflows (and makes, e.g., the L2 field's
    linear solve fail); such a step is rejected (error ``inf``), and the stage is replaced
    by zeros (a harmless state) before it reaches the field. ``ymax`` is ``_WILD`` times
    the largest entry of the step's start.
    """
    # NaN compares False: caught with the overflowing rows
    bad |= ~(np.abs(Ys).max(-1) <= ymax)
    if bad.any():
        Ys[bad] = 0.0
    return Ys


class _DOP853Stepper:
    """Explicit Dormand-Prince 8(5,3) steps: SciPy's coefficients, error norm and rule."""

    err_exp = -1.0 / 8.0     # SciPy's DOP853: error estimator of order 7
    max_factor = 10.0

    def __init__(self, field, d, atol, rtol, nfev):
        self.field, self.d, self.n = field, d, d * d
        self.atol, self.rtol, self.nfev = atol, rtol, nfev

    def compact(self, keep):
        pass

    def accepted(self, rows):
        pass

    def attempt(self, idx, y, f, h, rows=None):
        field, d, n = self.field, self.d, self.n
        m = idx.size
        plan = None if rows is None else field._plan(idx)
        K = np.empty((_NS + 1, m, n))
        K[0] = f
        bad = np.zeros(m, dtype=bool)
        ymax = _WILD * np.abs(y).max(-1)
        hc = h[:, None]
        for s in range(1, _NS):
            Ys = y + _wsum(_A[s, :s], K[:s]) * hc
            K[s] = field(_guard(Ys, ymax, bad).reshape(m, d, d), plan).reshape(m, n)
        y_new = y + hc * _wsum(_B, K[:_NS])
        f_new = field(_guard(y_new.copy(), ymax, bad).reshape(m, d, d), plan).reshape(m, n)
        K[_NS] = f_new
        self.nfev[idx] += _NS
        # Hairer's stiffness indicator h |lambda| from the last stage (c = 1) and y_new
        y_last = y + hc * _wsum(_A[_NS - 1, :_NS - 1], K[:_NS - 1])
        num = np.sum((f_new - K[_NS - 1]) ** 2, -1)
        den = np.sum((y_new - y_last) ** 2, -1)
        self.hlamb = np.where(den > 0, h * np.sqrt(num / np.where(den > 0, den, 1.0)), 0.0)
        sc = self.atol + np.maximum(np.abs(y), np.abs(y_new)) * self.rtol
        err5 = _wsum(_E5, K) / sc
        err3 = _wsum(_E3, K) / sc
        e5, e3 = np.sum(err5 * err5, -1), np.sum(err3 * err3, -1)
        denom = e5 + 0.01 * e3
        err = np.where(denom > 0, h * e5 / np.sqrt(np.where(denom > 0, denom, 1.0) * n), 0.0)
        err[bad] = np.inf
        return y_new, err, _DOP853Step(self, idx, y_new, f_new, K, h)


class _DOP853Step:
    def __init__(self, stepper, idx, y_new, f_new, K, h):
        self.s, self.idx, self.y_new, self.f_new, self.K, self.h = (stepper, idx, y_new,
                                                                   f_new, K, h)

    def rate(self, a):
        return self.f_new[a]

    def dense(self, a, y_old, f_old):
        F = None
        s = self.s

        def interp(sel, x):
            nonlocal F
            if F is None:   # three more evaluations, only when output or an event needs it
                F = _dense_coeffs(s.field, self.idx[a], y_old, self.y_new[a], f_old,
                                  self.f_new[a], self.K[:, a], self.h[a], s.d)
                s.nfev[self.idx[a]] += 3
            return _dense_eval(F[:, sel], y_old[sel], x)

        return interp


# RODAS4 (Hairer and Wanner, Solving ODEs II, section IV.7, and their code rodas.f,
# METH = 1): 6 stages, order 4 with an embedded order-3 estimate, L-stable and stiffly
# accurate, with an order-3 continuous extension. Hairer-Wanner form: with
# W = I/(gamma h) - J,  W U_i = f(y + sum_j a_ij U_j) + sum_j (c_ij/h) U_j,
# y_new = y + sum_j a_6j U_j + U_6 and error estimate U_6.
_RGAMMA = 0.25
_RA = np.zeros((6, 6))
_RA[1, 0] = 1.544
_RA[2, :2] = [0.9466785280815826, 0.2557011698983284]
_RA[3, :3] = [3.314825187068521, 2.896124015972201, 0.9986419139977817]
_RA[4, :4] = [1.221224509226641, 6.019134481288629, 12.53708332932087, -0.6878860361058950]
_RA[5, :5] = [*_RA[4, :4], 1.0]           # stage 6 is evaluated at stage 5 + U_5
_RB = np.array([*_RA[5, :5], 1.0])       # y_new = stage 6 + U_6 (stiffly accurate)
_RC = np.zeros((6, 6))
_RC[1, 0] = -5.6688
_RC[2, :2] = [-2.430093356833875, -0.2063599157091915]
_RC[3, :3] = [-0.1073529058151375, -9.594562251023355, -20.47028614809616]
_RC[4, :4] = [7.496443313967647, -10.24680431464352, -33.99990352819905, 11.70890893206160]
_RC[5, :5] = [8.083246795921522, -7.981132988064893, -31.52159432874371, 16.31930543123136,
              -6.058818238834054]
# continuous extension: y(s) = (1-s) y0 + s (y1 + (1-s) (H_1 U + s H_2 U))
_RH = np.array([[10.12623508344586, -7.487995877610167, -34.80091861555747,
                 -7.992771707568823, 1.025137723295662, 0.0],
                [-0.6762803392801253, 6.087714651680015, 16.43084320892478,
                 24.76722511418386, -6.594389125716872, 0.0]])
#: central-difference Jacobian: relative perturbation and its floor relative to max |L|
_FD_EPS3 = np.finfo(float).eps ** (1.0 / 3.0)
_FD_FLOOR = 1e-3
#: generated modules whose factor_rhs is analytic in L (complex-step Jacobian)
_HOLOMORPHIC = ("softmax", "l2")
#: a stage state this many times larger than the step's start is rejected outright
_WILD = 1e6


def _batched_inv(W):
    """Inverses of a stack (LAPACK LU, ``gesv`` with identity); NaN where singular."""
    try:
        return np.linalg.inv(W)
    except np.linalg.LinAlgError:
        out = np.full_like(W, np.nan)
        for r in range(W.shape[0]):
            try:
                out[r] = np.linalg.inv(W[r])
            except np.linalg.LinAlgError:
                pass
        return out


def _head_jacobian(kind, Q, K, V, s, L):
    r"""Jacobian of one softmax or L2 head's ``L' = M(\Sigma) L`` at stacked ``L``.

    Both fields have :math:`dM[d\Sigma] = A\,d\Sigma\,C`: softmax
    :math:`M = sV\Sigma K^TQ`, :math:`A = sV`, :math:`C = K^TQ`; L2
    :math:`M = 2sVX^{-1}\Sigma K^TQ`, :math:`X = 2s\Sigma K^TK + I`,
    :math:`A = 2sVX^{-1}`, :math:`C = K^TQ - 2sK^TKX^{-1}\Sigma K^TQ`. With
    :math:`d\Sigma = EL^T + LE^T` and :math:`B = CL`,
    :math:`dF[E] = ME + AEL^TB + ALE^TB`, so for :math:`E = e_ae_b^T`
    :math:`J_{ij,ab} = M_{ia}\delta_{jb} + A_{ia}(L^TB)_{bj} + (AL)_{ib}B_{aj}`.
    """
    r, d = L.shape[0], L.shape[-1]
    Lt = np.swapaxes(L, -1, -2)
    Kt = np.swapaxes(K, -1, -2)
    KtQ = Kt @ Q
    S = L @ Lt
    if kind == "softmax":
        A = np.broadcast_to(s * V, (r, d, d))
        C = KtQ
        M = A @ S @ KtQ
    else:
        X = (2 * s) * (S @ (Kt @ K)) + np.eye(d)
        Xi = np.linalg.inv(X)
        P = Xi @ (S @ KtQ)
        A = (2 * s) * (V @ Xi)
        M = (2 * s) * (V @ P)
        C = KtQ - (2 * s) * ((Kt @ K) @ P)
    B = C @ L
    J = np.empty((r, d, d, d, d))
    J[...] = np.einsum("ria,rbj->rijab", A, Lt @ B)
    J += np.einsum("rib,raj->rijab", A @ L, B)
    J += np.einsum("ria,jb->rijab", M, np.eye(d))
    return J.reshape(r, d * d, d * d)


def _analytic_jacobian(field, idx, L):
    """Jacobian of the field at rows ``idx`` (all heads softmax or L2), ``(r, n, n)``."""
    r, d = L.shape[0], L.shape[-1]
    out = None
    for rows, params in field._plan(idx):
        Lr = L if rows is None else L[rows]
        Jg = None
        for gen, Q, K, V, s, _ in params:
            term = _head_jacobian(gen.__name__.rsplit(".", 1)[-1], Q, K, V, s, Lr)
            Jg = term if Jg is None else Jg + term
        if rows is None:
            return Jg
        if out is None:
            out = np.empty((r, d * d, d * d))
        out[rows] = Jg
    return out


class _RosenbrockStepper:
    """Linearly implicit RODAS4 steps with a finite-difference Jacobian per trajectory."""

    err_exp = -1.0 / 4.0     # error estimator of order 3
    max_factor = 6.0         # rodas.f's FACR = 1/6

    def __init__(self, field, d, atol, rtol, nfev):
        self.field, self.d, self.n = field, d, d * d
        self.atol, self.rtol, self.nfev = atol, rtol, nfev
        self.J = None
        self.fresh = None      # J is the Jacobian at the row's current state
        self.n_active = None
        self.njev = 0
        #: how ``jacobian`` differentiates: "analytic" (softmax and L2 heads only),
        #: "complex" (complex step) or "central" (central differences)
        self.jac_mode = "analytic" if field.analytic_jacobian else "central"

    def compact(self, keep):
        if self.J is not None:
            self.J, self.fresh = self.J[keep], self.fresh[keep]

    def accepted(self, rows):
        if self.fresh is not None:
            self.fresh[rows] = False

    def jacobian(self, idx, y, f):
        r"""Jacobian of ``L'`` by differences: all perturbed states of all rows in ONE call.

        For softmax and L2 (polynomial and rational in ``L``, so analytic) the complex step
        :math:`J e_j = \operatorname{Im} f(y + i\delta e_j)/\delta`, ``d^2`` states per
        row, exact to rounding (no cancellation; Squire and Trapp 1998). Otherwise (Sinkhorn:
        eigendecompositions) central differences
        :math:`(f(y + \delta_j e_j) - f(y - \delta_j e_j))/(2\delta_j)`, ``2 d^2`` states,
        :math:`\delta_j = \varepsilon^{1/3}\max(|y_j|, 10^{-3}\max_k|y_k|)`, relative
        error near :math:`\varepsilon^{2/3}`. Accuracy matters here: near a continuum of
        equilibria ``J`` has (near) zero eigenvalues, and with the long steps a stiff
        solver takes, ``1/(gamma h)`` is small, so an error in ``J`` of that size spoils
        ``(I/(gamma h) - J)^{-1}``; with forward differences (error near
        :math:`\sqrt\varepsilon`) RODAS4 took several times more steps on the paper's
        workload.
        """
        r, n, d = y.shape[0], self.n, self.d
        if self.jac_mode == "analytic":
            self.nfev[idx] += 1
            return _analytic_jacobian(self.field, idx, y.reshape(r, d, d))
        j = np.arange(n)
        scale = np.max(np.abs(y), axis=1, keepdims=True) + 1e-150
        if self.jac_mode == "complex":
            delta = 1e-30 * scale
            Y = np.repeat(y[:, None, :].astype(complex), n, axis=1)   # row j: y + i delta e_j
            Y[:, j, j] += 1j * delta
            F = self.field.at_stack(idx, Y.reshape(r, n, d, d)).reshape(r, n, n)
            self.nfev[idx] += n
            return np.swapaxes(F.imag / delta[:, :, None], 1, 2)
        delta = _FD_EPS3 * np.maximum(np.abs(y), _FD_FLOOR * scale)
        Y = np.repeat(y[:, None, :], 2 * n, axis=1)   # rows j, n + j: y +- delta_j e_j
        Y[:, j, j] += delta
        Y[:, n + j, j] -= delta
        step = Y[:, j, j] - Y[:, n + j, j]            # the perturbations actually made
        F = self.field.at_stack(idx, Y.reshape(r, 2 * n, d, d)).reshape(r, 2 * n, n)
        self.nfev[idx] += 2 * n
        return np.swapaxes((F[:, :n] - F[:, n:]) / step[:, :, None], 1, 2)

    def attempt(self, idx, y, f, h, rows=None):
        """One RODAS4 step for trajectories ``idx``, rows ``rows`` of the active stack."""
        field, d, n = self.field, self.d, self.n
        m = idx.size
        if self.J is None:
            self.J = np.empty((m if rows is None else self.n_active, n, n))
            self.fresh = np.zeros(self.J.shape[0], dtype=bool)
        rows = np.arange(m) if rows is None else rows
        plan = field._plan(idx) if m != self.J.shape[0] else None
        stale = np.flatnonzero(~self.fresh[rows])
        if stale.size:  # rows that moved since their last Jacobian (not after a rejection)
            self.J[rows[stale]] = self.jacobian(idx[stale], y[stale], f[stale])
            self.fresh[rows[stale]] = True
        W = np.eye(n) / (_RGAMMA * h)[:, None, None] - self.J[rows]
        Winv = _batched_inv(W)
        U = np.empty((6, m, n))
        U[0] = (Winv @ f[..., None])[..., 0]
        hinv = 1.0 / h[:, None]
        bad = np.zeros(m, dtype=bool)
        ymax = _WILD * np.abs(y).max(-1)
        for s in range(1, 6):
            Ys = _guard(y + _wsum(_RA[s, :s], U[:s]), ymax, bad)
            rhs = (field(Ys.reshape(m, d, d), plan).reshape(m, n)
                   + _wsum(_RC[s, :s], U[:s]) * hinv)
            U[s] = (Winv @ rhs[..., None])[..., 0]
        self.nfev[idx] += 5
        y_new = y + _wsum(_RB, U)
        sc = self.atol + np.maximum(np.abs(y), np.abs(y_new)) * self.rtol
        err = np.where(bad, np.inf, _rms(U[5] / sc))
        return y_new, err, _RosenbrockStep(self, idx, y_new, U)


class _RosenbrockStep:
    def __init__(self, stepper, idx, y_new, U):
        self.s, self.idx, self.y_new, self.U = stepper, idx, y_new, U
        self._f = None

    def rate(self, a):
        s = self.s
        Ln = self.y_new[a].reshape(-1, s.d, s.d)
        s.nfev[self.idx[a]] += 1
        return s.field.at(self.idx[a], Ln).reshape(a.size, s.n)

    def dense(self, a, y_old, f_old):
        Hc = None
        y1 = self.y_new[a]

        def interp(sel, x):
            nonlocal Hc
            if Hc is None:
                Hc = np.tensordot(_RH, self.U[:, a], axes=(1, 0))
            x = x[:, None]
            return (1 - x) * y_old[sel] + x * (y1[sel] + (1 - x) * (Hc[0, sel] + x * Hc[1, sel]))

        return interp


class _MixedStep:
    """The step of an iteration where some rows took DOP853 and others RODAS4 steps."""

    def __init__(self, parts, m):
        self.parts = parts
        self.part = np.empty(m, dtype=int)
        self.pos = np.empty(m, dtype=int)
        for p, (rows, _) in enumerate(parts):
            self.part[rows] = p
            self.pos[rows] = np.arange(rows.size)

    def rate(self, a):
        out = None
        for p, (_, step) in enumerate(self.parts):
            mask = self.part[a] == p
            if mask.any():
                r = step.rate(self.pos[a[mask]])
                if out is None:
                    out = np.empty((a.size, r.shape[1]))
                out[mask] = r
        return out

    def dense(self, a, y_old, f_old):
        subs = []
        for p, (_, step) in enumerate(self.parts):
            mask = self.part[a] == p
            loc = np.cumsum(mask) - 1     # position of a row of ``a`` within its part
            subs.append((loc, step.dense(self.pos[a[mask]], y_old[mask], f_old[mask])
                         if mask.any() else None))

        def interp(sel, x):
            out = np.empty((sel.size, y_old.shape[1]))
            for p, (loc, fn) in enumerate(subs):
                mask = self.part[a[sel]] == p
                if mask.any():
                    out[mask] = fn(loc[sel[mask]], x[mask])
            return out

        return interp


_METHODS = ("auto", "DOP853", "rosenbrock")
#: Hairer's DOP853 stiffness test: h |lambda| above this on _STIFF_STEPS accepted steps
#: (a run of _NONSTIFF_RESET non-stiff steps resets the count) switches a row to RODAS4
_STIFF_HLAMB, _STIFF_STEPS, _NONSTIFF_RESET = 6.1, 15, 6


def solve_batch(attentions_or_weights, cov0s, t_span, *, t_eval=None, rtol=1e-10, atol=1e-12,
                blowup_threshold=1e8, steady_tol=None, steady_atol=0.0, rank_tol=None,
                max_step=np.inf, max_nfev=100_000, method="auto"):
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
        paper's criterion). ``max_nfev`` counts every evaluation of the field, the
        Jacobian's included (a Rosenbrock step costs ``d^2 + 6`` for softmax and L2,
        ``2 d^2 + 6`` otherwise; a DOP853 step 12).
    method : {"auto", "DOP853", "rosenbrock"}
        ``"DOP853"``: explicit Dormand-Prince 8(5,3) steps. ``"rosenbrock"``: the
        L-stable, stiffly accurate linearly implicit RODAS4 (Hairer and Wanner 1996) with
        its embedded order-3 estimate. ``"auto"`` (default): every trajectory starts with
        DOP853 and switches for good to RODAS4 once Hairer's stiffness test
        (:math:`h|\lambda| > 6.1` on 15 accepted steps) finds it stiff, so short and
        non-stiff runs take exactly the DOP853 steps and the stiff tail of a slow
        convergence (K = -Q: the covariance approaches a rank-deficient limit like
        :math:`1/t` while the surviving directions relax fast, and explicit steps are
        stability-limited to about ``0.004 t``) takes steps limited by accuracy only.

    Returns
    -------
    BatchSolution

    Notes
    -----
    A DOP853 step of a trajectory uses SciPy's error norm and step-size rule, so with
    ``method="DOP853"`` (and with ``"auto"`` until a trajectory is found stiff) a batch
    trajectory follows the same steps as ``solve(..., method="DOP853")`` up to rounding.

    A RODAS4 step solves, for :math:`W = I/(\gamma h) - J` (:math:`\gamma = 1/4`),

    .. math::

        W U_i = f\Big(y + \sum_{j<i} a_{ij} U_j\Big) + \sum_{j<i} \frac{c_{ij}}{h} U_j,
        \qquad i = 1, \dots, 6,

    with :math:`y_{n+1} = y + \sum_j a_{6j} U_j + U_6` and error estimate :math:`U_6`
    (coefficients and the order-3 dense output of Hairer's ``rodas.f``; E. Hairer and
    G. Wanner, *Solving Ordinary Differential Equations II*, 2nd ed., Springer 1996,
    section IV.7). :math:`J` is the Jacobian of the factor field at the step's start, by
    complex-step (softmax, L2) or central differences, all perturbed states of all rows in
    one vectorised call of the field; it is recomputed only after an accepted step. The
    :math:`d^2 \times d^2` matrices :math:`W` are LU-inverted once per step for the whole
    stack (:func:`numpy.linalg.inv`) and applied to the six stages as batched mat-vecs. The
    step-size rule is the DOP853 one with exponent :math:`-1/4` and growth at most 6. The
    factor form is kept, so the covariance stays symmetric PSD with its rank.

    The blow-up event is checked at step ends; the blow-up time comes from
    the same extrapolation of :math:`1/\operatorname{tr}\Sigma` as in
    :func:`gaussian_pde.solve`, evaluated at the end of the first step past the threshold.

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> from gaussian_pde.integrate._batch import solve_batch
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
    t_eval = validate_t_eval(t_eval, t0, t1)
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
    if not (isinstance(method, str) and method in _METHODS):
        raise ValueError("`method` must be 'auto', 'DOP853' or 'rosenbrock', "
                         f"got {method!r}.")

    n = d * d
    # outputs
    status = np.full(nb, Status.FINISHED, dtype=object)
    message = ["reached the end of t_span"] * nb
    t_final = np.full(nb, t1)
    L_final = np.empty((nb, d, d))
    t_blowup = np.full(nb, np.nan)
    nfev = np.zeros(nb, dtype=int)
    nsteps = np.zeros(nb, dtype=int)
    stiff_final = np.full(nb, method == "rosenbrock")
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
    # a finite-time estimate (t*, t) awaiting confirmation further up, as in solve
    suspected = [None] * nb
    rejected = np.zeros(nb, dtype=bool)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        f = field(y.reshape(nb, d, d)).reshape(nb, n)
        nfev += 1
        dop = _DOP853Stepper(field, d, atol, rtol, nfev)
        ros = _RosenbrockStepper(field, d, atol, rtol, nfev)
        implicit = np.full(nb, method == "rosenbrock")   # per active row: RODAS4 steps
        switching = method == "auto"
        iasti = np.zeros(nb, dtype=int)
        nonsti = np.zeros(nb, dtype=int)
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
                      (0.01 / np.maximum(np.maximum(d1, d2), 1e-300))
                      ** -np.where(implicit, ros.err_exp, dop.err_exp))
        h_abs = np.minimum.reduce([100 * h0, h1, np.full(nb, t1 - t0), np.full(nb, max_step)])

        while idx.size:
            m = idx.size
            min_step = 10 * np.abs(np.nextafter(t, np.inf) - t)
            h_abs = np.clip(h_abs, min_step, max_step)
            h = np.minimum(h_abs, t1 - t)
            # one attempted step for every active row: DOP853 or RODAS4 by row
            ros.n_active = m
            parts = []
            y_new, err = np.empty_like(y), np.empty(m)
            explicit_rows = np.flatnonzero(~implicit)
            for stepper, rows in ((dop, explicit_rows), (ros, np.flatnonzero(implicit))):
                if rows.size == m:
                    y_new, err, st = stepper.attempt(idx, y, f, h, None if stepper is dop
                                                     else rows)
                elif rows.size:
                    y_new[rows], err[rows], st = stepper.attempt(idx[rows], y[rows], f[rows],
                                                                 h[rows], rows)
                else:
                    continue
                parts.append((rows, st))
            step = parts[0][1] if len(parts) == 1 else _MixedStep(parts, m)
            err_exp = np.where(implicit, ros.err_exp, dop.err_exp)
            max_factor = np.where(implicit, ros.max_factor, dop.max_factor)
            err = np.where(np.isfinite(err), err, np.inf)
            acc = err < 1
            fac = np.where(err == 0, max_factor,
                           np.minimum(max_factor, _SAFETY * np.where(err > 0, err, 1.0) ** err_exp))
            fac_acc = np.where(rejected, np.minimum(1.0, fac), fac)
            fac_rej = np.maximum(_MIN_FACTOR, _SAFETY * np.where(np.isfinite(err) & (err > 0),
                                                                  err, 1e300) ** err_exp)
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
                f_new_a = step.rate(a)
                Ln = y_new[a].reshape(-1, d, d)
                dLn = f_new_a.reshape(-1, d, d)
                nsteps[idx[a]] += 1
                stop_t = np.full(a.size, np.inf)        # located event time within the step
                stop_kind = np.zeros(a.size, dtype=int)  # 1 steady, 2 rank
                interp = step.dense(a, y_old, f_old)

                def locate(sel, gfun):
                    """Bisection for the downward crossing of ``gfun`` within the step."""
                    lo, hi = np.zeros(sel.size), np.ones(sel.size)
                    for _ in range(_BISECT):
                        mid = 0.5 * (lo + hi)
                        ym = interp(sel, mid)
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
                        x = (t_eval[j] - t_old[sel]) / h[a][sel]
                        ys = interp(sel, x)
                        Ls = ys.reshape(-1, d, d)
                        cov_out[idx[a[sel]], j] = Ls @ np.swapaxes(Ls, -1, -2)
                # located events stop the trajectory
                ev = np.flatnonzero(np.isfinite(stop_t))
                if ev.size:
                    x = (stop_t[ev] - t_old[ev]) / h[a][ev]
                    ye = interp(ev, x)
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
                        verdict, detail = _blowup_verdict(tstar[q], finite[q], t_new[r],
                                                          limit[a[r]], suspected[g])
                        if verdict is None:   # follow it further
                            suspected[g], limit[a[r]] = detail
                            continue
                        status[g], message[g] = verdict, detail
                        if verdict == Status.BLOWUP:
                            t_blowup[g] = tstar[q]
                        t_final[g] = t_new[r]
                        L_final[g] = Ln[r]
                        done[a[r]] = True
                # advance the accepted rows that go on
                t[a], y[a], f[a] = t_new, y_new[a], f_new_a
                ros.accepted(a)
                end = ~done[a] & (t_new >= t1)
                if end.any():
                    L_final[idx[a[end]]] = Ln[end]
                    done[a[end]] = True
            if switching and explicit_rows.size:
                # Hairer's stiffness detection on the accepted DOP853 steps
                hl = np.zeros(m)
                hl[explicit_rows] = dop.hlamb
                ok = acc & ~implicit
                stiff_step = ok & (hl > _STIFF_HLAMB)
                iasti = np.where(stiff_step, iasti + 1, iasti)
                nonsti = np.where(stiff_step, 0, np.where(ok, nonsti + 1, nonsti))
                iasti = np.where(nonsti >= _NONSTIFF_RESET, 0, iasti)
                to_implicit = iasti >= _STIFF_STEPS
                if to_implicit.any():
                    implicit = implicit | to_implicit
                    stiff_final[idx[to_implicit]] = True
                    if ros.fresh is not None:
                        ros.fresh[to_implicit] = False
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
                implicit, iasti, nonsti = implicit[keep], iasti[keep], nonsti[keep]
                ros.compact(keep)
                field.set_active(idx)

    cov_final = L_final @ np.swapaxes(L_final, -1, -2)
    return BatchSolution(t=t_eval, cov=cov_out, t_final=t_final, cov_final=cov_final,
                         factor_final=L_final, status=status, t_blowup=t_blowup,
                         message=message, nfev=nfev, nsteps=nsteps, ncalls=field.calls,
                         implicit=stiff_final)
