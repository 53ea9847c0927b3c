r"""Figures of covariance dynamics (docs/math.md section 5). Imports matplotlib; the package does not.

A 2 x 2 covariance :math:`\Sigma = \begin{pmatrix} a & c\\ c & b\end{pmatrix}` is a point
:math:`(a - b,\; 2c,\; a + b)` of :math:`\mathbb R^3`; positive semi-definite matrices
fill the cone :math:`(a-b)^2 + (2c)^2 \le (a+b)^2`, rank-one matrices
:math:`s\,uu^T` its surface (the ray through :math:`(u_1^2 - u_2^2, 2u_1u_2, 1)`), and
normalised covariances :math:`\Sigma/\operatorname{tr}\Sigma` the unit disk at height one.

Every function takes an optional matplotlib ``ax`` (a new figure is made otherwise) and
returns it; the start of each trajectory is marked in red, its end in black.
"""

from __future__ import annotations

import numpy as np

from ._common.validation import validate_array, validate_int, validate_square_2x2

__all__ = [
    "cone_coordinates",
    "disk_coordinates",
    "plot_cone_trajectories",
    "plot_disk_trajectories",
    "plot_eigenvalue_flow",
    "plot_rank_histogram",
]

START_COLOR = "tab:red"
END_COLOR = "black"
LIMIT_COLOR = "tab:orange"
OUTCOME_COLORS = {"zero": "tab:blue", "rank": "tab:green", "blowup": "tab:red",
                  "grows": "tab:purple", "undecided": "0.5"}


def cone_coordinates(cov):
    r"""The coordinates :math:`(a - b, 2c, a + b)` of 2 x 2 covariances, shape (..., 3)."""
    cov = validate_square_2x2(cov, "cov")
    a, b, c = cov[..., 0, 0], cov[..., 1, 1], 0.5 * (cov[..., 0, 1] + cov[..., 1, 0])
    return np.stack([a - b, 2 * c, a + b], axis=-1)


def disk_coordinates(cov):
    r"""The point :math:`((a - b)/(a + b), 2c/(a + b))` of the normalised covariance.

    It lies in the unit disk; on its boundary for rank-one covariances.
    """
    x = cone_coordinates(cov)
    if np.any(x[..., 2] <= 0):
        raise ValueError("`cov` must have a positive trace to be drawn in the unit disk.")
    return x[..., :2] / x[..., 2:3]


def _trajectories(covs, name="covs"):
    covs = validate_square_2x2(covs, name)
    if covs.ndim == 3:
        covs = covs[None]
    if covs.ndim != 4:
        raise ValueError(f"`{name}` must have shape (T, 2, 2) or (n, T, 2, 2), got {covs.shape}.")
    return covs


def _new_ax(projection=None):
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(5, 5))
    return fig.add_subplot(projection=projection)


def _line_direction(direction):
    u = validate_array(direction, "limit_direction", ndim=1)
    if u.shape != (2,) or not np.linalg.norm(u) > 0:
        raise ValueError("`limit_direction` must be a non-zero vector of length 2.")
    u = u / np.linalg.norm(u)
    return np.array([u[0] ** 2 - u[1] ** 2, 2 * u[0] * u[1], 1.0])


