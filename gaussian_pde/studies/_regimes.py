r"""The 2-D regimes of the paper's ``2d_plots.py``, with its draws, integrated accurately.

Six families (docs/math.md section 4.4), each for the attention types the paper draws it
for, with the parameters of the published script (NumPy's legacy generator
``RandomState``, seeded and consumed in the script's order):

=============  ==================================  ========================================
family         types                               parameters (seed)
=============  ==================================  ========================================
``zero``       softmax, L2, multi-head, Sinkhorn   :math:`Q_{ij}\sim U[0,1]`, :math:`K=-Q`,
                                                   :math:`V = GG^T` (35)
``line``       softmax, L2                         :math:`Q = q^T`, :math:`|q| = 1`,
                                                   :math:`K = -Q`, :math:`V = I` (36)
``plane``      multi-head                          the same :math:`q`, two heads (36)
``two_lines``  softmax, L2                         :math:`A + A^T` indefinite (36),
                                                   :math:`V` standard normal (32)
``blowup``     softmax, multi-head, L2, Sinkhorn   :math:`A + A^T \succ 0` (33), :math:`V = I`
``depends``    softmax, L2, multi-head             the ``two_lines`` :math:`Q, K`, another
                                                   :math:`V` (35)
=============  ==================================  ========================================

The published right-hand sides, in the package's conventions (checked in
tests/studies/test_regimes.py against a transcription of the script's formulas):

* softmax: ``Softmax(Q, K, V, scale=1/sqrt(2))`` (:math:`A = K^TQ/\sqrt d`, also for the
  one-row :math:`Q` of ``line``, where the package default would be 1);
* L2: ``L2(Q, K, V / sqrt(2), scale=1)`` (the quadratic part :math:`2K^TK` is not scaled,
  docs/math.md section 9.4);
* multi-head with ``H`` heads: head ``h`` takes rows ``h`` of ``Q`` and ``K`` (for
  ``H = 2``, ``d = 2``) and the value :math:`e_he_h^TV` (row ``h`` of ``V``), scale
  :math:`1/\sqrt{d/H}`. For ``plane`` the script's ``Q`` has one row, so its second head
  is empty: one head ``Softmax(q, -q, e_1 e_1^T, scale=1)`` remains. For ``depends`` the
  script calls the multi-head field without ``H``, so ``H = 1``: one head equal to the
  softmax field (the panel repeats the softmax one);
* Sinkhorn: ``Sinkhorn(Q, K, V, scale=1)`` (the script's :math:`A = K^TQ`, unscaled).

Every trajectory is integrated with :func:`gaussian_pde.integrate._batch.solve_batch` to a
horizon per family and classified by :func:`gaussian_pde.analysis.classify_trajectory`
(exact rate from the attention), with one refinement (:func:`_classify`): an eigenvalue
that has fallen below ``1e-12`` of the largest (exponential collapse of a direction) is
below what the integration resolves, so its rate is rounding; it counts as vanished
instead of leaving the trajectory undecided.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from .._common.validation import validate_int, validate_positive
from ..analysis import Outcome, classify_trajectory
from ..attention import (
    REGIME_FLOW_TYPE,
    REGIME_HORIZONS,
    REGIME_PANELS,
    REGIME_TYPES,
    regime_attention,
)
from ..integrate import solve_batch

__all__ = ["FAMILIES", "PANELS", "published_grid", "unit_trace_grid", "regime_grids"]

#: figures of :func:`figure_tasks`: one per attention type and the eigenvalue flows
N_FIGURES = 5

#: the families, in the order of the figures
FAMILIES = ("zero", "line", "plane", "two_lines", "blowup", "depends")
#: attention types drawn for each family (the script's order)
PANELS = REGIME_PANELS
#: families drawn in the PSD cone (the others as Sigma / tr Sigma in the unit disk)
CONE = ("zero", "line", "plane", "two_lines")
#: the script's initial grids: (points per side, half-width of the square of
#: ((a - b), 2c) at trace 1); the grid keeps the points inside the unit disk
_PUBLISHED_GRID = {"zero": (10, 0.5), "line": (10, 0.5), "plane": (10, 0.5),
                   "two_lines": (20, 1.0), "blowup": (40, 1.0), "depends": (30, 1.0)}
#: smaller grids of the same layout. The depends grid needs enough points near the
#: boundary of the disk to meet the blow-up sector (a thin band, see docs/math.md 4.4).
_GRID_SIZES = {"quick": {"zero": 3, "line": 3, "plane": 3, "two_lines": 5, "blowup": 4,
                         "depends": 10},
               "default": {"zero": 6, "line": 6, "plane": 6, "two_lines": 10, "blowup": 8,
                           "depends": 14},
               "published": {f: n for f, (n, _) in _PUBLISHED_GRID.items()}}
#: integration horizons. K = -Q converges algebraically (like 1/t), so the cone families
#: run long (the integrator turns implicit on the stiff tail, so this is cheap); softmax
#: blow-ups end at the solver's confirmed blow-up.
_HORIZON = {"zero": 1e4, "line": 1e6, "plane": 1e6, "two_lines": 1e6, "blowup": 200.0,
            "depends": 1e6}
#: panels that stop earlier than their family (REGIME_HORIZONS: the blow-up panels of
#: the types whose fields are bounded in Sigma, which grow exponentially instead)
_HORIZON_PANEL = REGIME_HORIZONS
#: trace growth that counts as divergence in the blow-up family (the script stops at
#: a trace of 1e3 or 1e4); the trace must also still grow, t tr'/tr >= 1
_GROWTH = 1e3
#: eigenvalues below this fraction of the largest count as vanished (see _classify)
_VANISHED = 1e-12
#: resolution of the figures. They are made at the resolution they are saved at: a
#: figure saved at another one lays out every text (and parses its mathtext) twice
DPI = 110

_TITLES = {
    "zero": r"$\Sigma\to 0$: $K=-Q$, $Q_{ij}\sim U[0,1]$, $V=GG^T$",
    "line": r"line: $Q=q^T$, $K=-Q$, $V=I$",
    "plane": r"plane: $Q=q^T$, $K=-Q$, 2 heads",
    "two_lines": r"two lines: $A+A^T$ indefinite, $V$ random",
    "blowup": r"blow-up: $A+A^T\succ 0$, $V=I$",
    "depends": r"$\Sigma_0$-dependent: $A+A^T$ indefinite",
}


# ----------------------------------------------------------------------------------------
# grids
# ----------------------------------------------------------------------------------------

def _from_disk(x, y):
    """Unit-trace covariances at the points ``(x, y) = ((a - b), 2c)`` of the disk."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    return 0.5 * np.stack([np.stack([1 + x, y], -1), np.stack([y, 1 - x], -1)], -2)


