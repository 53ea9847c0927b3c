"""Discrete depth: exact affine maps, continuous limit, particles, bad input."""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.closure._blocks import MLP, Affine
from gaussian_pde.closure._depth import Stack, propagate_gaussian, propagate_particles
from gaussian_pde.particles._simulate import sample_gaussian
from tests._helpers import random_spd


def test_affine_maps_exact(rng):
    W, c = 0.3 * rng.standard_normal((2, 2)), rng.standard_normal(2)
    mean, cov = rng.standard_normal(2), random_spd(rng, 2)
    h = 0.2
    r = propagate_gaussian(Stack(Affine(W, c), n_layers=3, h=h, mode="residual"), mean, cov)
    P = np.eye(2) + h * W
    m, C = mean, cov
    for _ in range(3):
        m, C = m + h * (c + W @ m), P @ C @ P.T
    assert r.exact.all() and np.allclose(r.mean[-1], m) and np.allclose(r.cov[-1], C)
    n = propagate_gaussian(Stack([Affine(W, c), Affine(2 * W, c)], h=h, mode="none"), mean, cov)
    m1, C1 = c + W @ mean, W @ cov @ W.T
    assert np.allclose(n.mean[-1], c + 2 * W @ m1) and np.allclose(n.cov[-1], 4 * W @ C1 @ W.T)


def test_continuous_matches_solve_and_residual_converges(rng):
    att = gp.Softmax(*(0.5 * rng.standard_normal((3, 2, 2))))
    mean, cov = np.array([0.2, 0.1]), random_spd(rng, 2) + 0.3 * np.eye(2)
    ref = gp.solve(att, mean, cov, (0, 1), t_eval=[1.0])
    cont = propagate_gaussian(Stack(att, n_layers=4, h=0.25, mode="continuous"), mean, cov)
    assert np.allclose(cont.cov[-1], ref.cov[-1], rtol=1e-6)
    errs = [np.abs(propagate_gaussian(Stack(att, n_layers=k, h=1 / k), mean, cov).cov[-1]
                   - ref.cov[-1]).max() for k in (10, 40)]
    assert errs[1] < errs[0] / 3  # Euler: first order, ratio ~4


def test_particles_all_modes(rng):
    mlp = MLP(rng.standard_normal((4, 2)), np.zeros(4), 0.3 * rng.standard_normal((2, 4)), np.zeros(2))
    att = gp.Softmax(*(0.5 * rng.standard_normal((3, 2, 2)))) + mlp
    x0 = sample_gaussian(np.zeros(2), np.eye(2), 400, seed=0)
    for mode in ("continuous", "residual", "none"):
        st = Stack(att, n_layers=3, h=0.2, mode=mode)
        g = propagate_gaussian(st, np.zeros(2), np.eye(2))
        p = propagate_particles(st, x0, steps_per_layer=2)
        assert not g.exact.any()
        # n = 400: Monte Carlo error of the covariance ~ 0.1; closure error measured < 0.05 here
        assert np.abs(g.cov[-1] - p.cov[-1]).max() < 0.3 * max(1, np.abs(g.cov[-1]).max())


def test_bad_input():
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="`h`"):
        Stack(att, n_layers=2, h=0.0)
    with pytest.raises(ValueError, match="`h`"):
        Stack(att, n_layers=2, h=-1.0)
    with pytest.raises(ValueError, match="n_layers"):
        Stack(att, n_layers=0)
    with pytest.raises(ValueError, match="layers"):
        Stack([], h=1.0)
    with pytest.raises(ValueError, match=r"layers\[1\]"):
        Stack([att, Affine(np.eye(3))])
    with pytest.raises(ValueError, match="mode"):
        Stack(att, n_layers=1, mode="post")
    with pytest.raises(ValueError, match="n_per_dim"):
        propagate_gaussian(Stack(att, n_layers=1), np.zeros(2), np.eye(2), n_per_dim=100)


def test_depth_options_are_checked_like_the_solvers():
    I2 = np.eye(2)
    st = gp.Stack(gp.Softmax(I2, I2, I2), n_layers=2, h=0.1)
    with pytest.raises(ValueError, match="`blowup_threshold` must be greater than 1"):
        gp.propagate_gaussian(st, np.zeros(2), I2, blowup_threshold=0.5)
    x0 = gp.sample_gaussian(np.zeros(2), I2, 50, seed=0)
    with pytest.raises(ValueError, match="`n_directions`"):
        gp.propagate_particles(st, x0, n_directions=0)
    with pytest.raises(ValueError, match="`blowup_threshold`"):
        gp.propagate_particles(st, x0, blowup_threshold=1.0)


def _finite(sol):
    return all(a is None or np.all(np.isfinite(a))
               for a in (sol.depth, sol.mean, sol.cov, sol.x_final, sol.non_gaussianity,
                         sol.block_mean, sol.block_cov))