def plot_cone_trajectories(covs, ax=None, *, limit_direction=None, color="tab:blue",
                           surface=True, title=None):
    r"""Trajectories of 2 x 2 covariances in the PSD cone, coordinates :math:`(a-b, 2c, a+b)`.

    Parameters
    ----------
    covs : array_like, shape (T, 2, 2) or (n, T, 2, 2)
        One or ``n`` trajectories; NaN samples (after a trajectory stopped) are skipped.
    ax : mpl_toolkits.mplot3d.Axes3D, optional
        Axes with ``projection="3d"``; a new figure is made otherwise.
    limit_direction : array_like, shape (2,), optional
        Draw the limiting line :math:`\{s\,uu^T\}` (a ray on the cone surface).
    surface : bool
        Draw the cone surface :math:`(a-b)^2 + (2c)^2 = (a+b)^2`.
    color : str
        Colour of the trajectories.
    title : str, optional
        Axes title.

    Notes
    -----
    The artists are drawn in a fixed order (``ax.computed_zorder`` is set to ``False``):
    the trajectories, the limit line, the starts and ends, then the cone's wireframe.
    """
    from mpl_toolkits.mplot3d.art3d import Line3DCollection

    covs = _trajectories(covs)
    if ax is None:
        ax = _new_ax("3d")
    ax.computed_zorder = False
    pts = cone_coordinates(np.nan_to_num(covs, nan=0.0))
    ok = np.isfinite(covs).all(axis=(-2, -1))
    top = max(float(np.nanmax(np.where(ok, pts[..., 2], np.nan))), 1e-12)
    paths = [p[k] for p, k in zip(pts, ok) if k.any()]
    # one artist each for the trajectories, the starts and the ends: the cost of drawing
    # is per artist, and a collection strokes its paths one by one, as separate lines would
    if paths:
        ax.add_collection3d(Line3DCollection(paths, colors=color, linewidths=1.0, alpha=0.8,
                                             zorder=2))
        ax.scatter(*np.array([p[0] for p in paths]).T, color=START_COLOR, s=12,
                   depthshade=False, zorder=3)
        ax.scatter(*np.array([p[-1] for p in paths]).T, color=END_COLOR, s=8,
                   depthshade=False, zorder=3)
    if surface:
        th, h = np.meshgrid(np.linspace(0, 2 * np.pi, 40), np.linspace(0, 1.05 * top, 8))
        ax.plot_wireframe(h * np.cos(th), h * np.sin(th), h, color="0.75", lw=0.4, zorder=4)
    if limit_direction is not None:
        r = _line_direction(limit_direction) * 1.05 * top
        ax.plot([0, r[0]], [0, r[1]], [0, r[2]], color=LIMIT_COLOR, lw=2.5, label="limit line")
    ax.plot([], [], color=color, label="trajectory")
    ax.scatter([], [], color=START_COLOR, s=12, label=r"$\Sigma_0$")
    ax.scatter([], [], color=END_COLOR, s=8, label="end")
    ax.set_xlabel(r"$a-b$")
    ax.set_ylabel(r"$2c$")
    ax.set_zlabel(r"$a+b$")
    ax.legend(fontsize=8, loc="upper left")
    if title:
        ax.set_title(title, fontsize=10)
        ax.title.set_y(1.0)    # at the top of the axes, as in 2-D (a 3-D title sits lower)
    return ax


