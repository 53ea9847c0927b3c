"""Training: a tiny model learns, gradients match finite differences, seeds repeat, divergence is recorded."""

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

from gaussian_pde.training import VARIANTS, get_task, init_params, loss_fn, model_spec, train  # noqa: E402
from gaussian_pde.training._model import x64  # noqa: E402

TINY = dict(width=4, heads=2, depth=2, ffn_width=6)


def test_tiny_model_learns_in_a_few_steps():
    res = train("pre_ln", "mixture", seeds=(0,), learning_rates=(3e-2,), n_steps=40,
                batch=16, n_tokens=8, **TINY)
    run = res.runs[0]
    assert not run.diverged and run.loss.shape == (40,)
    # cross-entropy starts near log 3 and falls (smoothed over the last 10 steps)
    assert abs(run.loss[0] - math.log(3)) < 0.5
    assert np.mean(run.loss[-10:]) < run.loss[0] - 0.1
    assert np.all(run.grad_norm > 0) and np.all(run.max_layer_grad_norm <= run.grad_norm + 1e-6)


def test_same_seed_same_history_other_seed_other_history():
    kw = dict(learning_rates=(1e-2,), n_steps=5, batch=4, n_tokens=6, **TINY)
    first = train("no_ln", "regression", seeds=(1, 2), **kw)
    a, c = first.run(1, 1e-2), first.run(2, 1e-2)
    b = train("no_ln", "regression", seeds=(1, 2), **kw).run(1, 1e-2)
    assert np.array_equal(a.loss, b.loss) and np.array_equal(a.grad_norm, b.grad_norm)
    assert not np.allclose(a.loss, c.loss)


@pytest.mark.slow
def test_lanes_are_independent():
    """A run trained alongside others is the run trained alone (vmap lanes do not mix)."""
    kw = dict(n_steps=4, batch=4, n_tokens=6, **TINY)
    both = train("pde_euler", "mixture", seeds=(0, 3), learning_rates=(1e-3, 1e-2), **kw)
    alone = train("pde_euler", "mixture", seeds=(3,), learning_rates=(1e-2,), **kw)
    np.testing.assert_allclose(both.run(3, 1e-2).loss, alone.runs[0].loss, rtol=1e-5)


def test_divergence_is_recorded_not_raised():
    res = train("neither", "regression", seeds=(0,), learning_rates=(1e-3, 50.0), n_steps=30,
                batch=8, n_tokens=6, **TINY)
    calm, wild = res.run(0, 1e-3), res.run(0, 50.0)
    assert not calm.diverged and np.all(np.isfinite(calm.loss))
    assert wild.diverged and 0 < wild.divergence_step < 30
    s = wild.divergence_step
    assert (not np.isfinite(wild.loss[s])) or wild.loss[s] > 10 * wild.loss[0]
    assert np.all(np.isnan(wild.loss[s + 1:]))
    # the frozen parameters are those before the diverged step's update: finite
    assert all(np.all(np.isfinite(v)) for v in jax.tree_util.tree_leaves(wild.params))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_gradient_matches_finite_differences(variant):
    """Directional derivative of the loss, autodiff against central differences (float64)."""
    spec = model_spec(variant, **TINY)
    task = get_task("mixture", n_tokens=5)
    x, y = task.sample(np.random.default_rng(7), 3)
    with x64():
        p = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64),
                                   init_params(spec, task, jax.random.PRNGKey(4)))
        flat, unravel = jax.flatten_util.ravel_pytree(p)
        xj, yj = jnp.asarray(x, jnp.float64), jnp.asarray(y)

        f = jax.jit(lambda v: loss_fn(unravel(v), spec, task, xj, yj))
        g = np.asarray(jax.jit(jax.grad(f))(flat))
        rng = np.random.default_rng(0)
        for _ in range(2):
            u = rng.standard_normal(flat.size)
            u /= np.linalg.norm(u)
            eps = 1e-5
            fd = (float(f(flat + eps * u)) - float(f(flat - eps * u))) / (2 * eps)
            # central differences: error O(eps^2 |f'''|) plus rounding 1e-16/eps
            assert abs(fd - g @ u) < 1e-7 * (1 + abs(fd)), (fd, g @ u)


@pytest.mark.parametrize("kwargs,word", [
    (dict(learning_rates=(float("nan"),)), "learning_rates"),
    (dict(learning_rates=(float("inf"),)), "learning_rates"),
    (dict(learning_rates=(-1e-3,)), "learning_rates"),
    (dict(seeds=(-1,)), "seeds"),
    (dict(n_steps=0), "n_steps"),
    (dict(depth=0), "depth"),
    (dict(divergence_factor=0.5), "divergence_factor"),
    (dict(width=6, heads=4), "width"),
])
def test_bad_input_is_refused_up_front(kwargs, word):
    with pytest.raises((ValueError, TypeError), match=f"`{word}"):
        train("pre_ln", "mixture", **{"n_steps": 2, **kwargs})


def test_bad_task_is_refused():
    with pytest.raises(ValueError, match="`task`"):
        train("pre_ln", "copy")
