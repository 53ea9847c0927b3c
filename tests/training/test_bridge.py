"""The bridge: the model's attention is the package's MultiHead, layer for layer."""

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

import gaussian_pde as gp  # noqa: E402
from gaussian_pde.training import (  # noqa: E402
    VARIANTS,
    gaussian_prediction,
    gaussian_stack,
    get_task,
    init_params,
    layer_attention,
    layer_ffn,
    model_on_gaussian_tokens,
    model_spec,
    stack_tokens,
    without_ffn,
)
from gaussian_pde.training._model import attention, block_weights, ffn, x64  # noqa: E402

NO_LN = [v for v, s in VARIANTS.items() if not s.has_layernorm]


def _params(spec, seed=0, gain=1.0):
    p = jax.jit(init_params, static_argnums=(0, 1))(spec, get_task("mixture"),
                                                    jax.random.PRNGKey(seed))
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, float), p)
    p["blocks"]["Q"] = gain * p["blocks"]["Q"]
    return p


def _jax(fn, *args):
    with x64():
        conv = [jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float64), a)
                if isinstance(a, (dict, np.ndarray)) else a for a in args]
        return np.asarray(jax.jit(fn)(*conv))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_model_attention_is_the_package_multihead(variant):
    spec = model_spec(variant, width=6, heads=3, depth=2)
    p = _params(spec, seed=1, gain=2.0)
    x = np.random.default_rng(0).standard_normal((40, 6))
    for layer in range(spec.depth):
        mine = _jax(lambda b, z: attention(b, z, spec.score_scale),
                    block_weights(p, spec, layer), x)
        pkg = layer_attention(p, spec, layer).particle_velocity(x)[0]
        np.testing.assert_allclose(mine, pkg, rtol=1e-13, atol=1e-13 * np.abs(pkg).max())
        mine_f = _jax(lambda b, z: ffn(b, z, spec.activation), block_weights(p, spec, layer), x)
        np.testing.assert_allclose(mine_f, layer_ffn(p, spec, layer).particle(x),
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", NO_LN)
def test_handed_over_layers_reproduce_the_model_to_rounding(variant):
    spec = model_spec(variant, depth=2)
    p = _params(spec, seed=2)
    x = 2.0 * np.random.default_rng(1).standard_normal((30, spec.width))
    ref = _jax(lambda q, z: stack_tokens(q, spec, z), p, x)
    toks, ess = model_on_gaussian_tokens(p, spec, x)
    np.testing.assert_allclose(toks, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    assert ess.shape == (spec.depth,) and np.all((ess > 0) & (ess <= 1))
    # the package's own particle propagation of the Stack takes the same first step
    stack, per = gaussian_stack(p, spec)
    if stack.mode != "continuous":
        sub = gp.Stack(list(stack.layers[:per]), h=stack.h, mode=stack.mode)
        got = gp.propagate_particles(sub, x).x_final
        np.testing.assert_allclose(got, ref[1], rtol=1e-12, atol=1e-12 * np.abs(ref).max())


def test_gaussian_first_step_is_the_many_token_limit_of_the_model():
    """Attention-only residual layer: the exact Gaussian map against n tokens, error ~ n^-1/2."""
    p, spec = without_ffn(_params(model_spec("no_ln", depth=1)), model_spec("no_ln", depth=1))
    mean0, cov0 = np.full(spec.width, 0.3), np.eye(spec.width)
    m, c, exact, status = gaussian_prediction(p, spec, mean0, cov0)
    assert exact and status == "finished"
    # the exact map, written out from the package's affine field (docs/math.md 7.1)
    att = layer_attention(p, spec, 0)
    M, b = att.field_matrix(cov0), att.field_offset(mean0, cov0)
    P = np.eye(spec.width) + M
    np.testing.assert_allclose(c[1], P @ cov0 @ P.T, rtol=1e-12)
    np.testing.assert_allclose(m[1], mean0 + b + M @ mean0, rtol=1e-12)
    rng = np.random.default_rng(5)
    errs = []
    ns = (100, 400, 1600)
    for n in ns:
        e = []
        for _ in range(8):
            x = mean0 + rng.standard_normal((n, spec.width))
            y = model_on_gaussian_tokens(p, spec, x)[0][1]
            e.append(np.linalg.norm(np.cov(y.T, bias=True) - c[1]) / np.linalg.norm(c[1]))
        errs.append(np.mean(e))
    slope = np.polyfit(np.log(ns), np.log(errs), 1)[0]
    assert -0.75 < slope < -0.3, (errs, slope)
    assert errs[-1] < 0.1


def test_bridge_refuses_layernorm_and_bad_dimensions():
    spec = model_spec("pre_ln", depth=1)
    with pytest.raises(ValueError, match="LayerNorm"):
        gaussian_stack(_params(spec), spec)
    spec = model_spec("no_ln", depth=1)
    with pytest.raises(ValueError, match="mean0"):
        gaussian_prediction(_params(spec), spec, np.zeros(spec.width + 1), np.eye(spec.width))
    with pytest.raises(ValueError, match="`layer`"):
        layer_attention(_params(spec), spec, 3)
