r"""The engine's two steppers: DOP853 and RODAS4P2 attempts, their dense output, the step rule.

Plain Python over flat float64 arrays, compiled by the engine
(:func:`gaussian_pde.integrate._compiled_engine._core`) and called from its trajectory
loop. DOP853 takes SciPy's tableau, error norm and step-size rule (the coefficients of
:mod:`gaussian_pde._common.tableaux`) with Hairer's stiffness test
(:func:`_stiffness_counts`) and a second one for crawling at its stability limit
(:func:`_crawl_counts`); RODAS4P2 solves with :math:`W = I/(\gamma h) - J` by LU with
partial pivoting, :math:`J` the field's closed form where it holds, column-scaled
central differences otherwise (:func:`_jacobian`). ``fld`` and ``wk`` are the engine's
``Field`` (the kernels, the parameters, the shape) and ``Work`` (the scratch).
"""

from __future__ import annotations

import math

import numpy as np

from .._common.lu import lu_factor as _lu
from .._common.lu import lu_solve as _lu_solve
from .._common.tableaux import _RA, _RB, _RC, _RGAMMA, _RH, _WILD, MIN_FACTOR, SAFETY
from .._common.tableaux import DOP853 as _dop

_NS = _dop.N_STAGES
_A = np.ascontiguousarray(_dop.A)
_B = np.ascontiguousarray(_dop.B)
_E3 = np.ascontiguousarray(_dop.E3)
_E5 = np.ascontiguousarray(_dop.E5)
_D = np.ascontiguousarray(_dop.D)
_B2 = _B[None, :].copy()
_E53 = np.stack([_E5, _E3])


def _columns(C, last, keep=()):
    """Row ``r`` of ``C``'s nonzero columns below ``last[r]`` (``keep``: those kept besides).

    ``(cols, count)``: ``cols[r, :count[r]]`` in increasing order. :func:`_combine` sums
    over them only: a zero coefficient adds an exact zero to a sum that starts at +0 (so
    never holds -0), which leaves every bit as it is wherever the stages are finite.
    """
    cols = np.zeros(C.shape, dtype=np.int64)
    count = np.zeros(C.shape[0], dtype=np.int64)
    for r in range(C.shape[0]):
        js = [j for j in range(last[r]) if C[r, j] != 0 or j in keep]
        cols[r, :len(js)], count[r] = js, len(js)
    return cols, count


# DOP853's stages (the first nonfinite stage always meets a nonzero coefficient in the
# next one, so the step is rejected as before); the solution's weights and the error's
# keep every column, zero or not: a nonfinite stage makes the new state or the error
# nonfinite as it did (the error keeps f(y_new), the last).
_A_COLS = _columns(_A, range(_A.shape[0]))
_B_COLS = _columns(_B2, [_NS], keep=range(_NS))
_E_COLS = _columns(_E53, [_NS + 1] * 2, keep=(_NS,))
_D_COLS = _columns(_D, [16] * _D.shape[0])
_RA_ = np.ascontiguousarray(_RA)
_RB_ = np.ascontiguousarray(_RB)
_RC_ = np.ascontiguousarray(_RC)
_RH_ = np.ascontiguousarray(_RH)
_EPS = float(np.finfo(float).eps)
_EPS3 = _EPS ** (1.0 / 3.0)
#: :func:`_combine` runs along the rows of ``K`` from this state size on
_ROWS_FROM = 16
_STIFF_HLAMB, _STIFF_STEPS, _NONSTIFF_RESET = 6.1, 15, 6
#: the second stiffness test (:func:`_crawl_counts`): at least ``_CRAWL_STEPS`` of a block
#: of ``_CRAWL_BLOCK`` accepted explicit steps with :math:`h|\lambda| \ge` ``_CRAWL_HLAMB``
_CRAWL_HLAMB, _CRAWL_STEPS, _CRAWL_BLOCK = 2.0, 75, 100


def _finite(x):
    for v in x:
        if not math.isfinite(v):
            return False
    return True


def _copy(dst, src):
    """``dst[:] = src`` (1-D) as a loop: no temporary, so no allocation."""
    for i in range(src.size):
        dst[i] = src[i]


def _guard(Ys, ymax):
    """Zero a stage state that is not finite or wild; True where it was (reject the step)."""
    wild = 0
    for v in Ys:                      # a count, not an early exit: the loop vectorises
        wild += not abs(v) <= ymax    # (NaN too)
    if wild:
        Ys[:] = 0.0
        return True
    return False