def published_grid(n, limit):
    r"""The script's grid of unit-trace initial covariances (its ``init_grid``).

    Parameters
    ----------
    n : int
        Points per side of the square :math:`[-\ell, \ell]^2` of
        :math:`(a - b, 2c)` at trace one.
    limit : float
        Half-width :math:`\ell` of the square.

    Returns
    -------
    ndarray, shape (m, 2, 2)
        The covariances :math:`\tfrac12\begin{pmatrix}1+x & y\\ y & 1-x\end{pmatrix}` for
        the grid points strictly inside the unit disk (full rank), ``x`` varying slowest.
    """
    n = validate_int(n, "n", minimum=1)
    limit = validate_positive(limit, "limit")
    u = np.linspace(-limit, limit, n)
    x, y = (a.ravel() for a in np.meshgrid(u, u, indexing="ij"))
    inside = x ** 2 + y ** 2 < 1
    return _from_disk(x[inside], y[inside])


def unit_trace_grid(n_radii, n_angles, r_max=0.85):
    r"""Unit-trace 2 x 2 covariances on a polar grid of the disk, plus its centre.

    Parameters
    ----------
    n_radii, n_angles : int
        Rings and points per ring.
    r_max : float
        Radius of the outer ring, below 1.

    Returns
    -------
    ndarray, shape (1 + n_radii * n_angles, 2, 2)
        :math:`\Sigma = \tfrac12\begin{pmatrix}1 + x & y\\ y & 1 - x\end{pmatrix}` with
        :math:`(x, y) = r(\cos\theta, \sin\theta)`, :math:`0 < r \le` ``r_max``
        :math:`< 1` (full rank).
    """
    n_radii = validate_int(n_radii, "n_radii", minimum=1)
    n_angles = validate_int(n_angles, "n_angles", minimum=1)
    r_max = validate_positive(r_max, "r_max")
    if r_max >= 1:
        raise ValueError(f"`r_max` must be smaller than 1 (full-rank covariances), got {r_max}.")
    r = np.linspace(r_max / n_radii, r_max, n_radii)
    # alternate rings are rotated by half an angular step so the grid looks even
    th = (np.linspace(0, 2 * np.pi, n_angles, endpoint=False)[None, :]
          + (np.arange(n_radii)[:, None] % 2) * np.pi / n_angles)
    x = np.concatenate([[0.0], (r[:, None] * np.cos(th)).ravel()])
    y = np.concatenate([[0.0], (r[:, None] * np.sin(th)).ravel()])
    return _from_disk(x, y)


