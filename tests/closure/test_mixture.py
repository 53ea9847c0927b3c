"""The Gaussian-mixture closure: state, closed-form field, one-component exactness, events."""

import numpy as np
import pytest
import sympy as sp

import gaussian_pde as gp
from derivations import _symbolic as S
from derivations import mixture as derivation
from gaussian_pde.closure import _mixture as mx
from gaussian_pde.closure._quadrature import gauss_hermite_gaussian


def _random_cov(rng, d, rank=None):
    B = rng.normal(size=(d, rank or d))
    return B @ B.T / d + (0 if rank else 0.1 * np.eye(d))


def _attentions(d, rng):
    return [gp.Softmax.example(d, rng), gp.L2.example(d, rng), gp.MultiHead.example(d, rng)]


# ------------------------------------------------------------------ the state


def test_mixture_validation():
    I2 = np.eye(2)
    with pytest.raises(ValueError, match="weights"):
        gp.GaussianMixture([0.5, 0.6], [[0, 0], [1, 1]], [I2, I2])
    with pytest.raises(ValueError, match="weights"):
        gp.GaussianMixture([1.5, -0.5], [[0, 0], [1, 1]], [I2, I2])
    with pytest.raises(ValueError, match="means"):
        gp.GaussianMixture([0.5, 0.5], [[0, 0]], [I2, I2])
    with pytest.raises(ValueError, match="covs"):
        gp.GaussianMixture([0.5, 0.5], [[0, 0], [1, 1]], [I2])
    with pytest.raises(ValueError, match="covs"):
        gp.GaussianMixture([0.5, 0.5], [[0, 0], [1, 1]], [I2, -I2])
    with pytest.raises(TypeError, match="mixture"):
        gp.solve_mixture(gp.Softmax.example(2, 0), (np.zeros(2), I2), (0, 1))
    with pytest.raises(TypeError, match="attention"):
        gp.solve_mixture(gp.Sinkhorn.example(2, 0),
                         gp.GaussianMixture([1.0], [[0, 0]], [I2]), (0, 1))
    with pytest.raises(ValueError, match="merge_tol"):
        gp.solve_mixture(gp.Softmax.example(2, 0),
                         gp.GaussianMixture([1.0], [[0, 0]], [I2]), (0, 1), merge_tol=-1)


def test_sample_keeps_labels_and_moments():
    rng = np.random.default_rng(1)
    mix = gp.GaussianMixture([0.2, 0.3, 0.5], rng.normal(size=(3, 2)) * 5,
                             [_random_cov(rng, 2) for _ in range(3)])
    x, lab = mix.sample(20_000, seed=2)
    assert x.shape == (20_000, 2)
    np.testing.assert_array_equal(np.bincount(lab), mix.counts(20_000))
    for k in range(3):
        np.testing.assert_allclose(x[lab == k].mean(0), mix.means[k], atol=0.05)
        np.testing.assert_allclose(np.cov(x[lab == k].T), mix.covs[k], atol=0.06)
    x2, _ = mix.sample(20_000, seed=2)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_allclose(np.cov(x.T, bias=True), mix.total_cov, rtol=0.03)


# ------------------------------------------------------------------ the field


@pytest.mark.parametrize("name", ["softmax", "l2"])
def test_log_partition_matches_sympy(name):
    """The vectorised log Z_k and m_k against the SymPy derivation (explicit d = 2 weights)."""
    subs, points = derivation.subs_2d()
    terms = derivation.log_partition(derivation.SCORES[name])
    f = lambda m: np.array(sp.Matrix(m).evalf(), dtype=float)   # noqa: E731
    Q, K, V, c = f(subs[S.Q]), f(subs[S.K]), f(subs[S.V]), float(subs[S.scale])
    att = (gp.Softmax if name == "softmax" else gp.L2)(Q, K, V, scale=c)
    head, = mx._heads(att)
    alpha, Sigma = f(subs[S.alpha]).ravel(), f(subs[S.Sigma])
    X = np.array(points, dtype=float)
    log_z, m = mx.component_log_partition(head.A, head.H, alpha[None], Sigma[None], X)
    for i, p in enumerate(points):
        lz_sym, m_sym = derivation.evaluate(terms, subs, p)
        r = -c * np.sum((Q @ X[i]) ** 2) if name == "l2" else 0.0
        assert abs(log_z[0, i] + r - float(lz_sym)) < 1e-13
        np.testing.assert_allclose(m[0, i], f(m_sym).ravel(), atol=1e-13)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_velocity_matches_definition_on_nodes(which):
    """Closed form against the attention average over a fine Gauss-Hermite discretisation."""
    rng = np.random.default_rng(3)
    d = 2
    att = _attentions(d, rng)[which]
    mix = gp.GaussianMixture([0.3, 0.7], [[-1.0, 0.5], [1.0, -0.2]],
                             [0.3 * _random_cov(rng, d), 0.2 * _random_cov(rng, d, rank=1)])
    Y, logw = [], []
    for k in range(2):
        y, w = gauss_hermite_gaussian(mix.means[k], mix.covs[k], 30)
        Y.append(y)
        logw.append(np.log(mix.weights[k]) + np.log(w))
    Y, logw = np.concatenate(Y), np.concatenate(logw)
    X = rng.normal(size=(7, d))
    ref = att.definition_field(Y, logw, X)
    np.testing.assert_allclose(gp.mixture_velocity(att, mix, X), ref, rtol=1e-9, atol=1e-10)