def _jacobian(fld, y, wk):
    """The Jacobian into ``wk.J``; returns the evaluations it cost (1 closed form, else 2n)."""
    rhs, P, d, m, J, ws = fld.rhs, fld.P, fld.d, fld.m, wk.J, wk.ws
    if fld.jac(P, d, m, y, J, ws):
        return 1
    up, fu, fd, c = wk.tmp, wk.xa, wk.xb, wk.tmp2     # (c: the column norms, m <= n)
    n = d * m
    Z = y.reshape((d, m))
    shortest = np.inf
    for b in range(m):
        s = 0.0
        for i in range(d):
            s += Z[i, b] * Z[i, b]
        c[b] = math.sqrt(s)
        if c[b] > 0 and c[b] < shortest:
            shortest = c[b]
    if not math.isfinite(shortest):
        shortest = 1.0
    for j in range(n):
        b = j % m
        delta = _EPS3 * (c[b] if c[b] > 0 else shortest)
        _copy(up, y)
        up[j] = y[j] + delta
        rhs(P, d, m, up, fu, ws)
        hi = up[j]
        up[j] = y[j] - delta
        rhs(P, d, m, up, fd, ws)
        step = hi - up[j]
        for i in range(n):
            J[i, j] = (fu[i] - fd[i]) / step
    return 2 * n


# ----------------------------------------------------------------------------------------
# the two steppers and their dense output
# ----------------------------------------------------------------------------------------

def _combine(C, cols, r, K, out):
    """``out[i] = sum_j C[r, j] K[j, i]`` over the columns ``cols`` (``(index, count)``).

    Summed over ``j`` in increasing order (see :func:`_columns`). From
    :data:`_ROWS_FROM` entries on, the loop over ``i`` runs innermost, along the rows of
    ``K``, so that the compiler vectorises it; below, dot products, four entries at a
    time (faster for short rows; four sums in flight, where one would wait on each add).
    Both sum each entry in the same order: the same bits.
    """
    n = out.size
    idx, count = cols
    s = count[r]
    if n < _ROWS_FROM:
        i = 0
        while i + 4 <= n:       # four sums in flight: each add waits on its own sum only
            a0 = a1 = a2 = a3 = 0.0
            for q in range(s):
                j = idx[r, q]
                c = C[r, j]
                a0 += c * K[j, i]
                a1 += c * K[j, i + 1]
                a2 += c * K[j, i + 2]
                a3 += c * K[j, i + 3]
            out[i], out[i + 1], out[i + 2], out[i + 3] = a0, a1, a2, a3
            i += 4
        for p in range(i, n):
            acc = 0.0
            for q in range(s):
                j = idx[r, q]
                acc += C[r, j] * K[j, p]
            out[p] = acc
        return
    for i in range(n):
        out[i] = 0.0
    for q in range(s):
        j = idx[r, q]
        a = C[r, j]
        for i in range(n):
            out[i] += a * K[j, i]


def _dop_errors(y, ynew, K, atol, rtol, S):
    """The sums of DOP853's error norms and of its stiffness ratio (``S``: scratch).

    ``S[0]`` holds the last stage's state (from :func:`_dop_attempt`); the two error
    combinations of the stages (:func:`_combine`) go into ``S[1:3]``, then one pass.
    """
    n = y.size
    _combine(_E53, _E_COLS, 0, K, S[1])
    _combine(_E53, _E_COLS, 1, K, S[2])
    num = 0.0
    den = 0.0
    e5 = 0.0
    e3 = 0.0
    for i in range(n):
        ylast = S[0, i]
        num += (K[_NS, i] - K[_NS - 1, i]) ** 2
        den += (ynew[i] - ylast) ** 2
        sc = atol + max(abs(y[i]), abs(ynew[i])) * rtol
        e5 += (S[1, i] / sc) ** 2
        e3 += (S[2, i] / sc) ** 2
    return num, den, e5, e3


