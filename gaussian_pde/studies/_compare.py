r"""Moment ODEs against particle Monte Carlo (docs/math.md section 8).

For a Gaussian-preserving attention type the particle system started from
:math:`x_i \sim \mathcal N(\alpha_0, \Sigma_0)` i.i.d. has moments
:math:`(\bar x_n(t), \Sigma_n(t))` that converge to the solution :math:`(\alpha(t),
\Sigma(t))` of the moment ODEs (:func:`gaussian_pde.solve`) with error
:math:`O(n^{-1/2})`. :func:`compare` measures, per number of tokens ``n``, per seed and per
time,

* the relative mean error :math:`|\bar x_n - \alpha| / \sqrt{\operatorname{tr}\Sigma}`
  (relative to the spread: the mean itself may vanish);
* the relative covariance error :math:`\|\Sigma_n - \Sigma\|_F / \|\Sigma\|_F`;
* the Bures-Wasserstein distance :math:`W_2(\mathcal N(\bar x_n, \Sigma_n),
  \mathcal N(\alpha, \Sigma))`, also relative to :math:`\sqrt{\operatorname{tr}\Sigma}`;

and fits the slope of :math:`\log(\text{error})` against :math:`\log n` (about
:math:`-1/2`). For every type, Gaussian-preserving or not, it measures how far the
particles are from Gaussian (sliced Wasserstein distance of the whitened tokens to
:math:`\mathcal N(0, I)` and the excess kurtosis along principal directions) and the
effective sample size of the attention weights.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import warnings

import numpy as np

from .._common.gaussian import bures_wasserstein
from .._common.validation import (
    validate_allocation,
    validate_array,
    validate_covariance,
    validate_int,
    validate_positive,
    validate_tolerance,
    validate_vector,
)
from ..attention import make_options, validate_attention
from ..integrate import solve
from ..particles import (
    PARTICLE_METHODS,
    ParticleDegeneracyWarning,
    SinkhornConvergenceWarning,
    sample_gaussian,
    simulate_particles,
    sliced_wasserstein_to_gaussian,
)

__all__ = ["CompareReport", "check_compare_memory", "compare", "compare_memory", "fit_slope",
           "mean_field_check_failures", "stored_compare"]

#: error metrics with an ODE reference, in the order of the table
ERROR_METRICS = ("mean_error", "cov_error", "bw", "bw_relative")
#: metrics defined for every attention type
SHAPE_METRICS = ("sliced_w2", "kurtosis", "ess_min", "ess_median")


def fit_slope(n, err):
    r"""Least-squares slope of :math:`\log(\text{err})` against :math:`\log n`.

    ``err`` has shape ``(N,)``; non-finite or non-positive entries are left out.
    Returns NaN with fewer than two usable points.
    """
    n = np.asarray(n, dtype=float)
    err = np.asarray(err, dtype=float)
    ok = np.isfinite(err) & (err > 0)
    if ok.sum() < 2:
        return np.nan
    return float(np.polyfit(np.log(n[ok]), np.log(err[ok]), 1)[0])


def compare_memory(d, n_max, n_sizes, n_seeds, n_times, n_directions=64):
    r"""Bytes that :func:`compare` and the files of ``gaussian-pde compare`` hold at peak.

    An estimate, linear in the number of output times :math:`T`: the particle run in
    progress keeps its tokens at every output time, :math:`8 n_{\max} d` bytes at the
    largest ``n``, and about 2 kB of moments and records per time (its own and the moment
    ODE's); the report holds, per ``(n, seed, t)``, :math:`d + d^2 + 10` numbers, about
    eight times over while they are written as JSON (lists of Python floats, then text);
    the CSV table a row of about 2 kB per ``(n, t)``; the sliced Wasserstein distance
    projects the largest run's tokens on :math:`L` directions and sorts a copy:

    .. math::

        T\,\big(8 n_{\max} d + 2000 + N\,(2000 + 64\,S\,(d + d^2 + 10))\big)
        + 16\,n_{\max} L,

    with :math:`N` numbers of tokens and :math:`S` seeds. The peak resident memory of
    ``gaussian-pde compare`` grows with :math:`T` within 20 % of it (d = 2, 20 and 30
    tokens, 2 seeds, 20,000 to 60,000 times: 12.5 kB per time measured, 10.6 kB here).

    Parameters
    ----------
    d : int
        Dimension of the tokens.
    n_max : int
        Largest number of tokens.
    n_sizes, n_seeds, n_times : int
        How many numbers of tokens, seeds and output times.
    n_directions : int
        Directions :math:`L` of the sliced Wasserstein distance.

    Returns
    -------
    float
        Bytes.
    """
    per_time = (8.0 * n_max * d + 2000.0
                + n_sizes * (2000.0 + 64.0 * n_seeds * (d + d * d + 10)))
    return float(n_times) * per_time + 16.0 * n_max * n_directions


def check_compare_memory(d, n_max, n_sizes, n_seeds, n_times, n_directions=64, *,
                         names=("`n`", "`len(seeds)`", "`len(t_eval)`", "`n_directions`")):
    """Refuse, before any work, a comparison whose arrays would not fit in memory.

    The limit is that of :func:`~gaussian_pde._common.validation.validate_allocation`
    (half the physical memory), the need :func:`compare_memory`. The message names the
    sizes as ``names`` (the numbers of tokens, the seeds, the output times and, when a
    fourth name is given, the directions: the arguments of :func:`compare` by default,
    the options of the command line there) and the size it would need. Returns the bytes
    needed.
    """
    need = compare_memory(d, n_max, n_sizes, n_seeds, n_times, n_directions)
    try:
        validate_allocation(need, names[2], itemsize=1)
    except ValueError:
        sizes = [f"{names[0]} up to {n_max} tokens in d = {d}", f"{names[1]} {n_seeds}",
                 f"{names[2]} {n_times} output times"]
        if len(names) > 3:
            sizes.append(f"{names[3]} {n_directions}")
        lower = [names[2], names[1], names[0], *names[3:]]
        raise ValueError(
            f"{', '.join(sizes[:-1])} and {sizes[-1]} would need {need / 2**30:.3g} GiB (the "
            f"tokens, moments and errors at every output time), more than half of this "
            f"machine's memory; lower {', '.join(lower[:-1])} or {lower[-1]}.") from None
    return need


@dataclasses.dataclass(frozen=True)
class CompareReport:
    """Result of :func:`compare`: arrays indexed ``[n, seed, time]``.

    Attributes
    ----------
    attention : str
        Registry name of the attention type.
    t : ndarray, shape (T,)
        Output times.
    n : ndarray, shape (N,)
        Numbers of tokens.
    seeds : ndarray, shape (S,)
        Seeds (run ``(n, seed)`` samples with ``seed=(seed, n)``).
    ode_mean, ode_cov : ndarray, shape (T, d) and (T, d, d), or None
        Moment ODE solution (NaN after the ODE stopped); ``None`` for types that do not
        preserve Gaussians or a position-dependent mean.
    ode_status : str or None
        Status of :func:`gaussian_pde.solve`.
    mean, cov : ndarray, shape (N, S, T, d) and (N, S, T, d, d)
        Particle moments (NaN after a run stopped).
    mean_error, cov_error, bw, bw_relative : ndarray, shape (N, S, T) or None
        Errors against the ODE (see the module docstring); ``None`` without an ODE.
    sliced_w2, kurtosis : ndarray, shape (N, S, T)
        Non-Gaussianity of the particles (Gaussian floor: the value at ``t = 0``).
    ess_min, ess_median : ndarray, shape (N, S, T)
        Effective sample size of the attention weights, minimum and median over queries.
    sinkhorn_error : ndarray, shape (N, S, T) or None
        Sinkhorn column marginal error.
    status : ndarray of str, shape (N, S)
        Status of every particle run.
    slopes : dict
        Fitted slope of each error metric (time-averaged RMS over seeds) against ``n``.
    slope_sem : dict
        Standard error of each slope from the spread of per-seed slopes.
    """

    attention: str
    t: np.ndarray
    n: np.ndarray
    seeds: np.ndarray
    ode_mean: np.ndarray | None
    ode_cov: np.ndarray | None
    ode_status: str | None
    mean: np.ndarray
    cov: np.ndarray
    mean_error: np.ndarray | None
    cov_error: np.ndarray | None
    bw: np.ndarray | None
    bw_relative: np.ndarray | None
    sliced_w2: np.ndarray
    kurtosis: np.ndarray
    ess_min: np.ndarray
    ess_median: np.ndarray
    sinkhorn_error: np.ndarray | None
    status: np.ndarray
    slopes: dict
    slope_sem: dict

    @property
    def slope_times(self):
        """The output times that the slopes are fitted over, shape ``(K,)``.

        Those at which every particle run and the moment ODE have every error metric
        (:func:`_slope`): all times up to the first stop. Only ``t[0]`` (the initial
        draw) when every run or the ODE stopped before the next output time; empty
        without an ODE.
        """
        errs = [getattr(self, m) for m in ERROR_METRICS if getattr(self, m) is not None]
        if not errs:
            return self.t[:0]
        common = np.all([np.all(np.isfinite(e), axis=(0, 1)) for e in errs], axis=0)
        return self.t[common]

    @property
    def metrics(self):
        """Names of the ``(N, S, T)`` metrics present in this report."""
        names = [m for m in ERROR_METRICS if getattr(self, m) is not None]
        names += list(SHAPE_METRICS)
        if self.sinkhorn_error is not None:
            names.append("sinkhorn_error")
        return names

    def summary(self, metric):
        """Mean and standard error over seeds of ``metric``, each of shape ``(N, T)``."""
        a = getattr(self, metric)
        if a is None:
            raise ValueError(f"`metric` {metric!r} is not available for {self.attention}.")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            count = np.sum(np.isfinite(a), axis=1)
            mean = np.nanmean(a, axis=1)
            sd = np.nanstd(a, axis=1, ddof=1) if a.shape[1] > 1 else np.zeros_like(mean)
            sem = np.where(count > 1, sd / np.sqrt(np.maximum(count, 1)), np.nan)
        return mean, sem

    def table(self):
        """One row per ``(n, t)``: mean and standard error over seeds of every metric."""
        stats = {m: self.summary(m) for m in self.metrics}
        rows = []
        for i, n in enumerate(self.n):
            for k, t in enumerate(self.t):
                row = {"attention": self.attention, "n": int(n), "t": float(t)}
                for m, (mean, sem) in stats.items():
                    row[m] = float(mean[i, k])
                    row[m + "_sem"] = float(sem[i, k])
                rows.append(row)
        return rows

    def to_dict(self):
        """Everything as plain lists and numbers, JSON-ready (NaN becomes ``None``)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def save(self, path):
        """Write the report to ``path`` (compressed NPZ, no pickle); :meth:`load` reads it."""
        arrays, meta = {}, {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, np.ndarray):
                arrays[f.name] = v
            else:
                meta[f.name] = v
        np.savez_compressed(pathlib.Path(path), _meta=np.array(json.dumps(meta)), **arrays)

    @classmethod
    def load(cls, path):
        """The report that :meth:`save` wrote to ``path``."""
        with np.load(pathlib.Path(path), allow_pickle=False) as data:
            values = json.loads(str(data["_meta"])) if "_meta" in data.files else {}
            values.update({k: data[k] for k in data.files if k != "_meta"})
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in values]
        if missing:
            raise ValueError(f"`path` {str(path)!r} holds no CompareReport: {missing} missing.")
        return cls(**values)


