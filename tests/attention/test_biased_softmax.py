"""Softmax with query and key biases, added through its two files alone.

Checked against an independent quadrature of the mean-field velocity (the score written
out here, not the type's), against plain softmax at zero query bias, against the exact
blow-up of its covariance (plain softmax's Riccati equation), and through every solver:
``solve`` with events, ``solve_batch``, particles, the Gaussian closure and
``compare``. The registry-wide checks (particle estimate of the moment equations,
Jacobian, closure) run on it from ``tests/attention/test_capabilities.py``.
"""

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss

import gaussian_pde as gp
from gaussian_pde.cli._compare import compare_examples
from gaussian_pde.cli._main_job import default_examples

NAME = "biased_softmax"


@pytest.fixture
def cls():
    return gp.get_attention(NAME)


def _quadrature_velocity(Q, K, V, q, kb, c, mean, cov, X, n=40):
    """Gauss-Hermite (probabilists') product rule for V E[y e^s] / E[e^s], y ~ N(mean, cov)."""
    t, w = hermegauss(n)
    d = mean.size
    grids = np.meshgrid(*([t] * d), indexing="ij")
    Z = np.stack([g.ravel() for g in grids], axis=1)
    W = np.prod(np.meshgrid(*([w] * d), indexing="ij"), axis=0).ravel()
    Y = mean + Z @ np.linalg.cholesky(cov).T
    out = []
    for x in X:
        s = c * (Y @ K.T + kb) @ (Q @ x + q)
        e = W * np.exp(s - s.max())
        out.append(V @ (e @ Y) / e.sum())
    return np.array(out)


def _quadrature_partition(Q, K, q, kb, c, mean, cov, X, n=40):
    """The same rule for ``E[e^s]`` (n_x, 1) and ``E[y e^s] / E[e^s]`` (n_x, d) at each x."""
    t, w = hermegauss(n)
    d = mean.size
    Z = np.stack([g.ravel() for g in np.meshgrid(*([t] * d), indexing="ij")], axis=1)
    W = np.prod(np.meshgrid(*([w] * d), indexing="ij"), axis=0).ravel() / np.sqrt(2 * np.pi) ** d
    Y = mean + Z @ np.linalg.cholesky(cov).T
    E = W[:, None] * np.exp(c * (Y @ K.T + kb) @ (Q @ X.T + q[:, None]))    # (nodes, n_x)
    z = E.sum(axis=0)
    return z[:, None], (E.T @ Y) / z[:, None]


def test_field_matches_an_independent_quadrature(cls, rng):
    d, k = 2, 2
    Q, K = 0.5 * rng.standard_normal((k, d)), 0.5 * rng.standard_normal((k, d))
    V, q, kb = rng.standard_normal((d, d)), rng.standard_normal(k), rng.standard_normal(k)
    att = cls(Q, K, V, q=q, k_b=kb, scale=0.8)
    mean = np.array([0.3, -0.5])
    G = rng.standard_normal((d, d))
    cov = 0.3 * G @ G.T + 0.2 * np.eye(d)
    X = rng.standard_normal((5, d))
    want = _quadrature_velocity(Q, K, V, q, kb, 0.8, mean, cov, X)
    got = att.velocity(mean, cov, X)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    # the key bias cancels; the query bias does not
    same = cls(Q, K, V, q=q, k_b=np.zeros(k), scale=0.8)
    np.testing.assert_allclose(same.velocity(mean, cov, X), got, rtol=1e-13)
    plain = gp.Softmax(Q, K, V, scale=0.8)
    assert np.abs(plain.velocity(mean, cov, X) - got).max() > 1e-3


