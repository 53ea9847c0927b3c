r"""The work of one sweep task: draw the settings of a batch, integrate, summarise.

Everything a task computes goes through :func:`compute_batch`. With the DOP853 method the
whole batch is integrated at once by :func:`gaussian_pde.integrate._batch.solve_batch` (one
vectorised right-hand side, per-trajectory steps and events, the same steps as
:func:`gaussian_pde.solve` up to rounding); other SciPy methods fall back to
:func:`gaussian_pde.solve` per setting.
"""

from __future__ import annotations

import numpy as np

from ..analysis import Outcome, classify_trajectory
from ..analysis import limit_rank as _limit_rank
from ..attention import get_attention, has_hook
from ..integrate import Status, solve, solve_batch

__all__ = ["STATUSES", "OUTCOMES", "draw_setting", "draw_mean", "compute_batch", "classify_outcome",
           "limit_rank", "result_layout", "time_grid"]

#: stored status codes: index into this tuple, the words of :class:`gaussian_pde.Status`
#: (``"error"``: the setting raised)
STATUSES = tuple(s.value for s in Status) + ("error",)
#: stored outcome codes: index into this tuple, the words of :class:`gaussian_pde.Outcome`
OUTCOMES = tuple(o.value for o in Outcome)


def _entries(rng, shape, distribution, std):
    if distribution == "normal":
        return std * rng.standard_normal(shape)
    half_width = std * np.sqrt(3.0)
    return rng.uniform(-half_width, half_width, shape)


def _head(rng, cls, d, w):
    k = w.rank(d)
    Q = _entries(rng, (k, d), w.distribution, w.std)
    if w.key == "minus_query":
        K = -Q
    elif w.key == "query":
        K = Q.copy()
    else:
        K = _entries(rng, (k, d), w.distribution, w.std)
    if w.value == "identity":
        V = np.eye(d)
    else:
        G = _entries(rng, (d, d), w.distribution, w.std)
        V = {"gram": G.T @ G, "gram_t": G @ G.T, "random": G}[w.value]
    return cls(Q, K, V, scale=w.score_scale or None)


def draw_setting(spec, attention, d, draw):
    r"""The attention and initial covariance of one setting of a sweep.

    The random stream is ``SeedSequence(spec.seed, spawn_key=(d, draw))``: it depends on
    the base seed, the dimension and the draw index only, so a setting recomputes alone
    and the same draw is shared by every attention type. :math:`\Sigma_0` is drawn
    first, then the heads: one, or ``weights.heads`` of type ``weights.head_type`` for a
    type that sums heads (one that implements ``from_heads``, e.g. ``multihead``).

    Returns
    -------
    attention : Attention
    cov0 : ndarray, shape (d, d)
    """
    seq = np.random.SeedSequence(spec.seed, spawn_key=(int(d), int(draw)))
    rng = np.random.default_rng(seq)
    ini = spec.initial
    if ini.cov == "identity":
        cov0 = ini.std**2 * np.eye(d)
    else:
        r = d if ini.rank == "full" else min(ini.rank, d)
        G = _entries(rng, (d, r), ini.distribution, ini.std)
        cov0 = G @ G.T
    w = spec.weights
    cls = get_attention(attention)
    if has_hook(cls, "from_heads"):
        head = get_attention(w.head_type)
        att = cls.from_heads([_head(rng, head, d, w) for _ in range(w.heads)])
    else:
        att = _head(rng, cls, d, w)
    return att, cov0


def draw_mean(spec, attention, d, draw):
    r"""The initial mean of one setting, or None where the covariance does not need it.

    None unless the type's field matrix depends on the mean (``field_sees_mean``);
    then :math:`\alpha_0` has i.i.d. normal entries of standard deviation
    ``initial.mean_std`` from the stream ``SeedSequence(spec.seed, spawn_key=(d, draw, 1))``
    (its own: the covariance and the weights of :func:`draw_setting` do not change).
    """
    if not attention.field_sees_mean:
        return None
    seq = np.random.SeedSequence(spec.seed, spawn_key=(int(d), int(draw), 1))
    return spec.initial.mean_std * np.random.default_rng(seq).standard_normal(d)


