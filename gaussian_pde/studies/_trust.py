r"""Where the Gaussian-mixture closure can be trusted: its bias, separated from Monte Carlo.

The measure (:func:`closure_bias`). For one attention and one starting mixture
:math:`\mu_0 = \sum_k w_k\mathcal N(\alpha_k, \Sigma_k)`, each run ``s`` at ``n`` tokens

1. samples ``n`` labelled tokens (stratified, :meth:`~gaussian_pde.GaussianMixture.sample`);
2. starts the closure (:func:`gaussian_pde.solve_mixture`) from the tokens' *own*
   labelled moments :math:`\hat w_k = n_k/n`, :math:`\hat m_k`, :math:`\hat C_k`
   (:func:`empirical_start`), so that closure and particles agree exactly at
   :math:`t = 0`: no initial Monte Carlo offset is carried and amplified by the flow;
3. moves the tokens (classical RK4 on the particle system, all runs of one ``n`` as one
   batch, :func:`batched_particle_velocity`) and records, at each output time, the
   relative moment deviation of the labelled tokens from the closure's components
   (:func:`relative_deviation`)

   .. math::

       \delta = \Big(\sqrt{w_k}\,\frac{\hat m_k - \alpha_k}{s},\
                \sqrt{w_k}\,\frac{\hat C_k - \Sigma_k}{2s\sqrt{\operatorname{tr}\Sigma_k/d}}
                \Big)_k,\qquad s^2 = \sum_kw_k\operatorname{tr}\Sigma_k,

   whose norm is the linearised pooled Gaussian-fit W2 of the components, in units of
   their own size :math:`s` (the flow can grow or shrink the cloud exponentially; an
   absolute error would follow the scale, not the closure).

Over the runs, :math:`\mathbb E\,\delta(n) = b + b_1/n + \dots`: the closure's bias
:math:`b` (deterministic, what does not shrink with ``n``), while the Monte Carlo part has
mean zero and spread :math:`O(n^{-1/2})`. Runs at ``n`` and ``4n`` give the
extrapolated mean :math:`\hat b = (4\bar\delta(4n) - \bar\delta(n))/3` and

.. math::

    \hat\beta^2 = |\hat b|^2 - \operatorname{tr}\widehat{\operatorname{Var}}\,\hat b,\qquad
    \widehat{\operatorname{Var}}\,\hat b = \frac{16\,\widehat{\operatorname{Var}}\,\delta(4n)/S_4
    + \widehat{\operatorname{Var}}\,\delta(n)/S_1}{9},

an unbiased estimate of :math:`|b|^2`, reported as the signed root
:math:`\hat\beta = \operatorname{sign}(\hat\beta^2)|\hat\beta^2|^{1/2}` with a percentile
bootstrap interval (runs resampled at each size independently). Where the closure is exact
the interval holds 0; where it is not, :math:`\hat\beta` is the closure's relative error
in the limit :math:`n\to\infty`. The Monte Carlo level of one run of ``4n`` tokens on the
same scale is :math:`\mathrm{mc} = (\overline{|\delta(4n)|^2} - \hat\beta^2)^{1/2}`; the
resolution of :math:`\hat\beta` is about :math:`\mathrm{mc}/S^{1/2}`. Averaging the
signed deviations (rather than their norms) is what makes the bias visible below the
Monte Carlo level of a single run.

The map (:func:`run_trust`, command ``gaussian-pde clusters --trust``): two symmetric
components (means :math:`\pm\text{radius}\,e_1`, covariances :math:`0.3^2I`), softmax /
L2 / multi-head of :func:`~gaussian_pde.studies._clusters.cluster_attention` with
:math:`V = I`, over the attention scale ``q``, the radius (separation
:math:`2\,\text{radius}/0.3` standard deviations) and ``d`` in {2, 3}
(:func:`write_trust`: table and heat map); for softmax, also the exact control (one
Gaussian with the mixture's total mean and covariance, same attention). :func:`remeasure_study`
applies the measure to the cases of the clusters study.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time

import numpy as np

from .._common.runge_kutta import rk4_march
from ..attention import CLUSTER_REFERENCE_TYPE, quadratic_heads
from ..closure import GaussianMixture, solve_mixture
from ._clusters import (
    CLUSTER_ATTENTIONS,
    cluster_attention,
    cluster_cases,
    cluster_mixture,
    labelled_moments,
    moment_errors,
)

__all__ = [
    "empirical_start",
    "batched_particle_velocity",
    "relative_deviation",
    "ClosureBias",
    "closure_bias",
    "TRUST_GRID",
    "run_trust",
    "remeasure_study",
    "offset_growth",
    "growth_study",
    "mardia_kurtosis_ratio",
    "merge_gap_sources",
    "write_trust",
]


def empirical_start(x, labels, K):
    r"""The mixture of the tokens' labelled moments: :math:`(n_k/n,\ \hat m_k,\ \hat C_k)`.

    Parameters
    ----------
    x : array_like, shape (n, d)
        Tokens.
    labels : array_like of int, shape (n,)
        Component of each token, in ``0..K-1``, every label present.
    K : int
        Number of components.

    Returns
    -------
    GaussianMixture
        Covariances with the ``1/n_k`` normalisation (:func:`labelled_moments`).
    """
    labels = np.asarray(labels)
    counts = np.bincount(labels, minlength=K)
    if counts.size != K or np.any(counts == 0):
        raise ValueError(f"`labels` must hold every component 0..{K - 1} at least once, got "
                         f"counts {counts.tolist()}.")
    m, C = labelled_moments(x, labels, K)
    return GaussianMixture(counts / counts.sum(), m, 0.5 * (C + np.swapaxes(C, 1, 2)))


def batched_particle_velocity(heads, x):
    r"""Particle velocities of a stack of independent token clouds.

    For every head with score :math:`s(x, y) = -\tfrac12y^THy + y^T(Ax + g) + r(x)` (the
    quadratic form of :func:`gaussian_pde.attention.quadratic_heads`; :math:`r` cancels),

    .. math:: v_i = \sum_{\text{heads}} V\sum_j\operatorname{softmax}_j\big(s(x_i, x_j)\big)\,x_j,

    within each cloud. Agrees with :meth:`~gaussian_pde.attention._base.Attention.particle_velocity`
    cloud by cloud (tested), in one batched product.

    Parameters
    ----------
    heads : list of QuadraticScore
        From :func:`~gaussian_pde.attention.quadratic_heads`.
    x : ndarray, shape (S, n, d)
        ``S`` clouds of ``n`` tokens.

    Returns
    -------
    ndarray, shape (S, n, d)
    """
    out = np.zeros_like(x)
    for h in heads:
        logit = (x @ h.A.T) @ np.swapaxes(x, 1, 2)                   # [s, i, j]: y_j^T A x_i
        if h.H is not None:
            logit -= 0.5 * np.sum((x @ h.H) * x, axis=2)[:, None, :]
        if h.g is not None:
            logit += (x @ h.g)[:, None, :]
        logit -= logit.max(axis=2, keepdims=True)
        p = np.exp(logit)
        p /= p.sum(axis=2, keepdims=True)
        out += (p @ x) @ h.V.T
    return out


def _rk4_batch(heads, x, t_eval, dt):
    """RK4 with equal steps of at most ``dt`` between the output times: (T, S, n, d)."""
    def f(t, y):
        return batched_particle_velocity(heads, y)
    return np.stack(rk4_march(f, x, t_eval, dt))


def relative_deviation(means, covs, ref_means, ref_covs, weights):
    r"""The relative moment deviation :math:`\delta` of per-component moments (module docstring).

    .. math::

        \delta = \Big(\sqrt{w_k}\,\frac{m_k - \alpha_k}{s},\
                 \sqrt{w_k}\,\frac{C_k - \Sigma_k}{2s\,\sqrt{\operatorname{tr}\Sigma_k/d}}
                 \Big)_{k=1..K},\qquad s^2 = \sum_kw_k\operatorname{tr}\Sigma_k,

    so that :math:`|\delta|` is the linearised pooled Gaussian-fit W2 (exact for the means,
    and for isotropic :math:`\Sigma_k` to first order in :math:`C_k - \Sigma_k`) in units
    of the components' size :math:`s`.

    Parameters
    ----------
    means, covs : array_like, (..., K, d) and (..., K, d, d)
        Moments (e.g. of the labelled particles).
    ref_means, ref_covs : array_like, (..., K, d) and (..., K, d, d)
        The reference (the closure); leading axes broadcast.
    weights : array_like, shape (K,) or (..., K)
        Component weights.

    Returns
    -------
    ndarray, shape (..., K (d + d^2))
    """
    means, covs = np.asarray(means, float), np.asarray(covs, float)
    ref_means, ref_covs = np.asarray(ref_means, float), np.asarray(ref_covs, float)
    w = np.asarray(weights, float)
    d = means.shape[-1]
    tr = np.trace(ref_covs, axis1=-2, axis2=-1)                      # (..., K)
    s = np.sqrt(np.sum(w * tr, axis=-1))[..., None, None]            # (..., 1, 1)
    sw = np.sqrt(w)[..., None]
    dm = sw * (means - ref_means) / s
    flat = (covs - ref_covs).reshape(covs.shape[:-2] + (d * d,))
    dc = sw * flat / (2 * s * np.sqrt(tr / d)[..., None])
    lead = dm.shape[:-2]
    return np.concatenate([dm.reshape(lead + (-1,)), dc.reshape(lead + (-1,))], axis=-1)


@dataclasses.dataclass(frozen=True)
class ClosureBias:
    r"""Result of :func:`closure_bias`.

    Attributes
    ----------
    t : ndarray, shape (T,)
        Output times.
    ns : (int, int)
        The two sizes ``n`` and ``4n``.
    delta : (ndarray, ndarray)
        The runs' relative deviations :math:`\delta`, shapes (S, T, D) at each size.
    bias : ndarray, shape (T,)
        :math:`\hat\beta`, the signed root of the debiased :math:`|\hat b|^2` (relative to
        the components' size).
    interval : ndarray, shape (T, 2)
        Percentile bootstrap interval of ``bias``.
    rms : ndarray, shape (2, T)
        :math:`(\overline{|\delta|^2})^{1/2}` at each size: the typical error of one run
        (Monte Carlo and bias together).
    seconds : float
        Process time of the runs.
    bias_mean, bias_cov : ndarray, shape (T,)
        The same estimate on the mean entries and on the covariance entries of
        :math:`\delta` alone (:math:`\hat\beta^2` is their sum).
    """

    t: np.ndarray
    ns: tuple
    delta: tuple
    bias: np.ndarray
    interval: np.ndarray
    rms: np.ndarray
    seconds: float
    bias_mean: np.ndarray = None
    bias_cov: np.ndarray = None

    @property
    def mc(self):
        r"""Monte Carlo level of one run at ``4n``, shape (T,).

        :math:`\big(\max(\overline{|\delta|^2}(4n) - \hat\beta^2, 0)\big)^{1/2}`.
        """
        return np.sqrt(np.maximum(self.rms[1] ** 2 - np.sign(self.bias) * self.bias ** 2, 0))

    def at(self, i=-1):
        """``(bias, (lo, hi), mc)`` at output index ``i``."""
        return (float(self.bias[i]), tuple(float(v) for v in self.interval[i]),
                float(self.mc[i]))


def _signed_sqrt(v):
    return np.sign(v) * np.sqrt(np.abs(v))


def _bias_squared(d1, d4):
    r"""Debiased :math:`|\hat b|^2` from the deviations at n (S1, T, D) and 4n (S4, T, D).

    :math:`\hat b = (4\bar\delta(4n) - \bar\delta(n))/3`, minus the trace of its estimated
    covariance :math:`(16\,\widehat{\mathrm{Var}}_4/S_4 + \widehat{\mathrm{Var}}_1/S_1)/9`.
    """
    b = (4 * d4.mean(axis=0) - d1.mean(axis=0)) / 3
    v1 = np.sum(d1.var(axis=0, ddof=1), axis=-1) / d1.shape[0]
    v4 = np.sum(d4.var(axis=0, ddof=1), axis=-1) / d4.shape[0]
    return np.sum(b * b, axis=-1) - (16 * v4 + v1) / 9


def closure_bias(attention, mixture, t_eval, *, n=64, seeds=16, dt=0.1, n_per_dim=None,
                 n_boot=1000, level=0.9, seed=0):
    r"""Bias of the mixture closure against particles, separated from Monte Carlo.

    The procedure of the module docstring: ``seeds`` runs at ``n`` and at ``4n`` tokens,
    each closure started from its own tokens' labelled moments; the bias
    :math:`\hat\beta` from the mean relative deviations, extrapolated in :math:`1/n`, with
    a bootstrap interval.

    Parameters
    ----------
    attention : Softmax, L2 or MultiHead of them
        The attention.
    mixture : GaussianMixture
        The mixture the tokens are drawn from.
    t_eval : array_like, shape (T,)
        Output times, increasing, from the start ``t_eval[0]``.
    n : int
        The smaller size (at least ``4 K``); the larger is ``4 n``.
    seeds : int
        Runs per size (at least 3).
    dt : float
        Largest RK4 step of the particles (0.1: its error is far below the Monte Carlo
        error of the sizes used, checked against 0.05 on the map's strongest cells).
    n_per_dim : int, optional
        Gauss-Hermite nodes of the closure (default 6 in d = 2, 5 above).
    n_boot : int
        Bootstrap resamples.
    level : float
        Coverage of the interval, in (0, 1).
    seed : int
        Base seed; run ``j`` at size ``m`` draws with ``[seed, m, j]``.

    Returns
    -------
    ClosureBias
    """
    if not isinstance(mixture, GaussianMixture):
        raise TypeError(f"`mixture` must be a GaussianMixture, got {type(mixture).__name__}.")
    heads = quadratic_heads(attention)
    t_eval = np.asarray(t_eval, float)
    if t_eval.ndim != 1 or t_eval.size < 2 or np.any(np.diff(t_eval) <= 0):
        raise ValueError("`t_eval` must be an increasing 1-D array of at least two times.")
    if not (isinstance(n, (int, np.integer)) and n >= 4 * mixture.K):
        raise ValueError(f"`n` must be an int >= 4 K = {4 * mixture.K}, got {n!r}.")
    if not (isinstance(seeds, (int, np.integer)) and seeds >= 3):
        raise ValueError(f"`seeds` must be an int >= 3, got {seeds!r}.")
    if not (np.isfinite(dt) and dt > 0):
        raise ValueError(f"`dt` must be positive, got {dt!r}.")
    if not 0 < level < 1:
        raise ValueError(f"`level` must lie in (0, 1), got {level!r}.")
    if n_per_dim is None:
        n_per_dim = 6 if mixture.d == 2 else 5
    K, T = mixture.K, len(t_eval)
    t0 = time.process_time()
    deltas = []
    for m in (int(n), 4 * int(n)):
        xs, labs, rows = [], [], []
        for j in range(seeds):
            x0, lab = mixture.sample(m, seed=[int(seed), m, j])
            start = empirical_start(x0, lab, K)
            sol = solve_mixture(attention, start, (t_eval[0], t_eval[-1]), t_eval=t_eval,
                                n_per_dim=n_per_dim, rtol=1e-8, atol=1e-10)
            if len(sol.t) != T:
                raise ValueError(f"the closure stopped at t = {sol.t_final:.3g} "
                                 f"({sol.status}) before t_eval[-1]; shorten `t_eval`.")
            xs.append(x0)
            labs.append(lab)
            rows.append(sol)
        X = _rk4_batch(heads, np.stack(xs), t_eval, dt)           # (T, S, m, d)
        out = []
        for j, sol in enumerate(rows):
            pm, pc = zip(*(labelled_moments(X[i, j], labs[j], K) for i in range(T)))
            out.append(relative_deviation(np.asarray(pm), np.asarray(pc), sol.means,
                                          sol.covs, sol.weights))
        deltas.append(np.asarray(out))                            # (S, T, D)
    d1, d4 = deltas
    rng = np.random.default_rng(seed)
    boot = np.empty((n_boot, T))
    for i in range(n_boot):
        boot[i] = _signed_sqrt(_bias_squared(d1[rng.integers(0, seeds, seeds)],
                                             d4[rng.integers(0, seeds, seeds)]))
    q = (1 - level) / 2
    interval = np.stack([np.quantile(boot, q, axis=0), np.quantile(boot, 1 - q, axis=0)], 1)
    rms = np.sqrt(np.stack([np.mean(np.sum(v * v, axis=-1), axis=0) for v in deltas]))
    nm = K * mixture.d                                            # mean entries first
    return ClosureBias(t=t_eval, ns=(int(n), 4 * int(n)), delta=(d1, d4),
                       bias=_signed_sqrt(_bias_squared(d1, d4)), interval=interval, rms=rms,
                       seconds=time.process_time() - t0,
                       bias_mean=_signed_sqrt(_bias_squared(d1[..., :nm], d4[..., :nm])),
                       bias_cov=_signed_sqrt(_bias_squared(d1[..., nm:], d4[..., nm:])))


# --------------------------------------------------------------------------------------
# the map


#: the controlled grid: attention scale, radius of the two means (spread 0.3), dimension;
#: ``control``: the families whose cells also run the one-Gaussian control
TRUST_GRID = dict(kinds=CLUSTER_ATTENTIONS, q=(0.5, 1.0, 2.0, 4.0),
                  radius=(0.5, 1.0, 2.0), d=(2, 3), spread=0.3, t_end=2.0, n=64,
                  seeds=16, control=(CLUSTER_REFERENCE_TYPE,))


def run_trust(*, quick=False, grid=None, value="identity", progress=None):
    r"""The trust map: :func:`closure_bias` over :data:`TRUST_GRID`.

    Parameters
    ----------
    quick : bool
        ``d = 2`` only, ``q`` in {0.5, 2}, radius in {0.5, 2}.
    grid : dict, optional
        Overrides of :data:`TRUST_GRID` entries.
    value : {"identity", "random"}
        The value matrix of :func:`cluster_attention`.
    progress : callable, optional
        Called with one line per cell.

    Returns
    -------
    dict
        ``{"cells": [dict...], "grid": dict, "value": str, "seconds": float}``; each cell
        has ``kind, d, q, radius, bias, lo, hi, mc, rms_n, rms_4n`` (at ``t_end``), the
        curves ``bias_t``, ``t``, and ``control_bias, control_lo, control_hi,
        control_mc``: the same measure on the exact control, one Gaussian with the
        mixture's total mean and covariance under the same attention (its bias must be
        0 within its interval; its ``mc`` is the Monte Carlo level where the closure is
        exact), for the families in ``grid["control"]`` (NaN otherwise).
    """
    g = dict(TRUST_GRID)
    if quick:
        g.update(q=(0.5, 2.0), radius=(0.5, 2.0), d=(2,))
    g.update(grid or {})
    t_eval = np.linspace(0.0, g["t_end"], 5)
    t0 = time.process_time()
    cells = []
    for d in g["d"]:
        for kind in g["kinds"]:
            for q in g["q"]:
                att = cluster_attention(kind, d, value=value, q=q, seed=0)
                for radius in g["radius"]:
                    mix = cluster_mixture(2, d, config="symmetric", radius=radius,
                                          spread=g["spread"])
                    res = closure_bias(att, mix, t_eval, n=g["n"], seeds=g["seeds"])
                    b, (lo, hi), mc = res.at(-1)
                    cb = clo = chi = cmc = float("nan")
                    ctl_seconds = 0.0
                    if kind in g["control"]:
                        one = GaussianMixture([1.0], [mix.total_mean], [mix.total_cov])
                        ctl = closure_bias(att, one, t_eval, n=g["n"], seeds=g["seeds"],
                                           seed=1)
                        cb, (clo, chi), cmc = ctl.at(-1)
                        ctl_seconds = ctl.seconds
                    cells.append(dict(kind=kind, d=d, q=q, radius=radius, bias=b, lo=lo,
                                      hi=hi, mc=mc, rms_n=float(res.rms[0, -1]),
                                      rms_4n=float(res.rms[1, -1]),
                                      bias_mean=float(res.bias_mean[-1]),
                                      bias_cov=float(res.bias_cov[-1]),
                                      bias_t=[float(v) for v in res.bias],
                                      t=[float(v) for v in res.t], control_bias=cb,
                                      control_lo=clo, control_hi=chi, control_mc=cmc,
                                      seconds=res.seconds + ctl_seconds))
                    if progress is not None:
                        progress(f"{kind} d={d} q={q} radius={radius}: bias {b:.3f} "
                                 f"[{lo:.3f}, {hi:.3f}], mc(4n) {mc:.3f}; one-Gaussian "
                                 f"control {cb:.3f} [{clo:.3f}, {chi:.3f}], mc {cmc:.3f}")
    return {"cells": cells, "grid": g, "value": value, "seconds": time.process_time() - t0}



#: the attention kinds of the clusters study that the remeasure, growth and merge-gap
#: studies revisit: its reference family
STUDY_KINDS = (CLUSTER_REFERENCE_TYPE,)


def study_case_count(quick=False, kinds=STUDY_KINDS):
    """How many cases of the clusters study (:func:`cluster_cases`) are of ``kinds``."""
    return sum(c["kind"] in kinds for c in cluster_cases(quick))


def _study_cases(quick, kinds):
    """The clusters study's cases of the given kinds, with their attention and mixture."""
    for c in cluster_cases(quick):
        if c["kind"] in kinds:
            yield (c, cluster_attention(c["kind"], c["d"], value=c["value"], q=0.7,
                                        seed=c["seed"]),
                   cluster_mixture(c["K"], c["d"], config=c["config"], seed=c["seed"]))

def remeasure_study(*, kinds=STUDY_KINDS, quick=False, n=64, seeds=16, t_end=4.0,
                    progress=None):
    r""":func:`closure_bias` on the cases of the clusters study (same attention and start).

    Returns a list of ``{name, bias, lo, hi, mc, bias_mean, bias_cov, size, travel, bias_t,
    t}`` at the depth ``t_end``: ``bias_mean`` and ``bias_cov`` split the bias into its
    mean and covariance parts, ``size`` is the closure's component size :math:`s` there
    and ``travel`` the distance the cloud's mean moved (the bias times ``size`` is the
    absolute error).
    """
    out = []
    for c, att, mix in _study_cases(quick, kinds):
        res = closure_bias(att, mix, np.linspace(0.0, t_end, 5), n=max(n, 4 * c["K"]),
                           seeds=seeds, seed=c["seed"])
        b, (lo, hi), mc = res.at(-1)
        sol = solve_mixture(att, mix, (0.0, t_end), n_per_dim=6 if c["d"] == 2 else 5)
        size = float(np.sqrt(sol.weights @ np.trace(sol.covs_final, axis1=1, axis2=2)))
        out.append(dict(name=c["name"], bias=b, lo=lo, hi=hi, mc=mc,
                        bias_mean=float(res.bias_mean[-1]), bias_cov=float(res.bias_cov[-1]),
                        size=size, travel=float(np.linalg.norm(sol.total_mean[-1]
                                                               - sol.total_mean[0])),
                        bias_t=[float(v) for v in res.bias], t=[float(v) for v in res.t],
                        seconds=res.seconds))
        if progress is not None:
            progress(f"{c['name']}: bias {b:.3f} [{lo:.3f}, {hi:.3f}], mc(4n) {mc:.3f}")
    return out


def offset_growth(attention, mixture, t_eval, *, n=400, seed=0, dt=0.1, n_per_dim=None):
    r"""The study's former trust ratio :math:`\max_t e(t)/e(0)`, for comparison.

    The closure starts from the *true* mixture, the tokens from a sample of it (as
    :func:`~gaussian_pde.studies._clusters.run_case`); :math:`e` is the pooled Gaussian-fit
    W2 of the labelled tokens against the closure
    (:func:`~gaussian_pde.studies._clusters.moment_errors`, ``"bw"``). :math:`e(0)` is the
    sample's Monte Carlo offset, which the flow carries and can amplify: the ratio mixes
    that amplification with the closure's error. Returns the ratio (float).
    """
    heads = quadratic_heads(attention)
    t_eval = np.asarray(t_eval, float)
    if n_per_dim is None:
        n_per_dim = 6 if mixture.d == 2 else 5
    sol = solve_mixture(attention, mixture, (t_eval[0], t_eval[-1]), t_eval=t_eval,
                        n_per_dim=n_per_dim, rtol=1e-8, atol=1e-10)
    T = len(sol.t)
    x0, lab = mixture.sample(n, seed=seed)
    X = _rk4_batch(heads, x0[None], t_eval[:T], dt)[:, 0]
    pm, pc = zip(*(labelled_moments(X[i], lab, mixture.K) for i in range(T)))
    e = moment_errors(np.asarray(pm), np.asarray(pc), sol.means, sol.covs, sol.weights)["bw"]
    return float(e.max() / e[0])


def growth_study(*, kinds=STUDY_KINDS, quick=False, t_end=4.0, n=400, progress=None):
    r""":func:`offset_growth` on the study's cases and on their exact one-Gaussian controls.

    The control is one Gaussian with the case's total mean and covariance under the same
    attention, where the closure is exact: a ratio far above 1 there is Monte Carlo
    amplification, not closure error. Returns ``[{name, growth, growth_control}, ...]``.
    """
    out = []
    t_eval = np.linspace(0.0, t_end, 21)
    for c, att, mix in _study_cases(quick, kinds):
        one = GaussianMixture([1.0], [mix.total_mean], [mix.total_cov])
        row = dict(name=c["name"], growth=offset_growth(att, mix, t_eval, n=n, seed=c["seed"]),
                   growth_control=offset_growth(att, one, t_eval, n=n, seed=c["seed"]))
        out.append(row)
        if progress is not None:
            progress(f"{c['name']}: max e / e(0) {row['growth']:.1f}, exact control "
                     f"{row['growth_control']:.1f}")
    return out


def mardia_kurtosis_ratio(x):
    r"""Mardia's multivariate kurtosis over its Gaussian value: :math:`\overline{|z|^4}/(d(d+2))`.

    :math:`z` the tokens whitened by their own mean and covariance (``1/n``); 1 for a
    Gaussian (up to :math:`O(n^{-1/2})`), above 1 for heavier tails, below for lighter.
    """
    x = np.asarray(x, float)
    m = x.mean(axis=0)
    L = np.linalg.cholesky(np.atleast_2d(np.cov(x.T, bias=True)))
    z = np.linalg.solve(L, (x - m).T)
    d = x.shape[1]
    return float(np.mean(np.sum(z * z, axis=0) ** 2) / (d * (d + 2)))


def merge_gap_sources(*, kinds=STUDY_KINDS, t_end=4.0, n=400, progress=None):
    r"""Where the merge-time gap of the clusters study comes from, case by case.

    Three sets of merge times on the same output times
    (:func:`~gaussian_pde.studies._clusters.crossing_times` of single-linkage heights at
    the study's ``merge_tol``): the closure's components; the *labelled* tokens' moments
    (each token keeps its starting component); and the EM fit of the unlabelled tokens
    (:func:`~gaussian_pde.studies._clusters.particle_clusters`, the study's rule). A gap
    closure/labelled is the closure's error on the merges; a gap labelled/EM is the
    clustering of the particles. With :func:`mardia_kurtosis_ratio` (largest over the
    labelled components) at the closure's first merge, or at the end without one.

    Returns
    -------
    list of dict
        ``name, config, gap_em, gap_labelled, gap_labelled_em, merges_mixture,
        merges_labelled, merges_em, kurtosis``.
    """
    from ..closure import merge_heights, pairwise_bures_wasserstein
    from ._clusters import crossing_times, merge_time_gap, run_case

    t_eval = np.linspace(0.0, t_end, 21)
    out = []
    for c, att, mix in _study_cases(False, kinds):
        run = run_case(att, mix, t_eval, n=n, seed=c["seed"], name=c["name"],
                       n_per_dim=5 if c["d"] == 3 else 6)
        T, K = len(run.t), mix.K
        pm, pc = zip(*(labelled_moments(run.particles.x[i], run.labels, K) for i in range(T)))
        hl = np.array([merge_heights(D) for D in
                       pairwise_bures_wasserstein(np.asarray(pm), np.asarray(pc))])
        tl = crossing_times(run.t, hl.reshape(T, K - 1), run.merge_tol)
        i = T - 1
        if run.merge_times_mixture.size:
            i = min(T - 1, int(np.searchsorted(run.t, run.merge_times_mixture[0])))
        x = run.particles.x[i]
        row = dict(name=c["name"], config=c["config"], gap_em=float(run.merge_gap),
                   gap_labelled=merge_time_gap(run.merge_times_mixture, tl, run.t[-1]),
                   gap_labelled_em=merge_time_gap(tl, run.merge_times_particles, run.t[-1]),
                   merges_mixture=[float(v) for v in run.merge_times_mixture],
                   merges_labelled=[float(v) for v in tl],
                   merges_em=[float(v) for v in run.merge_times_particles],
                   kurtosis=max(mardia_kurtosis_ratio(x[run.labels == k]) for k in range(K)))
        out.append(row)
        if progress is not None:
            progress(f"{c['name']}: merge gap closure/EM {row['gap_em']:.2f}, closure/labelled "
                     f"{row['gap_labelled']:.2f}, labelled/EM {row['gap_labelled_em']:.2f}, "
                     f"kurtosis ratio {row['kurtosis']:.2f}")
    return out


def _verdict(c, tol):
    if c["hi"] < tol:
        return "trusted"
    if c["lo"] > tol:
        return "not trusted"
    return "unresolved"


def write_trust(result, out, *, tol=0.05, study=None, growth=None, merges=None):
    r"""``trust.md``, ``trust_map.png`` and ``trust.json`` of :func:`run_trust` in ``out``.

    Verdict per cell at the relative tolerance ``tol``: *trusted* when the upper end of the
    bias interval is below ``tol``, *not trusted* when its lower end is above, else
    *unresolved*. ``study`` (:func:`remeasure_study`) adds a table, with the former ratio
    and its exact control from ``growth`` (:func:`growth_study`) where given. Returns the
    JSON dict. The report is computed (:func:`trust_report_lines`), plotted
    (:func:`plot_trust_map`) and written here.
    """
    import json

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plot_trust_map(result, out / "trust_map.png", tol)
    lines = trust_report_lines(result, tol, study=study, growth=growth, merges=merges)
    (out / "trust.md").write_text("\n".join(lines) + "\n")
    summary = dict(result, study=study, growth=growth, merges=merges, tol=tol)
    (out / "trust.json").write_text(json.dumps(summary, indent=1))
    return summary


def plot_trust_map(result, path, tol):
    """The map of upper bias bounds per attention, dimension, scale and radius (``path``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g, cells = result["grid"], result["cells"]
    kinds, ds, qs, rs = g["kinds"], g["d"], g["q"], g["radius"]
    fig, axes = plt.subplots(len(ds), len(kinds), figsize=(3.6 * len(kinds), 3.2 * len(ds)),
                             squeeze=False, layout="constrained")
    vmax = 2 * tol
    for row, d in zip(axes, ds):
        for ax, kind in zip(row, kinds):
            M = np.full((len(qs), len(rs)), np.nan)
            for c in cells:
                if c["kind"] == kind and c["d"] == d:
                    M[qs.index(c["q"]), rs.index(c["radius"])] = max(c["hi"], 0.0)
            im = ax.imshow(M, origin="lower", cmap="magma_r", vmin=0, vmax=vmax,
                           aspect="auto")
            for c in cells:
                if c["kind"] == kind and c["d"] == d:
                    i, j = qs.index(c["q"]), rs.index(c["radius"])
                    verdict = _verdict(c, tol)
                    star = "*" if c["lo"] > 0 else ""
                    text = {"trusted": f"< {c['hi']:.3f}{star}",
                            "not trusted": f"{c['bias']:.2f} x",
                            "unresolved": f"? < {c['hi']:.2f}"}[verdict]
                    ax.text(j, i, text, ha="center", va="center", fontsize=7,
                            color="w" if max(c["hi"], 0) > 0.6 * vmax else "k")
            ax.set_xticks(range(len(rs)))
            ax.set_xticklabels([f"{r:g} ({2 * r / g['spread']:.0f} sd)" for r in rs],
                               fontsize=6)
            ax.set_yticks(range(len(qs)))
            ax.set_yticklabels([f"{q:g}" for q in qs], fontsize=7)
            ax.set_title(f"{kind}, d = {d}", fontsize=8)
            if d == ds[-1]:
                ax.set_xlabel("radius (distance of the means / spread)", fontsize=7)
            if kind == kinds[0]:
                ax.set_ylabel("attention scale q", fontsize=7)
    cb = fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, extend="max")
    cb.set_label(f"upper end of the 90% interval of the relative bias, t = {g['t_end']:g}",
                 fontsize=7)
    fig.suptitle(f"Mixture closure bias (n -> infinity), K = 2 symmetric, V = {result['value']}."
                 f"\n'< b': trusted (bias below b < {tol:g}; *: resolved above 0); '?': unresolved "
                 "(Monte Carlo); 'x': biased", fontsize=7)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def trust_report_lines(result, tol, *, study=None, growth=None, merges=None):
    """The lines of ``trust.md``: the grid's cells, the study's cases and the merge gaps."""
    g, cells = result["grid"], result["cells"]
    kinds, ds = g["kinds"], g["d"]
    lines = ["# Where the mixture closure can be trusted", "",
             "Measure (`gaussian_pde.studies._trust.closure_bias`): each closure starts from "
             "its own tokens' labelled moments (no initial Monte Carlo offset); at each time "
             "the labelled tokens' per-component moments minus the closure's, in units of "
             "the components' size s (s^2 = sum_k w_k tr Sigma_k; the covariance entries "
             "scaled so that the norm is the linearised pooled Gaussian-fit W2), averaged "
             "over the runs at n and at 4n and extrapolated in 1/n: b = (4 mean(4n) - "
             "mean(n)) / 3; bias = |b| with its estimated sampling variance subtracted "
             "(signed root; 0 on average where the closure is exact), with a 90% bootstrap "
             "interval over the runs. mc(4n): the Monte Carlo error of one run of 4n tokens "
             "on the same scale.", "",
             f"Grid: K = 2 symmetric components at +-radius e_1, spread {g['spread']}, "
             f"V = {result['value']}, depth t = {g['t_end']:g}, n = {g['n']} and "
             f"{4 * g['n']}, {g['seeds']} runs each. Verdict at tolerance {tol:g}: trusted "
             "(interval below), not trusted (interval above), unresolved.", "",
             "Control: the same measure on one Gaussian with the mixture's total mean and "
             "covariance under the same attention, where the closure is exact: its bias "
             "interval should hold 0, and its mc is the Monte Carlo level of the flow "
             "itself.", "",
             "| attention | d | q | radius | bias | 90% interval | mc(4n) | verdict | "
             "control bias | control interval | control mc(4n) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        lines.append(f"| {c['kind']} | {c['d']} | {c['q']:g} | {c['radius']:g} | "
                     f"{c['bias']:.3f} | [{c['lo']:.3f}, {c['hi']:.3f}] | {c['mc']:.3f} | "
                     f"{_verdict(c, tol)} | " + (
                         f"{c['control_bias']:.3f} | [{c['control_lo']:.3f}, "
                         f"{c['control_hi']:.3f}] | {c['control_mc']:.3f} |"
                         if np.isfinite(c["control_bias"]) else "- | - | - |"))
    lines += ["", "| attention | d | trusted | not trusted | unresolved | largest bias | "
              "largest upper end | controls holding 0 |", "|---|---|---|---|---|---|---|---|"]
    for kind in kinds:
        for d in ds:
            sel = [c for c in cells if c["kind"] == kind and c["d"] == d]
            if not sel:
                continue
            v = [_verdict(c, tol) for c in sel]
            ctl = [c for c in sel if np.isfinite(c["control_bias"])]
            held = sum(c["control_lo"] <= 0 <= c["control_hi"] for c in ctl)
            lines.append(f"| {kind} | {d} | {v.count('trusted')} | {v.count('not trusted')} | "
                         f"{v.count('unresolved')} | {max(c['bias'] for c in sel):.3f} | "
                         f"{max(c['hi'] for c in sel):.3f} | "
                         f"{f'{held}/{len(ctl)}' if ctl else '-'} |")
    if study:
        lines += _study_lines(study, growth, tol)
    if merges:
        lines += _merge_lines(merges)
    if result.get("seconds") is not None:
        lines += ["", f"Process time of the map: {result['seconds']:.0f} s."]
    lines += ["", "Figure: `trust_map.png`."]
    return lines


def _study_lines(study, growth, tol):
    """The re-measured cases of the clusters study (with the former ratio from ``growth``)."""
    lines = []
    grow = {r["name"]: r for r in (growth or [])}
    lines += ["", "## The study's cases, re-measured", "",
              "Same attention (q = 0.7) and starting mixture as the clusters study, depth "
              f"{study[0]['t'][-1]:g}. Former ratio: max_t e(t) / e(0) of the study "
              "(closure from the true mixture, e = Gaussian-fit W2 of the labelled "
              "tokens, 400 tokens, `offset_growth`); exact control: the same ratio for "
              "one Gaussian with the case's total moments under the same attention, "
              "where the closure is exact.", "",
              "| case | bias | 90% interval | mc(4n) | verdict | mean part | cov part | "
              "size s | travel | former ratio | former ratio, exact control |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in study:
        g_ = grow.get(c["name"])
        tail = (f"{g_['growth']:.1f} | {g_['growth_control']:.1f} |" if g_
                else "- | - |")
        lines.append(f"| {c['name']} | {c['bias']:.3f} | [{c['lo']:.3f}, {c['hi']:.3f}] | "
                     f"{c['mc']:.3f} | {_verdict(c, tol)} | {c['bias_mean']:.3f} | "
                     f"{c['bias_cov']:.3f} | {c['size']:.3f} | {c['travel']:.1f} | {tail}")
    b = np.array([c["bias"] for c in study])
    his = np.array([c["hi"] for c in study])
    lines += ["", f"Bias over the {len(study)} cases: median {np.median(b):.3f}, largest "
              f"{b.max():.3f}; upper interval ends: median {np.median(his):.3f}, largest "
              f"{his.max():.3f}."]
    if grow:
        gr = np.array([r["growth"] for r in grow.values()])
        gc = np.array([r["growth_control"] for r in grow.values()])
        lines.append(f"Former ratio: median {np.median(gr):.1f}, largest {gr.max():.1f}; "
                     f"exact control: median {np.median(gc):.1f}, largest "
                     f"{gc.max():.1f}.")
    return lines


def _merge_lines(merges):
    """Where the merge-time gap comes from: closure, labelled tokens and EM."""
    lines = []
    lines += ["", "## Where the merge-time gap comes from", "",
              "Merge times of the closure, of the labelled tokens' moments (each token "
              "keeps its starting component) and of the EM fit of the unlabelled tokens "
              "(the study's rule), same tolerance and output times; gaps as in the "
              "study (`merge_gap_sources`). Kurtosis: Mardia's ratio (1 for a Gaussian), "
              "largest over the labelled components at the closure's first merge.", "",
              "| case | gap closure/EM | gap closure/labelled | gap labelled/EM | merges "
              "closure / labelled / EM | kurtosis |", "|---|---|---|---|---|---|"]
    for r in merges:
        lines.append(f"| {r['name']} | {r['gap_em']:.2f} | {r['gap_labelled']:.2f} | "
                     f"{r['gap_labelled_em']:.2f} | {len(r['merges_mixture'])} / "
                     f"{len(r['merges_labelled'])} / {len(r['merges_em'])} | "
                     f"{r['kurtosis']:.2f} |")
    lines += ["", "| starts | cases | median gap closure/EM | median gap closure/labelled | "
              "median gap labelled/EM | median kurtosis |", "|---|---|---|---|---|---|"]
    for cfg in ("symmetric", "random"):
        sel = [r for r in merges if r["config"] == cfg]
        if sel:
            med = [float(np.median([r[k] for r in sel])) for k in
                   ("gap_em", "gap_labelled", "gap_labelled_em", "kurtosis")]
            lines.append(f"| {cfg} | {len(sel)} | " + " | ".join(f"{v:.2f}" for v in med)
                         + " |")
    return lines