def regime_grids(size="default"):
    """Initial covariances per family: the script's layout at a given size.

    Parameters
    ----------
    size : {"quick", "default", "published"}
        ``"published"``: the script's grids (10 x 10 in the cone, 20, 40 and 30 per side
        in the disk); the others are coarser grids of the same squares.

    Returns
    -------
    dict
        Family -> array of shape (m, 2, 2).
    """
    if size not in _GRID_SIZES:
        raise ValueError(f"`size` must be one of {sorted(_GRID_SIZES)}, got {size!r}.")
    return {f: published_grid(_GRID_SIZES[size][f], _PUBLISHED_GRID[f][1]) for f in FAMILIES}


# ----------------------------------------------------------------------------------------
# the published draws
# ----------------------------------------------------------------------------------------

def _indefinite_or_positive(seed, positive):
    """The script's loop: ``Q, K`` standard normal until ``A + A^T`` has the wanted sign."""
    rs = np.random.RandomState(seed)
    for _ in range(1000):
        Q, K = rs.randn(2, 2), rs.randn(2, 2)
        e = np.linalg.eigvalsh(K.T @ Q + Q.T @ K)
        if (e[0] > 0) if positive else (e[0] * e[1] < 0):
            break
    return Q, K


def published_weights():
    """The matrices of ``2d_plots.py``, drawn as the script draws them.

    Returns
    -------
    dict
        ``zero``: ``Q``, ``V``; ``line`` (also ``plane``): ``q`` (1 x 2, unit norm) and
        ``direction`` (the script's limit line, perpendicular to ``q``); ``two_lines``,
        ``blowup`` and ``depends``: ``Q``, ``K`` (and ``V`` for the first and the last).
    """
    out = {}
    rs = np.random.RandomState(35)
    Q = rs.rand(2, 2)
    G = rs.randn(2, 2)
    out["zero"] = dict(Q=Q, V=G @ G.T)
    rs = np.random.RandomState(36)
    q = rs.randn(1, 2)
    q = q / np.linalg.norm(q)
    rs.randn(2, 2)                      # the script's unused V
    w = rs.randn(1, 2)                  # compute_dir_mat: a draw projected off q
    w = w / np.linalg.norm(w)
    w = w - np.inner(w, q) * q
    out["line"] = dict(q=q, direction=(w / np.linalg.norm(w)).ravel())
    Q, K = _indefinite_or_positive(36, positive=False)
    out["two_lines"] = dict(Q=Q, K=K, V=np.random.RandomState(32).randn(2, 2))
    out["blowup"] = dict(zip("QK", _indefinite_or_positive(33, positive=True)))
    rs = np.random.RandomState(35)
    rs.randn(8, 7)                      # the script discards these
    out["depends"] = dict(Q=Q, K=K, V=rs.randn(2, 2))
    return out


def _regime_attentions(regime):
    """Type -> (attention, limit-line direction or None) for one family, as published."""
    if regime not in FAMILIES:
        raise ValueError(f"unknown regime {regime!r}; one of {FAMILIES}.")
    w = published_weights()
    I2 = np.eye(2)
    u, heads = None, 2
    if regime == "zero":
        Q, V = w["zero"]["Q"], w["zero"]["V"]
        args = (Q, -Q, V)
    elif regime in ("line", "plane"):
        q = w["line"]["q"]
        args = (q, -q, I2)
        u = None if regime == "plane" else w["line"]["direction"]
    elif regime == "blowup":
        args = (w[regime]["Q"], w[regime]["K"], I2)
    else:
        args = (w[regime]["Q"], w[regime]["K"], w[regime]["V"])
        heads = 1 if regime == "depends" else 2     # the script calls it with one head
    return {kind: (regime_attention(kind, *args, heads=heads), u) for kind in PANELS[regime]}


def draw_all():
    """``{family: _regime_attentions(family)}`` for every family."""
    return {f: _regime_attentions(f) for f in FAMILIES}


# ----------------------------------------------------------------------------------------
# integration and classification
# ----------------------------------------------------------------------------------------

