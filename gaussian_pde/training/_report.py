"""``report.md``, ``verdicts.md``, ``summary.json`` and the figures of the training study.

:func:`write_training_study` writes what :func:`~gaussian_pde.training.run_training_study`
returned: the numbers come from :mod:`._summary` (and the verdicts from
:func:`~gaussian_pde.training.verdicts`), the figures from :mod:`._figures`; this module
only formats and writes. ``verdicts.md`` is the verdict table alone, the file that
``docs/training.md`` includes.
"""

from __future__ import annotations

import numpy as np

from .._common.io import ensure_output_dir, write_json, write_text
from ._figures import (
    plot_bridge,
    plot_bridge_slope,
    plot_bridge_weights,
    plot_drift,
    plot_training,
)
from ._study import DRIFT_RATIO, GROWTH_RATIO, verdicts
from ._summary import bridge_rows, run_rows

__all__ = ["write_training_study", "verdict_table"]


def _f(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _fmt(a):
    return ", ".join(_f(float(x)) for x in a)


def verdict_table(v):
    """The verdicts as a Markdown table (one row per claim: criterion, count)."""
    lines = ["| claim | criterion | holds in |", "|---|---|---|"]
    for claim, c in v.items():
        extra = (f" ({c['both_diverged']} left out: both diverged)"
                 if c.get("both_diverged") else "")
        lines.append(f"| {claim} | {c['criterion']} | {c['holds']} of {c['total']}{extra} |")
    return lines


def _run_lines(results):
    cfg = results["config"]
    lines = []
    for t in results["runs"]:
        lines += [f"### Task `{t}`", "",
                  "| variant | " + " | ".join(f"lr {lr:g}: diverged / held-out loss"
                                              for lr in cfg["learning_rates"])
                  + f" | max grad norm / start (lr {cfg['bridge_learning_rate']:g}) |",
                  "|---|" + "---|" * (len(cfg["learning_rates"]) + 1)]
        for v, cells, g in run_rows(results, t):
            text = [f"{nd}/{n} / {_f(loss)}" for nd, n, loss in cells]
            lines.append(f"| {v} | " + " | ".join(text) + f" | {_f(g)} |")
        lines.append("")
    return lines


def _g(v):
    """A bridge number: ``-`` where it was not measured (NaN: stopped or collapsed)."""
    return "-" if v is None or not np.isfinite(v) else f"{v:.3g}"


def _gs(a):
    return ", ".join(_g(float(x)) for x in a)


def _bridge_lines(results):
    lines = ["| task / variant | blocks | Gaussian map | status | rel. cov error per layer "
             "(largest n) | slope in n per layer | ESS/n per layer (largest n) | "
             "ESS/n of the mean-field limit, e^(-a'Sa) | e^(a'Sa): median / 90th pct, "
             "per layer | tr S model / Gaussian (last layer reached) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in bridge_rows(results):
        status = r["status"]
        if status != "finished":
            status += f" after layer {r['layers_reached'] + 1}"
        tails = "; ".join(f"{_g(a)} / {_g(b)}" for a, b in zip(r["tail_median"], r["tail_p90"]))
        lines.append(f"| {r['task']}/{r['variant']} | {r['blocks']} | "
                     f"{'exact' if r['exact'] else 'closure'} | {status} | "
                     f"{_gs(r['cov_err'])} | {_gs(r['slope'])} | {_gs(r['ess'])} | "
                     f"{_gs(r['ess_mean_field'])} | {tails} | "
                     f"{_g(r['trace_model'])} / {_g(r['trace_gauss'])} |")
    return lines


def _intro(cfg):
    return ["# Training study: residuals, LayerNorm and the PDE simulator", "",
            f"Variants {', '.join(cfg['variants'])}; width {cfg['width']}, depth "
            f"{cfg['depth']}, {cfg['heads']} heads; tasks {', '.join(cfg['tasks'])}; Adam, "
            f"{cfg['n_steps']} steps of {cfg['batch']} sequences, learning rates "
            f"{cfg['learning_rates']}, seeds {cfg['seeds']}. Divergence: a non-finite loss "
            f"or gradient, or a loss above {cfg['divergence_factor']:g} x its step-0 value. "
            f"Measurements on {cfg['eval_batch']} held-out sequences per seed "
            "(docs/math.md section 11).", ""]


def _figures(results, out):
    paths = []
    for t in results["config"]["tasks"]:
        paths.append(plot_training(results, t, out / f"training_{t}.png"))
        paths.append(plot_drift(results, t, out / f"drift_{t}.png"))
    paths.append(plot_bridge(results, out / "bridge.png"))
    paths.append(plot_bridge_slope(results, out / "bridge_slope.png"))
    paths.append(plot_bridge_weights(results, out / "bridge_weights.png"))
    return [p for p in paths if p is not None]


def write_training_study(results, out):
    """Write ``summary.json``, ``verdicts.md``, ``report.md`` and the figures into ``out``.

    Figures: ``training_<task>.png`` and ``drift_<task>.png`` per task, ``bridge.png``,
    ``bridge_slope.png`` and ``bridge_weights.png`` (:mod:`gaussian_pde.training._figures`).
    Returns the verdicts (:func:`verdicts`).
    """
    out = ensure_output_dir(out)
    v = verdicts(results)
    cfg = results["config"]
    write_json(out / "summary.json", {"config": cfg, "verdicts": v, "runs": results["runs"],
                                      "bridge": results["bridge"]})
    table = verdict_table(v)
    write_text(out / "verdicts.md", "\n".join(table) + "\n")
    figs = _figures(results, out)
    lines = _intro(cfg) + ["## Verdicts", ""] + table
    lines += ["", f"Drift ratio threshold {DRIFT_RATIO:g}; explosive runs (diverged, or "
              f"gradient norm >= {GROWTH_RATIO:g} x its start), per task and variant: "
              + "; ".join(f"{t}: " + ", ".join(f"{k} {n}" for k, n in e.items())
                          for t, e in v["explosion"]["explosive_runs"].items()), "",
              "## Runs (diverged runs / median held-out loss of the others)", ""]
    lines += _run_lines(results)
    lines += ["## The bridge: trained model against the Gaussian prediction", "",
              f"Seed {cfg['seeds'][0]}, lr {cfg['bridge_learning_rate']:g}; Gaussian tokens "
              "with the mean and covariance of the model's embedded held-out tokens; "
              f"n = {cfg['bridge_tokens']} tokens, {cfg['bridge_sequences']} sequences "
              "each (medians). `attention`: the trained attention alone (Gaussian map "
              "exact); `full`: with the FFN (the package's closure). A slope near -1/2 in "
              "n is Monte Carlo error; a slope near 0 is a bias (of the closure, or of "
              "finite n). ESS/n is measured on the tokens; for Gaussian keys it converges to "
              "e^(-a'Sa) for a query with score vector a, so a small ESS/n is a property of "
              "the mean-field limit, not a failure of it. What slows the convergence in n "
              "is the tail of the importance weights: e^(a'Sa), the second moment of the "
              "normalised weights, by its median and 90th percentile over queries and "
              "heads. A status other than `finished` says where the Gaussian map stopped "
              "(`-`: not measured there; also where both covariances collapsed below "
              "1e-12 of the input's trace).", ""]
    lines += _bridge_lines(results)
    lines += ["", "Figures: " + ", ".join(p.name for p in figs), ""]
    write_text(out / "report.md", "\n".join(lines))
    return v