def plot_disk_trajectories(covs, ax=None, *, outcomes=None, limit_direction=None,
                           color="tab:blue", title=None):
    r"""Normalised covariances :math:`\Sigma/\operatorname{tr}\Sigma` in the unit disk.

    The boundary circle holds the rank-one normalised covariances :math:`uu^T`.

    Parameters
    ----------
    covs : array_like, shape (T, 2, 2) or (n, T, 2, 2)
        Trajectories (NaN samples are skipped).
    ax : matplotlib.axes.Axes, optional
        Axes to draw into; a new figure is made otherwise.
    color : str
        Colour of the trajectories.
    title : str, optional
        Axes title.
    outcomes : sequence of str, optional
        One outcome per trajectory (:class:`gaussian_pde.analysis.Outcome` values); colours
        the trajectories and adds a legend.
    limit_direction : array_like, shape (2,), optional
        Mark the limiting normalised covariance :math:`uu^T` on the circle.
    """
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Circle

    covs = _trajectories(covs)
    if outcomes is not None:
        outcomes = [str(o) for o in outcomes]
        if len(outcomes) != covs.shape[0]:
            raise ValueError(f"`outcomes` must have one entry per trajectory ({covs.shape[0]}), "
                             f"got {len(outcomes)}.")
    if ax is None:
        ax = _new_ax()
    ax.add_patch(Circle((0, 0), 1, fill=False, color="0.4", lw=1))
    paths, colors, seen = [], [], {}
    for i, cv in enumerate(covs):
        cv = cv[np.isfinite(cv).all(axis=(-2, -1))]
        cv = cv[np.trace(cv, axis1=-2, axis2=-1) > 0]
        if cv.shape[0] == 0:
            continue
        paths.append(disk_coordinates(cv))
        colors.append(color if outcomes is None else OUTCOME_COLORS.get(outcomes[i], "0.3"))
        if outcomes is not None:
            seen.setdefault(outcomes[i], colors[-1])
    # one artist for all the trajectories (in their order, each in its colour), one for
    # the starts and one for the ends: the cost of drawing is per artist
    if paths:
        ax.add_collection(LineCollection(paths, colors=colors, linewidths=1.0, alpha=0.85))
        ax.plot(*np.array([p[-1] for p in paths]).T, "o", color=END_COLOR, ms=2, ls="none")
        ax.plot(*np.array([p[0] for p in paths]).T, "o", color=START_COLOR, ms=3, ls="none")
    for lab, col in seen.items():   # legend entries, in the order the outcomes first occur
        ax.plot([], [], color=col, lw=1.0, alpha=0.85, label=lab)
    if limit_direction is not None:
        x = _line_direction(limit_direction)
        ax.plot(x[0], x[1], "*", color=LIMIT_COLOR, ms=14, mec="k", label="limit direction")
    ax.plot([], [], "o", color=START_COLOR, ms=3, label=r"$\Sigma_0$")
    ax.set_aspect("equal")
    ax.set_xlim(-1.08, 1.08)
    ax.set_ylim(-1.08, 1.08)
    ax.set_xlabel(r"$(a-b)/\mathrm{tr}\,\Sigma$")
    ax.set_ylabel(r"$2c/\mathrm{tr}\,\Sigma$")
    ax.legend(fontsize=8, loc="lower left")
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_eigenvalue_flow(t, covs, ax=None, *, normalized=True, logx=True, color=None,
                         title=None, summary=False):
    r"""Eigenvalues over time of :math:`\Sigma/\operatorname{tr}\Sigma` (or of :math:`\Sigma`).

    Parameters
    ----------
    t : array_like, shape (T,)
        Times.
    covs : array_like, shape (T, d, d) or (n, T, d, d)
        Trajectories (any ``d``; NaN samples are skipped).
    normalized : bool
        Plot the eigenvalues of :math:`\Sigma/\operatorname{tr}\Sigma` (log scale); else of
        :math:`\Sigma`.
    logx : bool
        Symmetric-log time axis (linear below 0.01).
    ax : matplotlib.axes.Axes, optional
        Axes to draw into; a new figure is made otherwise.
    color : str
        Line colour (default: the colour cycle).
    title : str, optional
        Axes title.
    summary : bool
        One labelled line per eigenvalue (ordered by size: the median over the
        trajectories, with a band from their 10th to 90th percentile) instead of one line
        per eigenvalue and trajectory.
    """
    t = validate_array(t, "t", ndim=1)
    covs = validate_array(covs, "covs", ndim=(3, 4), finite=False)
    if covs.ndim == 3:
        covs = covs[None]
    if covs.shape[1] != t.size or covs.shape[-1] != covs.shape[-2]:
        raise ValueError(f"`covs` must have shape (n, {t.size}, d, d), got {covs.shape}.")
    if ax is None:
        ax = _new_ax()
    if summary:
        _eigenvalue_bands(t, covs, ax, normalized)
    for cv in (() if summary else covs):
        k = np.isfinite(cv).all(axis=(-2, -1))
        if not k.any():
            continue
        w = np.linalg.eigvalsh(cv[k])
        if normalized:
            w = np.clip(w / np.sum(w, axis=-1, keepdims=True), 1e-300, 1.0)
        w = np.clip(w, 1e-300, None)
        ax.plot(t[k], w, color=color, lw=0.8, alpha=0.6)
    if normalized:
        ax.set_ylim(top=1.5)      # eigenvalues of Sigma / tr Sigma are at most 1
    if logx:
        ax.set_xscale("symlog", linthresh=1e-2)
        ax.set_xlim(0, float(np.nanmax(t)))   # times are non-negative
    ax.set_yscale("log")
    ax.set_xlabel("t (depth)")
    ax.set_ylabel(r"eigenvalues of $\Sigma/\mathrm{tr}\,\Sigma$" if normalized
                  else r"eigenvalues of $\Sigma$")
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def _eigenvalue_bands(t, covs, ax, normalized):
    """Median and 10-90 % band over trajectories of each ordered eigenvalue (labelled)."""
    import warnings

    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # times where every sample is NaN
        finite = np.isfinite(covs).all(axis=(-2, -1))
        w = np.full(covs.shape[:-1], np.nan)
        w[finite] = np.linalg.eigvalsh(covs[finite])
        if normalized:
            w = np.clip(w / np.sum(w, axis=-1, keepdims=True), 1e-300, 1.0)
        w = w[..., ::-1]                     # largest first
        d = w.shape[-1]
        for i in range(d):
            lo, med, hi = np.nanpercentile(w[..., i], [10, 50, 90], axis=0)
            ok = np.isfinite(med)
            suffix = {2: "nd", 3: "rd"}.get(i + 1, "th")
            name = "largest" if i == 0 else ("smallest" if i == d - 1 else f"{i + 1}{suffix} largest")
            line, = ax.plot(t[ok], med[ok], lw=1.8, label=f"{name} (median)")
            ax.fill_between(t[ok], lo[ok], hi[ok], color=line.get_color(), alpha=0.2, lw=0)
    ax.legend(fontsize=8, loc="lower left")


