r"""Residual / normalisation stabiliser study (docs/math.md section 7, the second source paper).

For every combination of {residual, no residual} x {no normalisation, LayerNorm, trace
normalisation} a stack of ``n_layers`` softmax-attention layers (weights drawn per layer,
normalisation in pre-norm position) is applied to :math:`\mathcal N(0, I_d)`, by the
Gaussian map (exact or closure, :mod:`gaussian_pde.closure._depth`) and by particles. Per layer:

* drift: Bures-Wasserstein :math:`W_2` from the input and between consecutive layers;
* growth: :math:`\operatorname{tr}\Sigma_\ell / \operatorname{tr}\Sigma_0` and the depth
  at which it passes ``blowup_threshold`` (the blow-up depth), if any;
* shape: the rank of :math:`\Sigma/\operatorname{tr}\Sigma` (eigenvalues above
  ``rank_tol``) and its effective rank :math:`\exp(-\sum_k p_k\log p_k)`.

The paper's claims are tested as: *drift* -- without residuals :math:`W_2` from the input
after the first layer is larger than with them; *explosion* -- without normalisation
:math:`\operatorname{tr}\Sigma` passes the threshold (or grows by a large factor) while
with normalisation it does not.
"""

from __future__ import annotations

import numpy as np

from .._common.gaussian import bures_wasserstein
from .._common.io import ensure_output_dir, save_figure, write_json, write_text
from .._common.validation import validate_int, validate_positive, validate_quadrature, validate_step
from ..attention import dot_product_head
from ..closure import LayerNorm, PreNorm, Stack, TraceNorm, propagate_gaussian, propagate_particles
from ..particles import sample_gaussian

__all__ = ["STUDY_MODES", "STUDY_NORMS", "draw_layers", "depth_metrics", "run_study",
           "summarize_study", "write_study"]

#: residual modes of the study (Stack modes)
STUDY_MODES = ("residual", "none")
#: normalisations of the study
STUDY_NORMS = ("none", "layernorm", "trace")


def draw_layers(d, n_layers, seed, *, weight_scale=1.0):
    r"""Random softmax layers: :math:`Q, K, V` with i.i.d. :math:`\mathcal N(0, s^2/d)` entries.

    ``s`` = ``weight_scale``; one independent draw per layer.
    """
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(n_layers):
        Q, K, V = rng.standard_normal((3, d, d)) * weight_scale / np.sqrt(d)
        layers.append(dot_product_head(Q, K, V, scale=1.0))
    return layers


def _wrap(layers, norm, d):
    if norm == "none":
        return list(layers)
    if norm == "layernorm":
        return [PreNorm(LayerNorm(d), a, n_per_dim=6) for a in layers]
    return [PreNorm(TraceNorm(d, target=float(d)), a) for a in layers]


def depth_metrics(mean, cov, rank_tol=1e-3):
    r"""Drift, growth and shape along depth from moments ``(K, d)``, ``(K, d, d)``.

    Returns a dict with ``w2_input`` (K,), ``w2_step`` (K - 1,), ``trace_ratio`` (K,),
    ``rank`` (K,) (eigenvalues of :math:`\Sigma/\operatorname{tr}\Sigma` above
    ``rank_tol``) and ``effective_rank`` (K,).
    """
    mean, cov = np.asarray(mean), np.asarray(cov)
    tr = np.trace(cov, axis1=1, axis2=2)
    # a covariance that vanished (trace 0 or underflowed) has rank 0: no 0/0 eigenproblem
    alive = tr > 1e-250
    p = np.zeros(cov.shape[:2])
    if alive.any():
        p[alive] = np.clip(np.linalg.eigvalsh(cov[alive] / tr[alive, None, None]), 0, None)
    ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), axis=1)
    return {
        "w2_input": bures_wasserstein(mean[:1], cov[:1], mean, cov),
        "w2_step": bures_wasserstein(mean[:-1], cov[:-1], mean[1:], cov[1:]),
        "trace_ratio": tr / tr[0] if tr.size and tr[0] > 0 else tr,
        "rank": np.sum(p > rank_tol, axis=1),
        "effective_rank": np.exp(ent),
    }


def _usable_layers(mean, cov, max_growth=1e100):
    """Number of leading layers whose moments are finite and not astronomically large.

    Beyond ``max_growth`` times the input trace (a blown-up covariance) square roots and
    eigenvalues of the covariance overflow; those layers are reported through the status
    and the blow-up depth, not through metrics computed from overflowed numbers.
    """
    tr = np.trace(cov, axis1=1, axis2=2)
    ok = (np.all(np.isfinite(cov), axis=(1, 2)) & np.all(np.isfinite(mean), axis=1)
          & (np.abs(tr) <= max_growth * max(abs(tr[0]), 1e-300))
          & (np.abs(mean).max(axis=1) <= np.sqrt(max_growth) * (1.0 + np.abs(mean[0]).max())))
    return int(np.argmin(ok)) if not ok.all() else ok.size


