r"""Certified limit rank: the inverse covariance integrated, its growth rates read off.

For :math:`K = -Q` the covariance converges *algebraically*: the vanishing eigenvalues of
:math:`\Sigma` decay like :math:`1/t` (docs/math.md section 4.1), so a threshold on
:math:`\Sigma(T)` at any finite horizon is a guess. This module integrates the precision
:math:`P = \Sigma^{-1}` instead,

.. math::

    P' = -\big(PM + M^TP\big), \qquad
    M_{\mathrm{softmax}} = V\,\Sigma A, \qquad
    M_{L2} = 2V\,(P + H)^{-1}A, \qquad A = cK^TQ,\; H = 2cK^TK,

(heads add), in which a vanishing direction of :math:`\Sigma` is a *growing* eigenvalue
of :math:`P` (linearly, for decay like :math:`1/t`), integrated with relative error
control, while a surviving direction is a bounded eigenvalue. The rank is decided from
the log-log exponents of the eigenvalues of :math:`\Sigma = P^{-1}` fitted over the last
decades of the horizon, never from a threshold on :math:`\Sigma(T)`:

* exponent :math:`\le -1/2` (decay like :math:`t^{-1}`): a vanishing direction;
* :math:`|\text{exponent}| \le 0.05`: a surviving direction (the fit is ~1e-6 there);
* anything else, or a conserved-quantity drift above ``drift_tol``: ``undecided``.

The integration is done in coordinates :math:`x = U^T x` with
:math:`U = [U_R, U_N]`, :math:`U_N` an orthonormal basis of :math:`\ker Q` (the common
kernel of all heads' :math:`Q`), so that the conserved block :math:`N^TPN` (docs/math.md
4.2) is a block of the state: its drift along the way measures the integration error in
the directions that must survive. Each entry :math:`P_{ij}` is error-controlled relative
to itself (with a floor of :math:`10^{-3}\min_i P_{ii}`), so the bounded blocks keep their
own relative accuracy while :math:`P_{RR}` grows like :math:`t`.

The stepper is the linearly implicit, L-stable RODAS4 of
:mod:`gaussian_pde.integrate._steppers` (the same coefficients) with the exact Jacobian
of the precision field, batched over trajectories of the same dimension and head
structure; steps land on the checkpoints :math:`t = 10^j`.

When :math:`\operatorname{tr}\Sigma` grows past ``1e8`` times its initial value (or
:math:`P` stops being positive definite), the precision form is left, and the package's
covariance solver with its finite-time blow-up verdict (docs/math.md 10.3,
:mod:`gaussian_pde.integrate._events`) decides between ``blowup`` and ``grows``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._common.linalg import psd_sqrt
from .._common.validation import validate_covariance, validate_positive, validate_tolerance
from ..attention._base import Attention
from ..attention._l2 import L2
from ..attention._multihead import MultiHead
from ..attention._softmax import Softmax
from ..integrate._steppers import _RA, _RB, _RC, _RGAMMA

__all__ = ["CertifiedLimit", "certified_limit", "certified_limits", "exact_precision_softmax"]

#: exponent of a vanishing eigenvalue of Sigma is at most this (1/t decay gives -1;
#: for V != I the R-N coupling decays with other powers, seen down to about -0.45)
VANISH = -0.25
#: a surviving eigenvalue has a fitted exponent of at most this in absolute value
SETTLED = 0.05
#: trace growth (relative to the initial trace) that hands over to the blow-up verdict
GROWTH = 1e8
_MAX_STEPS = 3_000


@dataclasses.dataclass(frozen=True)
class CertifiedLimit:
    r"""Result of :func:`certified_limit`.

    Attributes
    ----------
    outcome : str
        ``"rank"`` (a limit of rank ``rank`` :math:`\ge 1`), ``"zero"``, ``"blowup"``,
        ``"grows"`` or ``"undecided"``.
    rank : int or None
        Rank of the limit (0 for ``"zero"``); ``None`` otherwise.
    bound : int
        The lower bound :math:`d - \operatorname{rank}Q` of docs/math.md 4.2.
    exponents : ndarray, shape (d,)
        Fitted log-log exponents :math:`\gamma_i` of the eigenvalues of :math:`\Sigma`
        (ascending eigenvalues of :math:`\Sigma(T)`), :math:`\lambda_i \propto t^{\gamma_i}`
        over the last ``fit_decades`` decades; NaN if not reached.
    decay_rates : ndarray
        The exponents of the vanishing eigenvalues (about -1 for :math:`1/t` decay).
    conserved_drift : float
        :math:`\max_t \lVert N^TP(t)N - N^TP_0N\rVert_F / \lVert N^TP_0N\rVert_F` over the
        checkpoints (0 when :math:`\ker Q = 0`).
    lyapunov_increase : float or None
        For one head with :math:`K = -Q` and :math:`V` symmetric positive definite: the
        largest relative increase of :math:`\operatorname{tr}(V^{-1}\Sigma)` between
        checkpoints (it is non-increasing in exact arithmetic, docs/math.md 4.5);
        ``None`` otherwise.
    t_final : float
        Last time reached by the precision integration.
    t_blowup : float or None
        Blow-up time (``"blowup"``).
    limit : ndarray, shape (d, d), or None
        :math:`\Sigma(T)` with its vanishing eigen-directions removed (``"rank"``).
    eigenvalues : ndarray, shape (d,)
        Eigenvalues of :math:`\Sigma(T)`, ascending.
    steps : int
        Accepted steps of the precision integration.
    message : str
        The evidence in words, or why the outcome is undecided.
    """

    outcome: str
    rank: int | None
    bound: int
    exponents: np.ndarray
    decay_rates: np.ndarray
    conserved_drift: float
    lyapunov_increase: float | None
    t_final: float
    t_blowup: float | None
    limit: np.ndarray | None
    eigenvalues: np.ndarray
    steps: int
    message: str


# ----------------------------------------------------------------------------------------
# heads and coordinates
# ----------------------------------------------------------------------------------------

def _check_definite(cov, name):
    """``cov`` itself if it is positive definite (``Sigma^-1`` is integrated), else ``ValueError``."""
    w = np.linalg.eigvalsh(cov)
    if not w[0] > 1e-12 * max(w[-1], 0.0):
        raise ValueError(f"`{name}` must be positive definite (the precision Sigma^-1 is "
                         f"integrated); its eigenvalues span [{w[0]:.3g}, {w[-1]:.3g}].")
    return cov


def _heads(att, name="attention"):
    """``[(kind, Q, K, V, scale)]`` for softmax / L2 heads; ``TypeError`` otherwise."""
    if not isinstance(att, Attention):
        raise TypeError(f"`{name}` must be an attention type, got {type(att).__name__}.")
    heads = att.heads if isinstance(att, MultiHead) else [att]
    out = []
    for h in heads:
        if isinstance(h, L2):
            kind = "l2"
        elif isinstance(h, Softmax):
            kind = "softmax"
        else:
            raise TypeError(
                f"`{name}`: certified_limit supports softmax and L2 heads (and their sums), "
                f"for which N^T Sigma^-1 N is conserved; got {type(h).__name__}.")
        out.append((kind, np.asarray(h.Q, float), np.asarray(h.K, float),
                    np.asarray(h.V, float), float(h.scale)))
    return out


def _frame(heads, d):
    """Orthonormal ``U = [U_R, U_N]`` with ``U_N`` spanning the common kernel of the Q's."""
    Qall = np.concatenate([h[1] for h in heads], axis=0)
    _, s, Vt = np.linalg.svd(Qall, full_matrices=True)
    tol = max(Qall.shape) * np.finfo(float).eps * (s[0] if s.size else 0.0)
    r = int(np.sum(s > tol))
    return Vt.T.copy(), r


