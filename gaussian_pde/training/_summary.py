r"""Numbers of the training study's report, computed from :func:`run_training_study`'s output.

Plain NumPy on the results dict (no plotting, no writing): the curves the figures draw
(median over seeds of each variant's loss and gradient norm, per learning rate; the
per-layer measures; the largest stable rate against depth; the per-layer gradient norms;
the theory's prediction against the outcome; the bridge's errors) and the rows of the
report's tables. :mod:`gaussian_pde.training._figures` draws them and
:mod:`gaussian_pde.training._report` writes them.
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["training_curves", "drift_curves", "run_rows", "bridge_rows", "bridge_scope_rows",
           "stability_curves", "layer_grad_curves", "theory_points", "spread_rows", "DRIFT_KEYS"]

#: per-layer measures drawn against depth, with their axis labels
DRIFT_KEYS = (("cka_input", "linear CKA(X_l, X_0)"),
              ("probe_target", "target probe (held-out acc. / R^2)"),
              ("probe_input", "input probe R^2"),
              ("centred_step", "centred change |X_l - X_l-1| / |X_l-1|"),
              ("rel_step", "uncentred step drift (old metric)"),
              ("trace", "growth tr S_l / tr S_0"))


def _select(runs, lr=None, depth=None, optim=None):
    return [r for r in runs if (lr is None or np.isclose(r["learning_rate"], lr))
            and (depth is None or r["depth"] == depth)
            and (optim is None or r.get("optim", "plain") == optim)]


def _nanmedian(a):
    """Median over axis 0 of the finite entries (NaN where none is finite)."""
    a = np.asarray(a, float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(np.where(np.isfinite(a), a, np.nan), axis=0)


def bridge_rate(results, task):
    """The rate ``task`` is drifted and bridged at: the nearest of its rates to the study's."""
    ref = results.get("tasks", {}).get(task, {})
    return ref.get("bridge_learning_rate", results["config"]["bridge_learning_rate"])


def task_rates(results, task):
    """The learning rates ``task`` trained at: its own grid where it has one, else the study's."""
    cfg = results["config"]
    return cfg.get("task_rates", {}).get(task, cfg["learning_rates"])


def shown_rates(results, task=None, k=4):
    """``k`` learning rates of ``task``'s grid (default the study's), evenly spaced in log.

    These are the columns of the figures.
    """
    rates = results["config"]["learning_rates"] if task is None else task_rates(results, task)
    idx = np.unique(np.round(np.linspace(0, len(rates) - 1, min(k, len(rates)))).astype(int))
    return [rates[i] for i in idx]


def training_curves(results, task, depth=None, optim="plain", rates=None):
    """``{lr: {variant: {"loss", "grad_norm": (runs, steps), "median_*", "diverged"}}}``."""
    depth = results["config"]["depth"] if depth is None else depth
    out = {}
    for lr in (shown_rates(results, task) if rates is None else rates):
        out[lr] = {}
        for v, runs in results["runs"][task].items():
            sel = _select(runs, lr, depth, optim)
            if not sel:
                continue
            rec = {"diverged": [r["divergence_step"] for r in sel
                                if r["divergence_step"] is not None]}
            for key in ("loss", "grad_norm"):
                ys = np.array([np.asarray(r[key], float) for r in sel])
                rec[key] = ys
                rec["median_" + key] = _nanmedian(ys)
            out[lr][v] = rec
    return out


def drift_curves(results, task, lr=None, depth=None, optim="plain"):
    """``{variant: {when: {key: median over seeds, per layer}}}`` at rate ``lr``, ``depth``.

    ``when`` is ``"init"`` or ``"final"``; ``key`` one of :data:`DRIFT_KEYS` (``trace``
    divided by its input value: the growth). Default rate: the bridged one.
    """
    lr = bridge_rate(results, task) if lr is None else lr
    depth = results["config"]["depth"] if depth is None else depth
    out = {}
    for v, runs in results["runs"][task].items():
        sel = _select(runs, lr, depth, optim)
        if not sel:
            continue
        out[v] = {}
        for when in ("init", "final"):
            curves = {}
            for key, _ in DRIFT_KEYS:
                ys = np.array([np.asarray(r[f"measures_{when}"][key], float) for r in sel])
                if key == "trace":
                    with np.errstate(all="ignore"):
                        ys = ys / ys[:, :1]
                curves[key] = _nanmedian(ys)
            out[v][when] = curves
    return out


def _stable(sel):
    ok = [r["learning_rate"] for r in sel if not r["failed"]]
    return max(ok) if ok else 0.0


