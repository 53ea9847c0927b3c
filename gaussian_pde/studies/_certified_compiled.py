r"""The certified limit's log-time RODAS4 loop: the field, its Jacobian and the steps.

Written once, per trajectory, for Numba (``nopython``, ``cache=True``, parallel over
trajectories with ``prange``); :mod:`._certified` sets up the frame and the states and
decides from the checkpoints. The tests run the same functions uncompiled (``py_func``)
and hold the field to the precision equation :math:`P' = -(PM + M^TP)` written directly.

* the field in the variables of :class:`~gaussian_pde.studies._certified._LDLState`, in explicit loops over
  the :math:`d\times d` factors,

  .. math::

      \frac{d\ell_i}{d\tau} = -2Y_{ii}, \qquad
      \frac{dL}{d\tau} = L\,\Xi, \quad
      \Xi_{ij} = -\big(e^{\ell_i-\ell_j}Y_{ij} + Y_{ji}\big)\ (i > j),

  :math:`Y = \sum_{\mathrm{heads}} \tilde V X \tilde A\,t_sT` with
  :math:`\tilde V = L^TVL^{-T}`, :math:`\tilde A = L^{-1}AL^{-T}`, :math:`X = D^{-1}`
  (bilinear score) or :math:`X = 2D^{-1/2}(I + D^{-1/2}\tilde HD^{-1/2})^{-1}D^{-1/2}`
  (quadratic score, :math:`\tilde H = L^{-1}HL^{-T}`), generic in the scalar type so the
  one source serves real states and the complex steps;
* the complex-step Jacobian :math:`J_{:j} = \operatorname{Im} f(y + i\epsilon e_j)/\epsilon`
  of the augmented field :math:`(y, \tau)\mapsto(\dot y, 1)`;
* the RODAS4 stages :math:`W U_s = f(y + \sum_{j<s} a_{sj}U_j) + h^{-1}\sum_{j<s}c_{sj}U_j`,
  :math:`W = I/(\gamma h) - J`, with the coefficients of
  :data:`gaussian_pde.integrate.RODAS4`, solved by one pivoted LU per step.

Only the loop is compiled: the set-up (frame, factors, time scales) and the decision stay
in :mod:`._certified`.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from .._common.lu import lu_factor as _lu
from .._common.lu import lu_solve as _lu_solve
from ..integrate import RODAS4

#: stop codes of the compiled loop, in the order of the reference's strings
STOPS = ("", "growth", "step", "steps")


def prange(n):     # replaced by numba.prange when compiled
    return range(n)


def _mm(A, B, C):
    """``C = A @ B`` for small square matrices of any scalar type."""
    d = A.shape[0]
    for i in range(d):
        for j in range(d):
            acc = A[i, 0] * B[0, j]
            for m in range(1, d):
                acc += A[i, m] * B[m, j]
            C[i, j] = acc


def _factors(ya, k, d):
    r""":math:`\ell`, :math:`L` and :math:`L^{-1}` of an augmented state ``(y, tau)``.

    :math:`L_{ij} = \tilde L_{ij}/s_{ij}` (:math:`s_{ij} = T = e^{\tau}` on the block
    :math:`N\times R`), and :math:`(L^{-1})_{ij} = -\sum_{j\le m<i}L_{im}(L^{-1})_{mj}`.
    """
    ny = ya.size - 1
    T = np.exp(ya[ny])
    L = np.zeros((d, d), dtype=ya.dtype)
    p = d
    for i in range(d):
        L[i, i] = 1.0
        for j in range(i):
            L[i, j] = ya[p] / T if (i >= k and j < k) else ya[p]
            p += 1
    X = np.zeros((d, d), dtype=ya.dtype)
    for i in range(d):
        X[i, i] = 1.0
        for j in range(i):
            acc = L[i, j] * X[j, j]
            for m in range(j + 1, i):
                acc += L[i, m] * X[m, j]
            X[i, j] = -acc
    return ya[:d], L, X, T


def _solve_plain(G, B):
    r"""``G^{-1} B`` by elimination without pivoting.

    :math:`G = I + D^{-1/2}\tilde HD^{-1/2}` has a positive definite symmetric part, so no
    pivot vanishes; without pivoting the complex step stays analytic.
    """
    d = G.shape[0]
    G = G.copy()
    X = B.copy()
    for c in range(d):
        piv = G[c, c]
        for r in range(c + 1, d):
            f = G[r, c] / piv
            for m in range(c, d):
                G[r, m] -= f * G[c, m]
            for m in range(d):
                X[r, m] -= f * X[c, m]
    for c in range(d - 1, -1, -1):
        for m in range(d):
            acc = X[c, m]
            for j in range(c + 1, d):
                acc -= G[c, j] * X[j, m]
            X[c, m] = acc / G[c, c]
    return X


def _head_y(Y, kind, Vh, Ah, Hh, L, Li, ell, lt, d):
    r"""Adds one head's :math:`\tilde V X\tilde A\,t_sT` to ``Y``."""
    W1 = np.empty_like(L)
    Vt = np.empty_like(L)
    At = np.empty_like(L)
    LT = L.T.copy()
    LiT = Li.T.copy()
    _mm(Vh, LiT, W1)
    _mm(LT, W1, Vt)
    _mm(Ah, LiT, W1)
    _mm(Li, W1, At)
    if kind == 0:
        w = np.exp(lt - ell)
        for i in range(d):
            for j in range(d):
                acc = Vt[i, 0] * w[0] * At[0, j]
                for m in range(1, d):
                    acc += Vt[i, m] * w[m] * At[m, j]
                Y[i, j] += acc
        return
    Ht = np.empty_like(L)
    _mm(Hh, LiT, W1)
    _mm(Li, W1, Ht)
    e = np.exp(-0.5 * ell)
    G = np.empty_like(L)
    for i in range(d):
        for j in range(d):
            G[i, j] = e[i] * Ht[i, j] * e[j] + (1.0 if i == j else 0.0)
            W1[i, j] = e[i] * At[i, j]
    # T X A~ = 2 e^{lt} D^{-1/2} G^{-1} D^{-1/2} A~
    GA = _solve_plain(G, W1)
    two_t = 2.0 * np.exp(lt)
    for i in range(d):
        for j in range(d):
            acc = Vt[i, 0] * e[0] * GA[0, j]
            for m in range(1, d):
                acc += Vt[i, m] * e[m] * GA[m, j]
            Y[i, j] += two_t * acc