def limit_rank(cov, threshold):
    r"""Number of eigenvalues of :math:`\Sigma/\operatorname{tr}\Sigma` above ``threshold``.

    :func:`gaussian_pde.analysis.limit_rank` of the normalised covariance with
    ``rtol=0, atol=threshold`` (one definition of the rank for the package); 0 for a
    covariance whose trace is not positive and finite.
    """
    tr = np.trace(cov)
    if not np.isfinite(tr) or tr <= 0:
        return 0
    return int(_limit_rank(cov / tr, rtol=0.0, atol=threshold))


def classify_outcome(t, covs, status, t_blowup=None, attention=None, message=""):
    r"""Outcome code (into :data:`OUTCOMES`) of one setting: :func:`gaussian_pde.classify_trajectory`.

    The trajectory is the stored grid up to the stop and the final state; a setting that
    raised (``status="error"``) is ``"undecided"``.
    """
    if status == "error":
        return OUTCOMES.index(Outcome.UNDECIDED.value)
    out = classify_trajectory(t, covs, attention=attention, status=status,
                              t_blowup=None if t_blowup is None or np.isnan(t_blowup)
                              else t_blowup, message=message)
    return OUTCOMES.index(out.outcome.value)


def result_layout(spec, d):
    """Name -> (per-setting shape, dtype, fill value) of the arrays a task returns."""
    rec = spec.record
    out = {"status": ((), "i1", -1), "t_final": ((), "f8", np.nan),
           "nfev": ((), "i8", -1)}
    if rec.outcome:
        out["outcome"] = ((), "i1", -1)
    if rec.limit_rank:
        out["limit_rank"] = ((), "i2", -1)
    if rec.blowup_time:
        out["t_blowup"] = ((), "f8", np.nan)
    if rec.final_state:
        out["final_cov"] = ((d, d), "f8", np.nan)
    if rec.eigenvalues:
        out["eigenvalues"] = ((rec.grid, d), "f8", np.nan)
    return out


def time_grid(spec):
    """The coarse grid of the recorded eigenvalue trajectories."""
    return np.linspace(0.0, spec.solver.horizon, spec.record.grid)


def _summarise(spec, cov0, grid, status, t_final, nfev, cov, t_blowup, covs_on_grid,
               attention=None, message=""):
    """The recorded quantities of one integrated setting."""
    d = cov0.shape[0]
    out = {"status": STATUSES.index(status), "t_final": t_final, "nfev": nfev}
    rank = limit_rank(cov, spec.record.rank_threshold)
    out["limit_rank"] = rank
    out["t_blowup"] = t_blowup
    out["final_cov"] = cov
    eig = np.full((grid.size, d), np.nan)
    ok = np.isfinite(covs_on_grid[:, 0, 0])
    if ok.any():
        eig[ok] = np.linalg.eigvalsh(covs_on_grid[ok])
    out["eigenvalues"] = eig
    # the trajectory as stored, up to the stop, and the final state
    t_traj, c_traj = grid[ok], covs_on_grid[ok]
    if t_traj.size == 0 or t_final > t_traj[-1]:
        t_traj, c_traj = np.append(t_traj, t_final), np.concatenate([c_traj, cov[None]])
    if t_traj[0] > grid[0]:
        t_traj, c_traj = np.insert(t_traj, 0, grid[0]), np.concatenate([cov0[None], c_traj])
    out["outcome"] = classify_outcome(t_traj, c_traj, status, t_blowup, attention, message)
    return out


def _solve_one(spec, attention, d, draw, grid):
    att, cov0 = draw_setting(spec, attention, d, draw)
    sv = spec.solver
    try:
        sol = solve(att, draw_mean(spec, att, d, draw), cov0, (0.0, sv.horizon), t_eval=grid, method=sv.method,
                    rtol=sv.rtol, atol=sv.atol, blowup_threshold=sv.blowup_threshold,
                    steady_tol=sv.steady_tol or None, max_nfev=sv.max_nfev)
    except (ArithmeticError, ValueError, np.linalg.LinAlgError):
        return {"status": STATUSES.index("error"),
                "outcome": OUTCOMES.index(Outcome.UNDECIDED.value)}
    on_grid = np.full((grid.size, d, d), np.nan)
    on_grid[:sol.t.size] = sol.cov[:grid.size]
    return _summarise(spec, cov0, grid, str(sol.status), sol.t_final, sol.nfev, sol.cov_final,
                      np.nan if sol.t_blowup is None else sol.t_blowup, on_grid, att,
                      sol.message)