def _plain(v):
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (float, np.floating)):
        return float(v) if np.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    return v


def _nan(shape):
    return np.full(shape, np.nan)


def compare(attention, mean0, cov0, n=(500, 2000, 8000), seeds=range(5), t_eval=None, *,
            positions=None, method="RK45", dt=None, rtol=1e-6, atol=1e-8, chunk_size=None,
            dtype=np.float64, sinkhorn_tol=None, sinkhorn_max_iter=1000, ode_rtol=1e-10,
            ode_atol=1e-12, n_directions=64, ess_threshold=10.0, blowup_threshold=1e8,
            progress=None):
    r"""Compare particle Monte Carlo with the Gaussian moment ODEs.

    Parameters
    ----------
    attention : Attention
        Any attention type. Errors against the ODE need a Gaussian-preserving type and a
        constant mean; otherwise only the particle statistics are reported.
    mean0 : array_like, shape (d,), or callable
        Initial mean, or ``mean0(positions) -> (n, d)`` for a position-dependent mean
        (masked attention; see :func:`sample_gaussian`).
    cov0 : array_like, shape (d, d)
        Initial covariance.
    n : sequence of int
        Numbers of tokens (each at least 2).
    seeds : sequence of int
        Seeds; run ``(n, seed)`` draws its tokens with ``seed=(seed, n)``.
    t_eval : array_like, shape (T,)
        Output times (``t_eval[0]`` is the start); default ``linspace(0, 1, 11)``.
    positions : array_like or None
        Sequence positions for every ``n`` are :math:`(i + 1/2)/n` (``None``); give a
        callable ``positions(n) -> (n,)`` for others.
    method, dt, rtol, atol, chunk_size, dtype, sinkhorn_tol, sinkhorn_max_iter, blowup_threshold
        Passed to :func:`simulate_particles`.
    ode_rtol, ode_atol : float
        Tolerances of :func:`gaussian_pde.solve`.
    n_directions : int
        Directions of the sliced Wasserstein distance.
    ess_threshold : float
        One :class:`ParticleDegeneracyWarning` if any run's median effective sample
        size falls below it.
    progress : callable or None
        Called with a short message after the moment ODE (when there is one) and after
        each particle run (``"particles: n = 500, seed 0"``); ``None`` (the default):
        silent.

    Returns
    -------
    CompareReport
    """
    validate_attention(attention, gaussian=False)
    cov0, mean0, ns, seeds, t_eval, t_span, n_directions = _compare_sizes(
        attention, mean0, cov0, n, seeds, t_eval, positions, n_directions)
    ode_rtol = validate_tolerance(ode_rtol, "ode_rtol")
    ode_atol = validate_positive(ode_atol, "ode_atol")
    # the particle runs' options, checked before the moment ODE runs (not after it)
    if not isinstance(method, str) or method not in PARTICLE_METHODS:
        raise ValueError(f"`method` must be one of {list(PARTICLE_METHODS)}, got {method!r}.")
    if dt is not None:
        validate_positive(dt, "dt")
    validate_tolerance(rtol, "rtol")
    validate_positive(atol, "atol")
    make_options(2, chunk_size=chunk_size, dtype=dtype, sinkhorn_tol=sinkhorn_tol,
                 sinkhorn_max_iter=sinkhorn_max_iter)

    with_ode = attention.gaussian_preserving and not callable(mean0)
    ode_mean = ode_cov = ode_status = None
    if with_ode:
        ode_mean, ode_cov, ode_status = _moment_ode(attention, mean0, cov0, t_span, t_eval,
                                                    ode_rtol, ode_atol, progress)
    runs, low_ess, unconverged = _particle_runs(
        attention, mean0, cov0, ns, seeds, t_span, t_eval, positions, n_directions, progress,
        method=method, dt=dt, rtol=rtol, atol=atol, chunk_size=chunk_size, dtype=dtype,
        blowup_threshold=blowup_threshold, sinkhorn_tol=sinkhorn_tol,
        sinkhorn_max_iter=sinkhorn_max_iter, ess_threshold=ess_threshold)
    if low_ess:
        nn, seed, msg = low_ess[0]
        warnings.warn(f"{len(low_ess)} of {ns.size * seeds.size} particle runs lost track of "
                      f"the mean-field limit; first (n = {nn}, seed = {seed}): {msg}",
                      ParticleDegeneracyWarning, stacklevel=2)
    if unconverged:
        warnings.warn(f"{len(unconverged)} runs: {unconverged[0]}", SinkhornConvergenceWarning,
                      stacklevel=2)

    errs = {m: None for m in ERROR_METRICS}
    slopes, slope_sem = {}, {}
    if with_ode:
        errs, slopes, slope_sem = _errors_against_ode(ns, runs["mean"], runs["cov"], ode_mean,
                                                      ode_cov)
    return CompareReport(
        attention=attention.name, t=t_eval, n=ns, seeds=seeds, ode_mean=ode_mean,
        ode_cov=ode_cov, ode_status=ode_status, **runs, **errs, slopes=slopes,
        slope_sem=slope_sem)


