r"""Certified limit rank: the inverse covariance integrated, its growth rates read off.

For :math:`K = -Q` the covariance converges *algebraically*: the vanishing eigenvalues of
:math:`\Sigma` decay like :math:`1/t` or :math:`1/t^2` (docs/math.md section 4.5), so a
threshold on :math:`\Sigma(T)` at any finite horizon is a guess. This module integrates
the precision :math:`P = \Sigma^{-1}` instead,

.. math::

    P' = -\big(PM + M^TP\big), \qquad
    M_{\mathrm{softmax}} = V\,\Sigma A, \qquad
    M_{L2} = 2V\,(P + H)^{-1}A, \qquad A = cK^TQ,\; H = 2cK^TK,

(heads add), in which a vanishing direction of :math:`\Sigma` is a *growing* pivot of
:math:`P`, and a surviving direction a bounded one.

**Variables.** In the frame :math:`[U_R, U_N]` (:math:`U_N` an orthonormal basis of the
common :math:`\ker Q`, the range of :math:`Q^T` first), :math:`P = LDL^T` with
:math:`L` unit lower triangular and :math:`D = \operatorname{diag}(e^{\ell})`; the state is
the log pivots :math:`\ell`, the entries of :math:`L`, those of the block :math:`L_{NR}`
(which decays like :math:`1/t`) multiplied by :math:`T = 1 + t/t_s`, and the time is
:math:`\tau = \log T`. A pivot growing like :math:`t^a` is then a straight line in
:math:`\tau`, which the Runge-Kutta stages integrate without error, and the rest tends to
a steady state: the steps grow geometrically once the state has settled, and a horizon
of :math:`10^{10}t_s` costs tens to a few hundred steps (:class:`_LDLState`). Every
quantity is formed from products of the factors, never from differences of the huge
entries of :math:`P`, and :math:`P` is positive definite by construction.

**Stepper.** The package's engine
(:func:`gaussian_pde.integrate.integrate_states`, in parallel over the
settings) on the autonomous system :math:`(y, \tau)`, :math:`\dot\tau = 1`: the
L-stable RODAS4P2 from the first step, with the field's complex-step Jacobian (exact to
rounding), the error norm :math:`\mathrm{rms}\big(e_i/(r(1 + \max(|y_i|, |y^{new}_i|)))\big)`
(:math:`r` = ``rtol``), and the states at the checkpoints :math:`t = t_s10^j` from its
continuous extension. The field is written once, in :mod:`._certified_field`; this module
sets up the frame and the states, and decides.

**Decision** (docs/math.md 4.5), from the eigenvalues of :math:`\Sigma = F^TF`,
:math:`F = D^{-1/2}L^{-1}`, at the checkpoints of the last ``fit_decades`` decades:

* the :math:`d - \operatorname{rank}Q` largest survive: by Cauchy interlacing with the
  conserved :math:`N^TPN` (rebuilt from the factors, its drift reported) they stay above
  :math:`1/\max_t\lambda_{\max}(N^TPN)`; their fitted exponents must not be positive;
* each of the others vanishes: fitted exponent :math:`\le -1/4` (about -1 or -2), or
  below :math:`-0.05` while under :math:`10^{-3}` of that floor;
* anything else, or a drift above ``drift_tol``: ``undecided`` at ``t_max``, and one more
  integration to :math:`10^{12}t_s` with four times the steps follows (slow modes, e.g.
  a :math:`V` with an eigenvalue near 0).

When :math:`\operatorname{tr}\Sigma` grows past ``1e8`` times its initial value, the
precision form is left, and the package's covariance solver with its finite-time blow-up
verdict (docs/math.md 10.3, :mod:`gaussian_pde.integrate._events`) decides between
``blowup`` and ``grows``.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from .._common.linalg import psd_sqrt
from .._common.validation import (
    usable_cores,
    validate_allocation,
    validate_covariance,
    validate_positive,
    validate_tolerance,
)
from ..attention import Attention, quadratic_heads, single_heads
from ..integrate import integrate_states
from ._certified_field import kernels, pack

__all__ = ["CertifiedLimit", "certified_limit", "certified_limits", "exact_precision_softmax",
           "theorem_rank"]

#: exponent of a vanishing eigenvalue of Sigma is at most this (1/t decay gives -1, and
#: 1/t^2, where the coupling P_RN grows like t, gives -2)
VANISH = -0.25
#: a surviving eigenvalue has a fitted exponent of at most this in absolute value
SETTLED = 0.05
#: trace growth (relative to the initial trace) that hands over to the blow-up verdict
GROWTH = 1e8
_MAX_STEPS = 3_000
#: a setting left undecided at ``t_max`` is integrated once more to this horizon, with
#: this many times the steps (slow modes, e.g. V with an eigenvalue near 0, settle late)
_ESCALATE_T = 1e12
_ESCALATE_STEPS = 4


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
        The exponents of the vanishing eigenvalues (-1 for :math:`1/t` decay, as for
        :math:`V = I`; -2 where the coupling :math:`P_{RN}` grows like :math:`t`).
    pivot_exponents : ndarray, shape (d,)
        Log-log slopes of the pivots :math:`D_i` of :math:`P = LDL^T` over the same
        decades (the first ``rank Q`` are those of the range of :math:`Q^T`); NaN if not
        reached or past the floating-point range.
    conserved_drift : float
        :math:`\max_t \lVert N^TP(t)N - N^TP_0N\rVert_F / \lVert N^TP_0N\rVert_F` over the
        checkpoints (0 when :math:`\ker Q = 0`); :math:`N^TPN` is rebuilt from the factored
        state, so this measures the integration error.
    closed_form_gap : float
        :math:`\lVert\Sigma_\infty - N(N^T\Sigma_0^{-1}N)^{-1}N^T\rVert_F /
        \lVert\Sigma_\infty\rVert_F` (:math:`N` orthonormal); at the integration error
        (of the order of ``rtol``) where the closed form of docs/math.md 4.5 holds (always for
        :math:`V = I`), up to :math:`O(1)` where it does not.
        NaN unless ``"rank"``/``"zero"``.
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
        Accepted steps of the log-time integration.
    message : str
        The evidence in words, or why the outcome is undecided.
    path : str
        The integration that ran: ``"compiled"`` (the package's engine on the field of
        :mod:`._certified_field`, the only one).
    """

    outcome: str
    rank: int | None
    bound: int
    exponents: np.ndarray
    decay_rates: np.ndarray
    pivot_exponents: np.ndarray
    conserved_drift: float
    closed_form_gap: float
    lyapunov_increase: float | None
    t_final: float
    t_blowup: float | None
    limit: np.ndarray | None
    eigenvalues: np.ndarray
    steps: int
    message: str
    path: str = "compiled"


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


