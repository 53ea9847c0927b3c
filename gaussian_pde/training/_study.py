r"""The training study: variants x depths x learning rates x seeds x optimiser settings.

:func:`run_training_study` trains each variant of :data:`VARIANTS` (or those asked for) on
each task with the same seeds, learning rates, steps and batches: on the *sweep task* at
every depth of ``depths``, on the other tasks at ``depth``; each with the optimiser
settings of ``optims`` (plain Adam, and Adam with warmup and gradient clipping). Every run
is measured on held-out sequences at initialisation and after training (drift, growth,
CKA and linear probes by layer: :mod:`._measure`), and every model without normalisation
gets the Gaussian theory's prediction (:func:`predicted_blowup_depth`). The bridge
(:func:`bridge`) runs on the models without LayerNorm at ``depth``.
:func:`~gaussian_pde.training._verdicts.verdicts` applies the stated criteria;
:func:`write_training_study` writes ``summary.json``, the figures and ``report.md``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import multiprocessing
from typing import NamedTuple

import jax
import numpy as np

import gaussian_pde as gp
from gaussian_pde._common.validation import usable_cores, validate_allocation, validate_int
from gaussian_pde.attention import dot_product_head, sum_of_heads

from ._bridge import bridge, bridge_summary, without_ffn
from ._compile import compiled
from ._measure import attention_spread, drift_metrics, gaussian_fit, information_metrics
from ._model import block_weights, layer_tokens, loss_fn, x64
from ._spec import VARIANTS, model_spec
from ._tasks import get_task
from ._train import DEFAULT_LEARNING_RATES, _check_rates, _check_seeds, run_failed, train
from ._verdicts import verdicts

__all__ = ["STUDY_TASKS", "OPTIMS", "check_study_memory", "check_study_workers",
           "default_workers", "run_training_study", "verdicts",
           "predicted_blowup_depth", "largest_stable_rate"]

#: the tasks of the study
STUDY_TASKS = ("mixture", "regression", "text")
#: variants bridged to the Gaussian solvers (no normalisation, unscaled branches)
_BRIDGED = ("no_ln", "neither", "pde_euler", "pde_rk4", "pde_euler_tied", "pde_rk4_tied")


def OPTIMS(n_steps):
    """The optimiser settings: plain Adam; warmup over a tenth of the steps with clipping at 1."""
    return {"plain": dict(warmup=0, clip=None),
            "warmup_clip": dict(warmup=max(1, n_steps // 10), clip=1.0)}


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


def predicted_blowup_depth(params, spec, cov0, *, horizon_layers=2.0, max_nfev=20_000):
    r"""The Gaussian theory's blow-up depth :math:`L^* = t^*/h` of a model's attentions.

    Layer :math:`l` of the stack is one step :math:`h` of the Gaussian moment ODE
    :math:`\dot\Sigma = M_l(\Sigma)\Sigma + \Sigma M_l(\Sigma)^T` of its own attention,
    its values scaled by the branch factor :math:`\beta` (:attr:`ModelSpec.branch_factor`;
    ReZero: the layer's gate): the residual stack is that ODE's Euler scheme with step
    :math:`h` (1 for a block stack, :math:`T/L` for the simulator). From the covariance
    ``cov0`` of the embedded tokens, the ODE runs through the layers in turn, each for a
    time :math:`h` (:func:`gaussian_pde.solve_batch`, one trajectory, with its blow-up
    event); past the last layer, that layer's field goes on, up to ``horizon_layers``
    times the depth. A blow-up at time :math:`\tau` into layer :math:`l` (0-based) gives
    :math:`L^* = l + \tau/h`; ``inf`` when none is found within the horizon. NaN when the
    ODE cannot be followed through a layer: the solver stops without finishing it (more
    than ``max_nfev`` evaluations, a step below rounding, the covariance losing rank
    numerically) or the covariance is not finite. A layer whose branch is off (no
    residual, a closed gate) moves nothing.
    """
    depth, h = spec.depth, spec.step
    cov = np.asarray(cov0, float)
    cov = 0.5 * (cov + cov.T)
    horizon = horizon_layers * depth
    layer = 0
    while layer < horizon:
        att = _layer_attention(params, spec, min(layer, depth - 1))
        span = h if layer < depth - 1 else (horizon - layer) * h   # the last layer goes on
        if att is not None:
            try:
                with np.errstate(all="ignore"):
                    res = gp.solve_batch(att, cov[None], (0.0, span), blowup_threshold=1e8,
                                         rtol=1e-6, atol=1e-9, max_nfev=max_nfev)
            except (ValueError, FloatingPointError, np.linalg.LinAlgError):
                return math.nan
            status = res.status[0]
            if status == gp.Status.BLOWUP:
                return layer + float(res.t_blowup[0]) / h
            if status != gp.Status.FINISHED:
                return math.nan
            cov = res.cov_final[0]
            if not np.all(np.isfinite(cov)):
                return math.nan
        layer += 1 if layer < depth - 1 else horizon
    return math.inf


def _layer_attention(params, spec, layer):
    """The attention of ``layer`` as the moment ODE sees it (values times the branch factor), or None."""
    b = block_weights(params, spec, layer)
    beta = spec.branch_factor * (1.0 if spec.residual else 0.0) if spec.simulator is None \
        else 1.0
    if spec.rezero:
        beta = float(np.asarray(b["gate1"]).ravel()[0]) if beta != 0.0 else 0.0
    if beta == 0.0:
        return None
    heads = [dot_product_head(np.asarray(b["Q"][k], float), np.asarray(b["K"][k], float),
                              beta * np.asarray(b["Wo"][k] @ b["Wv"][k], float),
                              scale=spec.score_scale) for k in range(spec.heads)]
    return sum_of_heads(heads)


def largest_stable_rate(records, chance):
    """The largest learning rate of the grid whose run did not fail (0 if every one failed)."""
    ok = [r["learning_rate"] for r in records if not run_failed(r["eval_loss_final"], chance)]
    return max(ok) if ok else 0.0


def _layer_grad_summary(run):
    g = run.layer_grad_norm
    with np.errstate(all="ignore"):
        mx = np.nanmax(np.where(np.isfinite(g), g, np.nan), axis=0) if np.any(
            np.isfinite(g)) else np.full(g.shape[1], np.nan)
    return {"layer_grad_norm_start": g[0], "layer_grad_norm_max": mx,
            "layer_grad_norm_end": g[np.isfinite(g).all(axis=1)][-1]
            if np.isfinite(g).all(axis=1).any() else np.full(g.shape[1], np.nan)}


def _measure(params, spec, task, x, y, optimize):
    with np.errstate(all="ignore"):
        toks, loss = _eval(params, spec, task, x, y, optimize)
        info = information_metrics(toks, y, readout=task.readout,
                                   classes=task.loss == "cross_entropy")
        drift = drift_metrics(toks)
    return toks, loss, {**drift, **info}


def _spread(params, spec, x0):
    b = block_weights(params, spec, 0)
    return attention_spread(b["Q"], b["K"], x0, spec.score_scale)


def _train_and_measure(spec, task, seeds, rates, n_steps, batch, optim, evals, optimize,
                       theory):
    res = train(spec, task, seeds=seeds, learning_rates=rates, n_steps=n_steps, batch=batch,
                optimize=optimize, **optim)
    init = {}
    for s in seeds:
        toks, loss, meas = _measure(res.run(s, rates[0]).init_params, spec, task, *evals[s],
                                    optimize)
        m0, c0 = gaussian_fit(toks[0])
        init[s] = dict(loss=loss, meas=meas, fit=(m0, c0))
        if theory:
            init[s]["L_star"] = predicted_blowup_depth(res.run(s, rates[0]).init_params, spec,
                                                       c0)
            init[s]["spread"] = _spread(res.run(s, rates[0]).init_params, spec, toks[0])
    records = []
    for run in res.runs:
        toks, loss, meas = _measure(run.params, spec, task, *evals[run.seed], optimize)
        rec = {"seed": run.seed, "learning_rate": run.learning_rate, "depth": spec.depth,
               "divergence_step": run.divergence_step, "relative_step": run.relative_step,
               "loss": run.loss, "grad_norm": run.grad_norm,
               "final_train_loss": run.final_train_loss,
               "eval_loss_init": init[run.seed]["loss"], "eval_loss_final": loss,
               "measures_init": init[run.seed]["meas"], "measures_final": meas,
               **_layer_grad_summary(run)}
        rec["failed"] = bool(run_failed(loss, task.chance))
        if theory:
            rec["L_star_init"] = init[run.seed]["L_star"]
            with np.errstate(all="ignore"):
                fin = np.all(np.isfinite(toks[0]))
            rec["L_star_final"] = (predicted_blowup_depth(run.params, spec,
                                                          gaussian_fit(toks[0])[1])
                                   if fin else math.nan)
            rec["spread_init"] = init[run.seed]["spread"]
            rec["spread_final"] = _spread(run.params, spec, toks[0])
        records.append(rec)
    return res, records, {s: init[s]["fit"] for s in seeds}


def check_study_memory(n_seeds, *, tasks=STUDY_TASKS, eval_batch=128, name="seeds"):
    """Refuse, before any work, more seeds than their held-out batches leave memory for.

    :func:`run_training_study` draws, per task, a held-out batch of ``eval_batch``
    sequences for every seed and keeps them to the end: ``n_seeds`` times the bytes of one
    batch of each task (drawn here once to measure them). That is a lower bound of what
    the study holds; past half of this machine's memory
    (:func:`~gaussian_pde._common.validation.validate_allocation`) it is refused, naming
    ``name`` and the size. Returns the bytes of the held-out batches.
    """
    n_seeds = validate_int(n_seeds, name, minimum=1)
    eval_batch = validate_int(eval_batch, "eval_batch", minimum=1)
    per_seed = 0
    for tname in tasks:
        task = get_task(tname)
        split = "test" if task.name == "text" else "train"
        batch = task.sample(np.random.default_rng(0), eval_batch, split)
        per_seed += sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(batch))
    need = n_seeds * per_seed
    _refuse_past_half(need, name, f"`{name}` = {n_seeds} seeds would need at least "
                      f"{need / 2**30:.3g} GiB for their held-out batches alone "
                      f"({per_seed / 2**20:.3g} MiB per seed: {eval_batch} sequences per task, "
                      f"tasks {', '.join(tasks)})")
    return need


def _refuse_past_half(need, name, message, lower=None):
    """Raise ``ValueError(message + ...)`` where ``need`` bytes pass half of the memory."""
    try:
        validate_allocation(need, name, itemsize=1)
    except ValueError:
        raise ValueError(f"{message}, more than half of this machine's memory; lower "
                         f"{lower or f'`{name}`'}.") from None


#: memory of one training process before its first group (JAX, XLA, the package)
_WORKER_BYTES = 600 * 2**20


def default_workers():
    """The processes the study uses by default: the cores this process may run on."""
    return usable_cores()


def check_study_workers(workers, name="workers"):
    """Refuse, before any work, a bad or too large number of training processes.

    ``workers`` must be a positive integer, and the processes (about 600 MiB each) must
    fit in half of this machine's memory. Returns it as an int.
    """
    workers = validate_int(workers, name, minimum=1)
    need = workers * _WORKER_BYTES
    _refuse_past_half(need, name, f"`{name}` = {workers} training processes would need "
                      f"{need / 2**30:.3g} GiB (about {_WORKER_BYTES / 2**30:.2g} GiB each)")
    return workers


def run_training_study(*, tasks=STUDY_TASKS, variants=None, sweep_task="mixture",
                       sweep_variants=None, task_variants=None,
                       depths=(2, 4, 8, 16, 32, 64), depth=4, seeds=(0, 1, 2),
                       large_depth=16, large_depth_seeds=1,
                       learning_rates=DEFAULT_LEARNING_RATES, task_rates=None, n_steps=200,
                       task_steps=None, batch=32, width=8, task_width=None,
                       optims=("plain", "warmup_clip"), task_optims=None,
                       eval_batch=128, task_eval_batch=None, bridge_tokens=(64, 256, 1024), bridge_sequences=4,
                       bridge_learning_rate=1e-3, bridge_rates=(1e-3, 1e-2), theory=True,
                       optimize=True, workers=1, progress=None):
    r"""Train and measure every variant; predict from the Gaussian theory; bridge.

    Parameters
    ----------
    tasks : sequence of str
        Task names (:data:`~gaussian_pde.training.TASKS`).
    variants : sequence of str, optional
        Variant names (default: all of :data:`~gaussian_pde.training.VARIANTS`).
    sweep_task : str or None
        The task trained at every depth of ``depths``; the others train at ``depth``.
    sweep_variants : sequence of str, optional
        The variants of the depth sweep (default: all); the others train at ``depth``.
    task_variants : dict, optional
        ``task_variants[name]``: the variants trained on that task (default: all).
    depths, depth : sequence of int, int
        The depth sweep, and the depth of the other tasks and of the bridge.
    seeds : sequence of int
        Seeds (initialisation and data).
    large_depth, large_depth_seeds : int
        At depths of ``large_depth`` and more only the first ``large_depth_seeds`` seeds
        train (the study's trade for its time budget).
    learning_rates : sequence of float
        Every run trains at every rate (default the x2 grid
        :data:`~gaussian_pde.training._train.DEFAULT_LEARNING_RATES`).
    task_rates : dict, optional
        ``task_rates[name]``: the rates of that task instead of ``learning_rates`` (a
        sub-grid near its best rates, for a task whose runs are costly). Its bridge rates
        are the nearest of its own rates (recorded as ``tasks[name]["bridge_learning_rate"]``).
    n_steps, task_steps : int, dict
        Adam steps (``task_steps[name]`` overrides per task).
    batch, width, task_width : int, int, dict
        Sequences per batch; model width (``task_width[name]`` overrides per task).
    optims : sequence of {"plain", "warmup_clip"}
        Optimiser settings (:func:`OPTIMS`).
    task_optims : dict, optional
        ``task_optims[name]``: the settings of that task (default ``optims``).
    eval_batch, task_eval_batch : int, dict
        Held-out sequences per seed (seed ``10_000 + seed``; the test split for text);
        ``task_eval_batch[name]`` overrides it per task.
    bridge_tokens, bridge_sequences, bridge_learning_rate, bridge_rates
        The bridge's sequence lengths and sequences per length; every seed's model is
        bridged at the grid rates nearest to each of ``bridge_rates`` (``bridge_scope``),
        and the first seed's at the grid rate nearest to ``bridge_learning_rate`` is kept
        whole (``bridge``).
    theory : bool
        Compute the Gaussian theory's blow-up depth of every model without normalisation.
    optimize : bool
        Passed to :func:`train` and to the measurements' float64 program.
    workers : int
        Processes that train groups side by side (1: this process). Each group of
        (task, variant, depth, optimiser setting) trains from its seeds alone, so the
        results do not depend on ``workers``.
    progress : callable, optional
        Called with a short message after each trained group and each bridge.

    Returns
    -------
    dict
        ``config``; ``runs[task][variant]``: per-run records (``depth``, ``optim``,
        ``seed``, ``learning_rate``, curves, failure, held-out losses, measures at init and
        after training, per-layer gradient norms, the predicted blow-up depths);
        ``tasks``: each task's chance level and reference losses; ``bridge[task][variant]``;
        ``bridge_scope[task][variant]``: one summary per bridged (seed, rate).
    """
    variants = tuple(VARIANTS) if variants is None else tuple(variants)
    tasks = tuple(get_task(t).name for t in tasks)
    if not tasks:
        raise ValueError("`tasks` must name at least one task.")
    sweep_variants = variants if sweep_variants is None else tuple(sweep_variants)
    task_variants = {t: tuple(vs) for t, vs in dict(task_variants or {}).items()}
    for v in set(variants) | set(sweep_variants) | {v for vs in task_variants.values()
                                                    for v in vs}:
        model_spec(v)
    seeds, rates = _check_seeds(seeds), _check_rates(learning_rates)
    task_eval_batch = {t: validate_int(b, f"task_eval_batch[{t!r}]", minimum=1)
                       for t, b in dict(task_eval_batch or {}).items()}
    check_study_memory(len(seeds), tasks=tasks,
                       eval_batch=max([eval_batch, *task_eval_batch.values()]))
    task_steps = dict(task_steps or {})
    task_width = dict(task_width or {})
    task_optims = {t: tuple(o) for t, o in dict(task_optims or {}).items()}
    for name, opts in [("optims", optims)] + [(f"task_optims[{t!r}]", o)
                                              for t, o in task_optims.items()]:
        if not opts or any(o not in ("plain", "warmup_clip") for o in opts):
            raise ValueError(f"`{name}` must name 'plain' and/or 'warmup_clip', got {opts!r}.")
    workers = check_study_workers(workers)
    bridge_learning_rate, = _check_rates(bridge_learning_rate, "bridge_learning_rate")
    bridge_rates = _check_rates(bridge_rates, "bridge_rates")

    def nearest(grid, lr):
        return min(grid, key=lambda r: abs(math.log(r / lr)))

    def bridged_rates(grid):
        return tuple(dict.fromkeys(nearest(grid, lr) for lr in (bridge_learning_rate,
                                                                *bridge_rates)))

    lr_b = nearest(rates, bridge_learning_rate)
    task_rates = {t: _check_rates(r, f"task_rates[{t!r}]")
                  for t, r in dict(task_rates or {}).items()}
    for name, per_task in (("task_rates", task_rates), ("task_eval_batch", task_eval_batch)):
        if set(per_task) - set(tasks):
            raise ValueError(f"`{name}` must name tasks of `tasks` {list(tasks)}, got "
                             f"{sorted(per_task)}.")
    cfg = dict(tasks=list(tasks), variants=list(variants), sweep_task=sweep_task,
               sweep_variants=list(sweep_variants),
               task_variants={t: list(vs) for t, vs in task_variants.items()},
               depths=list(depths), depth=depth, seeds=list(seeds), large_depth=large_depth,
               large_depth_seeds=large_depth_seeds, learning_rates=list(rates),
               task_rates={t: list(r) for t, r in task_rates.items()},
               n_steps=n_steps, task_steps=task_steps, batch=batch, width=width,
               task_width=task_width, heads=model_spec(variants[0]).heads,
               optims={o: OPTIMS(n_steps)[o] for o in optims},
               task_optims={t: list(o) for t, o in task_optims.items()},
               eval_batch=eval_batch, task_eval_batch=task_eval_batch,
               bridge_tokens=list(bridge_tokens),
               bridge_sequences=bridge_sequences, bridge_learning_rate=lr_b,
               bridge_rates=list(bridged_rates(rates)),
               divergence_factor=10.0)
    out = {"config": cfg, "runs": {}, "bridge": {}, "bridge_scope": {}, "tasks": {}}
    jobs = []
    for tname in tasks:
        task = get_task(tname)
        steps = task_steps.get(tname, n_steps)
        w = task_width.get(tname, width)
        grid = task_rates.get(tname, rates)
        ref = {"chance": task.chance, "n_steps": steps, "width": w, "n_tokens": task.n_tokens,
               "eval_batch": task_eval_batch.get(tname, eval_batch),
               "bridge_learning_rate": nearest(grid, bridge_learning_rate)}
        if task.name == "text":
            ref["bigram"] = task.bigram_loss()
        else:
            ref["bayes_risk"] = task.bayes_risk()
        if task.name == "regression":
            ref["least_squares_risk"] = task.least_squares_risk()
        out["tasks"][tname] = ref
        out["runs"][tname], out["bridge"][tname], out["bridge_scope"][tname] = {}, {}, {}
        for v in task_variants.get(tname, variants):
            out["runs"][tname][v] = []
            sweep = tname == sweep_task and v in sweep_variants
            for L in (tuple(depths) if sweep else (depth,)):
                ss = seeds[:large_depth_seeds] if L >= large_depth else seeds
                for o in task_optims.get(tname, optims):
                    bridged = (v in _BRIDGED and L == depth
                               and o == task_optims.get(tname, optims)[0])
                    jobs.append(_Group(tname, v, L, w, o, tuple(ss), tuple(seeds), grid,
                                       steps, batch, ref["eval_batch"], optimize, theory,
                                       bridged, ref["bridge_learning_rate"],
                                       bridged_rates(grid), tuple(bridge_tokens),
                                       bridge_sequences))
    _check_group_memory(jobs, workers)
    for job, (recs, headline, scope) in zip(jobs, _run_groups(jobs, workers, progress)):
        out["runs"][job.task][job.variant] += recs
        if headline is not None:
            out["bridge"][job.task][job.variant] = headline
            out["bridge_scope"][job.task][job.variant] = scope
    return out


class _Group(NamedTuple):
    """One trained group: a (task, variant, depth, optimiser setting) over seeds and rates."""

    task: str
    variant: str
    depth: int
    width: int
    optim: str
    seeds: tuple
    eval_seeds: tuple
    rates: tuple
    n_steps: int
    batch: int
    eval_batch: int
    optimize: bool
    theory: bool
    bridged: bool
    bridge_rate: float
    bridge_rates: tuple
    bridge_tokens: tuple
    bridge_sequences: int

    @property
    def cost(self):
        """A relative estimate of the group's time: depth x lanes x steps x width."""
        return self.depth * len(self.seeds) * len(self.rates) * self.n_steps * self.width


@functools.lru_cache(maxsize=8)
def _held_out(tname, eval_batch, seeds):
    """The held-out batches of a task per seed (seed ``10_000 + seed``; text: the test split)."""
    task = get_task(tname)
    split = "test" if task.name == "text" else "train"
    return {s: task.sample(np.random.default_rng(10_000 + s), eval_batch, split)
            for s in seeds}


def _check_group_memory(jobs, workers):
    """Refuse, before any work, groups whose training batches ``workers`` processes cannot hold.

    A group holds its seeds' training batches twice (as drawn, float64, and as trained,
    float32): 12 bytes per number, ``seeds x n_steps x batch x n_tokens x input_dim``
    numbers; ``workers`` processes hold the largest ``workers`` groups at once.
    """
    def need(job):
        task = get_task(job.task)
        return 12 * len(job.seeds) * job.n_steps * job.batch * task.n_tokens * task.input_dim

    sizes = sorted((need(j) for j in jobs), reverse=True)[:workers]
    total = sum(sizes)
    _refuse_past_half(total, "workers", f"the training batches of {len(sizes)} groups trained "
                      f"side by side would need {total / 2**30:.3g} GiB (the largest group "
                      f"{sizes[0] / 2**30:.3g} GiB)", lower="`workers`, the steps or the batch")


def _run_group(job):
    """Train and measure one group; bridge it where asked: ``(records, headline, scope)``.

    The bridge runs for every seed of the group at each rate of ``job.bridge_rates``; the
    headline is the whole bridge of the first seed at ``job.bridge_rate``, the scope one
    :func:`bridge_summary` per (seed, rate).
    """
    task = get_task(job.task)
    spec = model_spec(job.variant, depth=job.depth, width=job.width)
    evals = _held_out(job.task, job.eval_batch, job.eval_seeds)
    res, recs, fits = _train_and_measure(
        spec, task, job.seeds, job.rates, job.n_steps, job.batch,
        OPTIMS(job.n_steps)[job.optim], evals, job.optimize,
        job.theory and not spec.has_layernorm)
    for r in recs:
        r["optim"] = job.optim
    if not job.bridged:
        return recs, None, None
    headline, scope = None, []
    for seed in job.seeds:
        for lr in job.bridge_rates:
            b = _bridge(res, seed, lr, fits[seed], job)
            if seed == job.seeds[0] and math.isclose(lr, job.bridge_rate):
                headline = b
            scope.append(dict(seed=seed, learning_rate=lr, diverged=b["diverged"],
                              **{k: bridge_summary(b[k]) for k in ("full", "attention")}))
    return recs, headline, scope


def _run_groups(jobs, workers, progress):
    """The groups' results in the order of ``jobs``, on ``workers`` processes.

    Each group is trained in one process from its seeds alone, so the results do not
    depend on the number of workers. The costliest groups start first.
    """
    def said(job):
        if progress is not None:
            progress(f"train: {job.task}/{job.variant} L={job.depth} {job.optim}")
            if job.bridged:
                progress(f"bridge: {job.task}/{job.variant}")

    if workers == 1 or len(jobs) < 2:
        results = []
        for job in jobs:
            results.append(_run_group(job))
            said(job)
        return results
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i].cost)
    results = [None] * len(jobs)
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(_run_group, jobs[i]): i for i in order}
        for fut in concurrent.futures.as_completed(futures):
            i = futures[fut]
            results[i] = fut.result()
            said(jobs[i])
    return results


def _bridge(res, seed, lr, fit, job):
    """Bridge the trained model of ``(seed, lr)``, with and without its MLP blocks."""
    run = res.run(seed, lr)
    m0, c0 = fit
    b = {}
    with np.errstate(all="ignore"):
        b["full"] = bridge(run.params, res.spec, m0, c0, n_tokens=job.bridge_tokens,
                           n_sequences=job.bridge_sequences)
        b["attention"] = bridge(*without_ffn(run.params, res.spec), m0, c0,
                                n_tokens=job.bridge_tokens, n_sequences=job.bridge_sequences)
    b["diverged"] = run.diverged
    return b
