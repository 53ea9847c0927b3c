"""Key-norm softmax, a type from another package, against its own derivation.

The closed form of ``keynorm_plugin.derivation`` against a quadrature of the definition;
the one kernel (run uncompiled and compiled) against the closed form; ``gamma = 0``
against softmax; particles against the moment equations (errors shrinking like
n^-1/2); ``solve`` and ``solve_batch`` with means on the compiled path against an
independent integration of the closed-form moment equations, alone and summed with a
softmax head in a ``MultiHead``; the registration through
the entry-point group when the distribution is installed.
"""

import importlib.metadata
import itertools
import os

import numpy as np
import pytest
from keynorm_plugin import KeyNormSoftmax, derivation
from keynorm_plugin import _kernel as kernel
from scipy.integrate import solve_ivp

import gaussian_pde as gp


def _att(d, gamma=0.7, seed=0):
    rng = np.random.default_rng(seed)
    return KeyNormSoftmax(0.6 * rng.standard_normal((d, d)), 0.6 * rng.standard_normal((d, d)),
                          rng.standard_normal((d, d)) / np.sqrt(d), gamma=gamma)


def _spd(d, seed=1, rank=None):
    rng = np.random.default_rng(seed)
    L = rng.standard_normal((d, rank or d)) / np.sqrt(d)
    return L @ L.T + (0 if rank else 0.2 * np.eye(d))


def _hermite_atoms(mean, cov, n):
    """Tensor Gauss-Hermite atoms and log weights of N(mean, cov)."""
    nodes, w = np.polynomial.hermite_e.hermegauss(n)
    C = np.linalg.cholesky(cov)
    d = len(mean)
    idx = np.array(list(itertools.product(range(n), repeat=d)))
    Y = mean + nodes[idx] @ C.T
    return Y, np.log(w[idx]).sum(axis=1)


@pytest.mark.parametrize("d, gamma", [(1, 0.3), (2, 0.7), (2, 2.5), (3, 1.0)])
def test_field_matches_a_quadrature_of_the_definition(d, gamma):
    att = _att(d, gamma, seed=d)
    mean, cov = np.linspace(-0.4, 0.5, d), _spd(d, seed=d)
    X = 0.5 * np.random.default_rng(3).standard_normal((5, d))
    Y, logw = _hermite_atoms(mean, cov, {1: 80, 2: 60, 3: 60}[d])
    quad = att.definition_field(Y, logw, X)
    closed = X @ att.field_matrix(cov).T + att.field_offset(mean, cov)
    np.testing.assert_allclose(quad, closed, rtol=1e-8, atol=1e-10)
    # and the velocity the solvers use is that field
    np.testing.assert_allclose(gp.attention.moment_rhs(att, mean, cov)[0],
                               att.field_matrix(cov) @ mean + att.field_offset(mean, cov))


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("with_mean", [False, True])
@pytest.mark.parametrize("rank", [None, 1])
def test_the_one_kernel_is_the_closed_form(compiled, with_mean, rank):
    d = 3
    att = _att(d)
    rng = np.random.default_rng(4)
    L = np.linalg.cholesky(_spd(d, 5)) if rank is None else np.hstack(
        [rng.standard_normal((d, 1)), np.zeros((d, d - 1))])
    mean = rng.standard_normal(d)
    Z = np.hstack([L, mean[:, None]]) if with_mean else L.copy()
    m = Z.shape[1]
    field = kernel.compiled_kernels()[0] if compiled else kernel.keynorm_field
    out = np.empty(d * m)
    cf = att.compiled_field()
    field(cf.params, d, m, np.ascontiguousarray(Z).ravel(), out, np.empty(cf.ws_size))
    cov = L @ L.T
    expect = att.factor_rhs(L)
    if with_mean:
        expect = np.hstack([expect, (att.field_matrix(cov) @ mean
                                     + att.field_offset(mean, cov))[:, None]])
    np.testing.assert_allclose(out.reshape(d, m), expect, rtol=1e-12, atol=1e-13)


def test_a_non_finite_state_gives_nan():
    att = _att(2)
    cf = att.compiled_field()
    out = np.zeros(4)
    kernel.keynorm_field(cf.params, 2, 2, np.array([np.nan, 0, 0, 1.0]), out, np.empty(cf.ws_size))
    assert np.isnan(out).all()