def stability_curves(results, task, optim="plain"):
    """``{variant: (depths, median over seeds of the largest stable rate)}``."""
    out = {}
    for v, runs in results["runs"][task].items():
        depths = sorted({r["depth"] for r in runs})
        med = []
        for L in depths:
            sel = _select(runs, depth=L, optim=optim)
            seeds = sorted({r["seed"] for r in sel})
            med.append(float(np.median([_stable([r for r in sel if r["seed"] == s])
                                        for s in seeds])) if seeds else np.nan)
        out[v] = (np.array(depths), np.array(med))
    return out


def layer_grad_curves(results, task, depth, lr=None, optim="plain"):
    """``{variant: (start, max)}``: median over seeds of each layer's gradient norm."""
    lr = bridge_rate(results, task) if lr is None else lr
    out = {}
    for v, runs in results["runs"][task].items():
        sel = _select(runs, lr, depth, optim)
        if sel:
            out[v] = tuple(_nanmedian([np.asarray(r[k], float) for r in sel])
                           for k in ("layer_grad_norm_start", "layer_grad_norm_max"))
    return out


def theory_points(results):
    """Per run of a model without normalisation: ``(variant, L, L*, failed, growth)``."""
    pts = []
    for t, byv in results["runs"].items():
        for v, runs in byv.items():
            for r in runs:
                if "L_star_init" not in r:
                    continue
                tr = np.asarray(r["measures_init"]["trace"], float)
                with np.errstate(all="ignore"):
                    g = tr[-1] / tr[0]
                pts.append((t, v, r["depth"], r["L_star_init"], bool(r["failed"]), float(g)))
    return pts


def run_rows(results, task):
    """Per (variant, depth): largest stable rate per optimiser, best loss, failure counts.

    The stable rate is the median over seeds; the best loss the lowest final held-out
    loss over rates and optimisers; the counts are of failed runs, of runs that became
    non-finite and of runs that tripped the older relative criterion.
    """
    rows = []
    for v, runs in results["runs"][task].items():
        for L in sorted({r["depth"] for r in runs}):
            sel = _select(runs, depth=L)
            stable = {}
            for o in results["config"]["optims"]:
                so = _select(sel, optim=o)
                seeds = sorted({r["seed"] for r in so})
                stable[o] = (float(np.median([_stable([r for r in so if r["seed"] == s])
                                              for s in seeds])) if seeds else None)
            fl = [r["eval_loss_final"] for r in sel if np.isfinite(r["eval_loss_final"])]
            rows.append(dict(variant=v, depth=L, stable=stable,
                             best=float(min(fl)) if fl else None,
                             failed=sum(r["failed"] for r in sel),
                             nonfinite=sum(r["divergence_step"] is not None for r in sel),
                             relative=sum(r["relative_step"] is not None for r in sel),
                             n=len(sel)))
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


def spread_rows(results):
    """The first attention's spread per (task, variant, depth) without normalisation.

    Medians over runs of the predicted and measured effective fraction, at initialisation
    and trained, and of the tokens one effective token needs.
    """
    rows = []
    for t, byv in results["runs"].items():
        for v, runs in byv.items():
            for L in sorted({r["depth"] for r in runs if "spread_init" in r}):
                sel = [r for r in runs if r["depth"] == L and "spread_init" in r]
                row = dict(task=t, variant=v, depth=L)
                for when in ("init", "final"):
                    for k in ("predicted", "measured", "tokens_needed"):
                        row[f"{k}_{when}"] = float(_nanmedian(
                            [r[f"spread_{when}"][k] for r in sel]))
                rows.append(row)
    return rows


def bridge_scope_rows(results):
    """The bridge over every seed and rate: one dict per (task, variant, rate, blocks).

    ``seeds``, how many ``finished`` (the Gaussian map through every layer) and how many
    diverged in training; ``exact``; the median, smallest and largest over seeds of the
    last reached layer's relative covariance error at the largest :math:`n`
    (``cov_err``) and of the model's trace over the Gaussian's there (``trace_ratio``).
    """
    rows = []
    for t, byv in results.get("bridge_scope", {}).items():
        for v, cases in byv.items():
            for lr in sorted({c["learning_rate"] for c in cases}):
                sel = [c for c in cases if c["learning_rate"] == lr]
                for kind in ("attention", "full"):
                    s = [c[kind] for c in sel]
                    err = np.array([x["cov_err_last"] for x in s], float)
                    ratio = np.array([x["trace_ratio"] for x in s], float)
                    fin = err[np.isfinite(err)]
                    rows.append(dict(
                        task=t, variant=v, learning_rate=lr, blocks=kind, seeds=len(s),
                        finished=sum(x["status"] == "finished" for x in s),
                        diverged=sum(bool(c["diverged"]) for c in sel),
                        exact=all(x["exact"] for x in s),
                        cov_err=float(_nanmedian(err)),
                        cov_err_min=float(fin.min()) if fin.size else np.nan,
                        cov_err_max=float(fin.max()) if fin.size else np.nan,
                        trace_ratio=float(_nanmedian(ratio))))
    return rows