def _classify(t, cov, attention, status, t_blowup, message, growth_ratio=1e8):
    r""":func:`classify_trajectory`, with eigenvalues lost in rounding counted as vanished.

    When the package's rules leave the trajectory undecided and the trace neither fell
    to zero nor grew without bound, the eigenvalues at or below ``_VANISHED`` times the
    largest (a direction that collapsed exponentially: the integration keeps no digit
    of it, and its rate is rounding) are set aside, and the remaining ones are judged
    by the same rules: the trace fell below a tenth and all of them decay
    (:math:`t\lambda'/\lambda \le -1/2`) gives ``zero``; all settled gives ``rank r``;
    otherwise it stays undecided.
    """
    oc = classify_trajectory(t, cov, attention=attention, status=status,
                             t_blowup=t_blowup, message=message, growth_ratio=growth_ratio)
    if oc.outcome != Outcome.UNDECIDED or str(status) == "failed":
        return oc
    cf = cov[-1]
    lam, U = np.linalg.eigh(cf)
    lam, U = lam[::-1], U[:, ::-1]
    ratio = np.trace(cf) / np.trace(cov[0])
    if not lam[0] > 0 or ratio >= 1e8:
        return oc
    small = lam <= _VANISHED * lam[0]
    if not small.any() or attention.field_sees_mean:   # (a rate that needs the mean)
        return oc
    rate = attention.cov_rhs(cf)
    gamma = t[-1] * np.einsum("ji,jk,ki->i", U, 0.5 * (rate + rate.T), U)[~small] / lam[~small]
    if ratio <= 0.1 and np.all(gamma <= -0.5):
        return dataclasses.replace(
            oc, outcome=Outcome.ZERO, rank=0, limit=np.zeros_like(cf),
            message=f"trace fell by {1 / ratio:.3g}; the eigenvalues decay (log-log slopes "
                    f"<= {gamma.max():.3g}) or vanished (below {_VANISHED:g} of the largest)")
    kept = lam[~small] > 1e-4 * lam[0]
    if np.all(np.abs(gamma[kept]) <= 1e-2) and np.all(gamma[~kept] <= 1e-2):
        r = int(kept.sum())
        Uk = U[:, ~small][:, kept]
        return dataclasses.replace(
            oc, outcome=Outcome.RANK, rank=r, limit=(Uk * lam[~small][kept]) @ Uk.T,
            message=f"{r} eigenvalue(s) settled (|t lambda'/lambda| <= "
                    f"{np.abs(gamma[kept]).max():.2g}); {int(small.sum())} vanished "
                    f"(below {_VANISHED:g} of the largest, exponential collapse)")
    return oc


def _against_conserved(oc, cov0, n):
    r"""Compare a limit with the one fixed by the conserved :math:`n^T\Sigma^{-1}n` (math.md 4.2).

    For :math:`K = -Q = -q^T` and :math:`n \perp q`, a rank-one limit along :math:`n` is
    :math:`nn^T/(n^T\Sigma_0^{-1}n)`. The relative distance goes into the message.
    """
    pred = np.outer(n, n) / (n @ np.linalg.solve(cov0, n))
    err = np.linalg.norm(oc.limit - pred) / np.trace(pred)
    return dataclasses.replace(oc, message=f"{oc.message}; the limit differs from "
                               f"n n^T / (n^T Sigma_0^-1 n) (conserved) by {err:.1e}")


def _run_regimes(grids, n_eval, drawn=None, progress=None):
    """Integrate and classify every panel.

    Parameters
    ----------
    grids : dict
        Family -> initial covariances (:func:`regime_grids`).
    n_eval : int
        Stored samples per trajectory (geometric in time, for the figures).
    drawn : dict, optional
        ``{family: _regime_attentions(family)}``; a subset runs only those families.
    progress : callable, optional
        Called after each family.

    Returns
    -------
    dict
        ``(family, type)`` -> dict with ``attention``, ``line``, ``covs`` (n, n_eval + 2,
        2, 2; NaN after the stop), ``outcomes``, ``t_eval``.
    """
    if drawn is None:
        drawn = draw_all()
    results = {}
    for family in [f for f in FAMILIES if f in drawn]:
        atts, grid = drawn[family], grids[family]
        names = [n for n in PANELS[family] if n in atts]
        horizons = {}
        for name in names:
            horizons.setdefault(_HORIZON_PANEL.get((family, name), _HORIZON[family]),
                                []).append(name)
        for T, group in horizons.items():
            _run_group(results, family, group, atts, grid, T, n_eval)
        if progress is not None:
            progress(f"regimes: {family}")
    return results