def _field(ya, kinds, V, A, H, log_ts, k, d, out):
    r"""Augmented field :math:`(\dot y, 1)` at ``ya = (y, tau)`` into ``out``."""
    ny = ya.size - 1
    ell, L, Li, T = _factors(ya, k, d)
    lt = log_ts + ya[ny]
    Y = np.zeros((d, d), dtype=ya.dtype)
    for h in range(kinds.size):
        _head_y(Y, kinds[h], V[h], A[h], H[h], L, Li, ell, lt, d)
    Xi = np.zeros((d, d), dtype=ya.dtype)
    for i in range(d):
        out[i] = -2.0 * Y[i, i]
        for j in range(i):
            Xi[i, j] = -(np.exp(ell[i] - ell[j]) * Y[i, j] + Y[j, i])
    p = d
    for i in range(d):
        for j in range(i):
            acc = L[i, j + 1] * Xi[j + 1, j]
            for m in range(j + 2, i + 1):
                acc += L[i, m] * Xi[m, j]
            if i >= k and j < k:
                out[p] = T * acc + ya[p]
            else:
                out[p] = acc
            p += 1
    out[ny] = 1.0


def _jacobian(ya, kinds, V, A, H, log_ts, k, d, J):
    r"""Complex-step Jacobian :math:`J_{:j} = \operatorname{Im} f(y + i\epsilon e_j)/\epsilon`."""
    n1 = ya.size
    eps = 1e-30
    yc = np.empty(n1, dtype=np.complex128)
    fc = np.empty(n1, dtype=np.complex128)
    for j in range(n1):
        for i in range(n1):
            yc[i] = ya[i]
        yc[j] += 1j * eps
        _field(yc, kinds, V, A, H, log_ts, k, d, fc)
        for i in range(n1):
            J[i, j] = fc[i].imag / eps


