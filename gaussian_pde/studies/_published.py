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
replay runs that sequential protocol as published, attempt after attempt: a converged
attempt moves on to the next setting, a failed one retries the same setting with the
next draw. Each attempt runs to its stop in the compiled kernel of
:mod:`gaussian_pde.studies._published_kernel` (Numba), which is the published scheme up
to rounding: :math:`F` in the low-rank form of :func:`_row_constants` (no inverse), and
the projection :math:`P` applied only where it can act, as the rank-one corrections of
the negative eigenpairs. The loop (:func:`reference_attempt`) keeps the published
expressions; the tests check that both agree on status, rank and stop iteration, except
within 1% of a decision boundary, and the details record how many attempts and settings
lie there.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np

from .._common.io import ensure_output_dir, write_json
from .._common.validation import validate_choices, validate_flag, validate_int
from ..attention import (
    PUBLISHED_PANELS,
    PUBLISHED_TIMED_TYPE,
    PUBLISHED_TYPES,
    PUBLISHED_V_SEEDS,
    published_attention,
)

__all__ = [
    "PANELS",
    "published_histograms",
    "published_settings",
    "reference_attempt",
    "write_published_histograms",
]

#: Parameters per panel (docs/math.md 9.5): steps for d = 3, 4, 5, tol, max_iter, n_max
#: (the attention package's table of the published script's settings).
PANELS = PUBLISHED_PANELS
DIMENSIONS = (3, 4, 5)
N_PER_DIM = 100
SEED_Q = 40
SEED_V = PUBLISHED_V_SEEDS
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


@functools.cache
def _quadratic_in_key(kind):
    r"""Whether the published type's score is quadratic in the key, read off its score.

    The L2 form, whose field carries :math:`(I + 2K^TKS)^{-1}`.
    """
    return published_attention(kind, np.ones((1, 2)), np.eye(2), 2).quadratic_score().H is not None


def _constants(kind, q, v, d):
    """Per-setting constants, computed with the published 2-D expressions."""
    k = -q
    a = np.dot(k.T, q) / np.sqrt(d)
    if not _quadratic_in_key(kind):
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
    if kk2 is None:
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
        if kk2 is None:
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
    qs, _ = published_settings(PUBLISHED_TIMED_TYPE)[5]
    s0 = _sigma0_draws(5, 1)[0]
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        reference_attempt(PUBLISHED_TIMED_TYPE, qs[0], np.eye(5), s0, 0.02, 0.0, n)
        best = min(best, (time.perf_counter() - t) / n)
    return best


# ---------------------------------------------------------------------------------------
# The replay: the sequential protocol, attempt after attempt, each attempt run to its stop
# by the compiled kernel of _published_kernel.
# ---------------------------------------------------------------------------------------