def _compare_sizes(attention, mean0, cov0, n, seeds, t_eval, positions, n_directions):
    """The initial state and the sizes of :func:`compare`, validated.

    Returns ``(cov0, mean0, ns, seeds, t_eval, t_span, n_directions)``; a comparison
    whose arrays would not fit in memory is refused (:func:`check_compare_memory`).
    """
    d = attention.d
    cov0 = validate_covariance(cov0, "cov0", d=d)
    if not callable(mean0):
        mean0 = validate_vector(mean0, "mean0", size=d)
    ns = np.array([validate_int(v, "n", minimum=2) for v in np.atleast_1d(n).tolist()],
                  dtype=int)
    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__iter__"):
        raise TypeError(f"`seeds` must be a sequence of non-negative integers, got {seeds!r}.")
    seeds = np.array([validate_int(s, "seeds", minimum=0) for s in seeds], dtype=int)
    if seeds.size == 0 or ns.size == 0:
        raise ValueError("`n` and `seeds` must not be empty.")
    t_eval = np.linspace(0.0, 1.0, 11) if t_eval is None else validate_array(t_eval, "t_eval",
                                                                              ndim=1)
    if t_eval.size < 1 or np.any(np.diff(t_eval) <= 0):
        raise ValueError("`t_eval` must be a non-empty, strictly increasing array.")
    t_span = (float(t_eval[0]), float(max(t_eval[-1], t_eval[0] + 1e-12)))
    if positions is not None and not callable(positions):
        raise TypeError("`positions` must be None or a callable positions(n) -> (n,).")
    n_directions = validate_int(n_directions, "n_directions", minimum=1)
    check_compare_memory(d, int(ns.max()), ns.size, seeds.size, t_eval.size, n_directions)
    return cov0, mean0, ns, seeds, t_eval, t_span, n_directions