def _lyapunov_matrix(heads):
    """``V^{-1}`` for one head with K = -Q and V SPD, else ``None``."""
    if len(heads) != 1:
        return None
    _, Q, K, V, _ = heads[0]
    if not np.allclose(K, -Q, rtol=0, atol=1e-14 * max(1.0, np.abs(Q).max())):
        return None
    if not np.allclose(V, V.T, rtol=0, atol=1e-13 * max(1.0, np.abs(V).max())):
        return None
    w = np.linalg.eigvalsh(0.5 * (V + V.T))
    if w[0] <= 1e-12 * w[-1]:
        return None
    return np.linalg.inv(0.5 * (V + V.T))


# ----------------------------------------------------------------------------------------
# the precision field, batched: P has shape (r, ..., d, d); parameters (r, 1.., d, d)
# ----------------------------------------------------------------------------------------

def _block_inv(Y, k):
    r"""Inverse of SPD ``Y`` (..., d, d) by the Schur complement of its trailing block.

    With ``R`` the first ``k`` coordinates and ``N`` the rest,
    :math:`S = Y_{RR} - Y_{RN}Y_{NN}^{-1}Y_{NR}`,
    :math:`(Y^{-1})_{RR} = S^{-1}`, :math:`(Y^{-1})_{NR} = -Y_{NN}^{-1}Y_{NR}S^{-1}` and
    :math:`(Y^{-1})_{NN} = Y_{NN}^{-1} + Y_{NN}^{-1}Y_{NR}S^{-1}Y_{RN}Y_{NN}^{-1}`.
    Where :math:`Y_{RR}` grows like :math:`t`, a plain LU inverse loses
    :math:`\operatorname{cond}(Y)\sim t` digits in every entry, and the entries of
    :math:`(Y^{-1})_{:R}`, of size :math:`1/t`, are lost completely at :math:`t\sim 10^8`;
    the block form keeps each block to its own relative accuracy.
    """
    d = Y.shape[-1]
    if k == 0 or k == d:
        return np.linalg.inv(Y)
    YRR, YRN = Y[..., :k, :k], Y[..., :k, k:]
    YNR, YNN = Y[..., k:, :k], Y[..., k:, k:]
    iNN = np.linalg.inv(YNN)
    B = iNN @ YNR                                   # Y_NN^-1 Y_NR
    Si = np.linalg.inv(YRR - YRN @ B)
    XNR = -B @ Si
    XRN = np.swapaxes(XNR, -1, -2)
    XNN = iNN - XNR @ np.swapaxes(B, -1, -2)
    top = np.concatenate([Si, XRN], axis=-1)
    bot = np.concatenate([XNR, XNN], axis=-1)
    return np.concatenate([top, bot], axis=-2)


