r"""Training: Adam on a task, every (seed, learning rate) pair in one compiled program.

All pairs train side by side (``jax.vmap`` over lanes, ``jax.lax.scan`` over steps), so
one compilation serves a whole grid, and the executable is kept for the next call of the
same shapes. Seed ``s`` fixes the initialisation
(``jax.random.PRNGKey(s)``) and the data (NumPy ``default_rng(s)``), so every variant sees
the same batches and starts from the same draws of the shared weights.

The optimiser is Adam (:math:`\beta = (0.9, 0.999)`, no weight decay) with two stated
options, both off by default: a linear warmup of the step size over ``warmup`` steps,
:math:`\eta_t = \eta\min(1, (t+1)/t_w)`, and clipping of the global gradient norm at
``clip`` (:math:`g \leftarrow g\min(1, c/\|g\|)`) before Adam sees it.

Failure (docs/math.md 11.3): a run is **non-finite** from the first step whose loss or
gradient norm is not finite (``divergence_step``); from that step on its parameters are
frozen (no update is applied), so the run is recorded, not crashed, and the other lanes
are untouched; the curves after it are ``NaN``. Whether a finite run *failed* is judged on
its final loss against the task's chance level (:func:`run_failed`). The older relative
criterion, the first step whose loss exceeds ``divergence_factor`` times the loss of step
0, is recorded beside it (``relative_step``) and stops nothing.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ._compile import compiled
from ._model import initial_params, loss_fn
from ._spec import _check_int, model_spec
from ._tasks import get_task

__all__ = ["Run", "TrainResult", "train", "run_failed", "learning_rate_grid",
           "DEFAULT_LEARNING_RATES"]


def learning_rate_grid(lo=1e-4, n=12):
    r"""Learning rates :math:`\eta_k = \mathrm{lo}\cdot2^k`, :math:`k = 0..n-1` (a x2 grid)."""
    return tuple(float(lo * 2.0 ** k) for k in range(n))


#: the default learning rates of the API and the CLI: 1e-4 * 2^k up to 0.2048 (3.3 decades)
DEFAULT_LEARNING_RATES = learning_rate_grid(1e-4, 12)


def run_failed(final_loss, chance):
    """A run fails when its final loss is not finite or is at ``chance`` or worse."""
    return (final_loss is None or not math.isfinite(final_loss)) or final_loss >= chance


@dataclasses.dataclass
class Run:
    r"""History of one training run (one seed, one learning rate).

    Attributes
    ----------
    seed : int
    learning_rate : float
    loss : ndarray, shape (n_steps,)
        Training loss at each step (before its update); ``NaN`` after divergence.
    grad_norm : ndarray, shape (n_steps,)
        Global gradient norm :math:`\|\nabla_\theta\mathcal L\|_2` (before clipping).
    max_layer_grad_norm : ndarray, shape (n_steps,)
        Largest gradient norm of one layer's block weights.
    layer_grad_norm : ndarray, shape (n_steps, S)
        Gradient norm of each weight set's block weights (``S`` = depth, or 1 when tied).
    divergence_step : int or None
        First step with a non-finite loss or gradient, ``None`` if there is none.
    relative_step : int or None
        First step whose loss exceeds ``divergence_factor`` times the loss of step 0 (the
        older relative criterion; it does not stop the run).
    params, init_params : dict
        Final (frozen at divergence) and initial parameters, NumPy arrays.
    """

    seed: int
    learning_rate: float
    loss: np.ndarray
    grad_norm: np.ndarray
    max_layer_grad_norm: np.ndarray
    divergence_step: int | None
    params: dict
    init_params: dict
    layer_grad_norm: np.ndarray = None
    relative_step: int | None = None

    @property
    def diverged(self) -> bool:
        """Whether the run became non-finite."""
        return self.divergence_step is not None

    @property
    def final_train_loss(self) -> float:
        """Mean training loss over the last tenth of the steps (at least one); NaN if non-finite."""
        k = max(1, self.loss.size // 10)
        tail = self.loss[-k:]
        return float(np.mean(tail)) if np.all(np.isfinite(tail)) else math.nan


@dataclasses.dataclass
class TrainResult:
    """Runs of one model on one task: :attr:`runs` in (seed, learning rate) order."""

    spec: object
    task: object
    runs: list
    n_steps: int
    batch: int
    divergence_factor: float
    warmup: int = 0
    clip: float | None = None

    def run(self, seed, learning_rate):
        """The run of ``seed`` at ``learning_rate``."""
        for r in self.runs:
            if r.seed == seed and math.isclose(r.learning_rate, learning_rate):
                return r
        raise KeyError(f"no run with seed {seed} and learning rate {learning_rate}.")


def _check_rates(learning_rates, name="learning_rates"):
    if isinstance(learning_rates, numbers.Real):
        learning_rates = (learning_rates,)
    out = []
    for i, lr in enumerate(learning_rates):
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
            raise TypeError(f"`{name}[{i}]` must be a real number, got "
                            f"{type(lr).__name__}.")
        if not math.isfinite(lr) or lr <= 0:
            raise ValueError(f"`{name}[{i}]` must be a finite positive number, "
                             f"got {lr!r}.")
        out.append(float(lr))
    if not out:
        raise ValueError(f"`{name}` must contain at least one rate.")
    return tuple(out)


def _check_seeds(seeds):
    if isinstance(seeds, numbers.Integral):
        seeds = (seeds,)
    seeds = tuple(_check_int(s, f"seeds[{i}]", 0) for i, s in enumerate(seeds))
    if not seeds:
        raise ValueError("`seeds` must contain at least one seed.")
    return seeds


def _layer_norms(grads):
    """Gradient norm of each weight set of the blocks, shape (S,)."""
    sq = [jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1) for g in grads["blocks"].values()]
    return jnp.sqrt(sum(sq))


def _make_lane(spec, task, factor, warmup, clip):
    """The training program of all lanes: ``(params, lr, which, xs, ys) -> (params, hist)``.

    Lane ``i`` trains ``params[i]`` at rate ``lr[i]`` on the batches of seed ``which[i]``:
    ``xs[which[i], t]``, ``ys[which[i], t]`` at step ``t``. The batches are held once per
    seed, not once per lane (the lanes of one seed share them).
    """
    adam = optax.scale_by_adam()

    def lane(params, lr, which, xs, ys):
        def step(carry, t):
            p, opt, div, loss0, i = carry
            data = (xs[which, t], ys[which, t])
            loss, g = jax.value_and_grad(loss_fn)(p, spec, task, *data)
            gnorm = jnp.sqrt(sum(jnp.sum(a ** 2) for a in jax.tree_util.tree_leaves(g)))
            loss0 = jnp.where(i == 0, loss, loss0)
            rel = loss > factor * loss0
            div = div | ~jnp.isfinite(loss) | ~jnp.isfinite(gnorm)
            layers = _layer_norms(g)
            if clip is not None:
                shrink = jnp.minimum(1.0, clip / jnp.maximum(gnorm, 1e-30))
                g = jax.tree_util.tree_map(lambda a: a * shrink, g)
            rate = lr * jnp.minimum(1.0, (i + 1.0) / warmup) if warmup else lr
            upd, new_opt = adam.update(g, opt, p)
            keep = lambda old, new: jnp.where(div, old, new)  # noqa: E731
            p = jax.tree_util.tree_map(lambda a, u: keep(a, a - rate * u), p, upd)
            opt = jax.tree_util.tree_map(keep, opt, new_opt)
            return (p, opt, div, loss0, i + 1), (loss, gnorm, layers, div, rel)

        init = (params, adam.init(params), jnp.array(False), jnp.array(0.0, xs.dtype),
                jnp.array(0))
        (p, *_), hist = jax.lax.scan(step, init, jnp.arange(xs.shape[1]))
        return p, hist

    return jax.vmap(lane, in_axes=(0, 0, 0, None, None))


def train(model, task, *, seeds=(0,), learning_rates=DEFAULT_LEARNING_RATES, n_steps=200,
          batch=32, divergence_factor=10.0, warmup=0, clip=None, n_tokens=None, optimize=True,
          **spec_changes):
    r"""Train ``model`` on ``task`` with Adam for every seed and learning rate.

    Parameters
    ----------
    model : str or ModelSpec
        A variant name of :data:`~gaussian_pde.training.VARIANTS` or a spec.
    task : str or Task
        ``"mixture"``, ``"regression"`` or ``"text"`` (:data:`~gaussian_pde.training.TASKS`),
        or a Task.
    seeds : sequence of int
        Non-negative seeds (initialisation and data).
    learning_rates : sequence of float
        Adam step sizes, finite and positive (default :data:`DEFAULT_LEARNING_RATES`, the
        CLI's grid: :math:`10^{-4}\cdot 2^k`, :math:`k = 0..11`).
    n_steps, batch : int
        Optimiser steps and sequences per batch (at least 1).
    divergence_factor : float
        The older relative criterion: the first step whose loss exceeds this multiple of
        the step-0 loss is recorded as ``relative_step`` (finite, > 1; it stops nothing).
    warmup : int
        Linear warmup of the step size over this many steps (0: none).
    clip : float, optional
        Clip the global gradient norm at this value (``None``: no clipping).
    n_tokens : int, optional
        Sequence length (default: the task's).
    optimize : bool
        Compile with XLA's backend optimisations (default). ``False`` builds three to six
        times faster and runs slower (:func:`~gaussian_pde.training._compile.compile_options`):
        worth it for a few short runs. Results agree to float32 rounding, which training
        can amplify. Either way the executable is kept: another call with the same model,
        task, grid and sizes does not compile again.
    **spec_changes
        Fields of :class:`ModelSpec` to change (``depth=6``, ``width=8``, ...).

    Returns
    -------
    TrainResult
        One :class:`Run` per (seed, learning rate), seeds outer.

    Examples
    --------
    >>> from gaussian_pde.training import train
    >>> res = train("pre_ln", "mixture", n_steps=3, batch=4, depth=1, width=4)
    >>> res.runs[0].loss.shape
    (3,)
    """
    spec = model_spec(model, **spec_changes)
    task = get_task(task, n_tokens=n_tokens)
    seeds, rates = _check_seeds(seeds), _check_rates(learning_rates)
    n_steps = _check_int(n_steps, "n_steps", 1)
    batch = _check_int(batch, "batch", 1)
    if (isinstance(divergence_factor, bool) or not isinstance(divergence_factor, numbers.Real)
            or not math.isfinite(divergence_factor) or divergence_factor <= 1):
        raise ValueError(f"`divergence_factor` must be a finite number above 1, "
                         f"got {divergence_factor!r}.")
    warmup = _check_int(warmup, "warmup", 0)
    if clip is not None:
        if (isinstance(clip, bool) or not isinstance(clip, numbers.Real)
                or not math.isfinite(clip) or clip <= 0):
            raise ValueError(f"`clip` must be None or a finite positive number, got {clip!r}.")
        clip = float(clip)
    lanes = [(s, lr) for s in seeds for lr in rates]
    inits = {s: initial_params(spec, task, s) for s in seeds}
    data = {s: task.batches(s, n_steps, batch) for s in seeds}
    dtype = np.dtype(jnp.asarray(0.0).dtype)
    stack = lambda *a: np.stack(a)  # noqa: E731
    params = jax.tree_util.tree_map(stack, *[inits[s] for s, _ in lanes])
    xs = np.stack([data[s][0] for s in seeds]).astype(dtype)
    ys = np.stack([data[s][1] for s in seeds])
    ys = ys.astype(np.int32 if task.loss == "cross_entropy" else dtype)
    lr = np.asarray([lr for _, lr in lanes], dtype)
    which = np.asarray([seeds.index(s) for s, _ in lanes], np.int32)
    factor = float(divergence_factor)
    lane = compiled(("train", spec, task, factor, warmup, clip),
                    _make_lane(spec, task, factor, warmup, clip),
                    params, lr, which, xs, ys, optimize=optimize)
    final, (loss, gnorm, lgn, div, rel) = lane(params, lr, which, xs, ys)
    final = jax.tree_util.tree_map(np.asarray, final)
    loss, gnorm, lgn, div, rel = (np.asarray(a, float) for a in (loss, gnorm, lgn, div, rel))
    runs = []
    for i, (s, r) in enumerate(lanes):
        first = int(np.argmax(div[i] > 0)) if div[i].any() else None
        relative = int(np.argmax(rel[i] > 0)) if rel[i].any() else None
        curves = [a[i].copy() for a in (loss, gnorm, lgn)]
        if first is not None:
            for c in curves:
                c[first + 1:] = np.nan
        runs.append(Run(seed=s, learning_rate=r, loss=curves[0], grad_norm=curves[1],
                        max_layer_grad_norm=np.max(curves[2], axis=1),
                        layer_grad_norm=curves[2], divergence_step=first,
                        relative_step=relative,
                        params=jax.tree_util.tree_map(lambda a, i=i: a[i], final),
                        init_params=inits[s]))
    return TrainResult(spec=spec, task=task, runs=runs, n_steps=n_steps, batch=batch,
                       divergence_factor=float(divergence_factor), warmup=warmup, clip=clip)
