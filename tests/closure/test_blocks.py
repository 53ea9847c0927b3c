"""Block components: closed forms against quadrature, exactness, bad input."""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.closure._blocks import MLP, Affine, LayerNorm, PreNorm, RMSNorm, TraceNorm
from gaussian_pde.closure._engine import Field, closure_moment_rhs
from tests._helpers import random_spd


class _Quad(Field):
    """Wrap a field to force the generic Gauss-Hermite closure (no closed form)."""

    def __init__(self, f):
        self.f, self.d = f, f.d

    def __call__(self, mean, cov, x):
        return self.f(mean, cov, x)

    def particle(self, x, positions=None):
        return self.f.particle(x)


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh"])
def test_mlp_closed_form_matches_quadrature(rng, act):
    mlp = MLP(rng.standard_normal((5, 2)), rng.standard_normal(5), rng.standard_normal((2, 5)),
              rng.standard_normal(2), activation=act)
    mean, cov = rng.standard_normal(2), random_spd(rng, 2) + 0.1 * np.eye(2)
    dm, dc = closure_moment_rhs(mlp, mean, cov)
    qm, qc = closure_moment_rhs(_Quad(mlp), mean, cov, n_per_dim=40)
    # ReLU kinks limit Gauss-Hermite to ~1e-4 at 40 nodes (measured 2e-5); GELU is smooth
    # (measured relative 5e-4 for ReLU, 1e-12 for GELU); tanh-GELU: 1-D Gauss-Hermite in the
    # hidden unit against the d-dimensional rule of the generic closure, which resolves the
    # tanh-GELU's sharper bend to 1e-6 at 40 nodes (measured 8e-7)
    tol = {"relu": 3e-3, "gelu": 1e-9, "gelu_tanh": 3e-6}[act]
    assert np.allclose(dm, qm, rtol=tol, atol=tol) and np.allclose(dc, qc, rtol=tol, atol=tol)


def test_gelu_tanh_is_gpt2s_activation(rng):
    """The tanh-GELU: its definition, derivative, distance to GELU, Gaussian expectations."""
    from scipy.special import ndtr

    from gaussian_pde.closure._blocks import gelu_tanh

    u = np.linspace(-8, 8, 4001)
    f, df = gelu_tanh(u)
    c = np.sqrt(2 / np.pi)
    np.testing.assert_allclose(f, 0.5 * u * (1 + np.tanh(c * (u + 0.044715 * u**3))), atol=1e-15)
    h = 1e-6
    np.testing.assert_allclose(df, (gelu_tanh(u + h)[0] - gelu_tanh(u - h)[0]) / (2 * h),
                               atol=1e-8)
    gap = np.abs(f - u * ndtr(u)).max()
    assert 1e-5 < gap < 5e-4
    mlp = MLP(np.eye(3), np.zeros(3), np.eye(3), np.zeros(3), activation="gelu_tanh")
    m, s = np.array([0.3, -2.0, 1.0]), np.array([1.5, 0.0, 0.2])
    e, de = mlp.activation_moments(m, s)
    n = 400_000
    z = m + s * rng.standard_normal((n, 3))
    fz, dz = gelu_tanh(z)
    for got, samples in ((e, fz), (de, dz)):
        bar = 5 * samples.std(axis=0) / np.sqrt(n) + 1e-12
        assert np.all(np.abs(got - samples.mean(axis=0)) < bar)
    np.testing.assert_allclose(mlp.particle(z[:5]), fz[:5])
    # and against adaptive quadrature, wide and narrow Gaussians
    from scipy.integrate import quad

    for mk, sk in ((0.5, 8.0), (-1.0, 0.5), (2.0, 1.0)):
        e, de = mlp.activation_moments(np.full(3, mk), np.full(3, sk))
        for got, k in ((e[0], 0), (de[0], 1)):
            want = quad(lambda v, k=k, mk=mk, sk=sk: gelu_tanh(v)[k]
                        * np.exp(-0.5 * ((v - mk) / sk) ** 2) / (sk * np.sqrt(2 * np.pi)),
                        mk - 40 * sk, mk + 40 * sk, points=[0.0],
                        epsabs=1e-14, epsrel=1e-13, limit=2000)[0]
            assert abs(got - want) < 1e-12


def test_affine_and_trace_norm_exact(rng):
    W = rng.standard_normal((3, 3))
    mean, cov = rng.standard_normal(3), random_spd(rng, 3)
    dm, dc = closure_moment_rhs(Affine(W, np.ones(3)), mean, cov, n_per_dim=2)
    assert np.allclose(dm, W @ mean + 1) and np.allclose(dc, W @ cov + cov @ W.T)
    att = gp.Softmax(*rng.standard_normal((3, 3, 3)))
    f = PreNorm(TraceNorm(3, target=2.0), att)
    assert f.affine(mean, cov) is not None
    c2 = 2.0 / np.trace(cov)
    x = rng.standard_normal((4, 3))
    ref = att.velocity(mean, c2 * cov, mean + np.sqrt(c2) * (x - mean))
    assert np.allclose(f(mean, cov, x), ref)


def test_layernorm_values_and_block_sum(rng):
    ln = LayerNorm(3)
    y = ln.apply(rng.standard_normal((10, 3)))
    assert np.allclose(y.mean(1), 0, atol=1e-12) and np.allclose((y**2).mean(1), 1, atol=1e-3)  # eps = 1e-5
    r = RMSNorm(3).apply(rng.standard_normal((10, 3)))
    assert np.allclose((r**2).mean(1), 1, atol=1e-3)
    att = gp.Softmax(*rng.standard_normal((3, 3, 3)))
    mlp = MLP(rng.standard_normal((4, 3)), np.zeros(4), rng.standard_normal((3, 4)), np.zeros(3))
    block = PreNorm(ln, att) + PreNorm(ln, mlp)
    mean, cov = rng.standard_normal(3), random_spd(rng, 3)
    parts = [closure_moment_rhs(t, mean, cov, 6) for t in block.terms]
    tot = closure_moment_rhs(block, mean, cov, 6)
    assert np.allclose(tot[0], parts[0][0] + parts[1][0])
    assert np.allclose(tot[1], parts[0][1] + parts[1][1])
    assert np.all(np.linalg.eigvalsh(closure_moment_rhs(block, mean, cov, 6)[1]) > -1e3)


def test_bad_input():
    with pytest.raises(ValueError, match="LayerNorm"):
        LayerNorm(1)
    with pytest.raises(ValueError, match="W2"):
        MLP(np.ones((4, 2)), np.zeros(4), np.ones((3, 4)), np.zeros(2))
    with pytest.raises(ValueError, match="activation"):
        MLP(np.ones((4, 2)), np.zeros(4), np.ones((2, 4)), np.zeros(2), activation="tanh")
    att2 = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match=r"terms\[1\]"):
        att2 + Affine(np.eye(3))
    with pytest.raises(ValueError, match="norm"):
        PreNorm(LayerNorm(3), att2)
    with pytest.raises(TypeError, match="norm"):
        PreNorm("layernorm", att2)
