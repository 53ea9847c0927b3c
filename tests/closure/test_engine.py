"""Gaussian closure engine: exactness on Gaussian-preserving types, sigmoid, masked."""

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import expit

import gaussian_pde as gp
from gaussian_pde._common.linalg import psd_sqrt
from gaussian_pde.attention import ATTENTIONS, names_with
from gaussian_pde.attention._masked import Masked
from gaussian_pde.attention._sigmoid import Sigmoid
from gaussian_pde.closure._engine import (
    AttentionField,
    closure_moment_rhs,
    logistic_normal_moments,
    solve_closure,
)
from gaussian_pde.closure._masked import masked_closure_rhs, solve_masked_closure
from tests._helpers import random_spd


def _weights(rng, d=2, s=0.6):
    return rng.standard_normal((3, d, d)) * s


def _types(rng, d=2):
    Q, K, V = _weights(rng, d)
    return [gp.Softmax(Q, K, V), gp.L2(Q, K, V), gp.Sinkhorn(Q, K, V),
            gp.MultiHead([gp.Softmax(Q, K, V), gp.L2(K, Q, V)])]


@pytest.mark.parametrize("i", range(4))
def test_closure_reproduces_exact_odes_from_definition(rng, i):
    # the field is computed from its definition with an inner Gauss-Hermite rule
    # (nonlinear in x), so this checks the closure engine, not the affine hooks;
    # 1e-8: with tr(cov) ~ 1 the inner rule with 30 nodes converged to ~1e-13 in our runs.
    # L2 kernels narrower than the spread need many more inner nodes (eigenvalue 5 of cov:
    # 3e-6 with 40 nodes): the reason this is a check, not a method
    att = _types(rng)[i]
    mean, cov = 0.5 * rng.standard_normal(2), 0.3 * random_spd(rng, 2) + 0.2 * np.eye(2)
    dm, dc = closure_moment_rhs(AttentionField(att, n_inner=30), mean, cov, n_per_dim=6)
    em, ec = att.moment_rhs(mean, cov)
    assert np.allclose(dm, em, rtol=1e-8, atol=1e-10)
    assert np.allclose(dc, ec, rtol=1e-8, atol=1e-10)


def test_closure_inner_rule_converges_and_can_fail(rng):
    # too few inner nodes gives a visible error for L2: the test above can fail
    Q, K, V = _weights(rng)
    att = gp.L2(Q, K, V)
    mean, cov = np.array([0.4, -0.2]), random_spd(rng, 2) + np.eye(2)
    exact = att.moment_rhs(mean, cov)[1]
    errs = [np.abs(closure_moment_rhs(AttentionField(att, n_inner=m), mean, cov, 10)[1] - exact).max()
            for m in (3, 8, 20)]
    assert errs[0] > 1e-6 and errs[2] < 1e-7 and errs[0] > errs[1] > errs[2]  # measured 5e-9


def test_affine_fields_exact_with_two_nodes(rng):
    for att in _types(rng, d=3):
        mean, cov = rng.standard_normal(3), random_spd(rng, 3, rank=2)
        dm, dc = closure_moment_rhs(att, mean, cov, n_per_dim=2)
        em, ec = att.moment_rhs(mean, cov)
        assert np.allclose(dm, em, atol=1e-12) and np.allclose(dc, 0.5 * (ec + ec.T), atol=1e-12)


def test_solve_closure_matches_gp_solve(rng):
    Q, K, V = _weights(rng)
    att = gp.Softmax(Q, K, V)
    mean, cov = np.array([0.3, 0.1]), random_spd(rng, 2) + 0.5 * np.eye(2)
    ref = gp.solve(att, mean, cov, (0, 1), t_eval=[0, 0.5, 1])
    sol = solve_closure(AttentionField(att, n_inner=16), mean, cov, (0, 1), t_eval=[0, 0.5, 1],
                        n_per_dim=8, rtol=1e-10, atol=1e-12)
    assert sol.status == "finished"
    assert np.allclose(sol.cov, ref.cov, rtol=1e-7, atol=1e-9)
    assert np.allclose(sol.mean, ref.mean, rtol=1e-7, atol=1e-9)