def _solve_many(spec, attention, d, draws, grid):
    """All settings of a task in one :func:`solve_batch` call."""
    sv = spec.solver
    settings = [draw_setting(spec, attention, d, draw) for draw in draws]
    atts = [a for a, _ in settings]
    cov0s = np.array([c for _, c in settings])
    means = [draw_mean(spec, a, d, draw) for a, draw in zip(atts, draws)]
    sol = solve_batch(atts, cov0s, (0.0, sv.horizon), t_eval=grid, rtol=sv.rtol, atol=sv.atol,
                      blowup_threshold=sv.blowup_threshold, steady_tol=sv.steady_tol or None,
                      max_nfev=sv.max_nfev,
                      mean0s=None if means[0] is None else np.array(means))
    return [_summarise(spec, cov0s[i], grid, str(sol.status[i]), sol.t_final[i],
                       int(sol.nfev[i]), sol.cov_final[i], sol.t_blowup[i], sol.cov[i],
                       atts[i], sol.message[i])
            for i in range(len(draws))]


def compute_batch(spec, task_index):
    """Compute one task of a sweep: a dict of arrays, one row per setting.

    Parameters
    ----------
    spec : SweepSpec
        The sweep.
    task_index : int
        In ``range(spec.n_tasks)``; the task covers draws ``lo:hi`` of block
        ``(attention, d)`` given by ``spec.task(task_index)``.

    Returns
    -------
    dict of ndarray
        The arrays of :func:`result_layout`, each of shape ``(hi - lo, ...)``. Pure: the
        same ``(spec, task_index)`` gives the same numbers in any process.
    """
    attention, d, lo, hi = spec.task(task_index)
    layout = result_layout(spec, d)
    arrays = {name: np.full((hi - lo,) + shape, fill, dtype=dtype)
              for name, (shape, dtype, fill) in layout.items()}
    grid = time_grid(spec)
    draws = range(lo, hi)
    if spec.solver.method == "DOP853":
        rows = _solve_many(spec, attention, d, draws, grid)
    else:
        rows = [_solve_one(spec, attention, d, draw, grid) for draw in draws]
    _certify(spec, attention, d, draws, rows)
    for row, values in enumerate(rows):
        for name, value in values.items():
            if name in arrays:
                arrays[name][row] = value
    return arrays


def _certify(spec, attention, d, draws, rows):
    r"""Certified limit rank and outcome of the :math:`K = -Q` softmax / L2 settings.

    For :math:`K = -Q` the covariance converges like :math:`1/t`, so the rank of
    :math:`\Sigma(T)/\operatorname{tr}\Sigma(T)` at the horizon over-counts (a vanishing
    eigenvalue is still large at any practical horizon). For these settings the recorded
    ``limit_rank`` and ``outcome`` are those of :func:`gaussian_pde.certified_limits`
    (docs/math.md 4.5), whatever the horizon; other settings keep the horizon's
    classification. A certified run that stays undecided records ``"undecided"`` and rank
    -1, never the horizon's guess. ``rows`` is updated in place.
    """
    if spec.weights.key != "minus_query":
        return
    from ..attention import quadratic_heads
    from ..studies import certified_limits

    picked, atts, covs = [], [], []
    for j, draw in enumerate(draws):
        if rows[j].get("status") == STATUSES.index("error"):
            continue
        att, cov0 = draw_setting(spec, attention, d, draw)
        try:
            quadratic_heads(att)
        except TypeError:
            return
        if np.linalg.eigvalsh(cov0)[0] <= 0:
            continue
        picked.append(j)
        atts.append(att)
        covs.append(cov0)
    if not picked:
        return
    for j, res in zip(picked, certified_limits(atts, covs)):
        rows[j]["outcome"] = OUTCOMES.index(res.outcome)
        rows[j]["limit_rank"] = res.rank if res.rank is not None else -1