def _run_group(results, family, names, atts, grid, T, n_eval):
    """One :func:`solve_batch` call for the panels ``names`` of a family (horizon ``T``)."""
    growth = _GROWTH if family == "blowup" else 1e8
    t_eval = np.concatenate([[0.0], np.geomspace(1e-3, T, n_eval)])
    seq = [atts[name][0] for name in names for _ in range(len(grid))]
    sol = solve_batch(seq, np.concatenate([grid] * len(names)), (0.0, T), t_eval=t_eval,
                      rtol=1e-9, atol=1e-12, max_nfev=20_000)
    for j, name in enumerate(names):
        att, line = atts[name]
        trajs, outcomes = [], []
        for i in range(len(grid)):
            b = j * len(grid) + i
            keep = np.isfinite(sol.cov[b, :, 0, 0])
            t = np.append(t_eval[keep], sol.t_final[b])
            cv = np.concatenate([sol.cov[b, keep], sol.cov_final[b][None]])
            if t[-2] == t[-1]:
                t, cv = t[:-1], cv[:-1]
            oc = _classify(t, cv, att, sol.status[b],
                           None if np.isnan(sol.t_blowup[b]) else sol.t_blowup[b],
                           sol.message[b], growth_ratio=growth)
            if line is not None and oc.limit is not None:
                oc = _against_conserved(oc, grid[i], line)
            outcomes.append(oc)
            traj = np.full((n_eval + 2, 2, 2), np.nan)
            traj[:cv.shape[0]] = cv
            trajs.append(traj)
        results[(family, name)] = dict(attention=att, line=line, covs=np.array(trajs),
                                       outcomes=outcomes, t_eval=t_eval,
                                       t_final=sol.t_final[j * len(grid):(j + 1) * len(grid)])


def limit_lines(outcomes, tol_deg=2.0):
    """The distinct limit lines (angles in degrees, in [0, 180)) of rank-1 outcomes.

    Parameters
    ----------
    outcomes : sequence of TrajectoryOutcome
        Classified trajectories (the rank-1 ones count).
    tol_deg : float
        Angles closer than this are one line.

    Returns
    -------
    list of float
        Representative angles, sorted.
    """
    angles = []
    for o in outcomes:
        if o.outcome == Outcome.RANK and o.rank == 1 and o.limit is not None:
            v = np.linalg.eigh(o.limit)[1][:, -1]
            angles.append(float(np.degrees(np.arctan2(v[1], v[0])) % 180.0))
    lines = []
    for a in sorted(angles):
        if not any(min(abs(a - b), 180 - abs(a - b)) < tol_deg for b in lines):
            lines.append(a)
    return lines


#: the script's divergence stop: it ends a run when the trace passes 1e3 (its default)
SCRIPT_STOP = 1e3


def passes_script_stop(covs):
    """Per trajectory: whether the trace passes :data:`SCRIPT_STOP` at a stored sample.

    The script's Euler runs stop there and count as "diverged"; an L2 trajectory of the
    ``depends`` family can pass it and still converge (to a rank-1 limit of large trace).
    """
    return np.nanmax(np.trace(covs, axis1=-2, axis2=-1), axis=1) > SCRIPT_STOP


def outcome_counts(outcomes):
    """``"blowup 1: 3, rank 1: 5, ..."``: outcomes (with their rank) and their counts."""
    kinds = {}
    for o in outcomes:
        key = str(o.outcome) + (f" {o.rank}" if o.outcome in ("rank", "blowup")
                                and o.rank is not None else "")
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{k}: {v}" for k, v in sorted(kinds.items()))


# ----------------------------------------------------------------------------------------
# figures and report
# ----------------------------------------------------------------------------------------

def _direction(angle_deg):
    a = np.radians(angle_deg)
    return np.array([np.cos(a), np.sin(a)])


def _draw_plane(ax, r):
    r"""The plane of steady states :math:`e_1^T\Sigma q = 0` of the ``plane`` panel, in the cone."""
    q = published_weights()["line"]["q"].ravel()
    top = float(np.nanmax(np.trace(r["covs"], axis1=-2, axis2=-1)))
    # a q_1 + c q_2 = 0 with a = (x + z) / 2, c = y / 2: y = -(x + z) q_1 / q_2
    x, z = np.meshgrid(np.linspace(-top, top, 30), np.linspace(0, top, 30))
    y = -(x + z) * q[0] / q[1]
    y = np.where(x ** 2 + y ** 2 <= z ** 2, y, np.nan)
    ax.plot_surface(x, y, z, color="tab:orange", alpha=0.3, linewidth=0, zorder=5)  # on top