def test_split_component_is_the_same_measure():
    rng = np.random.default_rng(4)
    att = gp.MultiHead.example(3, rng)
    m, C = rng.normal(size=3), _random_cov(rng, 3)
    one = gp.GaussianMixture([1.0], [m], [C])
    two = gp.GaussianMixture([0.25, 0.75], [m, m], [C, C])
    X = rng.normal(size=(5, 3))
    np.testing.assert_allclose(gp.mixture_velocity(att, two, X),
                               gp.mixture_velocity(att, one, X), rtol=1e-13, atol=1e-14)


# ------------------------------------------------------------------ one component = exact ODE


@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize("d", [2, 3])
def test_one_component_is_the_moment_ode(which, d):
    rng = np.random.default_rng(10 * d + which)
    att = _attentions(d, rng)[which]
    m, C = rng.normal(size=d), _random_cov(rng, d)
    mix = gp.GaussianMixture([1.0], [m], [C])
    dm, _, dC = mx.mixture_closure_terms(att, mix)
    em, eC = gp.moment_rhs(att, m, C)
    np.testing.assert_allclose(dm[0], em, rtol=1e-13, atol=1e-13 * np.abs(em).max())
    np.testing.assert_allclose(dC[0], eC, rtol=1e-12, atol=1e-13 * np.abs(eC).max())
    t = np.linspace(0, 0.5, 6)
    sol = gp.solve_mixture(att, mix, (0, 0.5), t_eval=t, rtol=1e-12, atol=1e-13)
    ref = gp.solve(att, m, C, (0, 0.5), t_eval=t, rtol=1e-12, atol=1e-13)
    assert sol.status == "finished" and sol.success
    np.testing.assert_allclose(sol.means[:, 0], ref.mean, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(sol.covs[:, 0], ref.cov, rtol=1e-9, atol=1e-10)
    assert sol.means.shape == (6, 1, d) and sol.covs.shape == (6, 1, d, d)


def test_one_component_blowup_verdict_as_solve():
    """Softmax, V = I: the exact Riccati blow-up; same status and time as gp.solve."""
    Q = np.array([[1.0, 0.3]])
    att = gp.Softmax(Q, Q, np.eye(2))
    C = np.array([[1.0, 0.2], [0.2, 0.5]])
    sol = gp.solve_mixture(att, gp.GaussianMixture([1.0], [[0.0, 0.0]], [C]), (0, 10),
                           n_per_dim=2, rtol=1e-10, atol=1e-12)
    ref = gp.solve(att, None, C, (0, 10))
    assert sol.status == "blowup" == ref.status
    assert abs(sol.t_blowup - ref.t_blowup) < 1e-6 * ref.t_blowup


def test_singular_component():
    rng = np.random.default_rng(5)
    att = gp.L2.example(3, rng)
    C = _random_cov(rng, 3, rank=1)
    mix = gp.GaussianMixture([0.5, 0.5], [[0, 0, 0], [3, 0, 0]], [C, np.eye(3)])
    sol = gp.solve_mixture(att, mix, (0, 1))
    assert sol.success
    assert np.linalg.matrix_rank(sol.covs_final[0], tol=1e-8) == 1


# ------------------------------------------------------------------ events


def _converging_pair():
    """Softmax, V = I, K = -Q: each cluster moves at the other's mean, so they converge."""
    Q = np.array([[1.0, 0.0]])
    att = gp.Softmax(Q, -Q, np.eye(2))
    mix = gp.GaussianMixture([0.5, 0.5], [[-2.0, 0.0], [2.0, 0.0]], [0.1 * np.eye(2)] * 2)
    return att, mix


def test_merge_event_records_and_stops():
    att, mix = _converging_pair()
    t = np.linspace(0, 3, 61)
    sol = gp.solve_mixture(att, mix, (0, 3), t_eval=t, merge_tol=1.0)
    assert sol.status == "finished"
    assert sol.merge_times.size == 1
    tm = sol.merge_times[0]
    # the event time is where the pair's distance crosses the tolerance
    dist = [mx.pairwise_bures_wasserstein(m, c)[0, 1] for m, c in zip(sol.means, sol.covs)]
    i = np.searchsorted(-np.asarray(dist), -1.0)
    assert sol.t[i - 1] <= tm <= sol.t[i]
    stop = gp.solve_mixture(att, mix, (0, 3), merge_tol=1.0, stop_at_merge=True)
    assert stop.status == "event" and "merge" in stop.message
    assert abs(stop.t_final - tm) < 1e-6
    d_final = mx.pairwise_bures_wasserstein(stop.means_final, stop.covs_final)[0, 1]
    assert abs(d_final - 1.0) < 1e-6


def test_merge_heights_count_clusters():
    pts = np.array([0.0, 1.0, 5.0, 5.5, 20.0])
    D = np.abs(pts[:, None] - pts[None])
    h = mx.merge_heights(D)
    np.testing.assert_allclose(h, [0.5, 1.0, 4.0, 14.5])
    assert 1 + np.sum(h > 2.0) == 3
