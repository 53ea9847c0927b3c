"""The affine fields of every Gaussian-preserving type against independent computations.

* softmax, L2, multi-head: the attention integral computed by Gauss-Hermite quadrature
  (60 nodes per dimension, d = 2) at several query tokens, to 1e-9;
* Sinkhorn: a Sinkhorn scaling run on a fine Gauss-Hermite discretisation of the Gaussian
  (deterministic) and on particles (tolerance scaled by n^{-1/2}).
"""

import numpy as np
import pytest
from scipy.special import logsumexp

import gaussian_pde as gp
from gaussian_pde.attention import has_hook
from gaussian_pde.closure._quadrature import gauss_hermite_gaussian


def _quadrature_field(head, mean, cov, x, nodes=60):
    """V * E_w[y] with weights e^{s(x, y)} against N(mean, cov), by quadrature."""
    ys, w = gauss_hermite_gaussian(mean, cov, nodes)
    s = head.score_matrix(x[None, :], ys)[0]     # the score of the definition (particles)
    logp = np.log(w) + s
    p = np.exp(logp - logsumexp(logp))
    return head.V @ (p @ ys)


def _random_head(cls, rng, d, k, weight=0.5):
    """A head with ``k``-row query and key matrices; a type with further weights (biases)
    by its ``example`` (all its weights random, ``k = d``)."""
    if cls.weight_names != gp.SingleHeadAttention.weight_names:
        return cls.example(d, rng)
    return cls(weight * rng.standard_normal((k, d)), weight * rng.standard_normal((k, d)),
               rng.standard_normal((d, d)))


#: the softmax-normalised heads with exact moments: a score quadratic in the key token
NORMALISED = [cls for cls in gp.ATTENTIONS.values() if has_hook(cls, "quadratic_score")]


@pytest.mark.parametrize("cls", NORMALISED)
@pytest.mark.parametrize("k", [1, 2])  # k = 1 < d: singular A
def test_field_against_quadrature(cls, k, rng):
    d = 2
    for _ in range(3):
        head = _random_head(cls, rng, d, k)
        mean = rng.standard_normal(d)
        G = 0.6 * rng.standard_normal((d, d))
        cov = G @ G.T
        for x in rng.standard_normal((3, d)):
            field = head.velocity(mean, cov, x)
            np.testing.assert_allclose(field, _quadrature_field(head, mean, cov, x),
                                       rtol=1e-9, atol=1e-9)


def test_field_rank_deficient_covariance(rng):
    """Singular Sigma: the closed form still equals the integral over the degenerate Gaussian."""
    d = 2
    v = rng.standard_normal(d)
    cov = 0.8 * np.outer(v, v) / (v @ v)
    for cls in NORMALISED:
        head = _random_head(cls, rng, d, 2)
        mean = rng.standard_normal(d)
        x = rng.standard_normal(d)
        np.testing.assert_allclose(head.velocity(mean, cov, x),
                                   _quadrature_field(head, mean, cov, x), rtol=1e-9, atol=1e-9)


def test_multihead_field_is_sum_of_heads(rng):
    d = 2
    heads = [_random_head(gp.Softmax, rng, d, 1), _random_head(gp.L2, rng, d, 2)]
    mh = gp.MultiHead(heads)
    mean, cov = rng.standard_normal(d), np.array([[0.5, 0.1], [0.1, 0.3]])
    x = rng.standard_normal(d)
    expected = sum(_quadrature_field(h, mean, cov, x) for h in heads)
    np.testing.assert_allclose(mh.velocity(mean, cov, x), expected, rtol=1e-9, atol=1e-9)


def _sinkhorn_conditional_means(points, weights, A, V, tol=1e-13, max_iter=20_000):
    """Log-domain Sinkhorn for the kernel e^{y^T A x} with both marginals ``weights``.

    Returns V E_pi[y | x_i] for every support point and the final marginal error.
    """
    logK = points @ A.T @ points.T  # [i, j] = x_j^T A x_i = s(x_i, y = x_j)
    logw = np.log(weights)
    f = np.zeros(len(weights))
    for _ in range(max_iter):
        g = -logsumexp(logK + f[:, None] + logw[:, None], axis=0)
        f = -logsumexp(logK + g[None, :] + logw[None, :], axis=1)
        logpi = logK + f[:, None] + g[None, :] + logw[:, None] + logw[None, :]
        err = np.abs(np.exp(logsumexp(logpi, axis=0)) - weights).sum()
        if err < tol:
            break
    cond = np.exp(logpi - logsumexp(logpi, axis=1, keepdims=True))
    return (cond @ points) @ V.T, err


@pytest.mark.parametrize("k", [1, 2])
def test_sinkhorn_against_discretised_gaussian(k, rng):
    """Sinkhorn scaling on a 40 x 40 Gauss-Hermite grid of N(alpha, Sigma) vs the closed form.

    The conditional mean is compared at the grid points within 1.5 standard deviations,
    where the rule resolves the Gaussian; the measured discrepancy is below 1e-7.
    """
    d = 2
    head = _random_head(gp.Sinkhorn, rng, d, k, weight=0.6)
    mean = rng.standard_normal(d)
    cov = np.array([[0.7, 0.2], [0.2, 0.4]])
    pts, w = gauss_hermite_gaussian(mean, cov, 40)
    v_disc, err = _sinkhorn_conditional_means(pts, w, head.A, head.V)
    assert err < 1e-12
    z = np.linalg.solve(np.linalg.cholesky(cov), (pts - mean).T).T
    inner = np.sum(z**2, axis=1) < 1.5**2
    v_closed = head.velocity(mean, cov, pts[inner])
    np.testing.assert_allclose(v_disc[inner], v_closed, rtol=0, atol=1e-7)