def test_gamma_zero_is_softmax():
    soft = _att(3, gamma=0.0)
    plain = gp.Softmax(soft.Q, soft.K, soft.V)
    mean0, cov0 = np.array([0.2, -0.1, 0.3]), _spd(3, 7)
    for a, b in zip(soft.moment_rhs(mean0, cov0), plain.moment_rhs(mean0, cov0)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    s1 = gp.solve(soft, mean0, cov0, (0.0, 2.0), t_eval=[1.0, 2.0])
    s2 = gp.solve(plain, mean0, cov0, (0.0, 2.0), t_eval=[1.0, 2.0])
    assert s1.status == s2.status
    np.testing.assert_allclose(s1.cov, s2.cov, rtol=1e-8)
    np.testing.assert_allclose(s1.mean, s2.mean, rtol=1e-8, atol=1e-10)


def _reference(att, mean0, cov0, t_eval):
    """The closed-form moment equations integrated by SciPy's DOP853 (independent path)."""
    d = len(mean0)

    def rhs(_, y):
        dm, dc = att.moment_rhs(y[:d], y[d:].reshape(d, d))
        return np.concatenate([dm, dc.ravel()])

    sol = solve_ivp(rhs, (0.0, t_eval[-1]), np.concatenate([mean0, cov0.ravel()]),
                    method="DOP853", t_eval=t_eval, rtol=1e-11, atol=1e-13)
    return sol.y[:d].T, sol.y[d:].T.reshape(-1, d, d)


def test_solve_and_solve_batch_run_the_compiled_path():
    d, t_eval = 3, np.array([0.5, 1.0, 2.0])
    atts = [_att(d, gamma=g, seed=s) for s, g in enumerate((0.2, 0.8, 1.5, 3.0))]
    means = np.array([[0.3, -0.2, 0.1], [0.0, 0.5, -0.4], [0.2, 0.2, 0.2], [-0.5, 0.1, 0.0]])
    covs = np.stack([_spd(d, s) for s in range(4)])
    bat = gp.solve_batch(atts, covs, (0.0, 2.0), mean0s=means, t_eval=t_eval)
    assert bat.path == "compiled"
    for i, att in enumerate(atts):
        ref_mean, ref_cov = _reference(att, means[i], covs[i], t_eval)
        one = gp.solve(att, means[i], covs[i], (0.0, 2.0), t_eval=t_eval)
        assert one.status == gp.Status.FINISHED
        for got_mean, got_cov in ((one.mean, one.cov), (bat.mean[i], bat.cov[i])):
            np.testing.assert_allclose(got_cov, ref_cov, rtol=1e-6, atol=1e-9)
            np.testing.assert_allclose(got_mean, ref_mean, rtol=1e-6, atol=1e-9)


def test_covariance_invariants_along_the_trajectory():
    """Symmetric, positive definite and bounded: (I + gamma Sigma)^{-1} Sigma <= I / gamma."""
    att = _att(2, gamma=1.0, seed=11)
    sol = gp.solve(att, np.array([0.1, -0.2]), np.eye(2), (0.0, 5.0),
                   t_eval=np.linspace(0, 5, 26))
    assert sol.status == gp.Status.FINISHED
    np.testing.assert_allclose(sol.cov, np.swapaxes(sol.cov, 1, 2), atol=1e-12)
    assert np.all(np.linalg.eigvalsh(sol.cov) > 0)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::gaussian_pde.particles._simulate.ParticleDegeneracyWarning")
def test_particles_follow_the_moment_equations():
    """Particle means against the ODE's: the error shrinks with n like n^-1/2 (16x n)."""
    ex = KeyNormSoftmax.example_setting()
    att, mean0, cov0 = ex["attention"], ex["mean0"], ex["cov0"]
    ode = gp.solve(att, mean0, cov0, (0.0, 0.2), t_eval=[0.2])
    errs = []
    for n in (100, 1600):
        e = []
        for seed in range(8):
            x0 = gp.sample_gaussian(mean0, cov0, n, seed=seed)
            ps = gp.simulate_particles(att, x0, (0.0, 0.2), t_eval=[0.2])
            e.append(np.abs(ps.mean[-1] - ode.mean[-1]).max())
        errs.append(np.mean(e))
    assert errs[1] < 0.5 * errs[0]          # n^-1/2: a factor 4 expected
    assert errs[1] < 4.0 * np.sqrt(np.trace(cov0) / 1600)


def test_bad_gamma_is_refused():
    eye = np.eye(2)
    with pytest.raises(ValueError, match="gamma"):
        KeyNormSoftmax(eye, eye, eye, gamma=-1.0)
    with pytest.raises(ValueError, match="gamma"):
        KeyNormSoftmax(eye, eye, eye, gamma=float("nan"))
    with pytest.raises(TypeError, match="gamma"):
        KeyNormSoftmax(eye, eye, eye, gamma="1")


def test_a_wrong_closed_form_fails_the_derivations_checks(monkeypatch):
    """The quadrature check can fail: drop the key-norm factor from the closed form."""
    monkeypatch.setattr(derivation, "closed_form",
                        lambda Sigma, alpha, A, V, g=None: (V * Sigma * A, V * alpha))
    with pytest.raises(AssertionError):
        derivation.check_quadrature_d2_d3()


@pytest.mark.slow
def test_the_derivations_checks_pass():
    assert derivation.run_checks() == list(derivation.CHECKS)


def _installed():
    try:
        importlib.metadata.distribution("gaussian-pde-keynorm")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _installed() and os.environ.get("GAUSSIAN_PDE_REQUIRE_PLUGIN") != "1",
                    reason="pip install ./examples/keynorm_plugin registers the type")
