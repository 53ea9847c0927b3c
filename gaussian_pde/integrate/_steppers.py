r"""Vectorised one-step methods for a stack of trajectories, each with its own step.

A stepper's ``attempt(idx, y, f, h)`` takes one step for every row of the active stack and
returns ``(y_new, err, step)``: ``err`` is the scaled error norm (accept where
``err < 1``), ``step.rate(a)`` is ``L'`` at ``y_new`` of the accepted rows ``a`` and
``step.dense(a, y_old, f_old)`` a callable ``(sel, x) -> states`` at fractions ``x`` of
the step of rows ``a[sel]``. :func:`gaussian_pde.solve_batch` is the loop over them: the
step-size rule, the events and the output are shared by both methods.

* :class:`DOP853Stepper`: the explicit Dormand-Prince 8(5,3) pair with SciPy's
  coefficients, error norm and step-size rule, and Hairer's stiffness test;
* :class:`RosenbrockStepper`: the L-stable, stiffly accurate linearly implicit RODAS4
  (Hairer and Wanner 1996) with its embedded order-3 estimate and the exact Jacobian
  (softmax and L2 heads) or central differences;
* :class:`MixedStep`: an iteration in which some rows took one method and the rest the
  other.
"""

from __future__ import annotations

import numpy as np

from ._differences import column_steps
from ._field import analytic_jacobian
from ._tableaux import DOP853 as _dop
from ._tableaux import RODAS4

__all__ = ["DOP853Stepper", "RosenbrockStepper", "MixedStep", "rms", "SAFETY", "MIN_FACTOR"]

# DOP853 tableau (gaussian_pde.integrate._tableaux: Hairer, Norsett and Wanner; SciPy's values)
_NS = _dop.N_STAGES
_A = _dop.A[:_NS, :_NS]
_B = _dop.B
_E3, _E5 = _dop.E3, _dop.E5
_D = _dop.D
_A_EXTRA = _dop.A[_NS + 1:]
_C_EXTRA = _dop.C[_NS + 1:]
#: step-size rule shared by both methods (SciPy's DOP853 values)
SAFETY, MIN_FACTOR = 0.9, 0.2


def rms(x):
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


def _sq(x):
    """Squared norm of each row: ``einsum`` is about twice as fast as ``sum`` on rows this short."""
    return np.einsum("ij,ij->i", x, x)


def _guard(Ys, ymax, bad):
    """Mark (in ``bad``) and replace by ``y`` the stage states that are not finite or wild.

    A too-long step can produce a stage that overflows (and makes, e.g., the L2 field's
    linear solve fail); such a step is rejected (error ``inf``), and the stage is replaced
    by zeros (a harmless state) before it reaches the field. ``ymax`` is ``_WILD`` times
    the largest entry of the step's start.
    """
    # fast path: two reductions over the whole stack, no temporary, and (rows of 4 to 25
    # entries being short) much cheaper than a reduction per row. NaN compares False.
    floor = ymax.min()
    if Ys.max() <= floor and -Ys.min() <= floor:
        return Ys
    bad |= ~(np.abs(Ys).max(-1) <= ymax)
    if bad.any():
        Ys[bad] = 0.0
    return Ys


class DOP853Stepper:
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
        num = _sq(f_new - K[_NS - 1])
        den = _sq(y_new - y_last)
        self.hlamb = np.where(den > 0, h * np.sqrt(num / np.where(den > 0, den, 1.0)), 0.0)
        sc = self.atol + np.maximum(np.abs(y), np.abs(y_new)) * self.rtol
        err5 = _wsum(_E5, K) / sc
        err3 = _wsum(_E3, K) / sc
        e5, e3 = _sq(err5), _sq(err3)
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


# RODAS4 (gaussian_pde.integrate._tableaux) in the Hairer-Wanner form: with
# W = I/(gamma h) - J,  W U_i = f(y + sum_j a_ij U_j) + sum_j (c_ij/h) U_j,
# y_new = y + sum_j a_6j U_j + U_6 and error estimate U_6.
_RA, _RB, _RC, _RGAMMA, _RH = RODAS4.a, RODAS4.b, RODAS4.c, RODAS4.gamma, RODAS4.h
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



class RosenbrockStepper:
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
        #: how ``jacobian`` differentiates: "analytic" (every head has an exact
        #: Jacobian) or "central" (central differences)
        self.jac_mode = "analytic" if field.analytic_jacobian else "central"

    def compact(self, keep):
        if self.J is not None:
            self.J, self.fresh = self.J[keep], self.fresh[keep]

    def accepted(self, rows):
        if self.fresh is not None:
            self.fresh[rows] = False

    def jacobian(self, idx, y, f):
        r"""Jacobian of ``L'``: exact, or by differences with all states of all rows in ONE call.

        For softmax and L2 heads the closed form of
        :func:`gaussian_pde.integrate._field.analytic_jacobian` (one evaluation), except
        for rows with an L2 head whose factor columns spread past
        :data:`~gaussian_pde.integrate._differences.JACOBIAN_SPREAD_MAX`, where that
        closed form loses its digits. Otherwise (those rows, and Sinkhorn:
        eigendecompositions) central differences
        :math:`(f(y + \delta_{ab} e_{ab}) - f(y - \delta_{ab} e_{ab}))/(2\delta_{ab})`,
        ``2 d^2`` states, with a step per column of ``L``
        (:func:`~gaussian_pde.integrate._differences.column_steps`), relative error near
        :math:`\varepsilon^{2/3}` of each column's scale. Accuracy matters here: near a
        continuum of equilibria ``J`` has (near) zero eigenvalues, and with the long steps
        a stiff solver takes, ``1/(gamma h)`` is small, so an error in ``J`` of that size
        spoils ``(I/(gamma h) - J)^{-1}``; with forward differences (error near
        :math:`\sqrt\varepsilon`) RODAS4 took several times more steps on the paper's
        workload.
        """
        r, d = y.shape[0], self.d
        if self.jac_mode != "analytic":
            return self._central(idx, y)
        if self.field.limited:
            holds = self.field.jacobian_holds(y.reshape(r, d, d))
            if not holds.all():
                J = np.empty((r, self.n, self.n))
                if holds.any():
                    J[holds] = self._closed(idx[holds], y[holds])
                J[~holds] = self._central(idx[~holds], y[~holds])
                return J
        return self._closed(idx, y)

    def _closed(self, idx, y):
        """The closed-form Jacobian at rows ``idx`` (one evaluation each)."""
        r, d = y.shape[0], self.d
        self.nfev[idx] += 1
        return analytic_jacobian(self.field, idx, y.reshape(r, d, d))

    def _central(self, idx, y):
        """Central differences with column-scaled steps, every state in one field call."""
        r, n, d = y.shape[0], self.n, self.d
        j = np.arange(n)
        delta = column_steps(y.reshape(r, d, d)).reshape(r, n)
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
        err = np.where(bad, np.inf, rms(U[5] / sc))
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


class MixedStep:
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