def _dop_attempt(fld, y, h, wk, atol, rtol):
    """One DOP853 step; ``K[0]`` holds ``f(y)``. Returns ``(err, hlamb)``; ``K[12] = f(ynew)``.

    The stages go into ``wk.K``, the step's end into ``wk.ynew``; ``wk.Kx`` is scratch.
    """
    rhs, P, d, m = fld.rhs, fld.P, fld.d, fld.m
    K, ynew, tmp, ws, S = wk.K, wk.ynew, wk.tmp, wk.ws, wk.Kx
    n = y.size
    top = 0.0
    for v in y:
        top = max(top, abs(v))
    ymax = _WILD * top
    bad = False
    for s in range(1, _NS):
        _combine(_A, _A_COLS, s, K, tmp)
        for i in range(n):
            tmp[i] = y[i] + tmp[i] * h
        if s == _NS - 1:        # the last stage's state: the stiffness test's
            _copy(S[0], tmp)
        bad |= _guard(tmp, ymax)
        rhs(P, d, m, tmp, K[s], ws)
    _combine(_B2, _B_COLS, 0, K, ynew)
    for i in range(n):
        ynew[i] = y[i] + h * ynew[i]
        tmp[i] = ynew[i]
    bad |= _guard(tmp, ymax)
    rhs(P, d, m, tmp, K[_NS], ws)
    num, den, e5, e3 = _dop_errors(y, ynew, K, atol, rtol, S)
    hlamb = h * math.sqrt(num / den) if den > 0 else 0.0
    denom = e5 + 0.01 * e3
    err = h * e5 / math.sqrt(denom * n) if denom > 0 else 0.0
    if bad or not math.isfinite(err):
        err = np.inf
    return err, hlamb


def _dop_dense(fld, y, h, wk):
    """DOP853's dense-output coefficients ``wk.F`` (7, n) of the step (three more stages)."""
    K, Kx, F, f, ynew, tmp = wk.K, wk.Kx, wk.F, wk.f, wk.ynew, wk.tmp
    n = y.size
    for s in range(_NS + 1):
        _copy(Kx[s], K[s])
    for s in range(_NS + 1, 16):
        _combine(_A, _A_COLS, s, Kx, tmp)
        for i in range(n):
            tmp[i] = y[i] + tmp[i] * h
        fld.rhs(fld.P, fld.d, fld.m, tmp, Kx[s], wk.ws)
    for r in range(4):
        _combine(_D, _D_COLS, r, Kx, F[3 + r])
        for i in range(n):
            F[3 + r, i] = h * F[3 + r, i]
    for i in range(n):
        dy = ynew[i] - y[i]
        F[0, i] = dy
        F[1, i] = h * f[i] - dy
        F[2, i] = 2 * dy - h * (K[_NS, i] + f[i])


def _dop_eval(F, y, x, out):
    n = y.size
    for i in range(n):
        v = 0.0
        for r in range(7):
            v += F[6 - r, i]
            v *= x if r % 2 == 0 else 1.0 - x
        out[i] = v + y[i]


def _ros_attempt(fld, y, h, wk, atol, rtol):
    """One RODAS4P2 step with the Jacobian ``wk.J``; returns the error norm (inf: reject)."""
    rhs, P, d, m = fld.rhs, fld.P, fld.d, fld.m
    J, W, piv, U, ynew, tmp, rr, ws = wk.J, wk.W, wk.piv, wk.U, wk.ynew, wk.tmp, wk.xa, wk.ws
    n = y.size
    top = 0.0
    for v in y:
        top = max(top, abs(v))
    ymax = _WILD * top
    g = 1.0 / (_RGAMMA * h)
    for i in range(n):
        for j in range(n):
            W[i, j] = -J[i, j]
        W[i, i] += g
    if not _lu(W, piv):
        return np.inf
    _copy(U[0], wk.f)
    _lu_solve(W, piv, U[0])
    bad = False
    for s in range(1, 6):
        for i in range(n):
            acc = 0.0
            for j in range(s):
                acc += _RA_[s, j] * U[j, i]
            tmp[i] = y[i] + acc
        bad |= _guard(tmp, ymax)
        rhs(P, d, m, tmp, rr, ws)
        for i in range(n):
            acc = 0.0
            for j in range(s):
                acc += _RC_[s, j] * U[j, i]
            U[s, i] = rr[i] + acc / h
        _lu_solve(W, piv, U[s])
    acc_e = 0.0
    for i in range(n):
        acc = 0.0
        for j in range(6):
            acc += _RB_[j] * U[j, i]
        ynew[i] = y[i] + acc
        sc = atol + max(abs(y[i]), abs(ynew[i])) * rtol
        acc_e += (U[5, i] / sc) ** 2
    err = math.sqrt(acc_e / n)
    if bad or not math.isfinite(err):
        err = np.inf
    return err


def _ros_eval(y, ynew, U, x, out):
    n = y.size
    for i in range(n):
        h1 = 0.0
        h2 = 0.0
        for j in range(6):
            h1 += _RH_[0, j] * U[j, i]
            h2 += _RH_[1, j] * U[j, i]
        out[i] = (1 - x) * y[i] + x * (ynew[i] + (1 - x) * (h1 + x * h2))


def _nmin(a, b):
    """``numpy.minimum`` of two floats (NaN propagates)."""
    if a != a or b != b:
        return np.nan
    return a if a <= b else b