def run_study(*, d=3, n_layers=12, h=0.25, seeds=(0, 1, 2), n_particles=400,
              n_per_dim=6, weight_scale=1.5, blowup_threshold=1e8, particle_seed=0,
              progress=None):
    r"""Run the 2 x 3 grid for every weight draw.

    ``progress``: called with a short message (``"stabilizers: residual/layernorm"``)
    after each cell of the grid, ``len(STUDY_MODES) * len(STUDY_NORMS)`` calls in all;
    ``None`` (the default): silent.

    Returns
    -------
    dict
        ``results[(mode, norm)]`` is a list (one per seed) of dicts with keys
        ``"closure"`` and ``"particles"`` (each :func:`depth_metrics` plus ``status``,
        ``blowup_depth`` and ``depth``), ``"closure_exact"`` (all layer maps exact) and
        ``"closure_vs_particles"`` (:math:`W_2` per layer); plus ``"config"``.
    """
    d = validate_int(d, "d", minimum=2)
    n_layers = validate_int(n_layers, "n_layers", minimum=1)
    h = validate_step(h, "h")
    n_particles = validate_int(n_particles, "n_particles", minimum=2)
    n_per_dim = validate_quadrature(n_per_dim, "n_per_dim", d=d)
    weight_scale = validate_positive(weight_scale, "weight_scale")
    seeds = tuple(validate_int(s, "seeds[i]", minimum=0) for s in seeds)
    mean0, cov0 = np.zeros(d), np.eye(d)
    x0 = sample_gaussian(mean0, cov0, n_particles, seed=particle_seed)
    out = {"config": dict(d=d, n_layers=n_layers, h=h, seeds=list(seeds),
                          n_particles=n_particles, n_per_dim=n_per_dim,
                          weight_scale=weight_scale, blowup_threshold=blowup_threshold)}
    with np.errstate(all="ignore"):
        for mode in STUDY_MODES:
            for norm in STUDY_NORMS:
                runs = []
                for seed in seeds:
                    layers = _wrap(draw_layers(d, n_layers, seed, weight_scale=weight_scale),
                                   norm, d)
                    stack = Stack(layers, h=h, mode=mode)
                    g = propagate_gaussian(stack, mean0, cov0, n_per_dim=n_per_dim,
                                           blowup_threshold=blowup_threshold)
                    p = propagate_particles(stack, x0, blowup_threshold=blowup_threshold)
                    run, usable = {}, {}
                    for key, sol in (("closure", g), ("particles", p)):
                        usable[key] = _usable_layers(sol.mean, sol.cov)
                        k_ok = usable[key]
                        m = depth_metrics(sol.mean[:k_ok], sol.cov[:k_ok])
                        m.update(status=str(sol.status), depth=sol.depth,
                                 blowup_depth=sol.t_blowup)
                        run[key] = m
                    k = min(usable.values())
                    run["closure_exact"] = bool(np.all(g.exact))
                    run["closure_vs_particles"] = bures_wasserstein(
                        g.mean[:k], g.cov[:k], p.mean[:k], p.cov[:k])
                    run["non_gaussianity"] = p.non_gaussianity
                    runs.append(run)
                out[(mode, norm)] = runs
                if progress is not None:
                    progress(f"stabilizers: {mode}/{norm}")
    return out


def summarize_study(results):
    r"""Per cell: medians over seeds of the headline numbers, and the verdicts.

    Returns a dict ``{"cells": {"mode/norm": {...}}, "claims": {...}}``; a cell has
    ``w2_input_first`` (after layer 1), ``w2_input_last``, ``w2_step_median``,
    ``trace_ratio_last`` (at the last layer reached), ``blowups`` (seeds that passed the
    threshold) with their ``blowup_depths``, ``rank_last``, ``effective_rank_last`` and
    ``closure_vs_particles_max`` (largest W2 over layers and seeds), all from the closure
    unless prefixed ``particles_``.
    """
    cells = {}
    for mode in STUDY_MODES:
        for norm in STUDY_NORMS:
            runs = results[(mode, norm)]
            c = {}
            for src, prefix in (("closure", ""), ("particles", "particles_")):
                ms = [r[src] for r in runs]
                c[prefix + "w2_input_first"] = float(np.median([m["w2_input"][1] for m in ms]))
                c[prefix + "w2_input_last"] = float(np.median([m["w2_input"][-1] for m in ms]))
                c[prefix + "w2_step_median"] = float(np.median(
                    [np.median(m["w2_step"]) for m in ms]))
                c[prefix + "trace_ratio_last"] = float(np.median(
                    [m["trace_ratio"][-1] for m in ms]))
                c[prefix + "blowups"] = int(sum(m["status"] == "blowup" for m in ms))
                c[prefix + "blowup_depths"] = [m["blowup_depth"] for m in ms
                                               if m["status"] == "blowup"]
                c[prefix + "rank_last"] = [int(m["rank"][-1]) for m in ms]
                c[prefix + "effective_rank_last"] = float(np.median(
                    [m["effective_rank"][-1] for m in ms]))
            c["closure_vs_particles_max"] = float(max(np.max(r["closure_vs_particles"])
                                                      for r in runs))
            c["closure_exact"] = all(r["closure_exact"] for r in runs)
            cells[f"{mode}/{norm}"] = c
    claims = {}
    for norm in STUDY_NORMS:
        r, n = cells[f"residual/{norm}"], cells[f"none/{norm}"]
        claims[f"drift/{norm}"] = {
            "w2_input_first_residual": r["w2_input_first"],
            "w2_input_first_no_residual": n["w2_input_first"],
            "holds": n["w2_input_first"] > r["w2_input_first"],
        }
    for mode in STUDY_MODES:
        base = cells[f"{mode}/none"]
        claims[f"explosion/{mode}"] = {
            "blowups_without_norm": base["blowups"],
            "trace_ratio_without_norm": base["trace_ratio_last"],
            "trace_ratio_layernorm": cells[f"{mode}/layernorm"]["trace_ratio_last"],
            "trace_ratio_trace_norm": cells[f"{mode}/trace"]["trace_ratio_last"],
            "blowups_with_norm": cells[f"{mode}/layernorm"]["blowups"]
            + cells[f"{mode}/trace"]["blowups"],
        }
    return {"cells": cells, "claims": claims}


