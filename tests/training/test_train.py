"""Training: a tiny model learns, gradients match finite differences, seeds repeat, divergence is recorded."""

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("optax")

from gaussian_pde.training import VARIANTS, train  # noqa: E402

from .conftest import TINY  # noqa: E402


def test_tiny_model_learns_in_a_few_steps(trained):
    res, _ = trained("pre_ln", "mixture")
    run = res.run(0, 3e-2)
    assert not run.diverged and run.loss.shape == (40,)
    # cross-entropy starts near log 3 and falls (averaged over the first and last 10 steps)
    assert abs(run.loss[0] - math.log(3)) < 0.5
    assert np.mean(run.loss[-10:]) < np.mean(run.loss[:10]) - 0.1
    assert np.all(run.grad_norm > 0) and np.all(run.max_layer_grad_norm <= run.grad_norm + 1e-6)


def test_same_seed_same_history_other_seed_other_history(trained):
    first, kw = trained("pre_ln", "mixture")
    again = train("pre_ln", "mixture", **kw)       # the kept executable, fresh data and init
    for lr in kw["learning_rates"]:
        a, b = first.run(0, lr), again.run(0, lr)
        np.testing.assert_array_equal(a.loss, b.loss)
        np.testing.assert_array_equal(a.grad_norm, b.grad_norm)
    assert not np.allclose(first.run(0, 3e-2).loss, first.run(1, 3e-2).loss)
    p0, p1 = first.run(0, 3e-2).init_params, first.run(1, 3e-2).init_params
    assert not np.allclose(p0["blocks"]["Q"], p1["blocks"]["Q"])


@pytest.mark.slow
def test_lanes_are_independent():
    """A run trained alongside others is the run trained alone (vmap lanes do not mix)."""
    kw = dict(n_steps=4, batch=4, n_tokens=6, **TINY)
    both = train("pde_euler", "mixture", seeds=(0, 3), learning_rates=(1e-3, 1e-2), **kw)
    alone = train("pde_euler", "mixture", seeds=(3,), learning_rates=(1e-2,), **kw)
    np.testing.assert_allclose(both.run(3, 1e-2).loss, alone.runs[0].loss, rtol=1e-5)


@pytest.mark.parametrize("model,task", [("pre_ln", "mixture"), ("neither", "mixture")])
def test_divergence_is_recorded_not_raised(trained, model, task):
    res, kw = trained(model, task)
    for seed in kw["seeds"]:
        calm, wild = res.run(seed, 1e-3), res.run(seed, 50.0)
        assert not calm.diverged and np.all(np.isfinite(calm.loss))
        assert wild.diverged and 0 < wild.divergence_step < kw["n_steps"]
        s = wild.divergence_step
        assert (not np.isfinite(wild.loss[s])) or wild.loss[s] > 10 * wild.loss[0]
        assert np.all(np.isfinite(wild.loss[:s]))
        assert np.all(wild.loss[:s] <= 10 * wild.loss[0])     # the first bad step is recorded
        assert np.all(np.isnan(wild.loss[s + 1:]))
        # the frozen parameters are those before the diverged step's update: finite
        assert all(np.all(np.isfinite(v)) for v in jax.tree_util.tree_leaves(wild.params))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_gradient_matches_finite_differences(probe, variant):
    """Directional derivatives of the training loss, autodiff against central differences."""
    r = probe(variant)
    assert np.isfinite(r["loss"]) and np.all(np.abs(r["dir_grad"]) > 1e-6)
    # central differences in float64: error O(eps^2 |f'''|) plus rounding 1e-16 / eps
    np.testing.assert_allclose(r["dir_grad"], r["fd"], rtol=1e-7, atol=1e-9)


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
