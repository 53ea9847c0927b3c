r"""The training study: every variant on every task, seeds and learning rates; the verdicts.

:func:`run_training_study` trains each variant of :data:`VARIANTS` (or those asked for)
on each task with the same seeds, learning rates, steps and batches, measures drift and
activation growth by layer on held-out sequences at initialisation and after training
(:func:`drift_metrics`), and runs the bridge (:func:`bridge`) on the models without
LayerNorm. :func:`verdicts` applies the stated criteria of docs/math.md 11.3;
:func:`write_training_study` writes ``summary.json``, the figures and ``report.md``.
"""

from __future__ import annotations

import math

import jax
import numpy as np

from ._bridge import bridge, without_ffn
from ._compile import compiled
from ._measure import drift_metrics, gaussian_fit
from ._model import layer_tokens, loss_fn, x64
from ._spec import VARIANTS, model_spec
from ._tasks import get_task
from ._train import _check_rates, _check_seeds, train

__all__ = ["STUDY_TASKS", "run_training_study", "verdicts", "DRIFT_RATIO", "GROWTH_RATIO"]

#: the tasks of the study
STUDY_TASKS = ("mixture", "regression")
#: drift criterion: no-residual step drift at least this multiple of the residual model's
DRIFT_RATIO = 2.0
#: explosion criterion: largest gradient norm at least this multiple of its step-0 value
GROWTH_RATIO = 100.0
#: variants bridged to the Gaussian solvers (no LayerNorm)
_BRIDGED = ("no_ln", "neither", "pde_euler", "pde_rk4", "pde_euler_tied", "pde_rk4_tied")


def _eval(params, spec, task, x, y, optimize=True):
    """Tokens per layer and loss of one model in float64, from one kept executable."""
    def f(p, xx, yy):
        return layer_tokens(p, spec, xx), loss_fn(p, spec, task, xx, yy)

    with x64():
        p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
        xx = np.asarray(x, np.float64)
        yy = np.asarray(y, np.int32 if task.loss == "cross_entropy" else np.float64)
        exe = compiled(("eval", spec, task), f, p, xx, yy, optimize=optimize)
        toks, loss = exe(p, xx, yy)
        return np.asarray(toks), float(loss)


def _run_record(run, spec, task, x, y, optimize=True):
    rec = {"seed": run.seed, "learning_rate": run.learning_rate,
           "divergence_step": run.divergence_step, "loss": run.loss,
           "grad_norm": run.grad_norm, "max_layer_grad_norm": run.max_layer_grad_norm}
    for when, params in (("init", run.init_params), ("final", run.params)):
        with np.errstate(all="ignore"):
            toks, loss = _eval(params, spec, task, x, y, optimize)
        rec[f"eval_loss_{when}"] = loss
        rec[f"drift_{when}"] = drift_metrics(toks)
        if when == "final":
            rec["input_fit"] = gaussian_fit(toks[0])
    return rec


