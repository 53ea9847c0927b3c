r"""One attempt of the published projected Euler scheme, compiled (docs/math.md 9.4).

:func:`attempt` runs one attempt of

.. math::

    r = F(\Sigma), \qquad \Sigma \leftarrow P(\Sigma + h\,r),

to its stop, as :func:`gaussian_pde.studies._published.reference_attempt` does with the
published expressions, but compiled by Numba (a plain Python function where Numba is
missing: the same numbers, about 500 times slower, with a warning). Two things differ from the
published expressions, both only in rounding:

* :math:`F` is evaluated in the low-rank form of
  :func:`~gaussian_pde.studies._published._row_constants`,
  :math:`F = c\,(W + W^T)`, :math:`W = VY^TN Y`, :math:`Y = Q\Sigma`,
  :math:`N = I` (softmax) or :math:`(I + 2YQ^T)^{-1}` (L2), which needs no
  :math:`d \times d` inverse;
* the projection :math:`P` (eigenvalues below zero replaced by :math:`10^{-14}`) is
  applied only where it can act, and as the rank-one corrections
  :math:`\Sigma + (10^{-14} - \lambda_i)u_iu_i^T` of the negative eigenpairs, which
  equal the published reconstruction :math:`U\max(\Lambda, 10^{-14})U^T`. Where it can
  act is decided, cheapest first:

  1. a lower bound :math:`\mu` of :math:`\lambda_{\min}`, lowered at each step by
     :math:`h\lVert r\rVert_F` (Weyl's inequality): while it is positive the matrix is
     positive definite and :math:`P` is the identity;
  2. else a Cholesky factorisation: where it succeeds :math:`P` is the identity again
     (every :data:`FULL_CHECK` such steps, :data:`FLOOR_CHECK` where the smallest
     eigenvalue sits at the floor, the eigendecomposition renews :math:`\mu`);
  3. else two steps of shifted inverse iteration from the last eigenvector of the
     smallest eigenvalue give :math:`(\lambda_1, u_1)`, :math:`\lambda_1 < 0`, and the
     corrected :math:`\Sigma + (10^{-14} - \lambda_1)u_1u_1^T` must pass the Cholesky
     test: it is a positive rank-one update of :math:`\Sigma`, so by interlacing
     :math:`\Sigma` had no other negative eigenvalue (with V random the Euler step leaves
     one :math:`O(h^2)` negative eigenvalue at the floor at almost every step);
  4. else the eigendecomposition (LAPACK, as published).

Where two eigenvalues sit at the floor together, step 3 can put the floor value
:math:`10^{-14}` on a combination of their eigenvectors: the iterate then differs from the
published one by about :math:`10^{-14}` in that plane, far below every threshold of the
protocol.
"""

import math
import warnings

import numpy as np

try:
    from numba import njit
except ImportError:             # pragma: no cover - numba is a dependency
    warnings.warn("numba is not installed: the published replay runs its compiled loop as "
                  "plain Python (the same numbers, about 500 times slower); "
                  "`pip install numba` restores the speed", RuntimeWarning, stacklevel=2)

    def njit(*args, **kwargs):
        """Without Numba the kernel runs as plain Python (slowly, same numbers)."""
        if args and callable(args[0]):
            return args[0]
        return lambda f: f

#: status codes returned by :func:`attempt`
CONVERGED, DIVERGED, MAX_ITER = 0, 1, 2
CLIP = 1e-14            # the published clipping value
MARGIN = 1e-12          # rounding margin of the eigenvalue bounds, relative to the largest
FULL_CHECK = 32         # steps with mu <= 0 between eigendecompositions,
FLOOR_CHECK = 256       # and where the smallest eigenvalue is at the floor


@njit(cache=True)
def _cholesky_ok(a, low, d):
    """Whether the symmetric ``a`` (``d x d``) has a Cholesky factor; writes it to ``low``."""
    for j in range(d):
        acc = a[j, j]
        for k in range(j):
            acc -= low[j, k] * low[j, k]
        if not acc > 0.0:
            return False
        piv = math.sqrt(acc)
        low[j, j] = piv
        for i in range(j + 1, d):
            acc = a[i, j]
            for k in range(j):
                acc -= low[i, k] * low[j, k]
            low[i, j] = acc / piv
    return True