def fixed_margins(fig, *, left, right, bottom, top, wspace, hspace):
    """Place the subplots with margins given in inches (``wspace``, ``hspace``: fractions).

    What ``tight_layout`` would choose for these figures, without its cost: it measures
    every tick label and title, and a 3-D panel by drawing it.
    """
    w, h = fig.get_size_inches()
    fig.subplots_adjust(left=left / w, right=1 - right / w, bottom=bottom / h, top=1 - top / h,
                        wspace=wspace, hspace=hspace)


#: matplotlib settings of the figures: each title sits at the top of its axes. (With the
#: default, matplotlib measures the tick labels of every axes at each draw to see whether
#: a title must move up past top tick labels or an offset text, which these axes lack.)
FIGURE_RC = {"axes.titley": 1.0}


def draw_figure(draw, path, save_figure):
    """Make a figure with ``draw(fig)`` and save it to ``path`` at :data:`DPI`.

    The figure is a plain :class:`matplotlib.figure.Figure` (no pyplot state, nothing to
    close), made at the resolution it is saved at, under :data:`FIGURE_RC`.
    """
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.rc_context(FIGURE_RC):
        fig = Figure(dpi=DPI)
        canvas = FigureCanvasAgg(fig)
        draw(fig)
        # matplotlib caches parsed mathtext per parser, and the renderer of each figure
        # has its own: the figures share one, so a title or label is parsed once
        renderer = canvas.get_renderer()   # the one savefig uses (same size and dpi)
        parser = getattr(renderer, "mathtext_parser", None)
        if parser is not None:
            renderer.mathtext_parser = _MATHTEXT.setdefault("parser", parser)
        return save_figure(fig, path, dpi=DPI)


#: the mathtext parser that the figures share (see :func:`draw_figure`)
_MATHTEXT = {}


def draw_figures(tasks, out, save_figure, *, processes=1, progress=None):
    """Draw figures with :func:`draw_figure`, on one process or on two.

    Parameters
    ----------
    tasks : sequence of (str, callable)
        ``(name, draw)`` pairs (as :func:`figure_tasks` returns): ``draw(fig)`` fills the
        figure saved as ``out / "<name>.png"``.
    out : pathlib.Path
        Existing output folder.
    save_figure : callable
        ``save_figure(fig, path, dpi=...)``, as for :func:`draw_figure`.
    processes : {1, 2}
        2: a forked child process draws from the end of ``tasks`` while this one draws
        from the front, each taking the next figure nobody has taken yet, so that the two
        finish together. The files are those of the serial run, pixel for pixel. On one
        core, where fork does not exist or in a process that may not have children, one
        process; when the child fails, this process draws its share.
    progress : callable or None
        Called with ``"figure: <name>.png"`` after each figure (those of the child when
        it has finished).

    Returns
    -------
    paths : dict
        ``{name: path}``, in the order of ``tasks``.
    seconds : dict
        ``{name: (wall, cpu)}``: the seconds each figure took in the process that drew it.
    """
    tasks = list(tasks)
    n = len(tasks)
    if progress is None:
        def progress(msg):
            return None
    processes = validate_int(processes, "processes", minimum=1)
    if processes > 2:
        raise ValueError(f"`processes` must be 1 or 2, got {processes}.")
    ctx = None
    if processes == 2 and n > 1 and (os.cpu_count() or 1) >= 2:
        import multiprocessing

        try:
            ctx = multiprocessing.get_context("fork")
        except ValueError:   # no fork on this platform: one process
            ctx = None
    seconds = {}
    if ctx is None:
        for name, draw in tasks:
            seconds[name] = _draw_timed(draw, out / f"{name}.png", save_figure)
            progress(f"figure: {name}.png")
        return {name: out / f"{name}.png" for name, _ in tasks}, seconds
    # imported before the fork, once for both processes. Fonts are not shared: matplotlib
    # empties its font cache in a forked child, and the child drops the shared mathtext
    # parser (_draw_share), so it opens font files of its own
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.figure  # noqa: F401

    ends = ctx.Array("i", [0, n])          # next task from the front, one past the last
    done = ctx.Array("b", n)               # 1: drawn by the child
    times = ctx.Array("d", 2 * n)          # the child's (wall, cpu) per task
    child = ctx.Process(target=_draw_share, args=(tasks, out, save_figure, ends, done, times),
                        daemon=True)
    try:
        child.start()
    except (AssertionError, OSError):      # a daemonic process has no children: all here
        child = None
    try:
        while (i := _take(ends, front=True)) is not None:
            name, draw = tasks[i]
            seconds[name] = _draw_timed(draw, out / f"{name}.png", save_figure)
            progress(f"figure: {name}.png")
    finally:
        if child is not None:
            child.join()
    for i, (name, draw) in enumerate(tasks):
        if name in seconds:
            continue
        if child is not None and child.exitcode == 0 and done[i]:
            seconds[name] = (times[2 * i], times[2 * i + 1])
        else:                              # the child failed: drawn here
            seconds[name] = _draw_timed(draw, out / f"{name}.png", save_figure)
        progress(f"figure: {name}.png")
    return {name: out / f"{name}.png" for name, _ in tasks}, seconds


