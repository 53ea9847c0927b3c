"""The bridge: the model's attention is the package's MultiHead, layer for layer."""

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")

import gaussian_pde as gp  # noqa: E402
from gaussian_pde.training import (  # noqa: E402
    VARIANTS,
    gaussian_prediction,
    gaussian_stack,
    layer_attention,
    layer_ffn,
    model_on_gaussian_tokens,
    without_ffn,
)
from gaussian_pde.training._bridge import weight_tails  # noqa: E402

#: the variants the bridge hands over: no normalisation, unscaled and ungated branches
NO_LN = [v for v, s in VARIANTS.items()
         if not s.has_layernorm and s.branch_scale == "1" and not s.rezero]


#: the default tier checks one variant per normalisation and the simulators (the attention
#: is one function for all); the rest run in the slow tier
_FAST = {"pre_ln", "post_ln", "no_ln", "no_residual", "neither", "pde_euler", "pde_rk4",
         "pde_euler_tied", "pde_rk4_tied"}


@pytest.mark.parametrize("variant", [v if v in _FAST else pytest.param(v, marks=pytest.mark.slow)
                                     for v in sorted(VARIANTS)])
def test_model_attention_is_the_package_multihead(probe, variant):
    r = probe(variant)
    spec, p, z = r["spec"], r["params"], r["z"]
    for layer in range(spec.depth):
        pkg = layer_attention(p, spec, layer).particle_velocity(z)[0]
        np.testing.assert_allclose(r["attention"][layer], pkg, rtol=1e-13,
                                   atol=1e-13 * np.abs(pkg).max())
        np.testing.assert_allclose(r["ffn"][layer], layer_ffn(p, spec, layer).particle(z),
                                   rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", NO_LN)
def test_handed_over_layers_reproduce_the_model_to_rounding(probe, variant):
    r = probe(variant)
    spec, p, z, ref = r["spec"], r["params"], r["z"], r["tokens"]
    toks, ess = model_on_gaussian_tokens(p, spec, z)
    np.testing.assert_allclose(toks, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    assert ess.shape == (spec.depth,) and np.all((ess > 0) & (ess <= 1))
    # the package's own particle propagation of the Stack's first layer takes the same step
    # (continuous mode: one classical RK4 step of h, the model's RK4 layer)
    stack, per = gaussian_stack(p, spec)
    sub = gp.Stack(list(stack.layers[:per]), h=stack.h, mode=stack.mode)
    got = gp.propagate_particles(sub, z, steps_per_layer=1).x_final
    np.testing.assert_allclose(got, ref[1], rtol=1e-12, atol=1e-12 * np.abs(ref).max())


def test_gaussian_first_step_is_the_many_token_limit_of_the_model(probe):
    """Attention-only residual layer: the exact Gaussian map against n tokens, error ~ n^-1/2."""
    r = probe("no_ln")
    p, spec = without_ffn(r["params"], r["spec"].replace(depth=1))     # its first layer
    d = spec.width
    mean0, cov0 = np.full(d, 0.3), np.eye(d)
    m, c, exact, status = gaussian_prediction(p, spec, mean0, cov0)
    assert exact and status == "finished"
    # the exact map, written out from the package's affine field (docs/math.md 7.1)
    att = layer_attention(p, spec, 0)
    M, b = att.field_matrix(cov0), att.field_offset(mean0, cov0)
    P = np.eye(d) + M
    np.testing.assert_allclose(c[1], P @ cov0 @ P.T, rtol=1e-12)
    np.testing.assert_allclose(m[1], mean0 + b + M @ mean0, rtol=1e-12)
    rng = np.random.default_rng(5)
    errs = []
    ns = (64, 256, 1024)
    for n in ns:
        e = []
        for _ in range(8):
            x = mean0 + rng.standard_normal((n, d))
            y = model_on_gaussian_tokens(p, spec, x)[0][1]
            e.append(np.linalg.norm(np.cov(y.T, bias=True) - c[1]) / np.linalg.norm(c[1]))
        errs.append(np.mean(e))
    slope = np.polyfit(np.log(ns), np.log(errs), 1)[0]
    assert -0.75 < slope < -0.3, (errs, slope)
    assert errs[-1] < 0.1


def test_bridge_refuses_layernorm_and_bad_dimensions(probe):
    r = probe("pre_ln")
    with pytest.raises(ValueError, match="LayerNorm"):
        gaussian_stack(r["params"], r["spec"])
    r = probe("no_ln")
    p, spec = r["params"], r["spec"]
    with pytest.raises(ValueError, match="mean0"):
        gaussian_prediction(p, spec, np.zeros(spec.width + 1), np.eye(spec.width))
    with pytest.raises(ValueError, match="`layer`"):
        layer_attention(p, spec, 3)


def test_exact_survives_a_blowup(probe):
    """An attention-only prediction that blows up is still an exact map (not 'closure'),
    and the bridge says after which layer it stopped."""
    r = probe("pde_rk4")
    p, spec = without_ffn(r["params"], r["spec"])
    d = spec.width
    m, c, exact, status = gaussian_prediction(p, spec, np.zeros(d), 1e3 * np.eye(d),
                                              blowup_threshold=1.0 + 1e-9)
    assert exact and status != "finished" and m.shape[0] < spec.depth + 1


def test_weight_tails_are_the_mean_field_ess(rng):
    """For Gaussian keys, ESS/n of the weights e^(a'y) tends to exp(-a'Sa) (Monte Carlo,
    4 standard errors of the ratio estimator)."""
    d = 3
    att = gp.MultiHead([gp.Softmax(rng.standard_normal((d, d)) / 2,
                                   rng.standard_normal((d, d)) / 2, np.eye(d))])
    cov = np.eye(d) + 0.2 * np.ones((d, d))
    x = rng.standard_normal((1, d))
    (log10_tail,) = weight_tails(att, x, cov)
    a = att.heads[0].A @ x[0]
    y = rng.multivariate_normal(np.zeros(d), cov, size=400_000)
    w = np.exp(y @ a - np.max(y @ a))
    ess = w.sum() ** 2 / np.sum(w * w) / w.size
    assert abs(np.log(ess) + log10_tail * np.log(10)) < 0.05, (ess, 10.0 ** -log10_tail)