class _PrecisionField:
    r"""Batched :math:`F(P) = -(PM + M^TP)` and its exact Jacobian (rows of one structure).

    ``k``: the rows' common :math:`\operatorname{rank}Q` (the first ``k`` coordinates
    span :math:`\operatorname{range}Q^T`).
    """

    def __init__(self, kinds, A, V, H, k):
        # A, V, H: (n_rows, n_heads, d, d); H only used for L2 heads
        self.kinds, self.A, self.V, self.H, self.k = kinds, A, V, H, k

    def take(self, rows):
        return _PrecisionField(self.kinds, self.A[rows], self.V[rows], self.H[rows], self.k)

    def _parts(self, P, extra):
        """Per head: the inverse ``X`` (Sigma or (P + H)^-1) and the factors of M = c V X A."""
        out = []
        for j, kind in enumerate(self.kinds):
            sl = (slice(None), j) + (None,) * extra
            A, V = self.A[sl], self.V[sl]
            if kind == "softmax":
                X = _block_inv(P, self.k)
                out.append((V, X, A))
            else:
                X = _block_inv(P + self.H[sl], self.k)
                out.append((2.0 * V, X, A))
        return out

    def __call__(self, P, extra=0):
        G = 0.0
        for V, X, A in self._parts(P, extra):
            G = G + P @ (V @ X @ A)
        return -(G + np.swapaxes(G, -1, -2))

    def jacobian(self, P):
        r"""``J[r, :, j]``: the derivative of ``vec F`` along ``vec E_j`` (exact)."""
        r, d = P.shape[0], P.shape[-1]
        n = d * d
        E = np.eye(n).reshape(n, d, d)[None]                 # (1, n, d, d)
        Pb = P[:, None]
        G = 0.0
        for V, X, A in self._parts(Pb, 1):
            # dX = -X E X (for Sigma = P^-1 and for (P + H)^-1 alike)
            dX = -(X @ E @ X)
            G = G + E @ (V @ X @ A) + Pb @ (V @ dX @ A)
        dF = -(G + np.swapaxes(G, -1, -2))                    # (r, n, d, d)
        return np.swapaxes(dF.reshape(r, n, n), 1, 2)