def _take(ends, front):
    """Index of the next task from the front or the back of the shared queue (or None)."""
    with ends.get_lock():
        lo, hi = ends[0], ends[1]
        if lo >= hi:
            return None
        if front:
            ends[0] = lo + 1
            return lo
        ends[1] = hi - 1
        return hi - 1


def _draw_share(tasks, out, save_figure, ends, done, times):
    """The forked child of :func:`draw_figures`: tasks from the back of the queue."""
    # the shared parser's cached glyphs point into the parent's open font files, whose
    # read offsets the two processes would move under each other: this one parses anew
    _MATHTEXT.clear()
    while (i := _take(ends, front=False)) is not None:
        name, draw = tasks[i]
        times[2 * i], times[2 * i + 1] = _draw_timed(draw, out / f"{name}.png", save_figure)
        done[i] = 1


def _draw_timed(draw, path, save_figure):
    """:func:`draw_figure` and its (wall, cpu) seconds in this process."""
    w, c = time.perf_counter(), time.process_time()
    draw_figure(draw, path, save_figure)
    return time.perf_counter() - w, time.process_time() - c


def figure_tasks(results):
    """The figures of the regimes: ``regimes_<type>`` and ``eigenvalue_flows``.

    Parameters
    ----------
    results : dict
        :func:`_run_regimes`'s results.

    Returns
    -------
    list of (str, callable)
        ``(name, draw)``: ``draw(fig)`` fills a :class:`matplotlib.figure.Figure`
        (:func:`draw_figure` makes and saves it as ``<name>.png``).
    """
    types = [n for n in REGIME_TYPES if any((f, n) in results for f in FAMILIES)]
    tasks = [(f"regimes_{name}", _bind(_draw_regimes, results, name)) for name in types]
    return tasks + [("eigenvalue_flows", _bind(_draw_flows, results))]


def _bind(fun, *args):
    return lambda fig: fun(fig, *args)