@njit(cache=True)
def _field(s, q, qm, v, c, y, u, t, w, m):
    r"""``w = c V Y^T N Y`` for ``Y = Q s``; :math:`F = w + w^T`."""
    d = s.shape[0]
    rq = q.shape[0]
    for a in range(rq):
        for j in range(d):
            acc = 0.0
            for i in range(d):
                acc += q[a, i] * s[i, j]
            y[a, j] = acc
    for a in range(rq):                        # M = I + 2 Y Qm^T
        for b in range(rq):
            acc = 0.0
            for j in range(d):
                acc += y[a, j] * qm[b, j]
            m[a, b] = 2.0 * acc + (1.0 if a == b else 0.0)
    if rq == 1:                                 # m <- c M^-1
        m[0, 0] = c / m[0, 0]
    else:
        f = c / (m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0])
        m00 = m[0, 0]
        m[0, 0] = m[1, 1] * f
        m[1, 1] = m00 * f
        m[0, 1] = -m[0, 1] * f
        m[1, 0] = -m[1, 0] * f
    for i in range(d):                          # u = V Y^T
        for a in range(rq):
            acc = 0.0
            for j in range(d):
                acc += v[i, j] * y[a, j]
            u[i, a] = acc
    for i in range(d):                          # t = u (c M^-1)
        for b in range(rq):
            acc = 0.0
            for a in range(rq):
                acc += u[i, a] * m[a, b]
            t[i, b] = acc
    for i in range(d):                          # w = t Y
        for j in range(d):
            acc = 0.0
            for b in range(rq):
                acc += t[i, b] * y[b, j]
            w[i, j] = acc


@njit(cache=True)
def _clip_negative(sn, lam, vec, d):
    """The published projection from an eigendecomposition, as rank-one corrections."""
    for k in range(d):
        if lam[k] < 0.0:
            g = CLIP - lam[k]
            for i in range(d):
                for j in range(d):
                    sn[i, j] += g * vec[i, k] * vec[j, k]


@njit(cache=True)
def _solve_chol(low, b, z, d):
    """``z = (L L^T)^{-1} b`` for the Cholesky factor ``low``."""
    for i in range(d):
        acc = b[i]
        for k in range(i):
            acc -= low[i, k] * z[k]
        z[i] = acc / low[i, i]
    for i in range(d - 1, -1, -1):
        acc = z[i]
        for k in range(i + 1, d):
            acc -= low[k, i] * z[k]
        z[i] = acc / low[i, i]


@njit(cache=True)
def _normalise(z, out, d):
    nz = 0.0
    for i in range(d):
        nz += z[i] * z[i]
    nz = math.sqrt(nz)
    for i in range(d):
        out[i] = z[i] / nz


@njit(cache=True)
def _track(sn, ev, a, low, z, d):
    r"""Two steps of shifted inverse iteration for the smallest eigenpair from ``ev``.

    Solves :math:`(\Sigma - \sigma I)z = u` twice with one Cholesky factorisation,
    :math:`\sigma = u^T\Sigma u - 10^{-9}\operatorname{tr}\Sigma` (below the smallest
    eigenvalue when ``ev`` is close to its eigenvector, so the shifted matrix is positive
    definite; ``a`` is scratch). Each step shrinks the angle to the eigenvector by
    :math:`(\lambda_1 - \sigma)/(\lambda_2 - \sigma)`. Writes the unit ``z`` into ``ev``
    and returns :math:`\lambda_1 = z^T\Sigma z`, or NaN where the factorisation fails.
    """
    sig = 0.0
    tr = 0.0
    for i in range(d):
        tr += sn[i, i]
        acc = 0.0
        for j in range(d):
            acc += sn[i, j] * ev[j]
        sig += ev[i] * acc
    sig -= 1e-9 * tr
    for i in range(d):
        for j in range(d):
            a[i, j] = sn[i, j]
        a[i, i] -= sig
    if not _cholesky_ok(a, low, d):
        return math.nan
    _solve_chol(low, ev, z, d)
    _normalise(z, ev, d)
    _solve_chol(low, ev, z, d)
    _normalise(z, ev, d)
    lam1 = 0.0
    for i in range(d):
        acc = 0.0
        for j in range(d):
            acc += sn[i, j] * ev[j]
        lam1 += ev[i] * acc
    return lam1