def _score_heads(att, name="attention"):
    """``[(kind, Q, K, V, scale, score)]`` of heads with a quadratic score; ``TypeError`` otherwise.

    ``kind`` is ``"bilinear"`` where the score has no quadratic part (:math:`H = 0`:
    softmax) and ``"quadratic"`` otherwise (L2); ``score`` is the head's
    :class:`~gaussian_pde.attention.QuadraticScore`.
    """
    scores = quadratic_heads(att, name, what="certified_limit (for which N^T Sigma^-1 N "
                             "is conserved)")
    out = []
    for h, score in zip(single_heads(att), scores):
        kind = "bilinear" if score.H is None else "quadratic"
        out.append((kind, np.asarray(h.Q, float), np.asarray(h.K, float),
                    np.asarray(h.V, float), float(h.scale), score))
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
    _, Q, K, V, _, _ = heads[0]
    if not np.allclose(K, -Q, rtol=0, atol=1e-14 * max(1.0, np.abs(Q).max())):
        return None
    if not np.allclose(V, V.T, rtol=0, atol=1e-13 * max(1.0, np.abs(V).max())):
        return None
    w = np.linalg.eigvalsh(0.5 * (V + V.T))
    if w[0] <= 1e-12 * w[-1]:
        return None
    return np.linalg.inv(0.5 * (V + V.T))


# ----------------------------------------------------------------------------------------
# the precision in factored form: P = L D L^T, D = exp(ell), L unit lower triangular
# ----------------------------------------------------------------------------------------

def _unit_lower_inv(L):
    r"""Inverse of unit lower triangular ``L`` (..., d, d) by forward substitution.

    :math:`(L^{-1})_{ij} = -\sum_{j\le m<i} L_{im}(L^{-1})_{mj}`: sums of products, so a
    tiny entry of :math:`L` (the :math:`O(1/t)` block :math:`L_{NR}`) keeps its relative
    accuracy in the inverse, which a pivoted LU would not promise. Works for complex
    entries (the complex-step Jacobian).
    """
    d = L.shape[-1]
    X = np.zeros_like(L)
    for i in range(d):
        X[..., i, i] = 1.0
        for j in range(i):
            X[..., i, j] = -np.einsum("...m,...m->...", L[..., i, j:i], X[..., j:i, j])
    return X