def _draw_regimes(fig, results, name):
    """The panels of attention type ``name``, one per family, into ``fig``."""
    from .. import plotting

    fams = [f for f in FAMILIES if (f, name) in results]
    ncol = min(3, len(fams))
    nrow = -(-len(fams) // ncol)
    fig.set_size_inches(4.3 * ncol, 4.0 * nrow + 1.1)
    for j, family in enumerate(fams):
        r = results[(family, name)]
        title = f"{_TITLES[family]}\n{outcome_counts(r['outcomes'])}"
        if family in CONE:
            ax = fig.add_subplot(nrow, ncol, j + 1, projection="3d")
            lines = [_direction(a) for a in limit_lines(r["outcomes"])]
            first = r["line"] if r["line"] is not None else (lines[0] if lines else None)
            if family in ("zero", "plane"):
                first = None
            plotting.plot_cone_trajectories(r["covs"], ax, limit_direction=first, title=title)
            if family == "two_lines":
                top = np.nanmax(np.trace(r["covs"], axis1=-2, axis2=-1))
                for u in lines[1:]:
                    p = plotting._line_direction(u) * 1.05 * top
                    ax.plot([0, p[0]], [0, p[1]], [0, p[2]], color=plotting.LIMIT_COLOR, lw=2.5)
            if family == "plane":
                _draw_plane(ax, r)
            ax.view_init(elev=20, azim=-60)
        else:
            ax = fig.add_subplot(nrow, ncol, j + 1)
            labels = [str(o.outcome) for o in r["outcomes"]]
            if family == "depends":      # converging, but past the script's stop
                labels = [f"rank, tr > {SCRIPT_STOP:g}" if lab == "rank" and big else lab
                          for lab, big in zip(labels, passes_script_stop(r["covs"]))]
            plotting.plot_disk_trajectories(r["covs"], ax, outcomes=labels, title=title)
    fig.suptitle(f"{name}: the paper's 2-D families (published draws)\n"
                 r"cone: $(a-b, 2c, a+b)$, disk: $\Sigma/\mathrm{tr}\,\Sigma$", fontsize=13)
    w, h = fig.get_size_inches()
    fixed_margins(fig, left=0.07 * w, right=0.05 * w, bottom=0.06 * h, top=1.25,
                  wspace=0.45, hspace=0.3)   # room for a 3-D z label beside a disk's y label


def _draw_flows(fig, results):
    """Eigenvalues of Sigma / tr Sigma over time, one panel per family, into ``fig``."""
    from .. import plotting

    flow = REGIME_FLOW_TYPE
    fams = [f for f in FAMILIES if (f, flow) in results]
    n = max(len(fams), 1)
    ncol = min(3, n)
    nrow = -(-n // ncol)
    fig.set_size_inches(4.3 * ncol, 3.6 * nrow + 0.7)
    axes = fig.subplots(nrow, ncol, squeeze=False)
    for ax, family in zip(axes.ravel(), fams):
        r = results[(family, flow)]
        plotting.plot_eigenvalue_flow(r["t_eval"], r["covs"][:, :-1], ax, summary=True,
                                      title=f"{flow}: {_TITLES[family].splitlines()[0]}")
        ax.set_ylim(bottom=_VANISHED, top=1.5)   # below: lost in rounding (see _classify)
    for ax in axes.ravel()[len(fams):]:
        ax.set_visible(False)
    fig.suptitle(r"Eigenvalues of $\Sigma/\mathrm{tr}\,\Sigma$ (" + flow + "): median over the "
                 r"starting covariances, 10-90 % band; cut at $10^{-12}$", fontsize=13)
    fixed_margins(fig, left=0.836, right=0.275, bottom=0.61, top=0.727, wspace=0.292,
                  hspace=0.287)


def report_lines(results, paths):
    """The regimes section of ``report.md``: a table of outcome counts and the figures.

    Parameters
    ----------
    results : dict
        :func:`_run_regimes`'s results.
    paths : dict
        Figure name (``regimes_<type>``, ``eigenvalue_flows``) -> path.

    Returns
    -------
    list of str
        Markdown lines.
    """
    L = ["## 2-D regimes (docs/math.md section 4.4)", "",
         "The six families of the published `2d_plots.py`, with its draws (NumPy's legacy "
         "generator, seeds 35, 36, 32 and 33 in the script's order) and the script's grids "
         "of unit-trace initial covariances (coarser by default). Each family is one "
         "`solve_batch` call; every trajectory is classified "
         "(`gaussian_pde.analysis.classify_trajectory`).", "",
         f"| family | type | initial covariances | outcomes | limit lines (deg) | "
         f"trace passes {SCRIPT_STOP:g} |", "|---|---|---|---|---|---|"]
    for family in FAMILIES:
        for name in PANELS[family]:
            if (family, name) not in results:
                continue
            oc = results[(family, name)]["outcomes"]
            lines = ", ".join(f"{a:.0f}" for a in limit_lines(oc)) or "-"
            big = int(passes_script_stop(results[(family, name)]["covs"]).sum())
            L.append(f"| {family} | {name} | {len(oc)} | {outcome_counts(oc)} | {lines} "
                     f"| {big} |")
    L += ["", "Outcomes: `zero` (Sigma -> 0), `rank r` (converges to a rank-r limit), "
          "`blowup r` (finite-time, Sigma / tr Sigma tends to rank r), `grows` (the trace "
          "grew by more than 1e3 and still grows: L2 and Sinkhorn fields are bounded in "
          "Sigma, so their growth is exponential), `undecided` (the evidence does not "
          "decide). Limit lines: the directions of the rank-1 limits, as angles of the "
          "top eigenvector. Last column: trajectories whose trace passes "
          f"{SCRIPT_STOP:g}, where the script stops and counts a divergence; in the L2 "
          "`depends` panel these converge (to rank-1 limits of large trace), so there the "
          "only thing that depends on Sigma_0 is the size and direction of the limit. The "
          "multi-head panel of `depends` is the script's multi-head field called with one "
          "head, i.e. the softmax field.", ""]
    for name in REGIME_TYPES:
        if f"regimes_{name}" in paths:
            L += [f"![{name} regimes]({paths[f'regimes_{name}'].name})", ""]
    L += [f"![eigenvalue flows]({paths['eigenvalue_flows'].name})", ""]
    return L