def _build(attentions, d):
    heads0 = _heads(attentions[0])
    kinds = tuple(h[0] for h in heads0)
    nr, nh = len(attentions), len(kinds)
    A = np.empty((nr, nh, d, d))
    V = np.empty((nr, nh, d, d))
    H = np.zeros((nr, nh, d, d))
    U = np.empty((nr, d, d))
    rq = np.empty(nr, dtype=int)
    lyap = []
    for i, att in enumerate(attentions):
        heads = _heads(att)
        U[i], rq[i] = _frame(heads, d)
        u = U[i]
        for j, (kind, Q, K, Vh, c) in enumerate(heads):
            A[i, j] = u.T @ (c * K.T @ Q) @ u
            V[i, j] = u.T @ Vh @ u
            if kind == "l2":
                H[i, j] = u.T @ (2.0 * c * K.T @ K) @ u
        W = _lyapunov_matrix(heads)
        lyap.append(None if W is None else u.T @ W @ u)
    return _PrecisionField(kinds, A, V, H, int(rq[0])), U, rq, lyap


# ----------------------------------------------------------------------------------------
# the batched RODAS4 loop in t, landing on checkpoints
# ----------------------------------------------------------------------------------------

def _spd(P):
    """Rows whose (symmetrised) P is positive definite."""
    w = np.linalg.eigvalsh(0.5 * (P + np.swapaxes(P, -1, -2)))
    return np.all(np.isfinite(w), -1) & (w[:, 0] > 0)


