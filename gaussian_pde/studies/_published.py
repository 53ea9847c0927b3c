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
draws are made ahead (the stream is deterministic), and a pool of *speculative* pairs
(setting ``i``, draw ``k``) is stepped together with batched ``eigh``. The sequential
path starts at ``(0, 0)`` and goes to ``(i + 1, k + 1)`` after a converged attempt and
to ``(i, k + 1)`` after a failed one; only pairs still reachable from the resolved part
of the path are kept, and the pool is refilled with the most probable ones. The result
is the sequential protocol itself, whatever the pool size.

Every arithmetic operation is the one of the published scheme, in the same order and
with the same LAPACK and BLAS calls per matrix, so a per-trajectory loop
(:func:`reference_attempt`) and the batched replay agree to the bit on this machine
(checked by the tests). The details record how close each count is to a decision
boundary, for readers on other machines.
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


class _Pool:
    """Speculative attempts of one panel, stepped together."""

    def __init__(self, kind, d, consts, draws, h, tol, max_iter):
        self.kind, self.d, self.h, self.tol, self.max_iter = kind, d, h, tol, max_iter
        self.consts, self.draws = consts, draws
        self.ids = []                       # (setting, draw) per row
        self.s = np.empty((0, d, d))
        self.v = np.empty((0, d, d))
        self.a = np.empty((0, d, d))
        self.kk = np.empty((0, d, d))
        self.it = np.empty(0, dtype=np.int64)
        self.prev = np.empty(0)             # norm of r at the previous iteration
        self.minr = np.empty(0)             # smallest norm of r so far
        self.steps = 0                      # batched steps taken
        self.traj_steps = 0                 # trajectory steps taken (including wasted)

    def __len__(self):
        return len(self.ids)

    def add(self, pairs):
        if not pairs:
            return
        d = self.d
        n = len(pairs)
        v = np.empty((n, d, d))
        a = np.empty((n, d, d))
        kk = np.empty((n, d, d))
        for m, (i, _) in enumerate(pairs):
            vi, ai, ki = self.consts[i]
            v[m], a[m] = vi, ai
            kk[m] = ki if ki is not None else 0.0
        self.ids += list(pairs)
        self.s = np.concatenate([self.s, self.draws[[k for _, k in pairs]]])
        self.v = np.concatenate([self.v, v])
        self.a = np.concatenate([self.a, a])
        self.kk = np.concatenate([self.kk, kk])
        self.it = np.concatenate([self.it, np.zeros(n, dtype=np.int64)])
        self.prev = np.concatenate([self.prev, np.full(n, np.inf)])
        self.minr = np.concatenate([self.minr, np.full(n, np.inf)])

    def keep(self, mask):
        self.ids = [p for p, m in zip(self.ids, mask) if m]
        for name in ("s", "v", "a", "kk", "it", "prev", "minr"):
            setattr(self, name, getattr(self, name)[mask])

    def step(self):
        """One published step for every row; returns the finished attempts."""
        s = self.s
        r = _rhs(self.kind, s, self.v, self.a, self.kk)
        nrm = np.sqrt(np.einsum("nij,nij->n", r, r))
        s_new = _project(s + self.h * r)
        tr = np.trace(s_new, axis1=1, axis2=2)
        self.steps += 1
        self.traj_steps += len(self.ids)
        conv = nrm < self.tol
        div = ~conv & (tr > TRACE_MAX)
        it = self.it
        capped = ~conv & ~div & (it + 1 >= self.max_iter)
        done = conv | div | capped
        finished = {}
        if done.any():
            for m in np.flatnonzero(done):
                rec = {"stop_iteration": int(it[m]), "norm": float(nrm[m]),
                       "norm_prev": float(self.prev[m]),
                       "norm_min": float(min(self.minr[m], nrm[m])),
                       "trace": float(tr[m])}
                if conv[m]:
                    eig = np.linalg.eigvalsh(s[m])
                    rec.update(status="converged", rank=int(np.sum(eig > RANK_THRESHOLD)),
                               eigenvalues=eig.tolist())
                else:
                    rec.update(status="diverged" if div[m] else "max_iter", rank=None,
                               eigenvalues=None)
                    if capped[m]:
                        rec["stop_iteration"] = self.max_iter
                finished[self.ids[m]] = rec
        self.s = s_new
        self.it = it + 1
        self.minr = np.minimum(self.minr, nrm)
        self.prev = nrm
        if done.any():
            self.keep(~done)
        return finished


def _candidates(i, k, n_settings, n_max, p_fail, want, exclude, max_f=60, min_prob=0.2):
    """Most probable unresolved pairs ``(i + j, k + j + f)`` reachable from ``(i, k)``.

    Pairs the path visits with estimated probability below ``min_prob`` are left out
    (the frontier ``(i, k)`` itself has probability one): speculation costs steps.
    """
    p = min(max(p_fail, 1e-3), 0.95)
    lq, lp = math.log1p(-p), math.log(p)
    js = np.arange(n_settings - i)
    fs = np.arange(max_f)
    jj, ff = np.meshgrid(js, fs, indexing="ij")
    kk = k + jj + ff
    # log P(the path visits (i + j, k + j + f)) = log C(j + f, f) + j log(1 - p) + f log p
    lg = np.vectorize(math.lgamma)
    logp = (lg(jj + ff + 1.0) - lg(jj + 1.0) - lg(ff + 1.0) + jj * lq + ff * lp)
    logp[kk >= n_max] = -np.inf
    order = np.argsort(-logp, axis=None, kind="stable")
    out = []
    for flat in order:
        if not logp.flat[flat] >= math.log(min_prob):
            break
        pair = (i + int(jj.flat[flat]), int(kk.flat[flat]))
        if pair not in exclude:
            out.append(pair)
            if len(out) >= want:
                break
    return out


