"""Closed Gaussian moments (no tensor rule): against the tensor rule, 1-D quadrature and Monte Carlo."""

import numpy as np
import pytest
from scipy.integrate import quad

import gaussian_pde as gp
from gaussian_pde._common.linalg import psd_sqrt
from gaussian_pde.closure._blocks import MLP, LayerNorm, PreNorm, RMSNorm, gelu_tanh
from gaussian_pde.closure._depth import _push_nodes
from gaussian_pde.closure._engine import standard_nodes
from gaussian_pde.closure._moments import activation_hermite, normalization_moments
from tests._helpers import random_spd


def _tensor_moments(f, mean, cov, n):
    """Mean, covariance and Cov(x, f(x)) of f(x), x ~ N(mean, cov), by the tensor rule."""
    Z, W = standard_nodes(mean.size, n)
    X = mean + Z @ psd_sqrt(cov).T
    Y = f(X)
    m = W @ Y
    Yc = Y - m
    return m, (Yc * W[:, None]).T @ Yc, ((X - mean) * W[:, None]).T @ Yc


def _setting(rng, d):
    return (rng.standard_normal(d), random_spd(rng, d) + 0.1 * np.eye(d),
            1 + 0.2 * rng.standard_normal(d), 0.1 * rng.standard_normal(d))