def _integrate(field, P0, checkpoints, rtol, atol):
    """RODAS4 on ``P' = F(P)``; returns P at every checkpoint (NaN where not reached)."""
    nb, d = P0.shape[0], P0.shape[-1]
    n = d * d
    nck = checkpoints.shape[1]
    rec = np.full((nb, nck, d, d), np.nan)
    steps = np.zeros(nb, dtype=int)
    stop = np.array([""] * nb, dtype=object)
    t_last = np.zeros(nb)
    idx = np.arange(nb)
    y = P0.reshape(nb, n).copy()
    t = np.zeros(nb)
    ck = np.zeros(nb, dtype=int)
    rec[:, 0] = P0          # checkpoints[:, 0] is t = 0
    ck[:] = 1
    f0 = field(P0)
    h = 1e-3 * np.linalg.norm(P0, axis=(1, 2)) / (np.linalg.norm(f0, axis=(1, 2)) + 1e-300)
    h = np.minimum(h, checkpoints[np.arange(nb), ck])
    fld = field
    tr0 = np.trace(np.linalg.inv(P0), axis1=1, axis2=2)
    eye = np.eye(n)
    while idx.size:
        m = idx.size
        target = checkpoints[idx, ck[idx]]
        hh = np.minimum(h, target - t)
        land = hh >= target - t
        P = y.reshape(m, d, d)
        J = fld.jacobian(P)
        # equilibrated: with the entries' scales s_i = sqrt(P_ii P_jj), invert
        # S^-1 W S (W = I/(gamma h) - J); J's entries span the ratio of the growing to the
        # bounded block, and an unscaled inverse loses that many digits in every stage
        dg0 = np.abs(np.diagonal(P, axis1=1, axis2=2))
        s_e = np.sqrt(dg0[:, :, None] * dg0[:, None, :]).reshape(m, n)
        Wt = (eye / (_RGAMMA * hh)[:, None, None] - J) * (s_e[:, None, :] / s_e[:, :, None])
        Winv = np.linalg.inv(Wt)

        def solve(r, s_e=s_e, Winv=Winv):
            return s_e * (Winv @ (r / s_e)[..., None])[..., 0]

        U = np.empty((6, m, n))
        U[0] = solve(fld(P).reshape(m, n))
        hinv = 1.0 / hh[:, None]
        bad = np.zeros(m, dtype=bool)
        for s in range(1, 6):
            Ys = y + np.tensordot(_RA[s, :s], U[:s], axes=(0, 0))
            bad |= ~_spd(Ys.reshape(m, d, d))     # a stage leaving the SPD cone: reject
            with np.errstate(all="ignore"):
                rhs = (fld(Ys.reshape(m, d, d)).reshape(m, n)
                       + np.tensordot(_RC[s, :s], U[:s], axes=(0, 0)) * hinv)
            U[s] = solve(rhs)
        y_new = y + np.tensordot(_RB, U, axes=(0, 0))
        Pn = y_new.reshape(m, d, d)
        bad |= ~_spd(Pn)
        # error scale of entry (i, j): relative to |P_ij| itself, with a floor of 1e-3 of
        # the smallest diagonal entry (a scale like sqrt(P_ii P_jj) lets the R-N block,
        # which settles to O(1) while P_RR grows like t, drift by rtol sqrt(t))
        floor = 1e-3 * np.min(np.abs(np.diagonal(P, axis1=1, axis2=2)), axis=1)
        sc = atol + rtol * np.maximum(np.maximum(np.abs(y), np.abs(y_new)), floor[:, None])
        with np.errstate(all="ignore"):
            err = np.sqrt(np.mean((U[5] / sc) ** 2, axis=1))
        err = np.where(bad | ~np.isfinite(err), np.inf, err)
        acc = err <= 1.0
        with np.errstate(divide="ignore"):
            fac = np.clip(0.9 * err ** -0.25, 0.2, 6.0)
        fac = np.where(err == 0, 6.0, np.where(np.isfinite(err), fac, 0.2))
        h_new = hh * fac
        # accepted rows move on
        a = np.flatnonzero(acc)
        t[a] += hh[a]
        y[a] = y_new[a]
        steps[idx[a]] += 1
        hit = a[land[a]]
        t[hit] = target[hit]
        rec[idx[hit], ck[idx[hit]]] = y[hit].reshape(-1, d, d)
        ck[idx[hit]] += 1
        h = np.where(acc, np.maximum(h_new, np.where(land, h, 0.0)), h_new)
        done = np.zeros(m, dtype=bool)
        done[hit] |= ck[idx[hit]] >= nck
        # growth of Sigma: hand over to the covariance solver's blow-up verdict
        if a.size:
            tr = np.trace(_block_inv(y[a].reshape(-1, d, d), field.k), axis1=1, axis2=2)
            grown = a[~(tr <= GROWTH * tr0[idx[a]])]
            stop[idx[grown]] = "growth"
            done[grown] = True
        tiny = h < 1e-13 * np.maximum(t, 1e-300) + 1e-300
        stop[idx[tiny & ~done]] = "step"
        many = steps[idx] >= _MAX_STEPS
        stop[idx[many & ~done]] = "steps"
        done |= tiny | many
        t_last[idx] = t
        keep = ~done
        idx, y, t, h = idx[keep], y[keep], t[keep], h[keep]
        fld = fld.take(keep) if not keep.all() else fld
    return rec, steps, stop, t_last


# ----------------------------------------------------------------------------------------
# the decision
# ----------------------------------------------------------------------------------------

def _fit(ts, lam):
    """Least-squares slope of log(lam) on log(t); lam of shape (k, d)."""
    x = np.log(ts)
    x = x - x.mean()
    yv = np.log(lam)
    return (x[:, None] * (yv - yv.mean(0))).sum(0) / (x ** 2).sum()