def plot_rank_histogram(ranks, d, ax=None, *, title=None):
    """Grouped bar chart of rank counts for ``0..d``.

    Parameters
    ----------
    ranks : mapping of str to array_like of int
        Label (e.g. a protocol) to ranks, one per setting; negative entries (undecided)
        are counted in a separate "?" bar.
    d : int
        Dimension (largest possible rank).
    ax : matplotlib.axes.Axes, optional
        Axes to draw into; a new figure is made otherwise.
    title : str, optional
        Axes title.
    """
    d = validate_int(d, "d", minimum=1)
    if not hasattr(ranks, "items") or len(ranks) == 0:
        raise ValueError("`ranks` must be a non-empty mapping label -> ranks.")
    if ax is None:
        ax = _new_ax()
    labels = list(ranks)
    width = 0.8 / len(labels)
    x = np.arange(d + 2)
    for j, lab in enumerate(labels):
        r = np.asarray(ranks[lab], dtype=int).ravel()
        if r.size and (r.max() > d):
            raise ValueError(f"`ranks[{lab!r}]` has ranks above d = {d}.")
        counts = np.bincount(np.where(r < 0, d + 1, r), minlength=d + 2)
        bars = ax.bar(x + (j - (len(labels) - 1) / 2) * width, counts, width, label=lab)
        ax.bar_label(bars, labels=[str(c) if c else "" for c in counts], fontsize=8)
    ax.set_xticks(x, [str(i) for i in range(d + 1)] + ["?"])
    ax.set_xlabel("rank of the limit covariance")
    ax.set_ylabel("number of settings")
    top = max((b.get_height() for c in ax.containers for b in c), default=1.0)
    ax.set_ylim(0, 1.4 * max(top, 1.0))        # room for the legend above the bars
    ax.legend(fontsize=8, loc="upper left", ncol=len(labels))
    if title:
        ax.set_title(title, fontsize=10)
    return ax
