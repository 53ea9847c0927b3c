"""Reference problems with exact solutions (docs/math.md section 4).

Tolerances are in the units of the solver: ``solve`` runs with rtol = 1e-10 (its default)
and the checks ask 1e-8 relative on the covariance, 1e-6 relative on the blow-up time
(the package's accuracy targets).
"""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde._exact import (
    blowup_time,
    exact_covariance,
    expm_stack,
    linear_mean,
    scalar_solution,
)
from tests._helpers import random_spd


def _softmax_identity(rng, d, k):
    return gp.Softmax(rng.standard_normal((k, d)), rng.standard_normal((k, d)), np.eye(d))


def _rel(a, b):
    return np.linalg.norm(a - b, axis=(-2, -1)) / np.linalg.norm(b, axis=(-2, -1))


@pytest.mark.parametrize("d", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", range(4))
def test_softmax_identity_covariance_and_blowup(d, seed):
    rng = np.random.default_rng(seed)
    att = _softmax_identity(rng, d, max(1, d - 1))
    cov0 = random_spd(rng, d)
    t_star = blowup_time(att, cov0)
    horizon = 0.9 * t_star if np.isfinite(t_star) else 5.0
    t_eval = np.linspace(0.0, horizon, 25)
    sol = gp.solve(att, None, cov0, (0.0, horizon), t_eval=t_eval)
    assert sol.status == "finished"
    assert np.max(_rel(sol.cov, exact_covariance(att, cov0, t_eval))) < 1e-8
    if np.isfinite(t_star):
        blow = gp.solve(att, None, cov0, (0.0, 2 * t_star))
        assert blow.status == "blowup"
        assert abs(blow.t_blowup - t_star) / t_star < 1e-6


def test_rank_deficient_initial_covariance_exact(rng):
    """Singular Sigma_0: the exact formula in square-root form and the solver agree."""
    d = 4
    att = _softmax_identity(rng, d, 2)
    cov0 = random_spd(rng, d, rank=2)
    t_star = blowup_time(att, cov0)
    horizon = 0.8 * t_star if np.isfinite(t_star) else 3.0
    t_eval = np.linspace(0, horizon, 9)
    sol = gp.solve(att, None, cov0, (0, horizon), t_eval=t_eval)
    np.testing.assert_allclose(sol.cov, exact_covariance(att, cov0, t_eval), rtol=1e-8,
                               atol=1e-10 * np.abs(cov0).max())
    assert all(np.linalg.matrix_rank(c, tol=1e-8 * np.abs(c).max()) == 2 for c in sol.cov)


def test_multihead_identity_exact(rng):
    d = 3
    heads = [_softmax_identity(rng, d, 1) for _ in range(3)]
    att = gp.MultiHead(heads)
    cov0 = random_spd(rng, d)
    t_star = blowup_time(att, cov0)
    horizon = 0.9 * t_star if np.isfinite(t_star) else 3.0
    sol = gp.solve(att, None, cov0, (0, horizon), t_eval=[horizon])
    assert _rel(sol.cov[-1], exact_covariance(att, cov0, horizon)) < 1e-8


def test_blowup_time_matches_hand_computation():
    """A = scale K^T Q = diag(1, -1)/2 and Sigma_0 = I: lambda_max(A + A^T) = 1, t* = 1."""
    att = gp.Softmax(np.eye(2), np.diag([1.0, -1.0]), np.eye(2), scale=0.5)
    assert blowup_time(att, np.eye(2)) == pytest.approx(1.0, rel=1e-15)
    assert blowup_time(att, np.diag([0.0, 1.0])) == np.inf  # only the contracting direction


def test_exact_rejects_types_without_closed_form(rng):
    Q = rng.standard_normal((2, 2))
    with pytest.raises(ValueError, match="closed-form"):
        exact_covariance(gp.L2(Q, Q, np.eye(2)), np.eye(2), 0.1)
    with pytest.raises(ValueError, match="V != I"):
        blowup_time(gp.Softmax(Q, Q, 2 * np.eye(2)), np.eye(2))
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=0.5)
    with pytest.raises(ValueError, match="blow-up time"):
        exact_covariance(att, np.eye(2), 1.5)


SCALAR_CASES = [(0.7, 0.9, 1.3), (0.7, -0.9, 0.8), (1.2, 0.5, -0.6), (0.0, 0.8, 1.0)]


@pytest.mark.parametrize("cls", [gp.Softmax, gp.L2, gp.Sinkhorn])
@pytest.mark.parametrize("q, k, v", SCALAR_CASES)
def test_scalar_closed_forms(cls, q, k, v):
    att = cls([[q]], [[k]], [[v]], scale=0.8)
    t = np.linspace(0, 0.3, 7)
    sol = gp.solve(att, [0.4], [[0.5]], (0, 0.3), t_eval=t, rtol=1e-12, atol=1e-14)
    mean, var = scalar_solution(att, 0.4, 0.5, t)
    np.testing.assert_allclose(sol.cov[:, 0, 0], var, rtol=1e-10)
    np.testing.assert_allclose(sol.mean[:, 0], mean, rtol=1e-10)