class _LDLState:
    r"""The factored state of the precision in log time (docs/math.md 4.5), read back.

    Its field, :func:`._certified_field._field`, integrates the precision equation in
    these variables:

    State per trajectory: :math:`y = (\ell, \tilde L)`, with :math:`P = LDL^T`,
    :math:`D = \operatorname{diag}(e^{\ell})`, :math:`L` unit lower triangular in the
    frame :math:`[U_R, U_N]` (``k`` = rank Q coordinates first), and
    :math:`\tilde L_{ij} = s_{ij}L_{ij}` with :math:`s_{ij} = T` on the block
    :math:`(i \in N, j \in R)` and 1 elsewhere. Time: :math:`\tau = \log T`,
    :math:`T = 1 + t/t_s`. With :math:`\dot P = t_sT\,F(P)`,
    :math:`\Phi = L^{-1}\dot PL^{-T} = -(B + B^T)`, :math:`B = D\,\tilde V\,X\,\tilde A\,t_sT`,
    :math:`\tilde V = L^TVL^{-T}`, :math:`\tilde A = L^{-1}AL^{-T}` and
    :math:`X = L^T\Sigma L = D^{-1}` (softmax) or :math:`2L^T(P+H)^{-1}L = 2(D + \tilde H)^{-1}`
    (L2, :math:`\tilde H = L^{-1}HL^{-T}`), so that with :math:`Y = t_sT\,\tilde VX\tilde A`

    .. math::

        \frac{d\ell_i}{d\tau} = \frac{\Phi_{ii}}{D_i} = -2Y_{ii}, \qquad
        \frac{dL}{d\tau} = L\,\Xi, \quad
        \Xi_{ij} = \frac{\Phi_{ij}}{D_j} = -\big(e^{\ell_i-\ell_j}Y_{ij} + Y_{ji}\big)
        \ (i > j),

    and :math:`d\tilde L_{ij}/d\tau = s_{ij}(L\Xi)_{ij} + [s_{ij} = T]\,\tilde L_{ij}`.
    A pivot growing like :math:`t^a` is a *linear* function of :math:`\tau`, which the
    Runge-Kutta stages integrate without error, and :math:`L_{NR}\sim 1/t` is a bounded
    :math:`\tilde L_{NR}`; so the state tends to a steady state (or a straight line in
    :math:`\ell`), and the steps grow. Every quantity is formed from products, never
    from the differences of the huge entries of :math:`P`.
    """

    def __init__(self, k, d):
        self.k, self.d = k, d
        self.il, self.jl = np.tril_indices(d, -1)
        self.nr = (self.il >= k) & (self.jl < k)

    def factors(self, y, tau):
        """``ell``, ``L`` and ``T`` of states ``y`` (..., ny) at log times ``tau`` (...)."""
        d = self.d
        T = np.exp(tau)
        s = np.where(self.nr, T[..., None], 1.0)
        L = np.zeros(y.shape[:-1] + (d, d), dtype=y.dtype)
        L[..., np.arange(d), np.arange(d)] = 1.0
        L[..., self.il, self.jl] = y[..., d:] / s
        return y[..., :d], L, T, s


def _sigma(field, y, tau):
    r"""Sigma, its factor and the conserved block, from states ``y`` (..., ny).

    :math:`\Sigma = F^TF` with :math:`F = D^{-1/2}L^{-1}`, and
    :math:`N^TPN = L_{N:}DL_{N:}^T`.
    """
    k = field.k
    ell, L, T, _ = field.factors(y, tau)
    Li = _unit_lower_inv(L)
    F = np.exp(-0.5 * ell)[..., :, None] * Li
    S = np.swapaxes(F, -1, -2) @ F
    Lh = L[..., k:, :] * np.exp(0.5 * ell)[..., None, :]      # rows N of L D^{1/2}
    C = Lh @ np.swapaxes(Lh, -1, -2)
    return S, F, C


def _eig_sigma(F, k):
    r"""Eigenvalues (ascending) and eigenvectors of :math:`\Sigma = F^TF`.

    From the SVD of the row-graded :math:`F`, its large rows (the :math:`N` pivots) first.
    """
    d = F.shape[-1]
    order = np.r_[np.arange(k, d), np.arange(k)]
    _, sv, Vt = np.linalg.svd(F[..., order, :])
    return sv[..., ::-1] ** 2, np.swapaxes(Vt, -1, -2)[..., ::-1]