def test_solve_closure_blowup_time():
    # softmax, V = I, A = I, Sigma0 = I in d = 2: t* = 1/lambda_max(A + A^T) = 1/2 (docs/math.md 4.1)
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=1.0)
    sol = solve_closure(att, np.zeros(2), np.eye(2), (0, 1),
                        n_per_dim=3, rtol=1e-10, atol=1e-12)
    assert sol.status == "blowup"
    assert abs(sol.t_blowup - 0.5) < 1e-4


@pytest.mark.parametrize("m,s", [(0.0, 0.0), (1.0, 3.0), (-2.0, 20.0), (4.0, 0.5), (0.3, 60.0)])
def test_logistic_normal_moments_within_bound(m, s):
    e1, e2, bound = logistic_normal_moments(m, s, tol=1e-12)
    assert bound <= 1e-12

    def integrand(f):
        return lambda t: f(m + s * t) * np.exp(-t * t / 2) / np.sqrt(2 * np.pi)

    r1 = quad(integrand(expit), -12, 12, points=[-m / s] if s else None, epsabs=1e-14, limit=200)[0]
    r2 = quad(integrand(lambda z: expit(z) * expit(-z)), -12, 12,
              points=[-m / s] if s else None, epsabs=1e-14, limit=200)[0]
    # quad's own error is ~1e-14; 1e-11 leaves room for it and rounding
    assert abs(e1 - r1) < 1e-11 and abs(e2 - r2) < 1e-11


def test_sigmoid_closure_matches_inner_quadrature(rng):
    # independent check of the Stein reduction: the 2-D Gauss-Hermite average of
    # sigma(y^T A x + b) y with 40 nodes per dimension
    Q, K, V = _weights(rng)
    att = Sigmoid(Q, K, V, bias=-0.7)
    mean, cov = np.array([0.4, -0.1]), random_spd(rng, 2) + 0.3 * np.eye(2)
    x = rng.standard_normal((5, 2))
    from gaussian_pde.closure._quadrature import gauss_hermite_gaussian
    Y, w = gauss_hermite_gaussian(mean, cov, 40)
    ref = (expit(x @ att.A.T @ Y.T + att.bias) * w) @ Y @ att.V.T
    got = AttentionField(att)(mean, cov, x)
    assert np.allclose(got, ref, atol=1e-9)


def test_sigmoid_closure_quadrature_converges(rng):
    Q, K, V = _weights(rng)
    att = Sigmoid(Q, K, V)
    mean, cov = np.array([0.4, -0.1]), np.eye(2)
    ref = closure_moment_rhs(att, mean, cov, n_per_dim=30)[1]
    err = np.abs(closure_moment_rhs(att, mean, cov, n_per_dim=10)[1] - ref).max()
    assert err < 1e-8  # measured 1e-10 (n_per_dim 10 vs 30)


def test_masked_position_independent_equals_softmax(rng):
    Q, K, V = _weights(rng)
    mean, cov = np.array([0.2, 0.5]), random_spd(rng, 2) + 0.2 * np.eye(2)
    B = 4
    dm, dL = masked_closure_rhs(Masked(Q, K, V), np.tile(mean, (B, 1)),
                                np.tile(psd_sqrt(cov), (B, 1, 1)), n_per_dim=4)
    em, ec = gp.Softmax(Q, K, V).moment_rhs(mean, cov)
    L = psd_sqrt(cov)
    for b in range(B):
        assert np.allclose(dm[b], em, atol=1e-12)
        assert np.allclose(L @ dL[b].T + dL[b] @ L.T, ec, atol=1e-12)