def run_training_study(*, tasks=STUDY_TASKS, variants=None, seeds=(0, 1, 2, 3, 4),
                       learning_rates=(1e-3, 1e-2, 3e-2), n_steps=200, batch=32, depth=4,
                       eval_batch=64, bridge_tokens=(64, 256, 1024), bridge_sequences=4,
                       bridge_learning_rate=None, optimize=True, progress=None):
    r"""Train and measure every variant on every task; bridge the models without LayerNorm.

    Parameters
    ----------
    tasks : sequence of str
        Task names (:data:`~gaussian_pde.training.TASKS`).
    variants : sequence of str, optional
        Variant names (default: all of :data:`~gaussian_pde.training.VARIANTS`).
    seeds, learning_rates : sequences
        Every variant trains with every seed at every rate.
    n_steps, batch, depth : int
        Adam steps, sequences per batch, layers.
    eval_batch : int
        Held-out sequences (seed ``10_000 + seed``) for the measurements.
    bridge_tokens, bridge_sequences : sequence of int, int
        Sequence lengths :math:`n` and sequences per length of the bridge.
    bridge_learning_rate : float, optional
        The rate whose trained models are bridged (default: the smallest rate); the first
        seed's model of each bridged variant is used.
    optimize : bool
        Passed to :func:`train`, and used for the measurements' float64 program
        (``False`` builds faster: for short runs).
    progress : callable, optional
        Called with a short message after each (task, variant) and each bridge.

    Returns
    -------
    dict
        ``config``; ``runs[task][variant]``: a list of per-run records (curves, divergence
        step, eval losses and drift at init and after training); ``bridge[task][variant]``:
        ``{"full": ..., "attention": ...}`` (:func:`bridge` with and without the FFN).
    """
    variants = tuple(VARIANTS) if variants is None else tuple(variants)
    specs = {v: model_spec(v, depth=depth) for v in variants}
    tasks = tuple(get_task(t).name for t in tasks)
    if not tasks:
        raise ValueError("`tasks` must name at least one task.")
    seeds, rates = _check_seeds(seeds), _check_rates(learning_rates)
    lr_b = min(rates) if bridge_learning_rate is None else float(bridge_learning_rate)
    cfg = dict(tasks=list(tasks), variants=list(variants), seeds=list(seeds),
               learning_rates=list(rates), n_steps=n_steps, batch=batch, depth=depth,
               width=specs[variants[0]].width, heads=specs[variants[0]].heads,
               eval_batch=eval_batch, bridge_tokens=list(bridge_tokens),
               bridge_sequences=bridge_sequences, bridge_learning_rate=lr_b,
               divergence_factor=10.0)
    out = {"config": cfg, "runs": {}, "bridge": {}}
    for tname in tasks:
        task = get_task(tname)
        out["runs"][tname], out["bridge"][tname] = {}, {}
        evals = {s: task.sample(np.random.default_rng(10_000 + s), eval_batch) for s in seeds}
        for v in variants:
            res = train(specs[v], task, seeds=seeds, learning_rates=rates, n_steps=n_steps,
                        batch=batch, optimize=optimize)
            out["runs"][tname][v] = [_run_record(r, res.spec, task, *evals[r.seed], optimize)
                                     for r in res.runs]
            if progress is not None:
                progress(f"train: {tname}/{v}")
            if v in _BRIDGED:
                run = res.run(seeds[0], lr_b)
                rec = next(r for r in out["runs"][tname][v] if r["seed"] == seeds[0]
                           and math.isclose(r["learning_rate"], lr_b))
                m0, c0 = rec["input_fit"]
                b = {}
                with np.errstate(all="ignore"):
                    b["full"] = bridge(run.params, res.spec, m0, c0, n_tokens=bridge_tokens,
                                       n_sequences=bridge_sequences)
                    b["attention"] = bridge(*without_ffn(run.params, res.spec), m0, c0,
                                            n_tokens=bridge_tokens,
                                            n_sequences=bridge_sequences)
                b["diverged"] = run.diverged
                out["bridge"][tname][v] = b
                if progress is not None:
                    progress(f"bridge: {tname}/{v}")
    return out


def _median_step_drift(rec, when="final"):
    r = rec[f"drift_{when}"]["rel_step"]
    return float(np.nanmedian(r)) if np.any(np.isfinite(r)) else math.nan


def _first_diverging_rate(runs, seed):
    rates = sorted(r["learning_rate"] for r in runs if r["seed"] == seed
                   and r["divergence_step"] is not None)
    return rates[0] if rates else math.inf


def _explosive(rec):
    g = rec["grad_norm"]
    return rec["divergence_step"] is not None or bool(
        np.nanmax(g) >= GROWTH_RATIO * g[0])


