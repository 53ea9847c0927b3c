r"""Replay of the published rank histograms, number for number (docs/math.md section 9).

The published script draws its settings and initial covariances from NumPy's legacy
generator and integrates each attempt with projected explicit Euler,

.. math::

    r = F(\Sigma), \qquad \Sigma \leftarrow P(\Sigma + h\,r),

where :math:`P` takes the eigendecomposition and replaces the negative eigenvalues by
:math:`10^{-14}`. An attempt converges when :math:`\lVert r\rVert_F < \mathrm{tol}`
(``r`` computed before the update), fails when :math:`\operatorname{tr}\Sigma > 10^3`
after the update or after ``max_iter`` iterations, and its rank is the number of
eigenvalues above 0.1 of the iterate ``r`` was computed from. The right-hand sides use
:math:`A = K^TQ/\sqrt d` with :math:`K = -Q`:

.. math::

    F_{\mathrm{softmax}}(S) = VSAS + (VSAS)^T, \qquad
    F_{L2}(S) = W + W^T,\quad W = 2VS(I + 2K^TKS)^{-1}AS .

Each attempt of a panel draws the next :math:`\Sigma_0 = GG^T` from the stream seeded
with 41, so the draw a setting gets depends on how many attempts failed before it. The
replay keeps that sequential order exactly while stepping many attempts at once: the
draws are made ahead (the stream is deterministic), and *speculative* pairs (setting
``i``, draw ``k``) are stepped together. The sequential path starts at ``(0, 0)`` and
goes to ``(i + 1, k + 1)`` after a converged attempt and to ``(i, k + 1)`` after a failed
one; each panel estimates the probability that the path visits each pair (from the
failure rate of its finished attempts, conditioned on how long a running one has
survived, and from 4,096 iterations on a forecast from the running attempt's own
residual, :meth:`_Panel.observe`), steps the most probable ones, pauses the others
(their state is kept) and drops the unreachable ones. The result is the sequential protocol itself, whatever the
speculation.

The attempts of all panels share one stack (``d < 5`` padded to 5), so one Python-level
step serves all of them. The scheme is the published one up to rounding: :math:`F` in
the low-rank form of :func:`_row_constants` (no inverse), and the projection :math:`P`
only where it can act (see :class:`_Engine`: a Weyl bound on the smallest eigenvalue,
a positive-definiteness test by elimination, the eigendecomposition where an eigenvalue
is negative, and a tracked eigenpair for rows whose smallest eigenvalue sits at the
clipping floor). The loop (:func:`reference_attempt`) keeps the published expressions;
the tests check that both agree on status, rank and stop iteration, except within 1% of
a decision boundary, and the details record how many attempts and settings lie there.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

__all__ = [
    "PANELS",
    "published_histograms",
    "published_settings",
    "reference_attempt",
    "write_published_histograms",
]

#: Parameters per panel (docs/math.md 9.5): steps for d = 3, 4, 5, tol, max_iter, n_max.
PANELS = {
    ("softmax", "identity"): {"h": (0.09, 0.05, 0.02), "tol": 1e-4, "max_iter": 60000,
                              "n_max": 1000},
    ("softmax", "random"): {"h": (0.09, 0.06, 0.02), "tol": 5e-5, "max_iter": 90000,
                            "n_max": 10000},
    ("l2", "identity"): {"h": (0.09, 0.06, 0.02), "tol": 1e-4, "max_iter": 60000,
                         "n_max": 1000},
    ("l2", "random"): {"h": (0.15, 0.15, 0.15), "tol": 5e-5, "max_iter": 50000,
                       "n_max": 1000},
}
DIMENSIONS = (3, 4, 5)
N_PER_DIM = 100
SEED_Q = 40
SEED_V = {"softmax": 26, "l2": 27}
SEED_SIGMA0 = 41
CLIP = 1e-14
TRACE_MAX = 1e3
RANK_THRESHOLD = 0.1
NEAR = 0.01          # "within 1%" of a decision boundary
_MARGIN = 1e-12      # rounding margin of the eigenvalue bounds, relative to the largest
_SEP = 1e-2          # floor rows: smallest eigenvalue below this fraction of the next,
_EXIT = 0.2          # and back to the full check above this fraction of its bound
_FULL_CHECK = 32     # rows at risk get the eigendecomposition every this many steps
_TRACK = 1e-3        # floor rows are tracked while h |r| < this times the second bound
_GAP = 1e-6          # floor rows need the second eigenvalue above this (relative)
#: the residual's forecast (_Panel.observe) orders the speculation from this iteration on:
#: a forecast below _FORECAST_CONVERGE times max_iter counts as converging, one above
#: _FORECAST_FAIL as failing, with the failure probabilities _FORECAST_PF. Calibrated on
#: the softmax V-random d = 5 panel's path (at 4,096 iterations: 75 of 83 attempts
#: forecast to converge did, 27 of 37 forecast to fail did; at 1,024 only 70 of 83 and
#: 21 of 42)
_FORECAST_FROM = 4096
_FORECAST_CONVERGE, _FORECAST_FAIL = 0.8, 1.5
_FORECAST_PF = (0.1, 0.75)


def published_settings(kind):
    r"""The published settings of one attention type, in the published draw order.

    Seed 40, then ``Q = randn(d // 2, d)`` for 100 settings of each ``d = 3, 4, 5``;
    seed 26 (softmax) or 27 (L2), then ``R = randn(d, d)`` in the same order and
    :math:`V = R^TR`.

    Returns
    -------
    dict
        ``{d: (Qs, Vs)}``, lists of 100 float64 arrays each.
    """
    rep = np.repeat(DIMENSIONS, N_PER_DIM)
    rs = np.random.RandomState(SEED_Q)
    qs = [rs.randn(d // 2, d) for d in rep]
    rs = np.random.RandomState(SEED_V[kind])
    rr = [rs.randn(d, d) for d in rep]
    vs = [np.dot(r.T, r) for r in rr]
    out = {}
    for j, d in enumerate(DIMENSIONS):
        sl = slice(N_PER_DIM * j, N_PER_DIM * (j + 1))
        out[int(d)] = (qs[sl], vs[sl])
    return out


def _constants(kind, q, v, d):
    """Per-setting constants, computed with the published 2-D expressions."""
    k = -q
    a = np.dot(k.T, q) / np.sqrt(d)
    if kind == "softmax":
        return v, a, None
    kk = np.dot(k.T, k)
    return 2 * v, a, 2 * kk


def _sigma0_draws(d, n):
    r"""The first ``n`` initial covariances :math:`\Sigma_0 = GG^T` after seed 41."""
    rs = np.random.RandomState(SEED_SIGMA0)
    out = np.empty((n, d, d))
    for k in range(n):
        g = rs.randn(d, d)
        out[k] = g @ g.T
    return out


def _rhs(kind, s, v, a, kk2):
    """Batched right-hand side (9.4); ``v`` is ``2V`` and ``kk2`` is ``2K^TK`` for L2."""
    if kind == "softmax":
        w = np.matmul(np.matmul(v, s), np.matmul(a, s))
    else:
        d = s.shape[-1]
        inv = np.linalg.inv(np.eye(d) + np.matmul(kk2, s))
        w = np.matmul(np.matmul(np.matmul(np.matmul(v, s), inv), a), s)
    return w + np.swapaxes(w, -1, -2)


def _project(s):
    """Batched projection: eigenvalues below zero replaced by 1e-14."""
    w, u = np.linalg.eigh(s)
    w[w < 0] = CLIP
    return np.matmul(u, w[..., :, None] * np.swapaxes(u, -1, -2))


def reference_attempt(kind, q, v, sigma0, h, tol, max_iter):
    r"""One attempt of the published scheme, step by step (the reference loop).

    Parameters
    ----------
    kind : {"softmax", "l2"}
        Attention type.
    q, v : ndarray
        ``Q`` (shape ``(d // 2, d)``) and ``V`` (``(d, d)``); ``K = -Q``.
    sigma0 : ndarray
        Initial covariance.
    h, tol, max_iter : float, float, int
        Step, tolerance on :math:`\lVert r\rVert_F` and iteration cap.

    Returns
    -------
    dict
        ``status`` ("converged", "diverged" or "max_iter"), ``iterations`` (index of the
        stopping iteration, or ``max_iter``), ``rank`` (converged only, else ``None``),
        ``eigenvalues`` of the counted iterate and ``norm`` of the last ``r``.
    """
    d = q.shape[1]
    vv, a, kk2 = _constants(kind, q, v, d)
    s = sigma0.copy()
    nrm = math.nan
    for i in range(max_iter):
        if kind == "softmax":
            w = np.dot(np.dot(vv, s), np.dot(a, s))
        else:
            inv = np.linalg.inv(np.eye(d) + np.dot(kk2, s))
            w = np.dot(np.dot(np.dot(np.dot(vv, s), inv), a), s)
        r = w + w.T
        nrm = float(np.linalg.norm(r))
        s_new = s + h * r
        lam, u = np.linalg.eigh(s_new)
        lam[lam < 0] = CLIP
        s_new = np.dot(u, np.dot(np.diag(lam), u.T))
        if nrm < tol:
            eig = np.linalg.eigvalsh(s)
            return {"status": "converged", "iterations": i, "norm": nrm,
                    "rank": int(np.sum(eig > RANK_THRESHOLD)), "eigenvalues": eig}
        if np.trace(s_new) > TRACE_MAX:
            return {"status": "diverged", "iterations": i, "norm": nrm, "rank": None,
                    "eigenvalues": None}
        s = s_new
    return {"status": "max_iter", "iterations": max_iter, "norm": nrm, "rank": None,
            "eigenvalues": None}


def step_seconds(n=2000, repeat=3):
    """Seconds per step of the published scheme: one d = 5 softmax trajectory, never stopping.

    The best of ``repeat`` runs of ``n`` steps: load on a shared machine only slows a run.
    """
    qs, _ = published_settings("softmax")[5]
    s0 = _sigma0_draws(5, 1)[0]
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        reference_attempt("softmax", qs[0], np.eye(5), s0, 0.02, 0.0, n)
        best = min(best, (time.perf_counter() - t) / n)
    return best


# ---------------------------------------------------------------------------------------
# The batched scheme.  Every attempt is a row of a stack in the layout (5, 5, N): the
# matrices of d < 5 are padded, Sigma with an identity block, Q and V with zeros, so
# the rows of all twelve panels share one stack and one Python-level step.
# ---------------------------------------------------------------------------------------

_DP = 5      # padded dimension
_RP = 2      # padded rank of Q


def _row_constants(kind, q, v, d):
    r"""Padded constants of one setting for the low-rank form of :math:`F`.

    With :math:`Y = QS` (:math:`r \times d`, :math:`r = d // 2`) and :math:`K = -Q`,

    .. math::

        VSAS = -\tfrac{1}{\sqrt d}\,VY^TY, \qquad
        2VS(I + 2K^TKS)^{-1}AS = -\tfrac{2}{\sqrt d}\,VY^T M^{-1} Y,
        \quad M = I_r + 2YQ^T,

    (push-through: :math:`S(I + 2Q^TQS)^{-1}Q^T = Y^TM^{-1}`), so
    :math:`F(S) = c\,(VY^TNY + (VY^TNY)^T)` with :math:`N = I` (softmax) or
    :math:`M^{-1}` (L2). Returns ``(Q, Qm, V, c)``: ``Qm`` is ``Q`` for L2 and zero for
    softmax, so that :math:`M = I + 2YQ_m^T` is the identity there.
    """
    qp = np.zeros((_RP, _DP))
    qp[:q.shape[0], :d] = q
    vp = np.zeros((_DP, _DP))
    vp[:d, :d] = v
    if kind == "softmax":
        return qp, np.zeros_like(qp), vp, -1.0 / math.sqrt(d)
    return qp, qp.copy(), vp, -2.0 / math.sqrt(d)


_SIGN22 = np.array([[1.0, -1.0], [-1.0, 1.0]])[..., None]


def _fast_rhs(s, q, qm, v, c):
    r"""Batched :math:`F(S)` in the low-rank form of :func:`_row_constants`.

    Arrays in the layout ``(..., N)``: ``s`` and ``v`` are ``(5, 5, N)``, ``q`` and
    ``qm`` ``(2, 5, N)``, ``c`` ``(N,)``. With :math:`M = I + 2YQ_m^T` (2 x 2),
    :math:`cM^{-1} = c\,\mathrm{adj}(M)/\det M` and
    :math:`W = VY^T(cM^{-1})Y`, :math:`F = W + W^T`. Equal to the published
    expressions up to rounding.
    """
    y = np.einsum("aiN,ijN->ajN", q, s)                    # Y = QS
    m = np.einsum("ajN,bjN->abN", y, qm)
    m *= 2.0
    m[0, 0] += 1.0
    m[1, 1] += 1.0                                         # M = I + 2 Y Qm^T
    det = m[0, 0] * m[1, 1] - m[0, 1] * m[1, 0]
    nm = m[::-1, ::-1] * (_SIGN22 * (c / det))              # c M^-1
    u = np.einsum("ijN,ajN->iaN", v, y)                    # V Y^T
    t = np.einsum("iaN,abN->ibN", u, nm)
    w = np.einsum("ibN,bjN->ijN", t, y)
    return w + np.ascontiguousarray(w.transpose(1, 0, 2))    # (a strided add is slow)


def _positive_definite(a):
    """Rows of a ``(5, 5, n)`` stack whose symmetric-elimination pivots are all > 0.

    These are the pivots of the Cholesky factorisation; a NaN pivot counts as failure.
    """
    low = a[0, 0]
    for _ in range(a.shape[0] - 1):
        col = a[1:, 0] / a[0, 0]
        a = a[1:, 1:] - col[:, None] * a[0, 1:][None]
        low = np.minimum(low, a[0, 0])
    return low > 0.0


class _Panel:
    """One panel's sequential path: frontier, finished and paused attempts, statistics."""

    def __init__(self, index, kind, val, d, qs, vs, h, tol, max_iter, n_max, n_settings,
                 width, label):
        self.index, self.kind, self.val, self.d = index, kind, val, d
        self.h, self.tol, self.max_iter, self.n_max = h, tol, max_iter, n_max
        self.n_settings, self.width, self.label = n_settings, width, label
        self.consts = [_row_constants(kind, q, v, d) for q, v in zip(qs, vs)]
        self.draws = _sigma0_draws(d, n_max)
        self.i = self.k = self.n_fail = 0
        self.path = []
        self.finished = {}          # (setting, draw) -> record, not yet on the path
        self.paused = {}            # (setting, draw) -> row state (_Engine._state)
        self.stops = {True: [], False: []}     # stop iterations of failed / converged
        self.sorted = None
        self.marks = {}             # (setting, draw) -> (iteration, |r|^2) of a running one
        self.hints = {}             # (setting, draw) -> its residual's forecast (observe)
        self.done = n_settings == 0
        self.batched_steps = 0
        self.traj_steps = 0

    def reachable(self, key):
        return key[0] >= self.i and key[1] - key[0] >= self.k - self.i

    def add_finished(self, key, rec):
        self.stops[rec["status"] != "converged"].append(rec["stop_iteration"])
        self.sorted = None
        if self.reachable(key):
            self.finished[key] = rec
        return self.advance()

    def advance(self):
        """Move the frontier along the finished attempts; True when it moved."""
        moved = False
        while not self.done and (self.i, self.k) in self.finished:
            rec = self.finished.pop((self.i, self.k))
            rec.update(setting=self.i, draw=self.k)
            self.path.append(rec)
            if rec["status"] == "converged":
                self.i += 1
            else:
                self.n_fail += 1
            self.k += 1
            moved = True
            if self.i >= self.n_settings or self.k >= self.n_max:
                self.done = True
        if moved:
            for key in [key for key in self.finished if not self.reachable(key)]:
                del self.finished[key]
            for key in [key for key in self.paused if not self.reachable(key)]:
                del self.paused[key]
        return moved

    def observe(self, key, it, n2):
        r"""Forecast from the residual of a running attempt whether it reaches ``tol``.

        A power law :math:`\lVert r\rVert \propto m^{-p}` through the residual at a
        mark :math:`m_0` and now (:math:`m \ge 1.5\,m_0`; the mark moves when the
        iteration count doubles) gives the iteration at which it would reach ``tol``,
        :math:`m\,(\lVert r\rVert/\mathrm{tol})^{1/p}`; ``hints[key]`` is that over
        ``max_iter``. The forecast only orders the speculation (:meth:`plan`): the path
        is the sequential protocol whatever it says.
        """
        if it < _FORECAST_FROM or not (n2 > 0.0 and math.isfinite(n2)):
            return
        mark = self.marks.get(key)
        if mark is None:
            self.marks[key] = (it, n2)
            return
        m0, r0 = mark
        if it < 1.5 * m0:
            return
        p = 0.5 * math.log(r0 / n2) / math.log(it / m0)
        r = math.sqrt(n2)
        if r <= self.tol:
            q = it / self.max_iter
        elif p > 0.0:
            # in logarithms: a slow decay (p -> 0) forecasts far past max_iter
            log_q = math.log(it / self.max_iter) + math.log(r / self.tol) / p
            q = math.exp(log_q) if log_q < 700.0 else math.inf
        else:
            q = math.inf
        self.hints[key] = q
        if it >= 2 * m0:
            self.marks[key] = (it, n2)

    def _hinted(self, key, pf):
        """``pf`` sharpened by the forecast of :meth:`observe`, where there is one."""
        q = self.hints.get(key)
        if q is None:
            return pf
        if q <= _FORECAST_CONVERGE:
            return _FORECAST_PF[0]
        if q >= _FORECAST_FAIL:
            return _FORECAST_PF[1]
        return pf

    def _fail_model(self):
        """``pf(m)``: probability that an attempt alive after ``m`` iterations fails."""
        if self.sorted is None:
            self.sorted = (np.sort(self.stops[True]), np.sort(self.stops[False]))
        fs, cs = self.sorted
        p0 = (len(fs) + 0.5) / (len(fs) + len(cs) + 1.0)

        def pf(m):
            if m == 0:
                return p0
            nf = len(fs) - np.searchsorted(fs, m)
            nc = len(cs) - np.searchsorted(cs, m)
            return (nf + 2.0 * p0) / (nf + nc + 2.0)
        return pf

    def plan(self, alive, p_min, depth=4000):
        r"""The unfinished attempts to step, most probable first.

        The probability that the sequential path visits ``(i + j, k + n)`` follows from
        the frontier ``(i, k)`` (probability one) by
        :math:`P_{n+1}(j+1) \mathrel{+}= P_n(j)(1 - p_f)` and
        :math:`P_{n+1}(j) \mathrel{+}= P_n(j)p_f`, with :math:`p_f` 0 or 1 for finished
        attempts and :func:`_fail_model` of the iterations done otherwise. ``alive`` maps
        running attempts to their iteration count.
        """
        if self.done:
            return []
        pf_of = self._fail_model()
        cache = {}
        probs = {0: 1.0}
        cands = []
        n = 0
        prune = p_min / 5.0
        while probs and n < depth and self.k + n < self.n_max \
                and max(probs.values()) >= p_min / 2.0:
            nxt = {}
            for j, q in probs.items():
                key = (self.i + j, self.k + n)
                rec = self.finished.get(key)
                if rec is not None:
                    pf = 0.0 if rec["status"] == "converged" else 1.0
                else:
                    m = alive.get(key)
                    if m is None:
                        m = self.paused[key][2] if key in self.paused else 0
                    pf = cache.get(m)
                    if pf is None:
                        pf = cache[m] = pf_of(m)
                    pf = self._hinted(key, pf)
                    cands.append((q, key))
                qc, qf = q * (1.0 - pf), q * pf
                if qc >= prune and key[0] + 1 < self.n_settings:
                    nxt[j + 1] = nxt.get(j + 1, 0.0) + qc
                if qf >= prune:
                    nxt[j] = nxt.get(j, 0.0) + qf
            probs = nxt
            n += 1
        cands.sort(key=lambda c: -c[0])
        return [key for q, key in cands[:self.width] if q >= p_min or key == (self.i, self.k)]


class _Engine:
    r"""Rows of all panels stepped together; the scheduler keeps the probable ones active.

    The projection :math:`P` is the identity on positive semi-definite matrices. Each row
    carries a lower bound :math:`\mu` of :math:`\lambda_{\min}(\Sigma)`; by Weyl's
    inequality :math:`\lambda_{\min}(\Sigma + hr) \ge \mu - h\lVert r\rVert_F`, so the
    bound is lowered by :math:`h\lVert r\rVert_F` at each step, and only rows whose bound
    reaches zero get the eigendecomposition (and, where an eigenvalue is negative, the
    published projection), which resets the bound to the smallest eigenvalue less a
    rounding margin.

    A row whose smallest eigenvalue sits at the clipping floor (the projection acts at
    every step there: the Euler step leaves an :math:`O(h^2)` negative eigenvalue when
    :math:`V \ne I`) is a *floor row*: its eigenpair :math:`(\lambda_1, u)` is followed by
    one step of shifted inverse iteration from the previous :math:`u` (the other
    eigenvalues are bounded below by :math:`\mu_2`, lowered like :math:`\mu`), and the
    published projection is the rank-one correction
    :math:`\Sigma + (10^{-14} - \lambda_1)uu^T` when :math:`\lambda_1 < 0`.
    """

    _ROW_ARRAYS = ("c", "h", "tol2", "minr", "prev", "mu", "mu2", "trlim", "start", "end",
                   "pid", "dim", "floor")
    _MAT_ARRAYS = ("s", "u", "q", "qm", "v")
    _INT_ARRAYS = ("start", "end", "pid", "dim")

    def __init__(self, panels, p_min=0.05, replan=512):
        self.panels = panels
        self.p_min, self.replan = p_min, replan
        self.t = 0
        self.ids = []
        self.active = [set() for _ in panels]
        self.s = np.empty((_DP, _DP, 0))
        self.u = np.empty((_DP, 0))
        self.q = np.empty((_RP, _DP, 0))
        self.qm = np.empty((_RP, _DP, 0))
        self.v = np.empty((_DP, _DP, 0))
        for name in self._ROW_ARRAYS:
            setattr(self, name, np.empty(0, dtype=np.int64 if name in self._INT_ARRAYS
                                         else bool if name == "floor" else float))
        self.next_cap = 0
        self.t_flush = 0
        self.eigh_rows = 0
        self.eigh_calls = 0
        self.plans = 0
        self.floor_steps = 0
        self.floor_idx = np.empty(0, dtype=np.int64)

    # -- bookkeeping ------------------------------------------------------------------
    def _flush(self):
        """Credit the trajectory steps since the last change of rows to their panels."""
        dt = self.t - self.t_flush
        if dt and len(self.ids):
            counts = np.bincount(self.pid, minlength=len(self.panels))
            for p, cnt in zip(self.panels, counts):
                p.traj_steps += int(cnt) * dt
        self.t_flush = self.t

    def _changed(self):
        self.next_cap = int(self.end.min()) if len(self.ids) else 0
        self.floor_idx = np.flatnonzero(self.floor)

    def _take(self, idx):
        self._flush()
        for name in self._MAT_ARRAYS:        # (indexing the last axis is not C-ordered)
            setattr(self, name, np.ascontiguousarray(getattr(self, name)[..., idx]))
        for name in self._ROW_ARRAYS:
            setattr(self, name, getattr(self, name)[idx])
        self.ids = [self.ids[m] for m in idx]
        self._changed()

    def _append(self, rows):
        """Add rows ``(panel, key, state)``, ``state`` as :meth:`_state` gives it."""
        if not rows:
            return
        self._flush()
        n = len(rows)
        mats = {name: np.empty(getattr(self, name).shape[:-1] + (n,))
                for name in self._MAT_ARRAYS}
        vec = {name: np.empty(n, dtype=getattr(self, name).dtype) for name in self._ROW_ARRAYS}
        for m, (p, key, (s, u, it, minr, prev, mu, mu2, floor)) in enumerate(rows):
            qp, qm, vp, c = p.consts[key[0]]
            mats["s"][..., m], mats["u"][..., m], mats["q"][..., m] = s, u, qp
            mats["qm"][..., m], mats["v"][..., m] = qm, vp
            vec["c"][m], vec["h"][m], vec["tol2"][m] = c, p.h, p.tol * p.tol
            vec["minr"][m], vec["prev"][m], vec["mu"][m] = minr, prev, mu
            vec["mu2"][m], vec["floor"][m] = mu2, floor
            vec["trlim"][m] = TRACE_MAX + (_DP - p.d)       # the padding adds 5 - d
            vec["start"][m] = self.t - it
            vec["end"][m] = self.t - it + p.max_iter - 1
            vec["pid"][m] = p.index
            vec["dim"][m] = p.d
            self.ids.append((p.index, key))
            self.active[p.index].add(key)
        for name in self._MAT_ARRAYS:
            setattr(self, name, np.concatenate([getattr(self, name), mats[name]], axis=-1))
        for name in self._ROW_ARRAYS:
            setattr(self, name, np.concatenate([getattr(self, name), vec[name]]))
        self._changed()

    def _fresh(self, p, key):
        s = np.eye(_DP)
        s[:p.d, :p.d] = p.draws[key[1]]
        return (p, key, (s, np.zeros(_DP), 0, np.inf, np.inf, -1.0, -1.0, False))

    def _state(self, m):
        return (self.s[..., m].copy(), self.u[:, m].copy(), self.t - int(self.start[m]),
                self.minr[m], self.prev[m], self.mu[m], self.mu2[m], bool(self.floor[m]))

    def schedule(self, which):
        """Re-plan the panels in ``which``: pause, drop or start rows accordingly."""
        self.plans += len(which)
        alive = {}
        for m, (pi, key) in enumerate(self.ids):
            if pi in which:
                it = self.t - int(self.start[m])
                alive.setdefault(pi, {})[key] = it
                self.panels[pi].observe(key, it, float(self.prev[m]))
        want = {pi: set(self.panels[pi].plan(alive.get(pi, {}), self.p_min)) for pi in which}
        keep = []
        for m, (pi, key) in enumerate(self.ids):
            if pi not in which or key in want[pi]:
                keep.append(m)
                if pi in which:
                    want[pi].discard(key)
                continue
            p = self.panels[pi]
            self.active[pi].discard(key)
            if not p.done and p.reachable(key):
                p.paused[key] = self._state(m)
        if len(keep) < len(self.ids):
            self._take(np.array(keep, dtype=np.int64))
        rows = []
        for pi in sorted(want):
            p = self.panels[pi]
            for key in sorted(want[pi]):
                st = p.paused.pop(key, None)
                rows.append(self._fresh(p, key) if st is None else (p, key, st))
        self._append(rows)

    # -- one step ---------------------------------------------------------------------
    def step(self):
        """One projected Euler step of every row; returns the finished rows' records."""
        s = self.s
        r = _fast_rhs(s, self.q, self.qm, self.v, self.c)
        n2 = np.einsum("ijN,ijN->N", r, r)
        r *= self.h
        r += s
        s_new = r
        hn = np.sqrt(n2) * self.h
        self.mu -= hn
        risk = self.mu <= 0.0
        full = self._floor_rows(s_new, hn) if len(self.floor_idx) else None
        if risk.any() or (full is not None and len(full)):
            self._check_rows(s_new, np.flatnonzero(risk), full)
        tr = np.einsum("iiN->N", s_new)
        done = n2 < self.tol2
        conv = done
        div = tr > self.trlim
        if self.t >= self.next_cap:
            done = conv | div | (self.end <= self.t)
        else:
            done = conv | div
        finished = None
        if done.any():
            finished = self._finish(np.flatnonzero(done), s, n2, tr, conv, div)
        np.minimum(self.minr, n2, out=self.minr)
        self.prev = n2
        self.s = s_new
        self.t += 1
        if finished is not None:
            for pi, key, _ in finished:
                self.active[pi].discard(key)
            self._take(np.flatnonzero(~done))
        return finished

    def _check_rows(self, s_new, rows, full=None):
        """Eigendecomposition of the rows whose bound reached zero.

        The published projection where an eigenvalue is negative; then new bounds, and
        the rows with one eigenvalue at the floor become floor rows. The rows in
        ``full`` (floor rows whose tracking is not accurate enough) always get it.
        """
        if self.t % _FULL_CHECK and len(rows):
            # between full checks, a row passes when it is positive definite: the
            # projection is the identity on it; its bound stays at or below zero
            rows = rows[~_positive_definite(s_new[..., rows])]
        if full is not None and len(full):
            rows = np.union1d(rows, full)
        if not len(rows):
            return
        self.eigh_rows += len(rows)
        self.eigh_calls += 1
        ds = self.dim[rows]
        for d in range(2, _DP + 1):
            if not (ds == d).any():
                continue
            sel = rows[ds == d]
            blk = np.moveaxis(s_new[:d, :d, sel], -1, 0)
            lam, u = np.linalg.eigh(blk)
            neg = (lam < 0).any(axis=1)
            if neg.any():
                lam = np.where(lam < 0, CLIP, lam)
                proj = np.matmul(u[neg], lam[neg][:, :, None] * np.swapaxes(u[neg], -1, -2))
                s_new[:d, :d, sel[neg]] = np.moveaxis(proj, 0, -1)
            top = np.abs(lam[:, -1])
            floor = (lam[:, 0] < _SEP * lam[:, 1]) & (lam[:, 1] > _GAP * top) if d > 1 \
                else np.zeros(len(sel), dtype=bool)
            self.mu[sel] = np.where(floor, np.inf, lam[:, 0] - _MARGIN * top)
            self.mu2[sel] = lam[:, 1] - _MARGIN * top if d > 1 else np.inf
            self.floor[sel] = floor
            self.u[:, sel] = 0.0
            self.u[:d, sel] = u[:, :, 0].T
        self.floor_idx = np.flatnonzero(self.floor)

    def _floor_rows(self, s_new, hn):
        """Projection of the floor rows; returns the rows that need a full check.

        Tracking is used only while the step moves the matrix by less than
        ``_TRACK`` times the bound on the second eigenvalue (one inverse iteration then
        gives the eigenvector to the cube of that angle); the other rows get the
        eigendecomposition, uncorrected.
        """
        f0 = self.floor_idx
        self.mu2[f0] -= hn[f0]
        ok = hn[f0] < _TRACK * self.mu2[f0]
        f, untracked = f0[ok], f0[~ok]
        if not len(f):
            return untracked
        self.floor_steps += len(f)
        s = s_new[..., f]
        v = self.u[:, f]
        sv = np.einsum("ijn,jn->in", s, v)
        sig = np.einsum("in,in->n", v, sv)
        scale = np.einsum("iin->n", s)
        a = np.moveaxis(s, -1, 0).copy()
        idx = np.arange(_DP)
        a[:, idx, idx] -= (sig - 1e-9 * scale)[:, None]
        try:
            z = np.linalg.solve(a, v.T[..., None])[..., 0].T
        except np.linalg.LinAlgError:
            return f0
        z /= np.sqrt(np.einsum("in,in->n", z, z))
        lam1 = np.einsum("in,ijn,jn->n", z, s, z)
        neg = lam1 < 0.0
        if neg.any():
            fn = f[neg]
            zn = z[:, neg]
            s_new[..., fn] += (CLIP - lam1[neg]) * (zn[:, None] * zn[None])
        self.u[:, f] = z
        bad = (lam1 > _EXIT * self.mu2[f]) | ~np.isfinite(lam1)
        return np.concatenate([untracked, f[bad]])

    def _finish(self, rows, s, n2, tr, conv, div):
        out = []
        for m in rows:
            pi, key = self.ids[m]
            p = self.panels[pi]
            rec = {"stop_iteration": self.t - int(self.start[m]),
                   "norm": math.sqrt(n2[m]), "norm_prev": math.sqrt(self.prev[m]),
                   "norm_min": math.sqrt(min(self.minr[m], n2[m])),
                   "trace": float(tr[m] - (_DP - p.d))}
            if conv[m]:
                eig = np.linalg.eigvalsh(s[:p.d, :p.d, m])
                rec.update(status="converged", rank=int(np.sum(eig > RANK_THRESHOLD)),
                           eigenvalues=eig.tolist())
            else:
                rec.update(status="diverged" if div[m] else "max_iter", rank=None,
                           eigenvalues=None)
                if not div[m]:
                    rec["stop_iteration"] = p.max_iter
            out.append((pi, key, rec))
        return out

    def run(self, progress=None):
        """Step until every panel's path is resolved.

        A panel is re-planned when its frontier attempt is not running, and every
        ``replan`` steps (the failure model changes as attempts age).
        """
        for p in self.panels:
            if p.done:
                self._report(p, progress)
        dirty = {p.index for p in self.panels if not p.done}
        pending = set()                 # frontier moved: re-plan after ``settle`` steps
        last = [0] * len(self.panels)
        last_all = 0
        settle = 32
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            while True:
                if self.t - last_all >= self.replan:
                    dirty |= {p.index for p in self.panels if not p.done}
                    last_all = self.t
                if pending:
                    ready = {pi for pi in pending if self.t - last[pi] >= settle}
                    dirty |= ready
                    pending -= ready
                if dirty:
                    dirty = {pi for pi in dirty if not self.panels[pi].done}
                    self.schedule(dirty)
                    for pi in dirty:
                        last[pi] = self.t
                    pending -= dirty
                    dirty = set()
                if not self.ids:
                    break
                fin = self.step()
                if fin is None:
                    continue
                for pi, key, rec in fin:
                    p = self.panels[pi]
                    if p.done or not p.add_finished(key, rec):
                        continue
                    if p.done:
                        p.batched_steps = self.t
                        self._drop_panel(pi)
                        self._report(p, progress)
                    elif (p.i, p.k) not in self.active[pi]:
                        dirty.add(pi)
                    else:
                        pending.add(pi)
        if not all(p.done for p in self.panels):
            raise RuntimeError("published replay: no attempt left to step")
        self._flush()

    def _drop_panel(self, pi):
        keep = [m for m, (q, _) in enumerate(self.ids) if q != pi]
        self._take(np.array(keep, dtype=np.int64))
        self.active[pi].clear()
        self.panels[pi].paused.clear()

    def _report(self, p, progress):
        if progress is not None:
            counts = _counts(p.path, p.d)
            progress(f"published {p.label} d={p.d}: {len(p.path)} attempts, "
                     f"{sum(r['status'] != 'converged' for r in p.path)} discarded, "
                     f"counts {counts}")


def _counts(path, d):
    counts = [0] * (d + 1)
    for rec in path:
        if rec["status"] == "converged" and rec["rank"] <= (d + 1) // 2:
            counts[rec["rank"]] += 1
    return counts


def _replay_panels(specs, pool_size=128, p_min=0.05, replan=512, progress=None):
    """Replay several panels in one engine.

    ``specs``: list of ``(kind, val, d, qs, vs, h, tol, max_iter, n_max, n_settings)``.
    Returns a list of ``(counts, path, stats)`` in the order of ``specs``.
    """
    panels = [_Panel(j, kind, val, d, qs, vs, h, tol, max_iter, n_max, n_settings,
                     pool_size, f"{kind} V={val}")
              for j, (kind, val, d, qs, vs, h, tol, max_iter, n_max, n_settings)
              in enumerate(specs)]
    eng = _Engine(panels, p_min=p_min, replan=replan)
    eng.run(progress)
    out = []
    for p in panels:
        stats = _panel_stats(p.path, p.d, p.tol, p.max_iter)
        stats.update(batched_steps=p.batched_steps, trajectory_steps=p.traj_steps)
        out.append((_counts(p.path, p.d), p.path, stats))
    return out


def _replay_panel(kind, d, qs, vs, h, tol, max_iter, n_max, n_settings=N_PER_DIM,
                  pool_size=128, progress=None, label=""):
    """Replay one panel; returns the histogram, the path of attempts and statistics."""
    return _replay_panels([(kind, "", d, qs, vs, h, tol, max_iter, n_max, n_settings)],
                          pool_size=pool_size, progress=progress)[0]


def _near(x, ref):
    return x is not None and math.isfinite(x) and abs(x / ref - 1.0) < NEAR


def _panel_stats(path, d, tol, max_iter):
    r"""Attempts, discards, unrecorded ranks and closeness to each decision boundary.

    An attempt is *near* a boundary when a 1% change of one threshold could change its
    outcome: a counted eigenvalue within 1% of 0.1 (``near_rank_threshold``); a
    converged attempt that stopped after :math:`0.99\,` ``max_iter`` iterations, or a
    ``max_iter`` attempt whose smallest :math:`\lVert r\rVert_F` came within 1% of tol
    (``near_max_iter``); a diverged attempt whose trace stopped within 1% of
    :math:`10^3` (``near_trace``). ``settings_near_boundary`` counts the settings with at least one
    such attempt. ``stop_test_fragile`` counts the attempts whose stop test was decided
    by less than :math:`10^{-10}` relative (rounding can move the stop by one step).
    """
    conv = [r for r in path if r["status"] == "converged"]
    near_rank = near_cap = near_trace = near_any = fragile = 0
    near_settings = set()
    min_margin = math.inf
    for r in path:
        nr = r["status"] == "converged" and any(
            abs(e / RANK_THRESHOLD - 1.0) < NEAR for e in r["eigenvalues"])
        if r["status"] == "converged":
            nc = r["stop_iteration"] >= (1.0 - NEAR) * max_iter
            margin = min((tol - r["norm"]) / tol, (r["norm_prev"] - tol) / tol)
        else:
            nc = r["status"] == "max_iter" and r["norm_min"] < tol * (1.0 + NEAR)
            margin = (r["norm_min"] - tol) / tol
        ntr = r["status"] == "diverged" and _near(r["trace"], TRACE_MAX)
        min_margin = min(min_margin, margin)
        fragile += margin < 1e-10
        near_rank += nr
        near_cap += nc
        near_trace += ntr
        if nr or nc or ntr:
            near_any += 1
            near_settings.add(r["setting"])
    return {
        "attempts": len(path),
        "discarded": len(path) - len(conv),
        "diverged": sum(r["status"] == "diverged" for r in path),
        "max_iter_reached": sum(r["status"] == "max_iter" for r in path),
        "converged": len(conv),
        "not_recorded": sum(r["rank"] > (d + 1) // 2 for r in conv),
        "near_rank_threshold": near_rank,
        "near_max_iter": near_cap,
        "near_trace": near_trace,
        "near_any_boundary": near_any,
        "settings_near_boundary": len(near_settings),
        "stop_test_margin_min": min_margin,
        "stop_test_fragile": int(fragile),
        "path_steps": sum(min(r["stop_iteration"] + 1, max_iter) for r in path),
    }


def published_histograms(types=("softmax", "l2"), ds=DIMENSIONS, values=("identity", "random"),
                         n_settings=N_PER_DIM, pool_size=128, progress=None,
                         return_paths=False):
    r"""Replay the published rank histograms (docs/math.md section 9).

    Parameters
    ----------
    types : sequence of {"softmax", "l2"}
        Attention types, in the order given.
    ds : sequence of int
        Dimensions among 3, 4, 5.
    values : sequence of {"identity", "random"}
        :math:`V = I` and/or the random :math:`V = R^TR`.
    n_settings : int
        Settings per panel (100 in the paper; fewer gives the first ones of the same
        sequential protocol, for tests).
    pool_size : int
        Most attempts of one panel stepped at once. The protocol does not depend on it
        (rounding may move a count only where an attempt is within 1% of a boundary).
    progress : callable or None
        Called with one short line per finished panel.
    return_paths : bool
        Also return every attempt of the sequential path, per panel.

    Returns
    -------
    dict
        ``{"histograms": {type: {values: {str(d): counts of ranks 0..d}}},
        "details": {type: {values: {str(d): statistics}}}}`` and, with
        ``return_paths``, ``"paths"`` in the same layout.
    """
    specs, keys = [], []
    for kind in types:
        settings = published_settings(kind)
        for val in values:
            par = PANELS[(kind, val)]
            for d in ds:
                j = DIMENSIONS.index(d)
                qs, vs = settings[d]
                if val == "identity":
                    vs = [np.eye(d) for _ in vs]
                specs.append((kind, val, d, qs[:n_settings], vs[:n_settings], par["h"][j],
                              par["tol"], par["max_iter"], par["n_max"], n_settings))
                keys.append((kind, val, d, par, j))
    res = _replay_panels(specs, pool_size=pool_size, progress=progress)
    hist, details, paths = {}, {}, {}
    for (kind, val, d, par, j), (counts, path, stats) in zip(keys, res):
        hist.setdefault(kind, {}).setdefault(val, {})[str(d)] = counts
        stats.update(h=par["h"][j], tol=par["tol"], max_iter=par["max_iter"],
                     n_max=par["n_max"])
        details.setdefault(kind, {}).setdefault(val, {})[str(d)] = stats
        paths.setdefault(kind, {}).setdefault(val, {})[str(d)] = path
    out = {"histograms": hist, "details": details}
    if return_paths:
        out["paths"] = paths
    return out


def write_published_histograms(out, progress=None, **kwargs):
    """Run :func:`published_histograms` and write its two JSON files into the folder ``out``.

    ``published_histograms.json`` holds the counts, ``published_histograms_details.json``
    the statistics per panel. ``kwargs`` go to :func:`published_histograms`.

    Returns
    -------
    dict
        The result of :func:`published_histograms` and the two paths written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res = published_histograms(progress=progress, **kwargs)
    p1 = out / "published_histograms.json"
    p2 = out / "published_histograms_details.json"
    p1.write_text(json.dumps(res["histograms"], indent=1) + "\n")
    p2.write_text(json.dumps(res["details"], indent=1) + "\n")
    return {**res, "files": [str(p1), str(p2)]}