def test_the_installed_distribution_registers_the_type():
    assert gp.ATTENTIONS.get("keynorm_softmax") is KeyNormSoftmax
    assert gp.get_attention("keynorm_softmax").name == "keynorm_softmax"


def test_a_batch_of_several_types_runs_each_kernel_compiled():
    """Key-norm heads among the package's types in one batch.

    Each kernel's trajectories run on the compiled path, and each equals its run alone.
    """
    rng = np.random.default_rng(5)
    atts = [_att(2, 0.5, seed=1), gp.Softmax.example(2, rng), _att(2, 1.5, seed=2),
            gp.L2.example(2, rng)]
    covs = np.stack([_spd(2, s) for s in range(4)])
    means = rng.standard_normal((4, 2))
    sol = gp.solve_batch(atts, covs, (0.0, 1.0), mean0s=means, t_eval=[0.5, 1.0])
    assert sol.path == "compiled" and len(sol) == 4
    for b, att in enumerate(atts):
        alone = gp.solve_batch(att, covs[b:b + 1], (0.0, 1.0), mean0s=means[b:b + 1],
                               t_eval=[0.5, 1.0])
        np.testing.assert_array_equal(sol.cov[b], alone.cov[0])
        np.testing.assert_array_equal(sol.mean[b], alone.mean[0])
        assert sol.nfev[b] == alone.nfev[0] and sol.message[b] == alone.message[0]
        assert str(sol.status[b]) == str(alone.status[0])


def test_a_sum_with_the_packages_heads_runs_compiled():
    """A MultiHead of a key-norm head and a softmax head has one compiled field.

    It is the sum of the two NumPy fields (with and without the mean); ``solve_batch``
    on the compiled path agrees with ``solve`` and with the closed-form moment equations
    integrated by SciPy.
    """
    d = 3
    rng = np.random.default_rng(6)
    Q = rng.standard_normal((2, d))
    att = gp.MultiHead([_att(d, 0.9, seed=3), gp.Softmax(Q, -Q, 0.5 * np.eye(d))])  # no blow-up
    cf = att.compiled_field()
    assert cf is not None and not cf.exact_jacobian
    L = np.linalg.cholesky(_spd(d, 8))
    mean = rng.standard_normal(d)
    for Z in (L, np.column_stack([L, mean])):
        m = Z.shape[1]
        out = np.empty(d * m)
        cf.rhs(cf.params, d, m, np.ascontiguousarray(Z).ravel(), out, np.empty(cf.ws_size))
        expect = sum(h.factor_rhs(L) for h in att.heads)
        if m > d:
            cov = L @ L.T
            dmean = sum(h.field_matrix(cov) @ mean + h.field_offset(mean, cov) for h in att.heads)
            expect = np.column_stack([expect, dmean])
        np.testing.assert_allclose(out.reshape(d, m), expect, rtol=1e-12, atol=1e-13)
    t_eval = np.array([0.5, 1.0])
    means = 0.5 * rng.standard_normal((2, d))
    covs = np.stack([_spd(d, s) for s in (9, 10)])
    bat = gp.solve_batch(att, covs, (0.0, 1.0), mean0s=means, t_eval=t_eval)
    assert bat.path == "compiled"
    for i in range(2):
        one = gp.solve(att, means[i], covs[i], (0.0, 1.0), t_eval=t_eval, rtol=1e-12,
                       atol=1e-14)
        ref_mean, ref_cov = _reference(att, means[i], covs[i], t_eval)
        assert str(bat.status[i]) == str(one.status) == "finished"
        np.testing.assert_allclose(bat.cov[i], one.cov, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(bat.mean[i], one.mean, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(one.cov, ref_cov, rtol=1e-8, atol=1e-11)
        np.testing.assert_allclose(one.mean, ref_mean, rtol=1e-8, atol=1e-11)