def _build(attentions, d):
    """Per-row heads in the frame ``U = [U_R, U_N]``: kinds, A, V, H, U, rank Q, V^-1."""
    heads0 = _score_heads(attentions[0])
    kinds = tuple(h[0] for h in heads0)
    nr, nh = len(attentions), len(kinds)
    A = np.empty((nr, nh, d, d))
    V = np.empty((nr, nh, d, d))
    H = np.zeros((nr, nh, d, d))
    U = np.empty((nr, d, d))
    rq = np.empty(nr, dtype=int)
    lyap = []
    for i, att in enumerate(attentions):
        heads = _score_heads(att)
        U[i], rq[i] = _frame(heads, d)
        u, k = U[i], int(rq[i])
        for j, (kind, _, _, Vh, _, score) in enumerate(heads):
            # the score's coupling, with the factor 2 of the quadratic form's A taken out
            # (M = 2V(P + H)^{-1}A below; exact: a power of two)
            A[i, j] = u.T @ (score.A if kind == "bilinear" else 0.5 * score.A) @ u
            A[i, j][:, k:] = 0.0            # A N = 0 exactly (N spans ker Q): no rounding
            V[i, j] = u.T @ Vh @ u          # can feed N^T P N
            if kind == "quadratic":
                H[i, j] = u.T @ score.H @ u
        W = _lyapunov_matrix(heads)
        lyap.append(None if W is None else u.T @ W @ u)
    return kinds, A, V, H, U, rq, lyap


def _precision_rhs(kinds, A, V, H, P, S):
    r""":math:`F(P) = -(PM + M^TP)` of (4.4) at one :math:`P` (for the time scale)."""
    G = 0.0
    for j, kind in enumerate(kinds):
        X = S if kind == "bilinear" else 2.0 * np.linalg.inv(P + H[:, j])
        G = G + P @ V[:, j] @ X @ A[:, j]
    return -(G + np.swapaxes(G, -1, -2))


# ----------------------------------------------------------------------------------------
# the decision
# ----------------------------------------------------------------------------------------

def _fit(ts, lam):
    """Least-squares slope of log(lam) on log(t); lam of shape (n, d)."""
    x = np.log(ts)
    x = x - x.mean()
    yv = np.log(lam)
    return (x[:, None] * (yv - yv.mean(0))).sum(0) / (x ** 2).sum()