@njit(cache=True)
def attempt(q, qm, v, c, s0, h, tol, max_iter, trace_max):
    r"""Run one attempt of the published scheme to its stop.

    Parameters
    ----------
    q, qm : ndarray, shape (r, d)
        ``Q`` and, for L2, ``Q`` again (zeros for softmax), ``r`` = 1 or 2.
    v : ndarray, shape (d, d)
        ``V``.
    c : float
        :math:`-1/\sqrt d` (softmax) or :math:`-2/\sqrt d` (L2).
    s0 : ndarray, shape (d, d)
        Initial covariance (not modified).
    h, tol, max_iter, trace_max : float, float, int, float
        Step, tolerance on :math:`\lVert r\rVert_F`, iteration cap, trace bound.

    Returns
    -------
    tuple
        ``(status, iteration, n2, n2_prev, n2_min, trace, s)``: the status code
        (:data:`CONVERGED`, :data:`DIVERGED` or :data:`MAX_ITER`), the stopping
        iteration (``max_iter`` for :data:`MAX_ITER`), :math:`\lVert r\rVert_F^2` at the
        stop, at the iteration before it and its minimum, the trace of the last update
        and the iterate the last :math:`r` was computed from (the counted one when
        converged). A non-finite trace counts as diverged.
    """
    d = s0.shape[0]
    rq = q.shape[0]
    s = s0.copy()
    sn = np.empty_like(s)
    y = np.empty((rq, d))
    u = np.empty((d, rq))
    t = np.empty((d, rq))
    w = np.empty((d, d))
    m = np.empty((rq, rq))
    low = np.zeros((d, d))
    ev = np.zeros(d)
    z = np.zeros(d)
    tol2 = tol * tol
    keep = np.empty_like(s)
    mu = -1.0                   # lower bound of lambda_min (-1: unknown)
    passed = 0                  # steps since the last eigendecomposition with mu <= 0
    interval = FULL_CHECK
    has_ev = False              # ev: the last eigenvector of the smallest eigenvalue
    n2 = math.nan
    prev = math.inf
    n2_min = math.inf
    tr = math.nan
    for it in range(max_iter):
        _field(s, q, qm, v, c, y, u, t, w, m)
        n2 = 0.0
        for i in range(d):
            for j in range(d):
                rij = w[i, j] + w[j, i]
                n2 += rij * rij
                sn[i, j] = s[i, j] + h * rij
        n2_min = min(n2_min, n2)
        if n2 < tol2:
            return CONVERGED, it, n2, prev, n2_min, tr, s
        mu -= h * math.sqrt(n2)
        full = False
        if not mu > 0.0:
            passed += 1
            if passed >= interval or not has_ev:
                full = True
            elif not _cholesky_ok(sn, low, d):
                # not positive definite: one negative eigenvalue, tracked?
                lam1 = _track(sn, ev, w, low, z, d)
                full = not lam1 < 0.0           # (also for NaN)
                if not full:
                    for i in range(d):
                        for j in range(d):
                            keep[i, j] = sn[i, j]
                    g = CLIP - lam1
                    for i in range(d):
                        for j in range(d):
                            sn[i, j] += g * ev[i] * ev[j]
                    # positive definite now: by interlacing no other eigenvalue was
                    # negative, and the correction is the published projection
                    if not _cholesky_ok(sn, low, d):
                        full = True
                        sn, keep = keep, sn
        tr = 0.0
        for i in range(d):
            tr += sn[i, i]
        if full and math.isfinite(tr):
            passed = 0
            lam, vec = np.linalg.eigh(sn)
            _clip_negative(sn, lam, vec, d)
            top = abs(lam[d - 1])
            mu = lam[0] - MARGIN * top
            # at the floor the bound stays below zero: renew it less often
            interval = FULL_CHECK if mu > 0.0 else FLOOR_CHECK
            has_ev = True
            for i in range(d):
                ev[i] = vec[i, 0]
            tr = 0.0
            for i in range(d):
                tr += sn[i, i]
        if not tr <= trace_max:
            return DIVERGED, it, n2, prev, n2_min, tr, s
        prev = n2
        s, sn = sn, s
    return MAX_ITER, max_iter, n2, prev, n2_min, tr, s