def _attempt(ya, hh, rtol, kinds, V, A, H, log_ts, k, d, ta, tc, tb, gamma, y_new):
    r"""One RODAS4 step of size ``hh`` from ``ya`` into ``y_new``; its error norm.

    :math:`\mathrm{err} = \mathrm{rms}(U_6/(\mathrm{rtol}\max(1, |y|, |y_{new}|)))`, infinite
    where :math:`W` is singular or a stage is not finite.
    """
    n1 = ya.size
    J = np.empty((n1, n1))
    _jacobian(ya, kinds, V, A, H, log_ts, k, d, J)
    W = -J
    for i in range(n1):
        W[i, i] += 1.0 / (gamma * hh)
    perm = np.empty(n1, dtype=np.int64)
    if not _lu(W, perm):
        return np.inf
    U = np.zeros((6, n1))
    Ys = np.empty(n1)
    rhs = np.empty(n1)
    hinv = 1.0 / hh
    for s in range(6):
        for i in range(n1):
            acc = ya[i]
            cc = 0.0
            for j in range(s):
                acc += ta[s, j] * U[j, i]
                cc += tc[s, j] * U[j, i]
            Ys[i] = acc
            rhs[i] = cc * hinv
        _field(Ys, kinds, V, A, H, log_ts, k, d, U[s])
        for i in range(n1):
            U[s, i] += rhs[i]
        _lu_solve(W, perm, U[s])
    ssum = 0.0
    for i in range(n1):
        acc = ya[i]
        for j in range(6):
            acc += tb[j] * U[j, i]
        y_new[i] = acc
        if not np.isfinite(acc):
            return np.inf
        sc = rtol * max(1.0, max(abs(ya[i]), abs(acc)))
        ssum += (U[5, i] / sc) ** 2
    err = np.sqrt(ssum / n1)
    return err if np.isfinite(err) else np.inf


def _trace(ya, k, d):
    r""":math:`\operatorname{tr}\Sigma = \sum_{ij}(L^{-1})_{ij}^2e^{-\ell_i}`."""
    ell, _, Li, _ = _factors(ya, k, d)
    tr = 0.0
    for i in range(d):
        for j in range(d):
            tr += Li[i, j] ** 2 * np.exp(-ell[i])
    return tr


def _trajectory(y0, taus, rtol, kinds, V, A, H, log_ts, k, d, tr_max, max_steps, ta, tc,
                tb, gamma, rec):
    """The reference loop for one trajectory: steps, stop code and last log time."""
    ny = y0.size
    n1 = ny + 1
    nck = taus.size
    ya = np.empty(n1)
    ya[:ny] = y0
    ya[ny] = 0.0
    rec[0] = y0
    y_new = np.empty(n1)
    ck, steps, stop, h = 1, 0, 0, 1e-3
    while True:
        z = ya[ny]
        target = taus[ck]
        hh = min(h, target - z)
        land = hh >= target - z
        err = _attempt(ya, hh, rtol, kinds, V, A, H, log_ts, k, d, ta, tc, tb, gamma, y_new)
        acc = err <= 1.0
        if err == 0.0:
            fac = 6.0
        elif np.isfinite(err):
            fac = min(max(0.9 * err ** -0.25, 0.2), 6.0)
        else:
            fac = 0.2
        h_new = hh * fac
        done = False
        if acc:
            ya[:ny] = y_new[:ny]
            ya[ny] = z + hh
            steps += 1
            if land:
                ya[ny] = target
                rec[ck] = ya[:ny]
                ck += 1
                done = ck >= nck
            h = max(h_new, h if land else 0.0)
            tr = _trace(ya, k, d)
            if not tr <= tr_max:
                stop, done = 1, True
        else:
            h = h_new
        tiny = h < max(1e-12 * ya[ny], 1e-30)
        if tiny and not done:
            stop = 2
        many = steps >= max_steps
        if many and not done:
            stop = 3
        if done or tiny or many:
            return steps, stop, ya[ny]