def _row_constants(kind, q, v, d):
    r"""Constants of one setting for the low-rank form of :math:`F`.

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
    q = np.ascontiguousarray(q, dtype=float)
    v = np.ascontiguousarray(v, dtype=float)
    if q.shape != (d // 2, d) or v.shape != (d, d) or d // 2 not in (1, 2):
        raise ValueError(f"published settings: expected Q of shape ({d // 2}, {d}) and V "
                         f"of shape ({d}, {d}) with d in 2..5, got {q.shape} and {v.shape}")
    if not _quadratic_in_key(kind):
        return q, np.zeros_like(q), v, -1.0 / math.sqrt(d)
    return q, q.copy(), v, -2.0 / math.sqrt(d)


def _run_attempt(kind, consts, sigma0, h, tol, max_iter):
    """One attempt by the compiled kernel, as a record of the path."""
    from ._published_kernel import CONVERGED, DIVERGED, attempt

    q, qm, v, c = consts
    status, it, n2, prev, n2_min, tr, s = attempt(q, qm, v, c, sigma0, float(h), float(tol),
                                                  int(max_iter), TRACE_MAX)
    rec = {"stop_iteration": int(it), "norm": math.sqrt(n2), "norm_prev": math.sqrt(prev),
           "norm_min": math.sqrt(n2_min), "trace": float(tr)}
    if status == CONVERGED:
        eig = np.linalg.eigvalsh(s)
        rec.update(status="converged", rank=int(np.sum(eig > RANK_THRESHOLD)),
                   eigenvalues=eig.tolist())
    else:
        rec.update(status="diverged" if status == DIVERGED else "max_iter", rank=None,
                   eigenvalues=None)
    return rec


def compile_kernel():
    """Compile the replay's kernel now (or load it from Numba's disk cache).

    One attempt of one step at ``d = 2`` (the kernel is compiled once for every ``d``):
    for a caller that compiles ahead of the work (a fresh machine's second core).
    """
    d, kind = 2, PUBLISHED_TYPES[0]
    _run_attempt(kind, _row_constants(kind, np.ones((d // 2, d)), np.eye(d), d),
                 _sigma0_draws(d, 1)[0], 0.01, 0.0, 1)


def _replay_panel(kind, d, qs, vs, h, tol, max_iter, n_max, n_settings=N_PER_DIM):
    """Replay one panel: the sequential protocol, attempt after attempt.

    Attempt ``k`` integrates the current setting ``i`` from the ``k``-th draw of the
    seed-41 stream; a converged attempt moves on to setting ``i + 1``, a failed one
    retries setting ``i`` with the next draw, until ``n_settings`` settings converged or
    ``n_max`` draws are used. Returns the histogram, the path of attempts and statistics.
    """
    consts = [_row_constants(kind, q, v, d) for q, v in zip(qs, vs)]
    draws = _sigma0_draws(d, n_max)
    path = []
    i = 0
    for k in range(n_max):
        if i >= n_settings:
            break
        rec = _run_attempt(kind, consts[i], draws[k], h, tol, max_iter)
        rec.update(setting=i, draw=k)
        path.append(rec)
        i += rec["status"] == "converged"
    return _counts(path, d), path, _panel_stats(path, d, tol, max_iter)


def _counts(path, d):
    counts = [0] * (d + 1)
    for rec in path:
        if rec["status"] == "converged" and rec["rank"] <= (d + 1) // 2:
            counts[rec["rank"]] += 1
    return counts


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


def _validate_replay(types, ds, values, n_settings):
    """The replay's selection, checked: known members, non-empty, no repeats."""
    types = validate_choices(types, "types", sorted({k for k, _ in PANELS}))
    values = validate_choices(values, "values", sorted({v for _, v in PANELS}))
    if isinstance(ds, (str, bytes)):
        raise TypeError(f"`ds` must be a sequence of dimensions among {DIMENSIONS}, got {ds!r}.")
    try:
        ds = tuple(validate_int(d, "ds") for d in ds)
    except TypeError:
        if not hasattr(ds, "__iter__"):
            raise TypeError(f"`ds` must be a sequence of dimensions among {DIMENSIONS}, got "
                            f"{type(ds).__name__}.") from None
        raise
    ds = validate_choices(ds, "ds", DIMENSIONS)
    n_settings = validate_int(n_settings, "n_settings", minimum=1)
    if n_settings > N_PER_DIM:
        raise ValueError(f"`n_settings` must be at most {N_PER_DIM} (the published settings per "
                         f"panel), got {n_settings}.")
    return types, ds, values, n_settings


def published_histograms(types=PUBLISHED_TYPES, ds=DIMENSIONS, values=("identity", "random"),
                         n_settings=N_PER_DIM, progress=None, return_paths=False):
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
        Settings per panel, 1 to 100 (100 in the paper; fewer gives the first ones of
        the same sequential protocol, for tests).
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

    Raises
    ------
    ValueError, TypeError
        For a type, dimension or ``values`` entry outside those listed (a plain string
        is refused, not read letter by letter), an empty or repeating sequence, or
        ``n_settings`` outside 1..100.
    """
    types, ds, values, n_settings = _validate_replay(types, ds, values, n_settings)
    if progress is not None and not callable(progress):
        raise TypeError(f"`progress` must be a callable or None, got {type(progress).__name__}.")
    return_paths = validate_flag(return_paths, "return_paths")
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
                    par["max_iter"], par["n_max"], n_settings)
                stats.update(h=par["h"][j], tol=par["tol"], max_iter=par["max_iter"],
                             n_max=par["n_max"])
                hist.setdefault(kind, {}).setdefault(val, {})[str(d)] = counts
                details.setdefault(kind, {}).setdefault(val, {})[str(d)] = stats
                paths.setdefault(kind, {}).setdefault(val, {})[str(d)] = path
                if progress is not None:
                    progress(f"published {kind} V={val} d={d}: {len(path)} attempts, "
                             f"{stats['discarded']} discarded, counts {counts}")
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
    _validate_replay(kwargs.get("types", PUBLISHED_TYPES), kwargs.get("ds", DIMENSIONS),
                     kwargs.get("values", ("identity", "random")),
                     kwargs.get("n_settings", N_PER_DIM))
    out = ensure_output_dir(out, "out")   # before the replay: a bad folder fails at once
    res = published_histograms(progress=progress, **kwargs)
    p1 = write_json(out / "published_histograms.json", res["histograms"])
    p2 = write_json(out / "published_histograms_details.json", res["details"])
    return {**res, "files": [str(p1), str(p2)]}