@pytest.mark.parametrize("d, n", [(2, 40), (3, 30), (4, 20)])
@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_normalization_moments_match_the_tensor_rule(rng, d, n, norm):
    """Small d, where both apply: the Laplace integrals equal the converged tensor rule.

    ``eps = 1`` keeps the integrand smooth so that the tensor rule converges (it converges
    towards the Laplace value as the nodes grow: at d = 2, 2e-3, 8e-5, 4e-5, 9e-6 at 10, 20,
    30, 40 nodes per dimension): doubling the nodes at least halves the difference, and the
    last one is below 3e-4 (entries of order one). The Laplace integrals do not depend on
    the smoothness.
    """
    mean, cov, g, b = _setting(rng, d)
    layer = LayerNorm(d, g, b, eps=1.0) if norm == "layernorm" else RMSNorm(d, g, eps=1.0)
    mu, C, J = layer.moments(mean, cov)
    got = np.concatenate([mu, C.ravel(), (cov @ J.T).ravel()])  # Stein: Cov(x, u) = Sigma J^T
    diff = [np.abs(np.concatenate([a.ravel() for a in _tensor_moments(layer.apply, mean, cov,
                                                                       k)]) - got).max()
            for k in (n // 2, n)]
    assert diff[1] < 3e-4 and (diff[1] < 0.5 * diff[0] or diff[1] < 1e-9), diff


@pytest.mark.parametrize("d", [3, 32])
def test_layernorm_moments_against_monte_carlo(rng, d):
    """Small and moderate d, GPT-2's eps: Monte Carlo within 4.5 standard errors (over all
    the entries tested), and the error falls ~ n^-1/2."""
    mean, cov, g, b = _setting(rng, d)
    ln = LayerNorm(d, g, b)
    mu, C, J = ln.moments(mean, cov)
    cross = cov @ J.T
    L = np.linalg.cholesky(cov)
    errs = []
    for n in (20_000, 320_000):
        x = mean + rng.standard_normal((n, d)) @ L.T
        u = ln.apply(x)
        uc = u - mu
        stats = {"mean": (u, mu), "var": (uc * uc, np.diag(C)),
                 "cov01": (uc[:, :1] * uc[:, 1:], C[0, 1:]),
                 "cross": ((x[:, :1] - mean[0]) * uc, cross[0])}
        worst = 0.0
        for sample, want in stats.values():
            se = sample.std(axis=0) / np.sqrt(n)
            z = np.abs(sample.mean(axis=0) - want) / se
            assert z.max() < 4.5, z.max()
            worst = max(worst, float(np.abs(sample.mean(axis=0) - want).max()))
        errs.append(worst)
    # 16 times the samples: a quarter of the error in expectation (a half would be a bias)
    assert errs[1] < 0.5 * errs[0], errs


def test_layernorm_concentrates(rng):
    """Wide tokens: LN is nearly affine, u ~ gamma (x - mean_i x) / sqrt(E r): the Jacobian's
    deviation from that is of the order of the relative spread of r, O(d^-1/2)."""
    for d in (64, 512):
        mean, cov = 0.3 * rng.standard_normal(d), np.eye(d)
        g = np.ones(d)
        mu, C, J = normalization_moments(mean, cov, g, np.zeros(d), 1e-5, center=True)
        rbar = (np.sum((mean - mean.mean()) ** 2) + d - 1) / d
        P = np.eye(d) - 1.0 / d
        dev = np.abs(J - P / np.sqrt(rbar)).max() * np.sqrt(rbar)
        assert dev < 3.0 / np.sqrt(d), (d, dev)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("m, s", [(0.3, 0.1), (0.3, 2.0), (-1.0, 5.0), (2.0, 0.7), (0.0, 30.0)])
def test_hermite_coefficients_against_adaptive_quadrature(act, m, s):
    phi = {"relu": lambda u: np.maximum(u, 0.0), "gelu": lambda u: u * gp.closure._blocks.ndtr(u),
           "gelu_tanh": lambda u: gelu_tanh(u)[0]}[act]
    psi = MLP(np.ones((1, 1)), np.zeros(1), np.ones((1, 1)), np.zeros(1), activation=act)._psi()
    e, second = activation_hermite(psi, np.array([m]), np.array([s]), 5)
    dens = lambda z: np.exp(-z * z / 2) / np.sqrt(2 * np.pi)   # noqa: E731
    for n in range(6):
        Hn = np.polynomial.hermite_e.HermiteE.basis(n)
        ref = quad(lambda z, Hn=Hn: phi(m + s * z) * Hn(z) * dens(z), -12, 12, points=[-m / s],
                   limit=400, epsabs=1e-13)[0]
        assert abs(e[n, 0] - ref) < 1e-9 * max(1.0, s ** n)
    ref2 = quad(lambda z: phi(m + s * z) ** 2 * dens(z), -12, 12, points=[-m / s], limit=400,
                epsabs=1e-13)[0]
    assert abs(second[0] - ref2) < 1e-9 * max(1.0, s * s)


@pytest.mark.parametrize("act", ["relu", "gelu_tanh"])
def test_mlp_moments_converge_to_the_tensor_rule(rng, act):
    """Mehler's expansion: error within its bound, shrinking with the order (d = 3, p = 4)."""
    d, p = 3, 4
    W1 = rng.standard_normal((p, d))
    mlp_args = (W1, rng.standard_normal(p), rng.standard_normal((d, p)), rng.standard_normal(d))
    mean, cov = rng.standard_normal(d), random_spd(rng, d) + 0.1 * np.eye(d)
    f = MLP(*mlp_args, activation=act)
    qm, qc, qx = _tensor_moments(lambda x: f(None, None, x), mean, cov, 40)
    err = []
    for order in (1, 4, 16):
        g = MLP(*mlp_args, activation=act, mehler_order=order)
        E, J, C = g.gaussian_moments(mean, cov)
        np.testing.assert_allclose(E, qm, atol=2e-4 * np.abs(qm).max())
        np.testing.assert_allclose(cov @ J.T, qx, atol=2e-4 * np.abs(qx).max())
        err.append(np.abs(C - qc).max() / np.abs(qc).max())
        if order > 1:
            # the remainder bound, in units of the largest non-linear variance, bounds the
            # entries of R = Cov(phi) - order 1; through W2 it scales by |W2|_1^2
            R_err = err[-1] * np.abs(qc).max()
            w = np.abs(g.W2).sum(axis=1).max() ** 2
            assert R_err <= 1e-4 + w * g.last_mehler_bound * 50, (R_err, g.last_mehler_bound)
    # ReLU's tensor rule is itself only accurate to ~1e-4 at 40 nodes (its kink)
    assert err[2] < 0.2 * err[0] and err[2] < (3e-3 if act == "relu" else 1e-5), err


def test_prenorm_attention_layer_is_the_tensor_rule_limit(rng):
    """Attention behind LayerNorm: the closed map is the tensor rule's limit (no closure)."""
    d = 3
    mean, cov, g, b = _setting(rng, d)
    att = gp.Softmax(rng.standard_normal((d, d)) / 2, rng.standard_normal((d, d)) / 2,
                     rng.standard_normal((d, d)))
    F = PreNorm(LayerNorm(d, g, b, eps=1.0), att + gp.Affine(np.zeros((d, d)),
                                                             rng.standard_normal(d)))
    stack = gp.Stack([F], h=0.5, mode="residual")
    sol = gp.propagate_gaussian(stack, mean, cov)
    qm, qc = _push_nodes(F, mean, cov, 0.5, "residual", 30)
    # the tensor rule's own error at 30 nodes (measured 6e-7 relative)
    np.testing.assert_allclose(sol.mean[1], qm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sol.cov[1], qc, rtol=1e-5, atol=1e-6)
    assert not sol.exact[0]


def test_wide_stacks_refuse_only_the_tensor_rule(rng):
    """d = 24: LayerNorm + MLP propagate; a layer that needs n^d nodes is refused up front."""
    d = 24
    mlp = MLP(rng.standard_normal((48, d)) / np.sqrt(d), np.zeros(48),
              rng.standard_normal((d, 48)) / np.sqrt(48), np.zeros(d), activation="gelu")
    att = gp.Softmax(np.eye(d) / d, np.eye(d), np.eye(d))
    stack = gp.Stack([PreNorm(LayerNorm(d), att), PreNorm(LayerNorm(d), mlp)], h=0.5)
    sol = gp.propagate_gaussian(stack, np.zeros(d), np.eye(d))
    assert sol.success and sol.cov.shape == (3, d, d)
    assert np.all(np.linalg.eigvalsh(sol.cov[-1]) > 0)
    sig = gp.get_attention("sigmoid").example(d=d, rng=1)
    with pytest.raises(ValueError, match=r"layer 2 .*GiB"):
        gp.propagate_gaussian(gp.Stack([att, sig], h=0.5), np.zeros(d), np.eye(d))


def test_closure_ode_terms_use_the_closed_moments(rng):
    """Continuous mode: G = E[J_inner] J_N L for attention behind LayerNorm equals the
    tensor rule's E[Gamma(alpha + Lz) z^T] (Stein's lemma; the inner field is affine)."""
    d = 3
    mean, cov, g, b = _setting(rng, d)
    att = gp.Softmax(rng.standard_normal((d, d)) / 2, rng.standard_normal((d, d)) / 2,
                     rng.standard_normal((d, d)))
    F = PreNorm(LayerNorm(d, g, b, eps=1.0), att)
    assert F.closed_moments and not F.always_affine
    L = psd_sqrt(cov)
    dm, G = gp.closure.closure_terms(F, mean, L)
    Z, W = standard_nodes(d, 30)
    X = mean + Z @ L.T
    V = F(mean, cov, X)
    np.testing.assert_allclose(dm, W @ V, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(G, (V * W[:, None]).T @ Z, rtol=1e-5, atol=1e-6)