def test_particles_leaving_the_range_end_failed_and_finite_in_every_mode():
    """Tokens of 1e150 under a growing field: a Runge-Kutta stage of the continuous mode
    overflowed into the velocity's own check of its tokens (a ValueError from inside the
    stack); finite tokens whose covariance overflows gave inf moments. Every mode now
    ends failed at the last layer with finite moments, with a message."""
    rng = np.random.default_rng(0)
    Q, K = 0.5 * rng.standard_normal((2, 2)), 0.5 * rng.standard_normal((2, 2))
    x0 = 1e150 * rng.standard_normal((12, 2))
    for mode in ("continuous", "residual", "none"):
        stack = Stack(gp.Softmax(Q, K, 1e3 * np.eye(2)), n_layers=100, h=1.0, mode=mode)
        sol = propagate_particles(stack, x0, blowup_threshold=1e300)
        assert sol.status == "failed" and sol.message
        assert _finite(sol), mode
        assert sol.mean.shape[0] == sol.depth.shape[0] >= 1


def test_continuous_stack_whose_threshold_passes_float64():
    """A contracting continuous stack (x' = -2x) with blowup_threshold = 1e307: the
    threshold of a later layer relative to its own start, 1e307 tr0 / tr, passed float64
    and the closure refused it (a ValueError about `blowup_threshold` from inside the
    stack); it is now capped, and the stack runs to its end."""
    stack = Stack(Affine(-2 * np.eye(2)), n_layers=4, h=1.0, mode="continuous")
    sol = propagate_gaussian(stack, np.zeros(2), np.eye(2), blowup_threshold=1e307)
    assert sol.status == "finished", sol.message
    assert _finite(sol)
    np.testing.assert_allclose(np.trace(sol.cov[-1]), 2 * np.exp(-16), rtol=1e-6)


def test_continuous_attention_layers_match_the_exact_solution():
    """Softmax with V = I, continuous mode: the covariance after every layer against
    gp.exact_covariance (docs/math.md 4.1) up to 0.8 t*, relative error below 1e-10 at
    solver tolerances rtol 1e-10, atol 1e-12 (measured 3e-12 with the compiled engine,
    6e-12 with the closure's RK45)."""
    Q = np.array([[0.8, 0.3], [-0.2, 0.6]])
    K = np.array([[0.5, -0.4], [0.3, 0.9]])
    att = gp.Softmax(Q, K, np.eye(2))
    mean0, cov0 = np.array([0.2, -0.1]), np.array([[1.0, 0.3], [0.3, 0.5]])
    t_end = 0.8 * gp.blowup_time(att, cov0)
    sol = propagate_gaussian(Stack(att, n_layers=4, h=t_end / 4, mode="continuous"), mean0,
                             cov0, rtol=1e-10, atol=1e-12)
    assert sol.status == "finished" and sol.exact.all()
    exact = gp.exact_covariance(att, cov0, sol.depth)
    assert np.abs(sol.cov - exact).max() < 1e-10 * np.abs(exact).max()
    # the mean after each layer: gp.solve over the whole depth (the layers are one ODE)
    ref = gp.solve(att, mean0, cov0, (0, t_end), t_eval=sol.depth, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sol.mean, ref.mean, rtol=1e-9, atol=1e-11)


def test_continuous_blowup_inside_an_attention_layer_is_gp_solves():
    """Softmax, A = V = I, Sigma0 = I in d = 2 blows up at t* = 1/2 (docs/math.md 4.1),
    inside layer 2 of h = 0.3: the stack's verdict is gp.solve's on that layer, from the
    state after layer 1 with the threshold relative to it (blowup_threshold tr0 / tr + 1,
    the same absolute level as the stack's)."""
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=1.0)
    sol = propagate_gaussian(Stack(att, n_layers=4, h=0.3, mode="continuous"), np.zeros(2),
                             np.eye(2))
    assert sol.status == "blowup" and sol.message.startswith("layer 2: finite-time blow-up")
    assert sol.mean.shape[0] == 2 and abs(sol.t_blowup - 0.5) < 1e-8
    rel = 1e8 * 2.0 / np.trace(sol.cov[1]) + 1.0
    ref = gp.solve(att, sol.mean[1], sol.cov[1], (0, 0.3), t_eval=[0, 0.3], rtol=1e-8,
                   atol=1e-10, blowup_threshold=rel, max_nfev=50_000)
    assert sol.t_blowup == 0.3 + ref.t_blowup
    assert sol.message == f"layer 2: {ref.message}"


def test_contracting_attention_stack_whose_threshold_passes_float64():
    """Softmax with V = -I contracts: with blowup_threshold = 1e307 the later layers'
    relative thresholds are capped below float64's largest number, and the stack equals
    gp.solve over the whole depth (one autonomous ODE) to the solvers' tolerances."""
    att = gp.Softmax(np.eye(2), np.eye(2), -np.eye(2))
    mean0 = np.array([0.5, -0.3])
    sol = propagate_gaussian(Stack(att, n_layers=4, h=1.0, mode="continuous"), mean0,
                             np.eye(2), blowup_threshold=1e307)
    assert sol.status == "finished", sol.message
    ref = gp.solve(att, mean0, np.eye(2), (0, 4), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sol.cov[-1], ref.cov_final, rtol=1e-8)
    np.testing.assert_allclose(sol.mean[-1], ref.mean_final, rtol=1e-8, atol=1e-10)