def _decide(rec, ck_t, step_count, stop, t_last, U, rq, lyap, fit_decades, drift_tol):
    d = rec.shape[-1]
    bound = d - int(rq)
    ok = np.all(np.isfinite(rec), axis=(1, 2))
    nan = np.full(d, np.nan)
    if not ok[-1] or stop:
        return dict(outcome="undecided", rank=None, bound=bound, exponents=nan,
                    decay_rates=np.empty(0), conserved_drift=np.nan, lyapunov_increase=None,
                    t_final=float(t_last), t_blowup=None, limit=None, eigenvalues=nan,
                    steps=int(step_count), message=f"precision integration stopped ({stop})")
    Ps = 0.5 * (rec + np.swapaxes(rec, -1, -2))
    Ss = _block_inv(Ps, int(rq))
    Ss = 0.5 * (Ss + np.swapaxes(Ss, -1, -2))
    lam, vec = np.linalg.eigh(Ss[-1])
    # eigenvalues at every fitted checkpoint, matched by order (ascending)
    T = ck_t[-1]
    sel = np.flatnonzero(ck_t >= T / 10 ** fit_decades)
    lam_k = np.linalg.eigvalsh(Ss[sel])
    if np.any(lam_k <= 0):
        expo = nan
    else:
        expo = _fit(ck_t[sel], lam_k)
    k = rq
    if k < d:
        C = Ps[:, k:, k:]
        drift = float(np.max(np.linalg.norm(C - C[0], axis=(1, 2)))
                      / np.linalg.norm(C[0]))
    else:
        drift = 0.0
    lyap_inc = None
    if lyap is not None:
        f = np.einsum("ij,kji->k", lyap, Ss)
        lyap_inc = float(max(0.0, np.max((f[1:] - f[:-1]) / f[:-1])))
    # the d - k largest eigenvalues of Sigma survive: by interlacing with the conserved
    # compression C = N^T P N, lambda_i(P) <= lambda_i(C) for the d - k smallest
    # eigenvalues of P, so those of Sigma stay above 1 / lambda_max(C) (docs/math.md 4.5)
    k_top = d - k
    floor = (1.0 / float(np.max(np.linalg.eigvalsh(Ps[:, k:, k:])))) if k_top else np.inf
    kept = np.zeros(d, dtype=bool)
    kept[k:] = True                                   # ascending: the top d - k
    # a vanishing one decays like a power; a slower decay (exponent below -SETTLED) counts
    # when the eigenvalue is already 1e-3 of the floor that the surviving ones obey
    vanish = ~kept & ((expo <= VANISH) | ((expo < -SETTLED) & (lam < 1e-3 * floor)))
    settled = kept | (np.abs(expo) <= SETTLED)
    base = dict(bound=bound, exponents=expo, decay_rates=expo[vanish], conserved_drift=drift,
                lyapunov_increase=lyap_inc, t_final=float(T), t_blowup=None,
                eigenvalues=lam, steps=int(step_count))
    expo_s = ", ".join(f"{e:.4f}" for e in expo)
    if np.any(~np.isfinite(expo)):
        return dict(base, outcome="undecided", rank=None, limit=None,
                    message="an eigenvalue of Sigma is not positive at a fitted checkpoint")
    if drift > drift_tol:
        return dict(base, outcome="undecided", rank=None, limit=None,
                    message=f"conserved N^T Sigma^-1 N drifted by {drift:.2e} > {drift_tol:g}")
    if np.any(expo[kept] > SETTLED):
        return dict(base, outcome="undecided", rank=None, limit=None,
                    message=f"eigenvalue exponents [{expo_s}]: a surviving one still grows")
    if not np.all(vanish | settled):
        return dict(base, outcome="undecided", rank=None, limit=None,
                    message=f"eigenvalue exponents [{expo_s}]: one of the {k} smallest neither "
                            f"decays (<= {VANISH}) nor settles (|.| <= {SETTLED})")
    if k_top and np.min(lam[kept]) < floor * (1.0 - 1e-6):
        return dict(base, outcome="undecided", rank=None, limit=None,
                    message="interlacing bound violated: inaccurate integration")
    r = int(settled.sum())
    keepv = vec[:, settled]
    limit_rot = keepv @ np.diag(lam[settled]) @ keepv.T
    limit = U @ limit_rot @ U.T
    msg = (f"{int(vanish.sum())} eigenvalues of Sigma decay (exponents "
           f"{', '.join(f'{e:.4f}' for e in expo[vanish]) or '-'}), {r} settle; "
           f"conserved drift {drift:.1e}")
    return dict(base, outcome="zero" if r == 0 else "rank", rank=r,
                limit=np.zeros((d, d)) if r == 0 else limit, message=msg)


def _blowup_verdict(att, cov0, t_max):
    """The package's covariance solver and its finite-time blow-up verdict."""
    from ..integrate._solve import solve

    sol = solve(att, None, cov0, (0.0, t_max))
    st = str(sol.status)
    if st == "blowup":
        return "blowup", float(sol.t_blowup), f"blow-up confirmed at t* = {sol.t_blowup:.6g}"
    if st == "failed" and "grows" in sol.message.lower():
        return "grows", None, sol.message
    return "undecided", None, f"covariance solver after precision growth: {st}: {sol.message}"


