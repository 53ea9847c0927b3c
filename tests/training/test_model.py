"""The variants' layers: exact identities of ReZero, nGPT, branch scales and the theory's L*."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("optax")

import gaussian_pde as gp  # noqa: E402
from gaussian_pde.training import get_task, model_spec, predicted_blowup_depth  # noqa: E402
from gaussian_pde.training._model import initial_params, stack_tokens, x64  # noqa: E402

from .conftest import TINY  # noqa: E402


def _tokens(spec, params, z):
    with x64():
        p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
        return np.asarray(jax.jit(lambda pp, zz: stack_tokens(pp, spec, zz))(p, z))


@pytest.fixture(scope="module")
def z():
    return np.random.default_rng(0).standard_normal((7, TINY["width"]))


def test_rezero_is_the_identity_at_initialisation(z):
    spec = model_spec("rezero", **TINY)
    toks = _tokens(spec, initial_params(spec, get_task("mixture"), 0), z)
    for layer in toks:
        np.testing.assert_array_equal(layer, z)


def test_ngpt_keeps_tokens_on_the_sphere(z):
    spec = model_spec("ngpt", **TINY)
    toks = _tokens(spec, initial_params(spec, get_task("mixture"), 0), z)
    # layer 0 here is z itself (the embedding projects; stack_tokens starts from its input);
    # N(x) = sqrt(d) x / sqrt(|x|^2 + 1e-5): relative error 1e-5 / (2 |x|^2) with |x|^2 ~ d
    np.testing.assert_allclose(np.linalg.norm(toks[1:], axis=-1), np.sqrt(TINY["width"]),
                               rtol=1e-5)


@pytest.mark.parametrize("name", ["no_ln_sqrt", "no_ln_depth"])
def test_branch_scale_is_a_scaled_value_and_output_map(z, name):
    """x + beta (W_O W_V ...) = x + (beta W_O) W_V ...; beta FFN = (beta W_2) phi + beta b_2."""
    spec = model_spec(name, **TINY)
    base = model_spec("no_ln", **TINY)
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64),
                               initial_params(spec, get_task("mixture"), 3))
    p["blocks"]["b2"] = p["blocks"]["b2"] + 0.3
    beta = spec.branch_factor
    q = jax.tree_util.tree_map(np.copy, p)
    for k in ("Wo", "W2", "b2"):
        q["blocks"][k] = beta * q["blocks"][k]
    np.testing.assert_allclose(_tokens(spec, p, z), _tokens(base, q, z), rtol=1e-12,
                               atol=1e-12)


def _v_identity_params(spec, rng):
    """Parameters whose single head has W_O W_V = I (one head), random Q and K."""
    p = initial_params(spec, get_task("mixture"), 0)
    d = spec.width
    p["blocks"]["Wv"] = np.broadcast_to(np.eye(d), p["blocks"]["Wv"].shape).copy()
    p["blocks"]["Wo"] = np.broadcast_to(np.eye(d), p["blocks"]["Wo"].shape).copy()
    p["blocks"]["Q"] = rng.standard_normal(p["blocks"]["Q"].shape)
    return p


@pytest.mark.parametrize("name", ["no_ln", "no_ln_depth", "pde_euler", "pde_euler_tL",
                                  "pde_euler_tied"])
def test_predicted_blowup_depth_is_the_exact_blowup_time_over_the_step(name):
    """V = I and its own Q per layer: each layer is the exact Riccati flow
    Sigma' = Sigma S_l Sigma (gp.exact_covariance) over a time beta h (block stacks; the
    simulator: h = T/L), from the covariance the layer before left; the first layer whose
    blow-up time t*_l (gp.blowup_time) falls within it gives L* = l + t*_l / (beta h)."""
    spec = model_spec(name, width=3, heads=1, depth=4, ffn_width=0)
    rng = np.random.default_rng(1)
    p = _v_identity_params(spec, rng)
    cov0 = np.array([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]])
    span = spec.branch_factor * spec.step if spec.simulator is None else spec.step
    cov, expected = cov0, None
    for layer in range(spec.depth):
        b = {k: v[0 if spec.tied else layer] for k, v in p["blocks"].items()}
        head = gp.Softmax(b["Q"][0], b["K"][0], np.eye(3), scale=spec.score_scale)
        t_star = gp.blowup_time(head, cov)
        if t_star <= span or layer == spec.depth - 1:   # the last layer goes on
            expected = layer + t_star / span
            break
        cov = gp.exact_covariance(head, cov, [span])[0]
    assert np.isfinite(expected)
    got = predicted_blowup_depth(p, spec, cov0, horizon_layers=10 * expected / spec.depth)
    assert got == pytest.approx(expected, rel=1e-4)
    if not spec.tied:     # the first layer's weights alone predict another depth
        first = gp.Softmax(p["blocks"]["Q"][0][0], p["blocks"]["K"][0][0], np.eye(3),
                           scale=spec.score_scale)
        assert abs(gp.blowup_time(first, cov0) / span - expected) > 1e-3 * expected


def test_predicted_blowup_depth_is_nan_where_a_layer_cannot_be_finished():
    """A layer the solver stops inside (here: its evaluation budget) leaves no covariance to
    go on from: the prediction is undetermined (NaN), not the next layer's blow-up."""
    spec = model_spec("no_ln", width=3, heads=1, depth=4, ffn_width=0)
    p = _v_identity_params(spec, np.random.default_rng(1))
    cov0 = np.array([[2.0, 0.3, 0.0], [0.3, 1.0, 0.1], [0.0, 0.1, 0.5]])
    assert np.isfinite(predicted_blowup_depth(p, spec, cov0))
    assert np.isnan(predicted_blowup_depth(p, spec, cov0, max_nfev=20))