def _plot(results, out):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    paths = []
    panels = (("w2_input", "W2 from input", True), ("trace_ratio", "tr Sigma / tr Sigma_0", True),
              ("effective_rank", "effective rank of Sigma/tr", False))
    fig, axes = plt.subplots(2, 3, figsize=(13, 7), squeeze=False)
    colors = {"none": "C3", "layernorm": "C0", "trace": "C2"}
    for i, mode in enumerate(STUDY_MODES):
        for j, (key, label, logy) in enumerate(panels):
            ax = axes[i, j]
            for norm in STUDY_NORMS:
                for k, run in enumerate(results[(mode, norm)]):
                    for src, ls in (("closure", "-"), ("particles", ":")):
                        m = run[src]
                        y = np.asarray(m[key], float)
                        x = np.arange(y.size)
                        if key == "w2_input":  # W2 = 0 at the input: not drawn on a log axis
                            x, y = x[1:], y[1:]
                        lab = f"{norm} ({src})" if k == 0 else None
                        ax.plot(x, y, ls, color=colors[norm], label=lab, lw=1.2)
            if logy:
                ax.set_yscale("log")
            ax.set_title(f"{'residual' if mode == 'residual' else 'no residual'}: {label}")
            ax.set_xlabel("layer")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(save_figure(fig, out / "stabilizers.png", dpi=90))
    plt.close(fig)
    return paths


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def write_study(results, out):
    """Write ``summary.json``, ``stabilizers.png`` and ``report.md`` (atomically) into ``out``."""
    out = ensure_output_dir(out)
    summary = summarize_study(results)
    write_json(out / "summary.json", {"config": results["config"], **summary})
    figs = _plot(results, out)
    cfg = results["config"]
    lines = ["# Residual / normalisation stabiliser study", "",
             f"Stack of {cfg['n_layers']} softmax-attention layers (d = {cfg['d']}, "
             f"h = {cfg['h']}, Q, K, V entries N(0, {cfg['weight_scale']}^2/d), a new draw "
             f"per layer), normalisation in pre-norm position, input N(0, I); weight draws "
             f"(seeds) {cfg['seeds']}; particles n = {cfg['n_particles']}; closure "
             f"Gauss-Hermite {cfg['n_per_dim']} nodes per dimension. Medians over seeds.", "",
             "| mode / norm | W2 from input, layer 1 | W2 from input, last | median W2 step | "
             "tr ratio, last | blow-ups (depths) | rank last | eff. rank last | "
             "particles tr ratio | closure-vs-particles max W2 | exact |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, c in summary["cells"].items():
        lines.append(
            f"| {key} | {_fmt(c['w2_input_first'])} | {_fmt(c['w2_input_last'])} | "
            f"{_fmt(c['w2_step_median'])} | {_fmt(c['trace_ratio_last'])} | {c['blowups']} "
            f"({', '.join(_fmt(x) for x in c['blowup_depths'])}) | {c['rank_last']} | "
            f"{_fmt(c['effective_rank_last'])} | {_fmt(c['particles_trace_ratio_last'])} | "
            f"{_fmt(c['closure_vs_particles_max'])} | {c['closure_exact']} |")
    lines += ["", "## Claims", ""]
    for key, c in summary["claims"].items():
        lines.append(f"- **{key}**: " + ", ".join(f"{k} = {_fmt(v)}" for k, v in c.items()))
    lines += ["", "Figures: " + ", ".join(p.name for p in figs), ""]
    write_text(out / "report.md", "\n".join(lines))
    return summary