def _initial_step(fld, y, wk, opt, err_exp):
    """Hairer, Norsett and Wanner II.4, as SciPy's ``select_initial_step``."""
    f, tmp, tmp2 = wk.f, wk.tmp, wk.tmp2
    atol, rtol, t0, t1 = opt.atol, opt.rtol, opt.t0, opt.t1
    n = y.size
    d0 = 0.0
    d1 = 0.0
    for i in range(n):
        sc = atol + abs(y[i]) * rtol
        d0 += (y[i] / sc) ** 2
        d1 += (f[i] / sc) ** 2
    d0 = math.sqrt(d0 / n)
    d1 = math.sqrt(d1 / n)
    h0 = 1e-6 if (d0 < 1e-5 or d1 < 1e-5) else 0.01 * d0 / max(d1, 1e-300)
    h0 = _nmin(h0, t1 - t0)
    for i in range(n):
        tmp[i] = y[i] + h0 * f[i]
    fld.rhs(fld.P, fld.d, fld.m, tmp, tmp2, wk.ws)
    d2 = 0.0
    for i in range(n):
        sc = atol + abs(y[i]) * rtol
        d2 += ((tmp2[i] - f[i]) / sc) ** 2
    d2 = math.sqrt(d2 / n) / h0
    if d1 <= 1e-15 and d2 <= 1e-15:
        h1 = max(1e-6, h0 * 1e-3)
    else:
        big = d1 if d1 >= d2 else d2
        if d2 != d2:
            big = d2
        h1 = (0.01 / max(big, 1e-300)) ** (-err_exp)
    return _nmin(_nmin(_nmin(100 * h0, h1), t1 - t0), opt.max_step)


def _next_step_size(h_abs, err, acc, rejected, err_exp, max_factor):
    r"""SciPy's step-size rule: the next :math:`|h|` after an attempt with error norm ``err``.

    Accepted: :math:`|h|\min(f_{\max}, 0.9\,\mathrm{err}^{e})` (no growth right after a
    rejection), rejected: :math:`|h|\max(0.2, 0.9\,\mathrm{err}^{e})`, with the exponent
    :math:`e` = ``err_exp`` and :math:`f_{\max}` = ``max_factor`` (``SAFETY`` and
    ``MIN_FACTOR`` of :mod:`gaussian_pde._common.tableaux`).
    """
    if err == 0:
        fac = max_factor
    else:
        fac = min(max_factor, SAFETY * (err if err > 0 else 1.0) ** err_exp)
    if acc:
        h_abs *= min(1.0, fac) if rejected else fac
    else:
        e = err if (math.isfinite(err) and err > 0) else 1e300
        h_abs *= max(MIN_FACTOR, SAFETY * e ** err_exp)
    return h_abs


def _stiffness_counts(acc, hlamb, iasti, nonsti):
    r"""Hairer's stiffness test after an explicit step: the updated ``(iasti, nonsti)``.

    An accepted step with :math:`h|\lambda| > 6.1` counts towards stiffness (the test
    fires at ``_STIFF_STEPS`` of them), any other accepted step towards non-stiffness;
    ``_NONSTIFF_RESET`` of those in a row clear the count (``dop853.f``).
    """
    if acc:
        if hlamb > _STIFF_HLAMB:
            iasti += 1
            nonsti = 0
        else:
            nonsti += 1
    if nonsti >= _NONSTIFF_RESET:
        iasti = 0
    return iasti, nonsti


def _crawl_counts(acc, hlamb, block, crawl):
    r"""The second stiffness test after an explicit step: ``(block, crawl, fired)``.

    DOP853 can crawl at its stability limit while the estimate of Hairer's test stays
    below 6.1 (:math:`h|\lambda|` of 1.5 to 3.3 on thousands of steps, where the stiff
    eigenvalue is :math:`10^5` times the growth rate). Accepted steps are counted in
    blocks of ``_CRAWL_BLOCK``; the test fires at the end of a block with at least
    ``_CRAWL_STEPS`` steps of :math:`h|\lambda| \ge` ``_CRAWL_HLAMB``. The engine's
    trajectory loop switches on it only where the field's Jacobian has a closed form
    there: with central differences a Rosenbrock step costs :math:`2n + 6` evaluations,
    more than such crawling saves.
    """
    fired = False
    if acc:
        block += 1
        if hlamb >= _CRAWL_HLAMB:
            crawl += 1
        if block >= _CRAWL_BLOCK:
            fired = crawl >= _CRAWL_STEPS
            block, crawl = 0, 0
    return block, crawl, fired


