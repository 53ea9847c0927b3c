r"""Numbers of the training study's report, computed from :func:`run_training_study`'s output.

Plain NumPy on the results dict (no plotting, no writing): the curves the figures draw
(median over seeds of each variant's loss and gradient norm, per learning rate; the
per-layer drift and growth; the bridge's errors) and the rows of the report's tables.
:mod:`gaussian_pde.training._figures` draws them and
:mod:`gaussian_pde.training._report` writes them.
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["training_curves", "drift_curves", "run_rows", "bridge_rows", "DRIFT_KEYS"]

#: per-layer measures drawn against depth, with their axis labels
DRIFT_KEYS = (("rel_step", "step drift |X_l - X_l-1| / |X_l-1|"),
              ("rel_from_input", "drift from input |X_l - X_0| / |X_0|"),
              ("w2_step_rel", "W2(fit_l-1, fit_l) / sqrt tr S_l-1"),
              ("trace", "growth tr S_l / tr S_0"))


def _at_rate(runs, lr):
    return [r for r in runs if np.isclose(r["learning_rate"], lr)]


def _nanmedian(a):
    """Median over axis 0 of the finite entries (NaN where none is finite)."""
    a = np.asarray(a, float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(np.where(np.isfinite(a), a, np.nan), axis=0)


def training_curves(results, task):
    """``{lr: {variant: {"loss", "grad_norm": (runs, steps), "median_*", "diverged"}}}``.

    ``diverged``: the divergence steps of the runs that diverged.
    """
    out = {}
    for lr in results["config"]["learning_rates"]:
        out[lr] = {}
        for v, runs in results["runs"][task].items():
            sel = _at_rate(runs, lr)
            rec = {"diverged": [r["divergence_step"] for r in sel
                                if r["divergence_step"] is not None]}
            for key in ("loss", "grad_norm"):
                ys = np.array([np.asarray(r[key], float) for r in sel])
                rec[key] = ys
                rec["median_" + key] = _nanmedian(ys)
            out[lr][v] = rec
    return out


def drift_curves(results, task, lr=None):
    """``{variant: {when: {key: median over seeds, per layer}}}`` at rate ``lr``.

    ``when`` is ``"init"`` or ``"final"``; ``key`` one of :data:`DRIFT_KEYS` (``trace``
    divided by its input value: the growth). Default rate: the bridged one.
    """
    lr = results["config"]["bridge_learning_rate"] if lr is None else lr
    out = {}
    for v, runs in results["runs"][task].items():
        sel = _at_rate(runs, lr)
        out[v] = {}
        for when in ("init", "final"):
            curves = {}
            for key, _ in DRIFT_KEYS:
                ys = np.array([np.asarray(r[f"drift_{when}"][key], float) for r in sel])
                if key == "trace":
                    with np.errstate(all="ignore"):
                        ys = ys / ys[:, :1]
                curves[key] = _nanmedian(ys)
            out[v][when] = curves
    return out


def run_rows(results, task):
    """Per variant: ``(variant, [(n diverged, n runs, median held-out loss) per rate], g)``.

    ``g``: median over seeds of the largest gradient norm over its step-0 value, at the
    bridged rate.
    """
    cfg = results["config"]
    rows = []
    for v, runs in results["runs"][task].items():
        cells = []
        for lr in cfg["learning_rates"]:
            sel = _at_rate(runs, lr)
            fl = [r["eval_loss_final"] for r in sel if r["divergence_step"] is None]
            cells.append((sum(r["divergence_step"] is not None for r in sel), len(sel),
                          float(np.median(fl)) if fl else None))
        sel = _at_rate(runs, cfg["bridge_learning_rate"])
        g = float(np.median([np.nanmax(r["grad_norm"]) / r["grad_norm"][0] for r in sel]))
        rows.append((v, cells, g))
    return rows


def bridge_rows(results):
    """One dict per (task, variant, blocks) of the bridge, the numbers of its table row."""
    rows = []
    for t, byv in results["bridge"].items():
        for v, b in byv.items():
            for kind in ("attention", "full"):
                r = b[kind]
                nan = np.full(len(r["ess_frac"][-1]), np.nan)
                reached = r.get("layers_reached", len(r["pred_trace"]) - 1)
                pred = np.asarray(r["pred_trace"], float)
                rows.append(dict(task=t, variant=v, blocks=kind, exact=r["exact"],
                                 status=r["status"], layers_reached=reached,
                                 cov_err=np.asarray(r["cov_err"][-1]),
                                 slope=np.asarray(r["slope"][1:]),
                                 ess=np.asarray(r["ess_frac"][-1]),
                                 ess_mean_field=np.asarray(r.get("ess_mean_field", nan)),
                                 tail_median=np.asarray(r.get("tail_median", nan)),
                                 tail_p90=np.asarray(r.get("tail_p90", nan)),
                                 trace_model=float(r["model_trace"][-1][-1]),
                                 trace_gauss=float(pred[reached]),
                                 diverged=b.get("diverged", False)))
    return rows