def _replay_panel(kind, d, qs, vs, h, tol, max_iter, n_max, n_settings=N_PER_DIM,
                  pool_size=256, progress=None, label=""):
    """Replay one panel; returns the histogram, the path of attempts and statistics."""
    consts = [_constants(kind, q, v, d) for q, v in zip(qs, vs)]
    draws = _sigma0_draws(d, n_max)
    pool = _Pool(kind, d, consts, draws, h, tol, max_iter)
    results = {}
    path = []
    i = k = 0
    n_fail = 0
    while i < n_settings and k < n_max:
        # resolve the sequential path as far as the finished attempts allow
        while i < n_settings and k < n_max and (i, k) in results:
            rec = results.pop((i, k))
            rec.update(setting=i, draw=k)
            path.append(rec)
            if rec["status"] == "converged":
                i += 1
            else:
                n_fail += 1
            k += 1
        if i >= n_settings or k >= n_max:
            break
        # drop pairs the path can no longer visit: fewer settings or fewer failures
        f0 = k - i
        if len(pool):
            mask = np.array([(a >= i and (b - a) >= f0) for a, b in pool.ids])
            if not mask.all():
                pool.keep(mask)
        for key in [key for key in results if key[0] < i or key[1] - key[0] < f0]:
            del results[key]
        if len(pool) < pool_size:
            p_fail = (n_fail + 0.5) / (len(path) + 5)
            exclude = set(pool.ids) | set(results)
            pool.add(_candidates(i, k, n_settings, n_max, p_fail,
                                 pool_size - len(pool), exclude))
        while True:
            fin = pool.step()
            if fin:
                results.update(fin)
                if (i, k) in results or len(pool) < pool_size // 2:
                    break
    counts = [0] * (d + 1)
    for rec in path:
        if rec["status"] == "converged" and rec["rank"] <= (d + 1) // 2:
            counts[rec["rank"]] += 1
    stats = _panel_stats(path, d, tol, pool)
    if progress is not None:
        progress(f"published {label} d={d}: {stats['attempts']} attempts, "
                 f"{stats['discarded']} discarded, counts {counts}")
    return counts, path, stats


def _near(x, ref):
    return x is not None and math.isfinite(x) and abs(x / ref - 1.0) < NEAR


def _panel_stats(path, d, tol, pool):
    """Attempts, discards, unrecorded ranks and closeness to each decision boundary."""
    conv = [r for r in path if r["status"] == "converged"]
    near_rank = near_tol = near_trace = near_any = fragile = 0
    min_margin = math.inf
    for r in path:
        nr = r["status"] == "converged" and any(
            abs(e / RANK_THRESHOLD - 1.0) < NEAR for e in r["eigenvalues"])
        if r["status"] == "converged":
            nt = _near(r["norm"], tol)
            # relative margins of the stop test at the stopping and the previous iteration
            margin = min((tol - r["norm"]) / tol, (r["norm_prev"] - tol) / tol)
        else:
            nt = r["norm_min"] < tol * (1.0 + NEAR)
            margin = (r["norm_min"] - tol) / tol
        ntr = _near(r["trace"], TRACE_MAX)
        min_margin = min(min_margin, margin)
        fragile += margin < 1e-10
        near_rank += nr
        near_tol += nt
        near_trace += ntr
        near_any += nr or nt or ntr
    return {
        "attempts": len(path),
        "discarded": len(path) - len(conv),
        "diverged": sum(r["status"] == "diverged" for r in path),
        "max_iter_reached": sum(r["status"] == "max_iter" for r in path),
        "converged": len(conv),
        "not_recorded": sum(r["rank"] > (d + 1) // 2 for r in conv),
        "near_rank_threshold": near_rank,
        "near_tol": near_tol,
        "near_trace": near_trace,
        "near_any_boundary": near_any,
        "stop_test_margin_min": min_margin,
        "stop_test_fragile": int(fragile),
        "batched_steps": pool.steps,
        "trajectory_steps": pool.traj_steps,
        "path_steps": sum(min(r["stop_iteration"] + 1, 10**9) for r in path),
    }


def published_histograms(types=("softmax", "l2"), ds=DIMENSIONS, values=("identity", "random"),
                         n_settings=N_PER_DIM, pool_size=256, progress=None,
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
        Attempts stepped at once. The results do not depend on it.
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
    hist, details, paths = {}, {}, {}
    for kind in types:
        settings = published_settings(kind)
        for val in values:
            par = PANELS[(kind, val)]
            for d in ds:
                j = DIMENSIONS.index(d)
                qs, vs = settings[d]
                if val == "identity":
                    vs = [np.eye(d) for _ in vs]
                counts, path, stats = _replay_panel(
                    kind, d, qs[:n_settings], vs[:n_settings], par["h"][j], par["tol"],
                    par["max_iter"], par["n_max"], n_settings=n_settings,
                    pool_size=pool_size, progress=progress, label=f"{kind} V={val}")
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