def _decide(field, rec, taus, ck_t, step_count, stop, t_last, U, k, lyap, C0, fit_decades,
            drift_tol, strict=True):
    d = field.d
    bound = d - int(k)
    nan = np.full(d, np.nan)
    if not np.all(np.isfinite(rec[-1])) or stop:
        return dict(outcome="undecided", rank=None, bound=bound, exponents=nan,
                    decay_rates=np.empty(0), pivot_exponents=nan, conserved_drift=np.nan,
                    closed_form_gap=np.nan, lyapunov_increase=None, t_final=float(t_last),
                    t_blowup=None, limit=None, eigenvalues=nan, steps=int(step_count),
                    message=f"precision integration stopped ({stop or 'not finite'})")
    Ss, Fs, Cs = _sigma(field, rec, taus)
    T = ck_t[-1]
    sel = np.flatnonzero(ck_t >= T / 10 ** fit_decades)
    lam_k, _ = _eig_sigma(Fs[sel], k)
    lam, vec = _eig_sigma(Fs[-1], k)
    expo = _fit(ck_t[sel], lam_k) if np.all(lam_k > 0) else nan
    piv = _fit(ck_t[sel], np.exp(rec[sel, :d]))      # log-log slopes of the pivots of P
    if k < d:
        drift = float(np.max(np.linalg.norm(Cs - C0, axis=(1, 2))) / np.linalg.norm(C0))
        if not np.isfinite(drift):     # N^T P N past the floating-point range: no drift to
            drift = np.nan             # measure (and the setting is undecided below)
        floor = 1.0 / float(np.max(np.linalg.eigvalsh(0.5 * (Cs + np.swapaxes(Cs, 1, 2)))))
    else:
        drift, floor = 0.0, np.inf
    lyap_inc = None
    if lyap is not None:
        f = np.einsum("ij,kji->k", lyap, Ss)
        lyap_inc = float(max(0.0, np.max((f[1:] - f[:-1]) / f[:-1])))
    # the d - k largest eigenvalues of Sigma stay above the floor 1 / lambda_max(N^T P N)
    # (Cauchy interlacing with the conserved compression, docs/math.md 4.5)
    kept = np.zeros(d, dtype=bool)
    kept[k:] = True
    vanish = ~kept & ((expo <= VANISH) | ((expo < -SETTLED) & (lam < 1e-3 * floor)))
    settled = kept & (np.abs(expo) <= SETTLED)
    if not strict:
        # last horizon: a surviving eigenvalue still decaying slowly is certified to stay
        # above the floor all the same; the message says it has not settled
        settled = kept & (expo <= SETTLED)
    base = dict(bound=bound, exponents=expo, decay_rates=expo[vanish], pivot_exponents=piv,
                conserved_drift=drift, lyapunov_increase=lyap_inc, t_final=float(T),
                t_blowup=None, eigenvalues=lam, steps=int(step_count), closed_form_gap=np.nan)
    expo_s = ", ".join(f"{e:.4f}" for e in expo)
    if np.any(~np.isfinite(expo)):
        return dict(base, outcome="undecided", rank=None, limit=None,
                    message="an eigenvalue of Sigma is not positive at a fitted checkpoint")
    if not drift <= drift_tol:
        return dict(base, outcome="undecided", rank=None, limit=None,
                    message=f"conserved N^T Sigma^-1 N drifted by {drift:.2e} > {drift_tol:g}")
    if np.any(expo[kept] > SETTLED):
        return dict(base, outcome="undecided", rank=None, limit=None,
                    message=f"eigenvalue exponents [{expo_s}]: a surviving one still grows")
    if not np.all(vanish | settled):
        return dict(base, outcome="undecided", rank=None, limit=None,
                    message=f"eigenvalue exponents [{expo_s}]: one of them neither decays "
                            f"(<= {VANISH}) nor settles (|.| <= {SETTLED})")
    if bound and np.min(lam[kept]) < floor * (1.0 - 1e-6):
        return dict(base, outcome="undecided", rank=None, limit=None,
                    message="interlacing bound violated: inaccurate integration")
    r = int(settled.sum())
    keepv = vec[:, settled]
    limit = U @ (keepv @ np.diag(lam[settled]) @ keepv.T) @ U.T
    if bound:
        # the candidate closed form N (N^T Sigma_0^-1 N)^-1 N^T (docs/math.md 4.5)
        UN = U[:, k:]
        closed = UN @ np.linalg.inv(C0) @ UN.T
        gap = float(np.linalg.norm(limit - closed) / np.linalg.norm(limit))
    else:
        gap = 0.0
    slow = kept & (np.abs(expo) > SETTLED)
    note = (f"; surviving exponents [{', '.join(f'{e:.3f}' for e in expo[slow])}] not yet "
            f"settled, bounded below by {floor:.3g} (interlacing)") if slow.any() else ""
    msg = (f"{int(vanish.sum())} eigenvalues of Sigma decay (exponents "
           f"{', '.join(f'{e:.4f}' for e in expo[vanish]) or '-'}; pivots of Sigma^-1 grow "
           f"like t^[{', '.join(f'{p:.3f}' for p in piv[:k])}]), {r} settle; conserved "
           f"drift {drift:.1e}; closed form gap {gap:.1e}{note}")
    return dict(base, outcome="zero" if r == 0 else "rank", rank=r, closed_form_gap=gap,
                limit=np.zeros((d, d)) if r == 0 else limit, message=msg)
def _blowup_verdict(att, cov0, t_max):
    """The package's covariance solver and its finite-time blow-up verdict."""
    from ..integrate import solve

    sol = solve(att, None, cov0, (0.0, t_max))
    st = str(sol.status)
    if st == "blowup":
        return "blowup", float(sol.t_blowup), f"blow-up confirmed at t* = {sol.t_blowup:.6g}"
    if st == "failed" and "grows" in sol.message.lower():
        return "grows", None, sol.message
    return "undecided", None, f"covariance solver after precision growth: {st}: {sol.message}"