def test_masked_position_dependent_differs_from_softmax(rng):
    Q, K, V = _weights(rng)
    cov = np.eye(2)
    means0 = np.array([[-1.0, 0.0], [1.0, 0.0]])
    sol = solve_masked_closure(Masked(Q, K, V), means0, cov, (0, 0.5), t_eval=[0, 0.5])
    # the first block sees only itself: it evolves as softmax of its own Gaussian
    ref = gp.solve(gp.Softmax(Q, K, V), means0[0], cov, (0, 0.5), t_eval=[0, 0.5])
    assert np.allclose(sol.means[-1, 0], ref.mean[-1], atol=1e-6)
    assert np.allclose(sol.covs[-1, 0], ref.cov[-1], atol=1e-6)
    assert not np.allclose(sol.means[-1, 1], ref.mean[-1], atol=1e-3)


@pytest.mark.parametrize("bad", [1, 41, 2.5])
def test_bad_quadrature(bad):
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises((ValueError, TypeError), match="n_per_dim"):
        closure_moment_rhs(att, np.zeros(2), np.eye(2), n_per_dim=bad)


def test_bad_inputs():
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="mean"):
        closure_moment_rhs(att, np.zeros(3), np.eye(2))
    with pytest.raises(TypeError, match="field"):
        closure_moment_rhs(lambda x: x, np.zeros(2), np.eye(2))
    with pytest.raises(TypeError, match="positions"):
        AttentionField(Masked(np.eye(2), np.eye(2), np.eye(2)))
    with pytest.raises(ValueError, match="covs0"):
        solve_masked_closure(Masked(np.eye(2), np.eye(2), np.eye(2)), np.zeros((3, 2)),
                             np.zeros((2, 2, 2)), (0, 1))
    with pytest.raises(ValueError, match="tol"):
        logistic_normal_moments(0.0, 1.0, tol=0.5)


def _blowing_up_softmax():
    # softmax, A = V = I in d = 2, Sigma0 = I: t* = 1/lambda_max(A + A^T) = 1/2 whatever
    # the mean (docs/math.md 4.1)
    return gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=1.0), np.array([0.1, -0.2])


def test_solve_closure_of_an_attention_is_gp_solve():
    """The default method hands an attention with a compiled field to gp.solve: the
    same run, field by field (statuses, messages, blow-up time, events), at the
    closure's tolerances and budget."""
    att, mean0 = _blowing_up_softmax()
    sol = solve_closure(att, mean0, np.eye(2), (0, 1))
    ref = gp.solve(att, mean0, np.eye(2), (0, 1), rtol=1e-8, atol=1e-10, max_nfev=50_000)
    assert sol.status == ref.status == "blowup"
    assert sol.message == ref.message and sol.nfev == ref.nfev
    assert sol.t_blowup == ref.t_blowup and abs(sol.t_blowup - 0.5) < 1e-8
    assert sol.t_events.keys() == ref.t_events.keys() == {"blowup"}
    np.testing.assert_array_equal(sol.t_events["blowup"], ref.t_events["blowup"])
    np.testing.assert_array_equal(sol.t, ref.t)
    np.testing.assert_array_equal(sol.cov, ref.cov)
    np.testing.assert_array_equal(sol.mean, ref.mean)
    # with the steady-state and rank events on, their keys as in gp.solve
    sol = solve_closure(att, mean0, np.diag([1.0, 1e-6]), (0, 0.2), steady_tol=1e-3,
                        rank_tol=1e-4)
    ref = gp.solve(att, mean0, np.diag([1.0, 1e-6]), (0, 0.2), steady_tol=1e-3,
                   rank_tol=1e-4, rtol=1e-8, atol=1e-10, max_nfev=50_000)
    assert sol.t_events.keys() == ref.t_events.keys() == {"blowup", "steady", "rank_collapse"}
    assert sol.status == ref.status and sol.message == ref.message


def _refuse_gp_solve(monkeypatch):
    import gaussian_pde.closure._engine as engine

    def refuse(*args, **kwargs):
        raise AssertionError("gp.solve was called")

    monkeypatch.setattr(engine, "solve", refuse)