def certified_limits(attentions, cov0s, *, t_max=1e6, rtol=1e-6, fit_decades=2.0,
                     drift_tol=1e-2):
    r"""Certified limits of many trajectories (batched by dimension and head structure).

    Parameters
    ----------
    attentions : Attention or sequence of Attention
        Softmax or L2 heads, or :class:`~gaussian_pde.MultiHead` sums of them; one
        attention applies to every covariance.
    cov0s : sequence of array_like, each (d, d)
        Initial covariances, positive definite (dimensions may differ between rows).
    t_max : float
        Horizon in units of the setting's own time scale
        :math:`t_s = \max(1, \lVert P_0\rVert_F/\lVert P'(0)\rVert_F)` (the time in which
        :math:`P` changes by its own size); the checkpoints are :math:`t = 0` and
        :math:`t = t_s10^j`, :math:`10^{-2} \le 10^j \le` ``t_max``.
    rtol : float
        Relative tolerance on each entry :math:`P_{ij}`.
    fit_decades : float
        The exponents are fitted over the last ``fit_decades`` decades of checkpoints.
    drift_tol : float
        Largest relative drift of :math:`N^TPN` accepted. The floor that the surviving
        eigenvalues obey is :math:`1/\max_t\lambda_{\max}(N^TP(t)N)` over the computed
        checkpoints, so a drift :math:`\delta` moves it by a factor of at most
        :math:`1 + \delta`; 1e-2 leaves the decision unchanged.

    Returns
    -------
    list of CertifiedLimit
    """
    if isinstance(cov0s, np.ndarray) and cov0s.ndim == 3:
        cov0s = list(cov0s)
    if isinstance(cov0s, (str, bytes)) or not hasattr(cov0s, "__len__"):
        raise TypeError(f"`cov0s` must be a sequence of (d, d) covariances, got "
                        f"{type(cov0s).__name__}.")
    if len(cov0s) == 0:
        raise ValueError("`cov0s` must hold at least one covariance.")
    if isinstance(attentions, Attention):      # one attention for every covariance
        attentions = [attentions] * len(cov0s)
    if isinstance(attentions, (str, bytes, np.ndarray)) or not hasattr(attentions, "__len__"):
        raise TypeError("`attentions` must be an attention type or a sequence of them, got "
                        f"{type(attentions).__name__}.")
    attentions = list(attentions)
    if len(cov0s) != len(attentions):
        raise ValueError(f"`cov0s` must hold one covariance per entry of `attentions`: got "
                         f"{len(cov0s)} for {len(attentions)}.")
    cov0s = [validate_covariance(c, f"cov0s[{i}]") for i, c in enumerate(cov0s)]
    for i, c in enumerate(cov0s):
        _check_definite(c, f"cov0s[{i}]")
    for i, (att, c) in enumerate(zip(attentions, cov0s)):
        _heads(att, f"attentions[{i}]")
        if att.d != c.shape[-1]:
            raise ValueError(f"`cov0s[{i}]` is {c.shape[-1]}-dimensional but `attentions[{i}]` "
                             f"acts in d = {att.d}.")
    t_max = validate_positive(t_max, "t_max")
    if not 1.0 <= t_max <= 1e12:
        raise ValueError(f"`t_max` must lie in [1, 1e12] (units of the setting's time "
                         f"scale), got {t_max:g}.")
    rtol = validate_tolerance(rtol, "rtol")
    if rtol < 1e-13:
        raise ValueError(f"`rtol` must be at least 1e-13 (rounding bounds what each entry of "
                         f"Sigma^-1 can resolve), got {rtol:g}.")
    fit_decades = validate_positive(fit_decades, "fit_decades")
    drift_tol = validate_positive(drift_tol, "drift_tol")
    jmax = int(np.floor(np.log10(t_max) + 1e-12))
    base = np.array([0.0] + [10.0 ** j for j in range(-2, jmax + 1)])
    if base[-1] < t_max:
        base = np.append(base, t_max)
    groups = {}
    for i, att in enumerate(attentions):
        heads = _heads(att)
        d = cov0s[i].shape[-1]
        key = (d, tuple(h[0] for h in heads), _frame(heads, d)[1])
        groups.setdefault(key, []).append(i)
    out = [None] * len(attentions)
    for (d, _, _), rows in groups.items():
        atts = [attentions[i] for i in rows]
        field, U, rq, lyap = _build(atts, d)
        S0 = np.einsum("rji,rjk,rkl->ril", U, np.array([cov0s[i] for i in rows]), U)
        if np.any(np.linalg.eigvalsh(S0)[:, 0] <= 0):
            raise ValueError("certified_limit needs positive definite initial covariances.")
        P0 = np.linalg.inv(S0)
        P0 = 0.5 * (P0 + np.swapaxes(P0, -1, -2))
        # the setting's own time scale: P changes by O(P) in |P0| / |P'(0)| (for V = I,
        # K = -Q: |Sigma_0^-1| / |2c Q^T Q|, where the 1/t decay starts); the checkpoints
        # are that scale (at least 1) times 0, 1e-2, ..., t_max
        f0 = field(P0)
        t_s = np.maximum(1.0, np.linalg.norm(P0, axis=(1, 2))
                         / (np.linalg.norm(f0, axis=(1, 2)) + 1e-300))
        t_s = np.minimum(t_s, 1e12)
        ck_t = t_s[:, None] * base[None, :]
        rec, steps, stop, t_last = _integrate(field, P0, ck_t, rtol, 0.0)
        for j, i in enumerate(rows):
            if stop[j] in ("growth",):
                oc, tb, msg = _blowup_verdict(attentions[i], cov0s[i], t_max * t_s[j])
                res = dict(outcome=oc, rank=None, bound=d - int(rq[j]),
                           exponents=np.full(d, np.nan), decay_rates=np.empty(0),
                           conserved_drift=np.nan, lyapunov_increase=None,
                           t_final=float(t_last[j]), t_blowup=tb, limit=None,
                           eigenvalues=np.full(d, np.nan), steps=int(steps[j]), message=msg)
            else:
                res = _decide(rec[j], ck_t[j], steps[j], stop[j], t_last[j], U[j], rq[j],
                              lyap[j], fit_decades, drift_tol)
            out[i] = CertifiedLimit(**res)
    return out