def _drive(y0, taus, rtol, kinds, V, A, H, log_ts, k, tr_max, max_steps, ta, tc, tb, gamma,
           rec, steps, stop, t_last):
    """:func:`_trajectory` for every row (``prange``)."""
    nb = y0.shape[0]
    d = V.shape[-1]
    for b in prange(nb):
        s, c, z = _trajectory(y0[b], taus[b], rtol, kinds, V[b], A[b], H[b], log_ts[b], k, d,
                              tr_max[b], max_steps, ta, tc, tb, gamma, rec[b])
        steps[b] = s
        stop[b] = c
        t_last[b] = z


_HELPERS = ("_mm", "_factors", "_solve_plain", "_head_y", "_field", "_jacobian", "_lu",
            "_lu_solve", "_attempt", "_trace", "_trajectory")


@functools.cache
def _core():
    """The compiled driver (Numba, parallel over trajectories, cached on disk)."""
    import numba

    if "NUMBA_THREADING_LAYER" not in os.environ:
        numba.config.THREADING_LAYER = "forksafe"    # as closure._mixture_kernel (why there)
    g = globals()
    for name in _HELPERS:
        if not hasattr(g[name], "py_func"):
            g[name] = numba.njit(cache=True, error_model="numpy")(g[name])
    g["prange"] = numba.prange
    return numba.njit(cache=True, parallel=True, error_model="numpy")(_drive)


def integrate_log_time_compiled(kinds, V, A, H, ts, k, y0, taus, rtol, tr_max, max_steps):
    r"""RODAS4 in log time for every row (compiled, parallel): the states at the checkpoints.

    Parameters
    ----------
    kinds : tuple of str
        ``"bilinear"`` or ``"quadratic"`` per head.
    V, A, H : ndarray, shape (nb, heads, d, d)
        The heads in the frame :math:`[U_R, U_N]`.
    ts : ndarray, shape (nb,)
        Time scales :math:`t_s`.
    k : int
        :math:`\operatorname{rank}Q`.
    y0 : ndarray, shape (nb, ny)
        Initial states.
    taus : ndarray, shape (nb, nck)
        Checkpoints in log time, the first 0.
    rtol : float
        Tolerance per component.
    tr_max : ndarray, shape (nb,)
        Trace of :math:`\Sigma` that stops a row with ``"growth"``.
    max_steps : int
        Step cap.

    Returns
    -------
    rec : ndarray, shape (nb, nck, ny)
        States at the checkpoints (NaN where not reached).
    steps : ndarray of int
    stop : ndarray of object
        ``""``, ``"growth"``, ``"step"`` or ``"steps"``.
    t_last : ndarray
        Last log time reached.
    """
    nb, ny = y0.shape
    rec = np.full((nb, taus.shape[1], ny), np.nan)
    steps = np.zeros(nb, dtype=np.int64)
    stop = np.zeros(nb, dtype=np.int64)
    t_last = np.zeros(nb)
    code = np.array([0 if kd == "bilinear" else 1 for kd in kinds], dtype=np.int64)
    c = np.ascontiguousarray
    with np.errstate(all="ignore"):
        _core()(c(y0, float), c(taus, float), float(rtol), code, c(V, float), c(A, float),
                c(H, float), np.log(c(ts, float)), int(k), c(tr_max, float), int(max_steps),
                c(RODAS4.a), c(RODAS4.c), c(RODAS4.b), float(RODAS4.gamma), rec, steps, stop,
                t_last)
    return rec, steps, np.array([STOPS[s] for s in stop], dtype=object), t_last