def _cov_past_two(t, mean, cov):
    return np.trace(cov) - 4.0


_cov_past_two.terminal = True


@pytest.mark.parametrize("options", [dict(method="RK45"), dict(method="DOP853"),
                                     dict(events=[_cov_past_two]), dict(first_step=1e-3)],
                         ids=["RK45", "DOP853", "events", "first_step"])
def test_named_method_events_or_first_step_keep_the_event_loop(monkeypatch, options):
    """A named SciPy method, user events or first_step integrate the closure in the
    event loop (gp.solve refused here), with the same verdict: blow-up at t* = 1/2 (or
    the user event, tr(cov) = 4, at t = 1/4: tr = 2/(1 - 2t) for this Riccati flow)."""
    att, mean0 = _blowing_up_softmax()
    _refuse_gp_solve(monkeypatch)
    sol = solve_closure(att, mean0, np.eye(2), (0, 1), **options)
    if "events" in options:
        assert sol.status == "event" and abs(sol.t_final - 0.25) < 1e-7
        assert sol.t_events.keys() == {"blowup", "_cov_past_two"}
    else:
        assert sol.status == "blowup" and abs(sol.t_blowup - 0.5) < 1e-6
    with pytest.raises(AssertionError, match="gp.solve was called"):
        solve_closure(att, mean0, np.eye(2), (0, 1))


def test_closure_fields_keep_the_event_loop(monkeypatch, rng):
    """Fields that are not exactly an attention's affine field (an inner rule, a sum
    with a feed-forward map, sigmoid) integrate the closure, never gp.solve."""
    from gaussian_pde.closure._blocks import MLP

    Q, K, V = _weights(rng)
    att = gp.Softmax(Q, K, V)
    mlp = MLP(0.5 * rng.standard_normal((3, 2)), np.zeros(3), 0.5 * rng.standard_normal((2, 3)),
              np.zeros(2))
    _refuse_gp_solve(monkeypatch)
    for field in (AttentionField(att, n_inner=6), att + mlp, Sigmoid(Q, K, V)):
        sol = solve_closure(field, np.array([0.2, 0.1]), np.eye(2), (0, 0.3), n_per_dim=4)
        assert sol.status == "finished" and np.isfinite(sol.cov_final).all()


@pytest.mark.parametrize("name", names_with(gaussian_preserving=True))
def test_every_gaussian_preserving_type_closes_through_gp_solve(name):
    """Every registered Gaussian-preserving type with a compiled field: the closure's
    default is gp.solve's run, and the event loop's RK45 closure of the same affine field
    agrees with it to the tolerances (rtol 1e-8: measured below 2e-9 relative)."""
    ex = ATTENTIONS[name].example_setting()
    if ex is None or callable(ex["mean0"]) or ex["attention"].compiled_field() is None:
        pytest.skip(f"{name}: no example with a fixed mean and a compiled field")
    att, mean0, cov0 = ex["attention"], ex["mean0"], ex["cov0"]
    sol = solve_closure(att, mean0, cov0, (0, 0.2), t_eval=[0, 0.2])
    ref = gp.solve(att, mean0, cov0, (0, 0.2), t_eval=[0, 0.2], rtol=1e-8, atol=1e-10,
                   max_nfev=50_000)
    np.testing.assert_array_equal(sol.cov, ref.cov)
    np.testing.assert_array_equal(sol.mean, ref.mean)
    loop = solve_closure(att, mean0, cov0, (0, 0.2), t_eval=[0, 0.2], method="RK45")
    assert loop.status == sol.status == "finished"
    np.testing.assert_allclose(loop.cov, sol.cov, rtol=2e-8, atol=2e-8 * np.abs(sol.cov).max())
    np.testing.assert_allclose(loop.mean, sol.mean, rtol=2e-8, atol=1e-9)