def _certify_rows(attentions, cov0s, t_max, rtol, fit_decades, drift_tol, max_steps,
                  strict=True):
    r""":func:`certified_limits` on validated input, at one horizon and step cap.

    A pivot of :math:`\Sigma^{-1}` past the floating-point range (an eigenvalue of
    :math:`\Sigma` below 1e-308) is not an error here: it makes the fit non-finite,
    and the row is ``undecided`` with that reason, so overflow warnings are silenced.
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _certify_rows_raw(attentions, cov0s, t_max, rtol, fit_decades, drift_tol,
                                 max_steps, strict)


def _certify_rows_raw(attentions, cov0s, t_max, rtol, fit_decades, drift_tol, max_steps,
                      strict):
    jmax = int(np.floor(np.log10(t_max) + 1e-12))
    base = np.array([0.0] + [10.0 ** j for j in range(-2, jmax + 1)])
    if base[-1] < t_max:
        base = np.append(base, t_max)
    groups = {}
    for i, att in enumerate(attentions):
        heads = _score_heads(att)
        d = cov0s[i].shape[-1]
        key = (d, tuple(h[0] for h in heads), _frame(heads, d)[1])
        groups.setdefault(key, []).append(i)
    out = [None] * len(attentions)
    il_cache = {}
    for (d, _, k), rows in groups.items():
        kinds, A, V, H, U, rq, lyap = _build([attentions[i] for i in rows], d)
        S0 = np.einsum("rji,rjk,rkl->ril", U, np.array([cov0s[i] for i in rows]), U)
        S0 = 0.5 * (S0 + np.swapaxes(S0, 1, 2))
        P0 = np.linalg.inv(S0)
        P0 = 0.5 * (P0 + np.swapaxes(P0, -1, -2))
        # the setting's own time scale: P changes by O(P) in |P0| / |P'(0)| (for V = I,
        # K = -Q: |Sigma_0^-1| / |2c Q^T Q|, where the 1/t decay starts)
        f0 = _precision_rhs(kinds, A, V, H, P0, S0)
        t_s = np.maximum(1.0, np.linalg.norm(P0, axis=(1, 2))
                         / (np.linalg.norm(f0, axis=(1, 2)) + 1e-300))
        t_s = np.minimum(t_s, 1e12)
        ch = np.linalg.cholesky(P0)
        dg = np.diagonal(ch, axis1=1, axis2=2)
        il = il_cache.setdefault(d, np.tril_indices(d, -1))
        y0 = np.concatenate([2.0 * np.log(dg), (ch / dg[:, None, :])[:, il[0], il[1]]], axis=1)
        field = _LDLState(k, d)
        taus = np.tile(np.log1p(base), (len(rows), 1))
        tr0 = np.trace(S0, axis1=1, axis2=2)
        rec, steps, stop, t_last = _integrate(kinds, V, A, H, t_s, k, y0, taus[0], rtol,
                                              GROWTH * tr0, max_steps)
        C0 = P0[:, k:, k:]
        for j, i in enumerate(rows):
            ck_t = t_s[j] * base
            if stop[j] == "growth":
                oc, tb, msg = _blowup_verdict(attentions[i], cov0s[i], t_max * t_s[j])
                nan = np.full(d, np.nan)
                res = dict(outcome=oc, rank=None, bound=d - k, exponents=nan,
                           decay_rates=np.empty(0), pivot_exponents=nan,
                           conserved_drift=np.nan, closed_form_gap=np.nan,
                           lyapunov_increase=None, t_final=float(t_s[j] * np.expm1(t_last[j])),
                           t_blowup=tb, limit=None, eigenvalues=nan, steps=int(steps[j]),
                           message=msg)
            else:
                res = _decide(field, rec[j], taus[j], ck_t,
                              steps[j], stop[j], t_s[j] * np.expm1(t_last[j]), U[j], k,
                              lyap[j], C0[j], fit_decades, drift_tol, strict=strict)
            out[i] = CertifiedLimit(**res, path="compiled")
    return out


#: the words of the engine's stops (its codes), as :func:`_decide` reports them
_STOPS = {"finished": "", "growth": "growth", "budget": "steps", "small step": "step",
          "overflow": "overflow", "not finite": "not finite"}


def _integrate(kinds, V, A, H, ts, k, y0, taus, rtol, tr_max, max_steps):
    r"""The rows on the engine, in log time: their states at the checkpoints ``taus``.

    The augmented states :math:`(y, \tau)` start at :math:`\tau = 0`; the tolerance
    ``rtol`` holds relative to :math:`\max(1, |y|)` (``atol = rtol``); a row stops with
    ``"growth"`` where :math:`\operatorname{tr}\Sigma` passes ``tr_max``, with ``"steps"``
    past the evaluations of ``max_steps`` accepted steps (7 each: the Jacobian, 5 stages
    and the rate at the step's end), with ``"step"`` where the step falls below rounding.

    Returns
    -------
    rec : ndarray, shape (nb, nck, ny)
        States at the checkpoints (NaN where not reached).
    steps : ndarray of int
    stop : ndarray of object
        ``""``, ``"growth"``, ``"steps"``, ``"step"``, ``"overflow"`` or ``"not finite"``.
    t_last : ndarray
        Last log time reached.
    """
    nb, ny = y0.shape
    ya = np.concatenate([y0, np.zeros((nb, 1))], axis=1)
    fields = (*kernels(), pack(kinds, V, A, H, ts, k), 1)
    with np.errstate(all="ignore"):
        states, ends, steps, t_last = integrate_states(fields, ya, taus, tr_max, rtol=rtol,
                                                       atol=rtol, max_nfev=7 * max_steps + 2)
    stop = np.array([_STOPS[e] for e in ends], dtype=object)
    return states[:, :, :ny], steps, stop, t_last


def _check_memory(dims):
    r"""Refuse, before any work, rows whose Jacobians would not fit in memory.

    A row in dimension :math:`d` has :math:`n = d(d+1)/2` unknowns and the log time; each
    thread of the engine holds its Jacobian and the RODAS4P2 matrix,
    :math:`16(n + 1)^2` bytes, and about twelve complex :math:`d\times d` matrices of the
    complex step, :math:`192d^2` bytes; the checkpoints of every row take
    :math:`8 \cdot 16(n + 1)` bytes.
    """
    def need(d):
        n1 = d * (d + 1) / 2 + 1
        return 16.0 * n1 ** 2 + 192.0 * d ** 2

    dims = np.asarray(dims, dtype=np.float64)
    threads = min(dims.size, usable_cores())
    total = threads * float(np.max(need(dims))) + float(np.sum(128.0 * (dims * (dims + 1) / 2 + 1)))
    try:
        validate_allocation(total, "cov0s", itemsize=1)
    except ValueError:
        d = int(dims.max())
        fits = next((k for k in range(d, 0, -1) if _fits(threads * need(k))), 1)
        raise ValueError(f"`cov0` (`cov0s`) is {d}-dimensional: the certified limit "
                         f"integrates {d * (d + 1) // 2} factored unknowns with a complex-step "
                         f"Jacobian, which would need {total / 2**30:.3g} GiB on {threads} "
                         f"thread(s), more than half of this machine's memory (it fits up "
                         f"to d = {fits}).") from None


def _fits(nbytes):
    try:
        validate_allocation(nbytes, "cov0s", itemsize=1)
    except ValueError:
        return False
    return True


def certified_limits(attentions, cov0s, *, t_max=1e10, rtol=1e-6, fit_decades=2.0,
                     drift_tol=1e-2, compiled=None):
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
        :math:`t = t_s10^j`, :math:`10^{-2} \le 10^j \le` ``t_max``. The integration is
        in :math:`\tau = \log(1 + t/t_s)`, so the horizon costs little once the state
        has settled.
    rtol : float
        Tolerance per state component (relative, floor 1; the log pivots absolutely).
    fit_decades : float
        The exponents are fitted over the last ``fit_decades`` decades of checkpoints.
    drift_tol : float
        Largest relative drift of :math:`N^TPN` accepted. The floor that the surviving
        eigenvalues obey is :math:`1/\max_t\lambda_{\max}(N^TP(t)N)` over the computed
        checkpoints, so a drift :math:`\delta` moves it by a factor of at most
        :math:`1 + \delta`; 1e-2 leaves the decision unchanged.
    compiled : None
        Deprecated and ignored: there is one integration, the package's compiled engine
        (on the field of :mod:`._certified_field`); the batched NumPy copy that ``compiled=False``
        selected is gone. Passing a value warns (``FutureWarning``).

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
        _score_heads(att, f"attentions[{i}]")
        if att.d != c.shape[-1]:
            raise ValueError(f"`cov0s[{i}]` is {c.shape[-1]}-dimensional but `attentions[{i}]` "
                             f"acts in d = {att.d}.")
    t_max = validate_positive(t_max, "t_max")
    if not 1.0 <= t_max <= 1e12:
        raise ValueError(f"`t_max` must lie in [1, 1e12] (units of the setting's time "
                         f"scale), got {t_max:g}.")
    rtol = validate_tolerance(rtol, "rtol")
    if rtol < 1e-12:
        raise ValueError(f"`rtol` must be at least 1e-12 (rounding bounds what the factored "
                         f"state can resolve), got {rtol:g}.")
    fit_decades = validate_positive(fit_decades, "fit_decades")
    drift_tol = validate_positive(drift_tol, "drift_tol")
    if compiled is not None:
        warnings.warn("`compiled` is deprecated and ignored: the certified limits have one "
                      "integration loop, compiled with Numba.", FutureWarning, stacklevel=2)
    _check_memory([c.shape[-1] for c in cov0s])
    out = _certify_rows(attentions, cov0s, t_max, rtol, fit_decades, drift_tol, _MAX_STEPS)
    # a setting still undecided (a slow mode not settled by t_max, or the step cap) gets
    # one longer integration; the message says so
    again = [i for i, r in enumerate(out) if r.outcome == "undecided"]
    if again and t_max < _ESCALATE_T:
        redo = _certify_rows([attentions[i] for i in again], [cov0s[i] for i in again],
                             _ESCALATE_T, rtol, fit_decades, drift_tol,
                             _ESCALATE_STEPS * _MAX_STEPS, strict=False)
        for i, r in zip(again, redo):
            out[i] = dataclasses.replace(
                r, message=f"{r.message} (horizon raised to {_ESCALATE_T:g} t_s after: "
                           f"{out[i].message})")
    return out


def certified_limit(attention, cov0, *, t_max=1e10, rtol=1e-6, fit_decades=2.0,
                    drift_tol=1e-2):
    r"""Certified limit of one trajectory: rank, outcome and evidence.

    Integrates :math:`P = \Sigma^{-1}`, :math:`P' = -(PM + M^TP)`, in the factored form
    :math:`P = LDL^T` and log time to ``t_max``, and reads the limit rank off the decay
    exponents of the eigenvalues of :math:`\Sigma`: a decaying one is a vanishing
    direction, a settled one survives, and the conserved block :math:`N^TPN`
    (:math:`N` a basis of :math:`\ker Q`) is checked along the way. See
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
    _score_heads(attention)
    cov0 = _check_definite(validate_covariance(cov0, "cov0"), "cov0")
    if attention.d != cov0.shape[-1]:
        raise ValueError(f"`cov0` is {cov0.shape[-1]}-dimensional but `attention` acts in "
                         f"d = {attention.d}.")
    return certified_limits([attention], [cov0], t_max=t_max, rtol=rtol,
                            fit_decades=fit_decades, drift_tol=drift_tol)[0]


def theorem_rank(attention, cov0):
    r"""The limit rank :math:`d - \operatorname{rank}Q` of docs/math.md 4.5, or ``None``.

    The theorem needs one softmax or L2 head with :math:`K = -Q`, :math:`V` symmetric
    positive definite and :math:`\Sigma_0` of full rank; each hypothesis is checked here,
    with margins for rounding (:math:`\lambda_{\min}(V) > 10^{-10}\max|V|`,
    :math:`\lambda_{\min}(\Sigma_0) > 10^{-10}\lambda_{\max}(\Sigma_0)`). Where one
    fails the answer is ``None``: the theorem says nothing, and the rank must come from
    an integration.

    Parameters
    ----------
    attention : Attention
        The setting's attention.
    cov0 : array_like, shape (d, d)
        Its initial covariance.

    Returns
    -------
    int or None
    """
    try:
        heads = _score_heads(attention)
    except TypeError:
        return None
    cov0 = validate_covariance(cov0, "cov0")
    if len(heads) != 1 or cov0.shape[-1] != attention.d:
        return None
    w = np.linalg.eigvalsh(cov0)
    if not w[0] > 1e-10 * w[-1]:
        return None
    _, Q, K, V, _, _ = heads[0]
    if _lyapunov_matrix(heads) is None:             # K = -Q and V symmetric positive definite
        return None
    Vs = 0.5 * (V + V.T)
    if not np.linalg.eigvalsh(Vs)[0] > 1e-10 * np.abs(V).max():
        return None
    return attention.d - _frame(heads, attention.d)[1]


def exact_precision_softmax(Q, cov0, scale, t):
    r"""Exact precision of softmax with :math:`V = I` and :math:`K = -Q` (docs/math.md 4.1).

    .. math:: P(t) = \Sigma_0^{-1} + 2ct\,Q^TQ .
    """
    R = psd_sqrt(np.asarray(cov0, float))
    P0 = np.linalg.inv(R @ R)
    return P0 + 2.0 * scale * t * (Q.T @ Q)