@pytest.mark.slow
def test_sinkhorn_against_particles():
    """Particle Sinkhorn (n tokens) converges to the closed form like n^{-1/2}."""
    d = 2
    rng = np.random.default_rng(3)
    head = _random_head(gp.Sinkhorn, rng, d, 1, weight=0.8)
    mean = np.array([0.3, -0.2])
    cov = np.array([[0.8, 0.3], [0.3, 0.5]])
    errs = {}
    for n in (500, 2000):
        e = []
        for seed in range(3):
            x = np.random.default_rng(seed).multivariate_normal(mean, cov, size=n)
            v_part, err = _sinkhorn_conditional_means(x, np.full(n, 1.0 / n), head.A, head.V,
                                                      tol=1e-10)
            assert err < 1e-10
            # compare with the closed-form field of the particles' own moment Gaussian
            m_hat, c_hat = x.mean(0), np.cov(x.T, bias=True)
            v_closed = head.velocity(m_hat, c_hat, x)
            e.append(np.sqrt(np.mean(np.sum((v_part - v_closed) ** 2, axis=1))))
        errs[n] = np.mean(e)
    scale = np.sqrt(np.mean(np.sum(head.velocity(mean, cov, x) ** 2, axis=1)))
    # n^{-1/2} scaling: 4x more tokens must shrink the error by about 2 (allow 1.4)
    assert errs[2000] < errs[500] / 1.4
    assert errs[2000] / scale < 3.0 / np.sqrt(2000)


def test_sinkhorn_rank_deficient_covariance(rng):
    """Singular Sigma (a line) and singular A: Sinkhorn scaling on the degenerate Gaussian."""
    d = 2
    head = _random_head(gp.Sinkhorn, rng, d, 1, weight=0.6)
    mean = rng.standard_normal(d)
    u = np.array([0.6, 0.8])
    cov = 0.9 * np.outer(u, u)
    z, w = np.polynomial.hermite_e.hermegauss(80)
    w = w / w.sum()
    pts = mean + np.sqrt(0.9) * z[:, None] * u
    v_disc, err = _sinkhorn_conditional_means(pts, w, head.A, head.V)
    assert err < 1e-12
    inner = np.abs(z) < 1.5
    np.testing.assert_allclose(v_disc[inner], head.velocity(mean, cov, pts[inner]), rtol=0,
                               atol=1e-7)
    # the factor form needs no inverse: L' stays in the range of L
    L = np.sqrt(0.9) * np.outer(u, u)
    dL = head.factor_rhs(L)
    assert np.abs(np.array([-u[1], u[0]]) @ L).max() < 1e-15
    np.testing.assert_allclose(dL @ np.array([-u[1], u[0]]), 0.0, atol=1e-15)


def test_l2_field_at_a_covariance_of_1e300_is_finite_and_exact():
    """Regression: ``moment_rhs`` for L2 at a covariance of 1e300 raised LinAlgError
    (``I + 2c Sigma K^T K`` is singular in floating point there). The SVD gain gives the
    large-covariance limit: for ``V = I``, ``Q = K`` (k = 1), ``M`` is the projection
    ``Sigma K^T (K Sigma K^T)^{-1} K`` to rounding."""
    K = np.array([[1.0, 1.0]])
    att = gp.L2(K, K, np.eye(2), scale=0.5)
    cov = 1e300 * np.diag([1.0, 1e-6])
    M = att.field_matrix(cov)
    assert np.allclose(M, cov @ K.T @ np.linalg.inv(K @ cov @ K.T) @ K, rtol=0, atol=1e-12)
    dmean, dcov = gp.moment_rhs(gp.L2.example(2, 0), np.zeros(2), 1e300 * np.eye(2))
    assert np.all(np.isfinite(dmean)) and np.all(np.isfinite(dcov))


def test_l2_field_is_accurate_when_the_covariance_spans_many_scales(rng):
    """The L2 field through the SVD gain keeps rounding-level relative accuracy where an LU
    solve with ``I + 2c Sigma K^T K`` left 1e-7 (a covariance over 12 orders of magnitude;
    the reference is the push-through form in extended precision)."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 40
    d = 4
    Q, K = rng.standard_normal((d, d)), rng.standard_normal((d, d))
    att = gp.L2(Q, K, np.eye(d))
    U, _ = np.linalg.qr(rng.standard_normal((d, d)))
    L = U * np.sqrt(np.logspace(6, -6, d))
    Lm, Km, Qm = (mp.matrix(a.tolist()) for a in (L, K, Q))
    c = mp.mpf(att.scale)
    S = Lm * Lm.T
    ref = 2 * c * mp.inverse(mp.eye(d) + 2 * c * S * Km.T * Km) * S * Km.T * Qm * Lm
    ref = np.array(ref.tolist(), dtype=float)
    field = att.compiled_field()
    out = np.empty(d * d)
    field.rhs(field.params, d, d, np.ascontiguousarray(L).ravel(), out, np.zeros(field.ws_size))
    for got in (att.factor_rhs(L), out.reshape(d, d)):
        assert np.linalg.norm(got - ref) <= 1e-12 * np.linalg.norm(ref)


def test_moment_rhs_that_overflows_raises():
    """Regression: softmax at a covariance of 1e300 returned ``-inf`` rates
    (``Sigma' = M Sigma + Sigma M^T`` is ~1e600)."""
    att = gp.Softmax.example(2, 0)
    with pytest.raises(ValueError, match="overflow float64"):
        gp.moment_rhs(att, np.zeros(2), 1e300 * np.eye(2))