def verdicts(results):
    r"""The paper's claims under the stated criteria, counted over tasks, seeds and rates.

    * ``drift``: for each pair (``no_residual`` vs ``pre_ln``; ``neither`` vs ``no_ln``),
      task, seed and rate at which neither run diverged, the claim holds if the median
      over layers of the step drift :math:`\|X_\ell - X_{\ell-1}\|/\|X_{\ell-1}\|` of the
      trained model without residuals is at least :data:`DRIFT_RATIO` times that of its
      residual counterpart.
    * ``explosion``: for each pair (``no_ln`` vs ``pre_ln``; ``no_ln`` vs ``post_ln``;
      ``neither`` vs ``no_residual``), task and seed, the claim holds if the model without
      LayerNorm diverges at a smaller learning rate of the grid than the one with it
      (never diverging counts as an infinite rate); ``explosive_runs`` counts, per variant,
      the runs that diverged or whose gradient norm reached :data:`GROWTH_RATIO` times
      its step-0 value.
    * ``simulator``: for each PDE simulator variant, task, seed and rate at which
      ``no_ln`` did not diverge, the claim (the simulator without normalisation trains
      stably) holds if it does not diverge either, and its trained activation growth
      :math:`\operatorname{tr}\hat\Sigma_L/\operatorname{tr}\hat\Sigma_0` is at most that
      of ``no_ln``; ``both_diverged`` counts the cases left out because both diverged.

    Returns a dict ``{claim: {"criterion", "holds", "total", "detail"}}``.
    """
    runs = results["runs"]
    out = {}
    pairs = [("no_residual", "pre_ln"), ("neither", "no_ln")]
    det, holds, total = [], 0, 0
    for t, byv in runs.items():
        for a, b in pairs:
            if a not in byv or b not in byv:
                continue
            for ra, rb in zip(byv[a], byv[b]):
                if ra["divergence_step"] is not None or rb["divergence_step"] is not None:
                    continue
                da, db = _median_step_drift(ra), _median_step_drift(rb)
                ok = bool(da >= DRIFT_RATIO * db)
                holds, total = holds + ok, total + 1
                det.append(dict(task=t, pair=f"{a}/{b}", seed=ra["seed"],
                                learning_rate=ra["learning_rate"], ratio=da / db, holds=ok))
    out["drift"] = {"criterion": f"median step drift without residuals >= {DRIFT_RATIO:g} x "
                                 "with (trained, non-diverged pairs)",
                    "holds": holds, "total": total, "detail": det}
    pairs = [("no_ln", "pre_ln"), ("no_ln", "post_ln"), ("neither", "no_residual")]
    det, holds, total = [], 0, 0
    for t, byv in runs.items():
        for a, b in pairs:
            if a not in byv or b not in byv:
                continue
            for s in sorted({r["seed"] for r in byv[a]}):
                fa, fb = _first_diverging_rate(byv[a], s), _first_diverging_rate(byv[b], s)
                ok = bool(fa < fb)
                holds, total = holds + ok, total + 1
                det.append(dict(task=t, pair=f"{a}/{b}", seed=s, first_diverging_rate=fa,
                                first_diverging_rate_other=fb, holds=ok))
    explosive = {t: {v: int(sum(_explosive(r) for r in rs)) for v, rs in byv.items()}
                 for t, byv in runs.items()}
    out["explosion"] = {"criterion": "without LayerNorm the first diverging learning rate "
                                     "is smaller than with it (per task and seed)",
                        "holds": holds, "total": total, "detail": det,
                        "explosive_runs": explosive}
    det, holds, total, both_diverged = [], 0, 0, 0
    for t, byv in runs.items():
        if "no_ln" not in byv:
            continue
        for v in [v for v in byv if v.startswith("pde_")]:
            for ra, rb in zip(byv[v], byv["no_ln"]):
                if rb["divergence_step"] is not None:
                    both_diverged += ra["divergence_step"] is not None
                    continue    # tested only where no_ln trains
                ga, gb = ra["drift_final"]["trace"], rb["drift_final"]["trace"]
                growth_a, growth_b = ga[-1] / ga[0], gb[-1] / gb[0]
                ok = bool(ra["divergence_step"] is None
                          and (not np.isfinite(growth_b) or growth_a <= growth_b))
                holds, total = holds + ok, total + 1
                det.append(dict(task=t, variant=v, seed=ra["seed"],
                                learning_rate=ra["learning_rate"], growth=growth_a,
                                growth_no_ln=growth_b, holds=ok))
    out["simulator"] = {"criterion": "where no_ln trains without diverging, the PDE "
                                     "simulator does too and its trained growth "
                                     "tr S_L / tr S_0 is at most no_ln's",
                        "holds": holds, "total": total, "detail": det,
                        "both_diverged": both_diverged}
    return out