def test_zero_query_bias_is_plain_softmax(cls, rng):
    d = 3
    Q, K, V = (rng.standard_normal((2, d)), rng.standard_normal((2, d)),
               rng.standard_normal((d, d)) / np.sqrt(d))
    att = cls(Q, K, V, k_b=rng.standard_normal(2))
    plain = gp.Softmax(Q, K, V)
    mean, G = rng.standard_normal(d), rng.standard_normal((d, d))
    cov = G @ G.T / d
    for a, b in zip(gp.moment_rhs(att, mean, cov), gp.moment_rhs(plain, mean, cov)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    s1 = gp.solve(att, mean, cov, (0.0, 0.5), t_eval=[0.25, 0.5])
    s2 = gp.solve(plain, mean, cov, (0.0, 0.5), t_eval=[0.25, 0.5])
    assert s1.status == s2.status
    np.testing.assert_allclose(s1.cov, s2.cov, rtol=1e-8)
    np.testing.assert_allclose(s1.mean, s2.mean, rtol=1e-8, atol=1e-10)


def test_solve_with_events_and_batch(cls):
    ex = cls.example_setting()
    att, mean0, cov0 = ex["attention"], ex["mean0"], ex["cov0"]
    t_star = gp.blowup_time(att, cov0)          # plain softmax's Riccati equation (V = I)
    assert 0.5 < t_star < 0.7
    sol = gp.solve(att, mean0, cov0, (0.0, ex["horizon"]))
    assert sol.status == gp.Status.BLOWUP
    assert abs(sol.t_blowup - t_star) < 1e-6 * t_star
    bat = gp.solve_batch([att, att], np.stack([cov0, 0.5 * cov0]), (0.0, 0.4),
                         t_eval=[0.2, 0.4])
    one = gp.solve(att, None, cov0, (0.0, 0.4), t_eval=[0.2, 0.4])
    np.testing.assert_allclose(bat.cov[0][-1], one.cov[-1], rtol=1e-7)
    # the mean's drift V Sigma g makes it move from a zero start (plain softmax's stays 0)
    moved = gp.solve(att, np.zeros(2), cov0, (0.0, 0.2))
    assert np.abs(moved.mean[-1]).max() > 1e-3


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::gaussian_pde.particles._simulate.ParticleDegeneracyWarning")
def test_particles_follow_the_moment_equations(cls):
    """Particle means against the ODE's: the error shrinks with n like n^-1/2 (16x n)."""
    ex = cls.example_setting()
    att, mean0, cov0 = ex["attention"], ex["mean0"], ex["cov0"]
    ode = gp.solve(att, mean0, cov0, (0.0, 0.1), t_eval=[0.1])
    errs = []
    for n in (100, 1600):
        e = []
        for seed in range(6):
            x0 = gp.sample_gaussian(mean0, cov0, n, seed=seed)
            ps = gp.simulate_particles(att, x0, (0.0, 0.1), t_eval=[0.1])
            e.append(np.abs(ps.mean[-1] - ode.mean[-1]).max())
        errs.append(np.mean(e))
    assert errs[1] < 0.5 * errs[0]          # n^-1/2: a factor 4 expected
    assert errs[1] < 4.0 * np.sqrt(np.trace(cov0) / 1600)


def test_cli_and_closure_see_it(cls):
    assert NAME in compare_examples() and NAME in default_examples()
    ex = cls.example_setting()
    att, mean0, cov0 = ex["attention"], ex["mean0"], ex["cov0"]
    clo = gp.solve_closure(att, mean0, cov0, (0.0, 0.2), t_eval=[0.2])
    ode = gp.solve(att, mean0, cov0, (0.0, 0.2), t_eval=[0.2])
    np.testing.assert_allclose(clo.mean[-1], ode.mean[-1], rtol=1e-6)
    np.testing.assert_allclose(clo.cov[-1], ode.cov[-1], rtol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        cls(np.eye(2), np.eye(2), np.eye(2), q=[1.0, 2.0, 3.0])


def test_the_recipe_two_hand_written_files():
    """docs/adding_an_attention_type.md: the type's name appears in its derivation, its
    attention module and the generated module only (the code outside them calls the
    contract), and the recipe names those files. Two modules are its clients, not part of
    adding it: ``attention/_transformer.py`` builds a trained head with biases as this
    type (``dot_product_head``), and ``training`` (a user of the public package) calls
    that."""
    import pathlib

    root = pathlib.Path(gp.__file__).resolve().parents[1]
    sources = [p for p in list((root / "gaussian_pde").rglob("*.py"))
               + list((root / "derivations").glob("*.py"))
               if "training" not in p.relative_to(root).parts and p.name != "_transformer.py"]
    naming = sorted(str(p.relative_to(root)) for p in sources if NAME in p.read_text())
    assert naming == ["derivations/biased_softmax.py", "gaussian_pde/_generated/biased_softmax.py",
                      "gaussian_pde/attention/_biased_softmax.py"]
    recipe = (root / "docs" / "adding_an_attention_type.md").read_text()
    for path in ("derivations/biased_softmax.py", "gaussian_pde/attention/_biased_softmax.py",
                 "python derivations/generate.py"):
        assert path in recipe


def test_mixture_closure_sees_it(cls, rng):
    """The score's linear term tilts each component (``QuadraticScore.tilt``): the mixture
    field against the quadrature written out here, summed over the components with their
    weights; one component is ``solve`` itself."""
    att = cls.example(2, rng)
    Q, K, V, c = att.Q, att.K, att.V, float(att.scale)
    w = np.array([0.35, 0.65])
    means = np.array([[-0.6, 0.4], [0.8, -0.3]])
    covs = np.array([[[0.3, 0.1], [0.1, 0.2]], [[0.15, -0.05], [-0.05, 0.25]]])
    mix = gp.GaussianMixture(w, means, covs)
    X = rng.normal(size=(5, 2))
    # V sum_k w_k E_k[y e^s] / sum_k w_k E_k[e^s], from the per-component quadratures
    num = np.zeros((5, 2))
    den = np.zeros((5, 1))
    for k in range(2):
        z, avg = _quadrature_partition(Q, K, att.q, att.k_b, c, means[k], covs[k], X)
        num += w[k] * z * avg
        den += w[k] * z
    ref = (num / den) @ V.T
    np.testing.assert_allclose(gp.mixture_velocity(att, mix, X), ref, rtol=1e-9, atol=1e-10)
    # one component: the moment equations, and solve_mixture is solve
    ex = cls.example_setting()
    one = gp.GaussianMixture(np.ones(1), ex["mean0"][None], ex["cov0"][None])
    sol = gp.solve_mixture(ex["attention"], one, (0.0, 0.1), t_eval=[0.1])
    ref = gp.solve(ex["attention"], ex["mean0"], ex["cov0"], (0.0, 0.1), t_eval=[0.1])
    np.testing.assert_allclose(sol.means[-1, 0], ref.mean[-1], rtol=1e-9)
    np.testing.assert_allclose(sol.covs[-1, 0], ref.cov[-1], rtol=1e-9)
    two = gp.solve_mixture(att, mix, (0.0, 0.1))
    assert two.status == "finished"