def test_scalar_closed_form_multihead():
    att = gp.MultiHead([gp.Softmax([[0.5]], [[1.0]], [[1.0]]), gp.Softmax([[1.0]], [[-0.2]], [[2.0]])])
    t = np.linspace(0, 0.5, 5)
    sol = gp.solve(att, [1.0], [[0.3]], (0, 0.5), t_eval=t, rtol=1e-12, atol=1e-14)
    mean, var = scalar_solution(att, 1.0, 0.3, t)
    np.testing.assert_allclose(sol.cov[:, 0, 0], var, rtol=1e-10)
    np.testing.assert_allclose(sol.mean[:, 0], mean, rtol=1e-10)


def test_scalar_l2_long_horizon_lambert_branch():
    """L2 in d = 1 grows exponentially for large variance: check far into that regime."""
    att = gp.L2([[1.0]], [[1.0]], [[1.0]], scale=1.0)
    t = np.array([0.0, 5.0, 20.0])
    sol = gp.solve(att, None, [[0.5]], (0, 20.0), t_eval=t, rtol=1e-12, atol=1e-14)
    _, var = scalar_solution(att, 1.0, 0.5, t)
    np.testing.assert_allclose(sol.cov[:, 0, 0], var, rtol=1e-9)


@pytest.mark.parametrize("count", [3, 40])        # one by one, and as one stack
def test_expm_stack_matches_scipy(count):
    """The NumPy matrix exponential against scipy.linalg.expm, norms from 1e-6 to 50,
    normal and far from normal (a Jordan-like block), zero matrices included."""
    from scipy.linalg import expm

    rng = np.random.default_rng(2)
    for scale in (1e-6, 1e-2, 1.0, 7.0, 50.0):
        X = scale * rng.standard_normal((count, 4, 4))
        X[0] = 0.0
        E, ref = expm_stack(X), expm(X)
        err = np.linalg.norm(E - ref, axis=(1, 2)) / np.linalg.norm(ref, axis=(1, 2))
        assert err.max() < 1e-10 * max(scale, 1.0), (scale, err.max())
        np.testing.assert_array_equal(E[0], np.eye(4))
    J = np.array([[1.0, 100.0, 0.0], [0.0, 1.0, 100.0], [0.0, 0.0, 1.0]])
    np.testing.assert_allclose(expm_stack(J[None])[0], expm(J), rtol=1e-13)


def test_linear_mean_solves_its_equation(rng):
    """alpha(t) = e^{tN} alpha_0: alpha(0) = alpha_0, and alpha' = N alpha by central
    differences; a rotation generator keeps |alpha| exactly."""
    N = rng.standard_normal((3, 3))
    a0 = rng.standard_normal(3)
    h = 1e-4
    a = linear_mean(N, a0, [0.0, 0.7 - h, 0.7, 0.7 + h])
    np.testing.assert_array_equal(a[0], a0)
    np.testing.assert_allclose((a[3] - a[1]) / (2 * h), N @ a[2], rtol=1e-7)
    W = np.array([[0.0, -2.0], [2.0, 0.0]])
    rot = linear_mean(W, np.array([1.0, 0.0]), np.linspace(0, 10, 25))
    np.testing.assert_allclose(np.linalg.norm(rot, axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(rot[:, 0], np.cos(2 * np.linspace(0, 10, 25)), atol=1e-12)


def test_linear_mean_against_fifty_digits():
    """exp(tN) alpha_0 against mpmath's matrix exponential at 50 digits, for a generator
    with decaying and growing modes, to t = 1000 (the mean spans 1e-105 to 1e124 there):
    within 1e-11 relative, through up to 13 squarings."""
    mp = pytest.importorskip("mpmath")
    mp.mp.dps = 50
    rng = np.random.default_rng(1)
    checked = 0
    for _ in range(3):
        N = rng.standard_normal((4, 4)) / 2 - 0.5 * np.eye(4)
        a0 = rng.standard_normal(4)
        times = np.array([10.0, 100.0, 1000.0])
        ours = linear_mean(N, a0, times)
        for t, a in zip(times, ours):
            E = mp.expm(mp.matrix((t * N).tolist()))
            exact = E * mp.matrix(a0.tolist())        # the product at 50 digits too
            size = mp.norm(exact)
            if size < 1e300:
                err = mp.norm(mp.matrix(a.tolist()) - exact)
                assert err <= 1e-11 * size, (t, float(err / size))
                checked += 1
    assert checked >= 6


@pytest.mark.parametrize("t", [0.5 + 0j, np.array([0.1, 0.2 + 0j]), [0.1, 0.2j], True,
                               np.array([False, True])])
def test_exact_solutions_refuse_complex_or_boolean_times(t):
    att = gp.Softmax(np.eye(2), -np.eye(2), np.eye(2))
    with pytest.raises(TypeError, match="`t`"):
        exact_covariance(att, np.eye(2), t)
    att1 = gp.Softmax([[1.0]], [[-1.0]], [[1.0]])
    with pytest.raises(TypeError, match="`t`"):
        scalar_solution(att1, 0.0, 1.0, t)
