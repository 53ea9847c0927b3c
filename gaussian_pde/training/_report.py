"""``report.md``, ``verdicts.md``, ``summary.json`` and the figures of the training study.

:func:`write_training_study` writes what :func:`~gaussian_pde.training.run_training_study`
returned: the numbers come from :mod:`._summary` (and the verdicts from
:func:`~gaussian_pde.training.verdicts`), the figures from :mod:`._figures`; this module
only formats and writes. ``verdicts.md`` is the verdict table alone, the file that
``docs/training.md`` includes.
"""

from __future__ import annotations

import math

import numpy as np

from .._common.io import ensure_output_dir, write_json, write_text
from ._figures import (
    plot_bridge,
    plot_bridge_slope,
    plot_bridge_weights,
    plot_drift,
    plot_layer_grads,
    plot_stability,
    plot_theory,
    plot_training,
)
from ._summary import bridge_rows, bridge_scope_rows, run_rows, spread_rows
from ._verdicts import GROWTH_LIMIT, verdicts

__all__ = ["write_training_study", "verdict_table"]


def _f(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def _fmt(a):
    return ", ".join(_f(float(x)) for x in a)


def _ratio_cell(r):
    lo, hi = r["ci95"]
    return (f"{_f(r['median'])} [{_f(r['p10'])}, {_f(r['p90'])}] | "
            f"[{_f(lo)}, {_f(hi)}]")


def verdict_table(v):
    """The verdicts as Markdown tables: one row per claim and pair, criterion first."""
    lines = ["| claim | pair | criterion | holds in | ratio median [10 %, 90 %] | "
             "bootstrap 95 % of the median |", "|---|---|---|---|---|---|"]
    for key in ("drift", "explosion"):
        for r in v[key]:
            und = f" ({r['undefined']} undefined)" if r["undefined"] else ""
            lines.append(f"| {r['claim']} | {r['pair']} | {r['criterion']} | "
                         f"{r['holds']} of {r['total']}{und} | {_ratio_cell(r)} |")
    lines += ["", "| claim | pair | task | criterion | holds in | both ok | only simulator "
              "fails | only the other fails | both fail |", "|---|---|---|---|---|---|---|---|---|"]
    for r in v["simulator"]:
        o = r["outcomes"]
        lines.append(f"| simulator | {r['pair']} | {r['task']} | {r['criterion']} | "
                     f"{r['holds']} of {r['total']} | {o['both_ok']} | "
                     f"{o['only_simulator_fails']} | {o['only_other_fails']} | "
                     f"{o['both_fail']} |")
    t = v["theory"]
    und = (f" ({t['undetermined']} undetermined: the moment ODE could not be followed)"
           if t.get("undetermined") else "")
    lines += ["", "| claim | criterion | runs | predicted to fail (L* < L) | failed | "
              "agrees with failure | agrees with growth |", "|---|---|---|---|---|---|---|",
              f"| theory | {t['criterion']} | {t['total']}{und} | {t['predicted']} | "
              f"{t['failed']} | "
              f"{t['agree_failure']} | {t['agree_growth']} |"]
    return lines


def _task_lines(results):
    lines = ["| task | chance | Bayes risk (MC ± s.e.) | least squares | bigram | best final "
             "loss (any variant) | best variant |", "|---|---|---|---|---|---|---|"]
    for t, ref in results["tasks"].items():
        best, who = math.inf, "-"
        for v, runs in results["runs"][t].items():
            for r in runs:
                if r["eval_loss_final"] < best:
                    best, who = r["eval_loss_final"], f"{v} (L = {r['depth']})"
        br = ref.get("bayes_risk")
        bcell = f"{br[0]:.4g} ± {br[1]:.1g}" if br else "-"
        lines.append(f"| {t} | {_f(ref['chance'])} | {bcell} | "
                     f"{_f(ref.get('least_squares_risk'))} | {_f(ref.get('bigram'))} | "
                     f"{_f(best)} | {who} |")
    return lines


def _run_lines(results):
    cfg = results["config"]
    optims = list(cfg["optims"])
    lines = []
    for t in results["runs"]:
        lines += [f"### Task `{t}`", "",
                  "| variant | L | " + " | ".join(f"largest stable lr ({o})" for o in optims)
                  + " | best final loss | failed / runs | non-finite | relative 10x |",
                  "|---|---|" + "---|" * (len(optims) + 4)]
        for r in run_rows(results, t):
            lines.append(f"| {r['variant']} | {r['depth']} | "
                         + " | ".join(_f(r["stable"][o]) for o in optims)
                         + f" | {_f(r['best'])} | {r['failed']} / {r['n']} | "
                         f"{r['nonfinite']} | {r['relative']} |")
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


def _bridge_scope_lines(results):
    lines = ["| task / variant | lr | blocks | Gaussian map | seeds | finished | diverged in "
             "training | rel. cov error, last layer: median [min, max] | tr model / "
             "Gaussian |", "|---|---|---|---|---|---|---|---|---|"]
    for r in bridge_scope_rows(results):
        lines.append(f"| {r['task']}/{r['variant']} | {r['learning_rate']:.3g} | "
                     f"{r['blocks']} | {'exact' if r['exact'] else 'closure'} | {r['seeds']} | "
                     f"{r['finished']} | {r['diverged']} | {_g(r['cov_err'])} "
                     f"[{_g(r['cov_err_min'])}, {_g(r['cov_err_max'])}] | "
                     f"{_g(r['trace_ratio'])} |")
    return lines


def _bridge_rates(results):
    lr = results["config"]["bridge_learning_rate"]
    own = {t: ref["bridge_learning_rate"] for t, ref in results["tasks"].items()
           if not math.isclose(ref.get("bridge_learning_rate", lr), lr)}
    return f"{lr:g}" + "".join(f" ({t}: {r:g}, the nearest of its rates)" for t, r in own.items())


def _task_rates(cfg):
    rates = cfg.get("task_rates") or {}
    if not rates:
        return "the same"
    return "; ".join(f"{t} {', '.join(f'{r:.3g}' for r in rs)}" for t, rs in rates.items())


def _intro(cfg):
    return ["# Training study: residuals, normalisation and the PDE simulator", "",
            f"Variants {', '.join(cfg['variants'])}; width {cfg['width']} (per task: "
            f"{cfg['task_width'] or 'the same'}), {cfg['heads']} heads; tasks "
            f"{', '.join(cfg['tasks'])}; depths {cfg['depths']} on `{cfg['sweep_task']}`, "
            f"{cfg['depth']} on the others; Adam, {cfg['n_steps']} steps (per task: "
            f"{cfg['task_steps'] or 'the same'}) of {cfg['batch']} sequences; learning rates "
            f"{', '.join(f'{r:.3g}' for r in cfg['learning_rates'])} (per task: "
            f"{_task_rates(cfg)}); seeds {cfg['seeds']} "
            f"(at depth >= {cfg['large_depth']}: the first {cfg['large_depth_seeds']}); "
            f"optimiser settings {cfg['optims']}. Held-out measurements on "
            f"{cfg['eval_batch']} sequences per seed (per task: "
            f"{cfg.get('task_eval_batch') or 'the same'}; docs/math.md section 11).", "",
            "**Failure** (stated before the numbers): a run fails when its loss becomes "
            "non-finite or its final held-out loss is at the task's chance level or worse. "
            "The largest stable learning rate is the largest rate of the grid whose run did "
            "not fail. The older relative criterion (the training loss exceeds "
            f"{cfg['divergence_factor']:g}x its first value) is counted beside it.", ""]


def _figures(results, out):
    paths = []
    for t in results["config"]["tasks"]:
        paths.append(plot_training(results, t, out / f"training_{t}.png"))
        paths.append(plot_drift(results, t, out / f"drift_{t}.png"))
        paths.append(plot_stability(results, t, out / f"stability_{t}.png"))
        paths.append(plot_layer_grads(results, t, out / f"layer_grads_{t}.png"))
    paths.append(plot_theory(results, out / "theory.png"))
    paths.append(plot_bridge(results, out / "bridge.png"))
    paths.append(plot_bridge_slope(results, out / "bridge_slope.png"))
    paths.append(plot_bridge_weights(results, out / "bridge_weights.png"))
    return [p for p in paths if p is not None]


def write_training_study(results, out):
    """Write ``summary.json``, ``verdicts.md``, ``report.md`` and the figures into ``out``.

    Figures: ``training_<task>.png``, ``drift_<task>.png``, ``stability_<task>.png``,
    ``layer_grads_<task>.png`` per task, ``theory.png``, ``bridge.png``, ``bridge_slope.png``
    and ``bridge_weights.png`` (:mod:`gaussian_pde.training._figures`). Returns the verdicts
    (:func:`verdicts`).
    """
    out = ensure_output_dir(out)
    v = verdicts(results)
    cfg = results["config"]
    write_json(out / "summary.json", {"config": cfg, "tasks": results["tasks"], "verdicts": v,
                                      "runs": results["runs"], "bridge": results["bridge"],
                                      "bridge_scope": results.get("bridge_scope", {})})
    table = verdict_table(v)
    write_text(out / "verdicts.md", "\n".join(table) + "\n")
    figs = _figures(results, out)
    lines = _intro(cfg) + ["## Tasks: chance, Bayes risk and the best model", ""]
    lines += _task_lines(results) + ["", "## Verdicts", ""] + table
    lines += ["", f"Theory: growth counts as explosive above {GROWTH_LIMIT:g}x at "
              "initialisation.", "", "### The first attention's spread", "",
              "Predicted effective fraction exp(-a^T S a) of the tokens against the measured "
              "(sum w)^2 / (n sum w^2) on the embedded held-out tokens, medians over queries, "
              "heads, sequences and runs; tokens needed for one effective token "
              "exp(a^T S a), against the sequence length.", "",
              "| task | variant | L | predicted (init) | measured (init) | predicted "
              "(trained) | measured (trained) | tokens needed (trained) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in spread_rows(results):
        lines.append(f"| {r['task']} | {r['variant']} | {r['depth']} | "
                     f"{_f(r['predicted_init'])} | {_f(r['measured_init'])} | "
                     f"{_f(r['predicted_final'])} | {_f(r['measured_final'])} | "
                     f"{_f(r['tokens_needed_final'])} |")
    lines += ["", "## Runs", ""]
    lines += _run_lines(results)
    lines += ["## The bridge: trained model against the Gaussian prediction", "",
              f"Seed {cfg['seeds'][0]}, lr {_bridge_rates(results)}; Gaussian tokens "
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
    lines += ["", "### The bridge over every seed and two learning rates", "",
              "Each seed's trained model at each rate, bridged as above. Relative "
              "covariance error at the last layer the Gaussian map reached, largest n: "
              "median over seeds [smallest, largest]; the model's trace over the "
              "Gaussian's there (median).", ""]
    lines += _bridge_scope_lines(results)
    lines += ["", "Figures: " + ", ".join(p.name for p in figs), ""]
    write_text(out / "report.md", "\n".join(lines))
    return v