def certified_limit(attention, cov0, *, t_max=1e6, rtol=1e-6, fit_decades=2.0,
                    drift_tol=1e-2):
    r"""Certified limit of one trajectory: rank, outcome and evidence.

    Integrates :math:`P = \Sigma^{-1}`, :math:`P' = -(PM + M^TP)`, to ``t_max`` and reads
    the limit rank off the growth exponents of :math:`P` (equivalently, the decay exponents
    of :math:`\Sigma`): an eigenvalue of :math:`\Sigma` decaying like :math:`t^{-1}` is a
    vanishing direction, a settled one survives, and the conserved block
    :math:`N^TPN` (:math:`N` a basis of :math:`\ker Q`) is checked along the way. See
    :func:`certified_limits` for the parameters and the module docstring for the method.

    Returns
    -------
    CertifiedLimit

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> Q = np.array([[1.0, 0.5, 0.0]])
    >>> res = gp.certified_limit(gp.Softmax(Q, -Q, np.eye(3)), np.eye(3))
    >>> res.outcome, res.rank, res.bound
    ('rank', 2, 2)
    """
    _heads(attention)
    cov0 = _check_definite(validate_covariance(cov0, "cov0"), "cov0")
    if attention.d != cov0.shape[-1]:
        raise ValueError(f"`cov0` is {cov0.shape[-1]}-dimensional but `attention` acts in "
                         f"d = {attention.d}.")
    return certified_limits([attention], [cov0], t_max=t_max, rtol=rtol,
                            fit_decades=fit_decades, drift_tol=drift_tol)[0]


def exact_precision_softmax(Q, cov0, scale, t):
    r"""Exact precision of softmax with :math:`V = I` and :math:`K = -Q` (docs/math.md 4.1).

    .. math:: P(t) = \Sigma_0^{-1} + 2ct\,Q^TQ .
    """
    R = psd_sqrt(np.asarray(cov0, float))
    P0 = np.linalg.inv(R @ R)
    return P0 + 2.0 * scale * t * (Q.T @ Q)