def _moment_ode(attention, mean0, cov0, t_span, t_eval, rtol, atol, progress):
    """The moment ODE's mean and covariance at ``t_eval`` (NaN after it stopped), its status."""
    d, T = attention.d, t_eval.size
    sol = solve(attention, mean0, cov0, t_span, t_eval=t_eval, rtol=rtol, atol=atol)
    ode_mean, ode_cov = _nan((T, d)), _nan((T, d, d))
    k = sol.t.size
    ode_mean[:k], ode_cov[:k] = sol.mean, sol.cov
    ode_status = str(sol.status)
    if progress is not None:
        progress(f"moment ODE -> {ode_status}")
    return ode_mean, ode_cov, ode_status


def _particle_run(attention, x0, t_span, t_eval, tau, low_ess, unconverged, label, **options):
    """One particle run from ``x0``, its warnings sorted.

    A :class:`ParticleDegeneracyWarning` goes into ``low_ess`` (as ``(*label, message)``,
    ``label`` being ``(n, seed)``) and a :class:`SinkhornConvergenceWarning` into
    ``unconverged``, for :func:`compare` to sum up; any other warning is issued again.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ps = simulate_particles(attention, x0, t_span, t_eval=t_eval, positions=tau,
                                keep_positions=True, warn=True, **options)
    for w in caught:
        if issubclass(w.category, ParticleDegeneracyWarning):
            low_ess.append((*label, str(w.message)))
        elif issubclass(w.category, SinkhornConvergenceWarning):
            unconverged.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return ps


def _particle_runs(attention, mean0, cov0, ns, seeds, t_span, t_eval, positions, n_directions,
                   progress, **options):
    """Every particle run ``(n, seed)`` of :func:`compare`: ``(runs, low_ess, unconverged)``.

    ``runs`` holds the report's particle fields, arrays ``(N, S, T, ...)`` that are NaN
    after a run stopped (``sinkhorn_error``: ``None`` unless a kernel reports a marginal
    error); ``low_ess`` and ``unconverged`` the sorted warnings (:func:`_particle_run`).
    """
    d = attention.d
    T, N, S = t_eval.size, ns.size, seeds.size
    mean, cov = _nan((N, S, T, d)), _nan((N, S, T, d, d))
    sw, kurt, ess_min, ess_med = (_nan((N, S, T)) for _ in range(4))
    sk_err = None                  # the first run whose kernel reports a marginal error
    status = np.empty((N, S), dtype=object)
    low_ess, unconverged = [], []
    for i, nn in enumerate(ns):
        tau = None if positions is None else positions(int(nn))
        for j, seed in enumerate(seeds):
            x0 = sample_gaussian(mean0, cov0, int(nn), seed=(int(seed), int(nn)), positions=tau)
            ps = _particle_run(attention, x0, t_span, t_eval, tau, low_ess, unconverged,
                               (int(nn), int(seed)), **options)
            k = ps.t.size
            status[i, j] = str(ps.status)
            mean[i, j, :k], cov[i, j, :k] = ps.mean, ps.cov
            ess_min[i, j, :k], ess_med[i, j, :k] = ps.ess_min, ps.ess_median
            kurt[i, j, :k] = ps.kurtosis
            for m in range(k):
                sw[i, j, m] = sliced_wasserstein_to_gaussian(ps.x[m], n_directions, seed=m)
            if ps.sinkhorn_error is not None:
                if sk_err is None:
                    sk_err = _nan((N, S, T))
                sk_err[i, j, :k] = ps.sinkhorn_error
            if progress is not None:
                progress(f"particles: n = {int(nn)}, seed {int(seed)} -> {status[i, j]}")
    runs = dict(mean=mean, cov=cov, sliced_w2=sw, kurtosis=kurt, ess_min=ess_min,
                ess_median=ess_med, sinkhorn_error=sk_err, status=status.astype(str))
    return runs, low_ess, unconverged


def _errors_against_ode(ns, mean, cov, ode_mean, ode_cov):
    """The error metrics of the particle moments against the ODE's, and their slopes in ``n``.

    Returns ``(errs, slopes, slope_sem)``: ``errs`` maps each of :data:`ERROR_METRICS` to
    its ``(N, S, T)`` array (see the module docstring), the others as in
    :class:`CompareReport`.
    """
    N, S, T = mean.shape[:3]
    errs = {m: None for m in ERROR_METRICS}
    slopes, slope_sem = {}, {}
    scale = np.sqrt(np.trace(ode_cov, axis1=-2, axis2=-1))  # (T,)
    errs["mean_error"] = np.linalg.norm(mean - ode_mean, axis=-1) / scale
    errs["cov_error"] = (np.linalg.norm(cov - ode_cov, axis=(-2, -1))
                         / np.linalg.norm(ode_cov, axis=(-2, -1)))
    bw = _nan((N, S, T))
    ok = np.isfinite(mean).all(-1) & np.isfinite(ode_mean).all(-1)
    bw[ok] = np.atleast_1d(bures_wasserstein(
        mean[ok], cov[ok], np.broadcast_to(ode_mean, mean.shape)[ok],
        np.broadcast_to(ode_cov, cov.shape)[ok]))
    errs["bw"] = bw
    errs["bw_relative"] = bw / scale
    for m in ERROR_METRICS:
        slopes[m], slope_sem[m] = _slope(ns, errs[m])
    return errs, slopes, slope_sem


#: relative agreement asked of a stored run that is run again (the runs are seeded; only the
#: order of floating-point sums and a Sinkhorn iteration count may differ between machines)
RERUN_RTOL = 1e-6


def stored_compare(path, attention, mean0, cov0, n, seeds=range(5), *, write=False, **kwargs):
    r""":func:`compare` whose runs at the largest ``n`` are read from a file.

    The runs at the largest ``n`` cost most (a particle step costs :math:`O(n^2)`). With
    ``write=True`` this is :func:`compare`, and the report is saved to ``path``. Otherwise
    the report saved there is read, and the moment ODE and the runs at every ``n`` but the
    largest are computed again: the stored report must be for the same attention type,
    ``n``, seeds and times, and the recomputed moments must agree with the stored ones to
    the relative :data:`RERUN_RTOL` (run ``(n, seed)`` draws its tokens with
    ``seed=(seed, n)``, so a stored run is reproducible). A stored file that the code no
    longer reproduces (another sampler, another kernel) is refused.

    Parameters
    ----------
    path : str, pathlib.Path or None
        The NPZ file (:meth:`CompareReport.save`); ``None``: every run is made here (this
        is :func:`compare`), and so with a warning when ``path`` does not exist.
    attention, mean0, cov0, n, seeds, kwargs
        As for :func:`compare`.
    write : bool
        Run everything and write ``path`` (default: read it).

    Returns
    -------
    CompareReport
        The stored report (``write=False``) or the new one.

    Raises
    ------
    ValueError
        If the stored report is for other arguments or its runs are not reproduced.
    """
    if path is not None and not write and not pathlib.Path(path).is_file():
        warnings.warn(f"no stored report at {str(path)!r}: every run is made here (write=True "
                      f"stores them)", UserWarning, stacklevel=2)
        path = None
    if path is None or write:
        report = compare(attention, mean0, cov0, n=n, seeds=seeds, **kwargs)
        if path is not None:
            report.save(path)
        return report
    stored = CompareReport.load(path)
    again = compare(attention, mean0, cov0, n=np.atleast_1d(n)[:-1], seeds=seeds, **kwargs)
    k = again.n.size
    same = (stored.attention == again.attention and stored.n.size == k + 1
            and np.array_equal(stored.n[:k], again.n) and np.array_equal(stored.seeds, again.seeds)
            and np.array_equal(stored.t, again.t))
    if not same:
        raise ValueError(f"`path` {str(path)!r} holds a report for other arguments "
                         f"({stored.attention}, n = {stored.n.tolist()}); write it again "
                         f"(write=True).")
    pairs = [(again.mean, stored.mean[:k]), (again.cov, stored.cov[:k])]
    if again.ode_cov is not None:
        pairs += [(again.ode_mean, stored.ode_mean), (again.ode_cov, stored.ode_cov)]
    for a, b in pairs:
        scale = np.nanmax(np.abs(b)) if np.isfinite(b).any() else 1.0
        if not np.allclose(a, b, rtol=RERUN_RTOL, atol=RERUN_RTOL * scale, equal_nan=True):
            raise ValueError(f"`path` {str(path)!r}: the runs at n = {again.n.tolist()} do not "
                             f"reproduce the stored ones (largest difference "
                             f"{np.nanmax(np.abs(a - b)):.3g}); write it again (write=True).")
    return stored


def _slope(ns, err):
    """Slope of the seed-RMS of the time-averaged error against ``n``, and its standard error.

    Only times where every run has a value enter the time average (so all ``n`` are
    compared over the same interval).
    """
    common = np.all(np.isfinite(err), axis=(0, 1))
    if not common.any():
        return np.nan, np.nan
    per_run = np.sqrt(np.mean(err[:, :, common] ** 2, axis=-1))  # (N, S) time RMS
    slope = fit_slope(ns, np.sqrt(np.mean(per_run**2, axis=1)))
    per_seed = np.array([fit_slope(ns, per_run[:, j]) for j in range(per_run.shape[1])])
    per_seed = per_seed[np.isfinite(per_seed)]
    sem = float(np.std(per_seed, ddof=1) / np.sqrt(per_seed.size)) if per_seed.size > 1 else np.nan
    return slope, sem


def mean_field_check_failures(report):
    r"""The agreement checks of the validation notebooks; returns the failed ones (empty: pass).

    For a Gaussian-preserving type compared over several ``n``:

    * the fitted slope of every error (mean, covariance, relative Bures-Wasserstein)
      against :math:`n` is :math:`-1/2` within three seed-to-seed standard errors of the
      slope plus 0.1;
    * at the largest :math:`n` the covariance error stays within 5 standard errors of a
      sample covariance, :math:`\sqrt{2/n}` relative (times :math:`\sqrt 2`), at every time;
    * the particles stay near-Gaussian: the sliced :math:`W_2` distance to the fitted
      Gaussian at the largest ``n`` stays within twice its value at :math:`t = 0` (the
      Monte Carlo floor of a Gaussian sample).
    """
    failures = []
    for metric in ("mean_error", "cov_error", "bw_relative"):
        tol = 3 * report.slope_sem[metric] + 0.1
        if not abs(report.slopes[metric] + 0.5) < tol:
            failures.append(f"slope of {metric} = {report.slopes[metric]:.3g}, expected "
                            f"-0.5 +- {tol:.3g}")
    n_max = np.max(report.n)
    bound = 5 * np.sqrt(2 / n_max) * np.sqrt(2)
    if not np.nanmax(report.cov_error[-1]) < bound:
        failures.append(f"covariance error at n = {n_max}: {np.nanmax(report.cov_error[-1]):.3g}"
                        f" >= {bound:.3g}")
    sw = report.summary("sliced_w2")[0]
    if not np.all(sw[-1] < 2 * sw[-1, 0]):
        failures.append(f"sliced W2 to the fitted Gaussian grew: {sw[-1]}")
    return failures

