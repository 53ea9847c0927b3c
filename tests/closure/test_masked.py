"""Masked (causal) attention in discrete depth: block-causal closure and particles."""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde._common.gaussian import bures_wasserstein
from gaussian_pde.attention._masked import Masked
from gaussian_pde.closure._depth import Stack, propagate_gaussian, propagate_particles
from gaussian_pde.closure._masked import block_positions
from gaussian_pde.particles._simulate import sample_gaussian
from tests._helpers import random_spd

MODES = ("continuous", "residual", "none")


@pytest.mark.parametrize("mode", MODES)
def test_position_independent_equals_softmax_stack(rng, mode):
    Q, K, V = 0.6 * rng.standard_normal((3, 2, 2))
    mean, cov = np.array([0.3, -0.2]), random_spd(rng, 2) + 0.2 * np.eye(2)
    h = 0.3
    st = Stack([Masked(Q, K, V), Masked(Q, K, 0.5 * V), Masked(Q, K, V)], h=h, mode=mode)
    soft_stack = Stack([gp.Softmax(Q, K, V), gp.Softmax(Q, K, 0.5 * V), gp.Softmax(Q, K, V)],
                       h=h, mode=mode)
    soft = propagate_gaussian(soft_stack, mean, cov)
    g = propagate_gaussian(st, mean, cov, n_blocks=4)
    # discrete modes: the block fields are affine, the node push is exact up to rounding;
    # continuous: two ODE solvers at rtol 1e-8
    tol = 1e-6 if mode == "continuous" else 1e-10
    assert g.status == "finished" and g.exact.all()
    assert g.block_mean.shape == (4, 4, 2) and g.block_cov.shape == (4, 4, 2, 2)
    for b in range(4):
        assert np.allclose(g.block_mean[:, b], soft.mean, rtol=0, atol=tol)
        assert np.allclose(g.block_cov[:, b], soft.cov, rtol=0, atol=tol)
    assert np.allclose(g.cov, soft.cov, rtol=0, atol=tol)
    # particles: with one block every token sees every token, so the masked particle
    # system is the softmax one exactly
    x0 = sample_gaussian(mean, cov, 60, seed=1)
    p = propagate_particles(st, x0, n_blocks=1, steps_per_layer=2)
    q = propagate_particles(soft_stack, x0, steps_per_layer=2)
    assert np.allclose(p.x_final, q.x_final, rtol=0, atol=1e-10)
    assert np.allclose(p.block_cov[:, 0], q.cov, rtol=0, atol=1e-10)


def test_first_block_is_softmax_of_itself(rng):
    Q, K, V = 0.6 * rng.standard_normal((3, 2, 2))
    means0 = np.array([[-1.0, 0.0], [1.0, 0.5]])
    for mode in ("residual", "none"):
        g = propagate_gaussian(Stack(Masked(Q, K, V), n_layers=2, h=0.4, mode=mode), means0,
                               np.eye(2))
        ref = propagate_gaussian(Stack(gp.Softmax(Q, K, V), n_layers=2, h=0.4, mode=mode),
                                 means0[0], np.eye(2))
        assert np.allclose(g.block_cov[:, 0], ref.cov, atol=1e-10)
        assert not g.exact.any()
        assert not np.allclose(g.block_mean[-1, 1], ref.mean[-1], atol=1e-3)


# Measured with Q scaled 0.5 (rng 3), V = I + 0.3 G, alpha(tau) = (2 tau - 1, tau / 2),
# B = 4, L = 3, n = 2000, seeds 0 and 1, n_per_dim 10 (20 changes the closure by < 1e-10).
# Largest block Bures-W2 between closure and particles, per layer (input, 1, 2, 3):
#   residual (h = 0.5): [0.067 0.100 0.150 0.227], [0.079 0.120 0.196 0.325]
#   none:               [0.067 0.078 0.072 0.075], [0.079 0.096 0.107 0.119]
# The input value is the Monte Carlo floor; at n = 8000 (Q scale 1) the residual error
# roughly halves, so it is dominated by Monte Carlo amplified through the layers.
# Bounds: twice the largest measured value.
@pytest.mark.parametrize("mode,h,bound", [("residual", 0.5, 0.65), ("none", 1.0, 0.25)])
def test_closure_matches_particles_position_dependent(mode, h, bound):
    rng = np.random.default_rng(3)
    Q, K, G = rng.standard_normal((3, 2, 2))
    att = Masked(0.5 * Q, K, np.eye(2) + 0.3 * G)
    mean0 = lambda tau: np.stack([2 * tau - 1, 0.5 * tau], 1)  # noqa: E731
    cov0 = np.array([[0.5, 0.1], [0.1, 0.3]])
    B, n = 4, 2000
    st = Stack(att, n_layers=3, h=h, mode=mode)
    g = propagate_gaussian(st, mean0, cov0, n_blocks=B, n_per_dim=10)
    assert g.status == "finished" and not g.exact.any()
    pos = block_positions(n, B)
    for seed in (0, 1):
        x0 = sample_gaussian(mean0, cov0, n, seed=seed, positions=pos)
        p = propagate_particles(st, x0, n_blocks=B)
        w = max(bures_wasserstein(g.block_mean[k, b], g.block_cov[k, b],
                                  p.block_mean[k, b], p.block_cov[k, b])
                for k in range(4) for b in range(B))
        assert w < bound


def test_bad_input():
    att = Masked(np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="`h`"):
        Stack(att, n_layers=2, h=0.0)
    with pytest.raises(ValueError, match="`h`"):
        Stack(att, n_layers=2, h=-0.5)
    with pytest.raises(ValueError, match="n_layers"):
        Stack(att, n_layers=0)
    with pytest.raises(ValueError, match=r"layers\[1\]"):
        Stack([att, gp.Softmax(np.eye(2), np.eye(2), np.eye(2))])
    st = Stack(att, n_layers=2, h=0.5)
    with pytest.raises(ValueError, match="n_blocks"):
        propagate_gaussian(st, np.zeros(2), np.eye(2), n_blocks=0)
    with pytest.raises(TypeError, match="n_blocks"):
        propagate_gaussian(st, np.zeros(2), np.eye(2), n_blocks=2.5)
    with pytest.raises(ValueError, match="n_blocks"):
        propagate_gaussian(st, np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match="n_blocks"):
        propagate_gaussian(st, np.zeros((3, 2)), np.eye(2), n_blocks=2)
    with pytest.raises(ValueError, match="cov0"):
        propagate_gaussian(st, np.zeros((3, 2)), np.tile(np.eye(2), (2, 1, 1)))
    with pytest.raises(ValueError, match="n_blocks"):
        propagate_particles(st, np.zeros((10, 2)), n_blocks=0)
    with pytest.raises(ValueError, match="n_blocks"):
        propagate_particles(Stack(gp.Softmax(np.eye(2), np.eye(2), np.eye(2)), n_layers=1),
                            np.zeros((10, 2)), n_blocks=2)
    with pytest.raises(ValueError, match="positions"):
        propagate_particles(st, np.zeros((10, 2)), positions=np.linspace(0, 1, 9))
    with pytest.raises(ValueError, match="positions"):
        propagate_particles(st, np.zeros((10, 2)), positions=np.full(10, 0.9), n_blocks=2)
    with pytest.raises(ValueError, match="n_blocks"):
        propagate_particles(st, np.zeros((10, 2)), n_blocks=3)  # 10 tokens, 3 blocks


def test_continuous_blowup_time_inside_a_layer():
    """Position-independent masked data is softmax data; with V = I a blow-up inside the
    second continuous layer must be dated at the exact softmax t* (docs/math.md section 4.1)."""
    from gaussian_pde._exact import blowup_time

    Q, K = np.array([[1.0, 0.5]]), np.array([[0.8, -0.2]])
    cov = np.array([[1.0, 0.3], [0.3, 0.6]])
    t_star = blowup_time(gp.Softmax(Q, K, np.eye(2)), cov)       # 0.5856...
    st = Stack(Masked(Q, K, np.eye(2)), n_layers=4, h=0.4, mode="continuous")
    g = propagate_gaussian(st, np.zeros(2), cov, n_blocks=3)
    assert g.status == "blowup" and "layer 2" in g.message
    assert g.t_blowup == pytest.approx(t_star, rel=1e-6)
    soft = propagate_gaussian(Stack(gp.Softmax(Q, K, np.eye(2)), n_layers=4, h=0.4,
                                    mode="continuous"), np.zeros(2), cov)
    assert soft.t_blowup == pytest.approx(t_star, rel=1e-6)


def _masked_weights():
    rng = np.random.default_rng(0)
    Q, K = 0.5 * rng.standard_normal((2, 2)), 0.5 * rng.standard_normal((2, 2))
    return Q, K, rng.standard_normal((2, 2)) / np.sqrt(2)


def _assert_finite(sol):
    for a in (sol.t, sol.means, sol.covs, sol.mixture_mean, sol.mixture_cov):
        assert np.all(np.isfinite(a))


def test_masked_closure_whose_logits_pass_the_rounding_ends_failed():
    """Block means of 1e150 (or covariances of 1e150, 1e300) give logits that differ
    between blocks by 1e298 and more: the weights switch like an argmax across layers
    below the resolution of the nodes, and the steps used to chatter to nothing (max_nfev
    after minutes, ~1e-139 of t_span). The run now stops at once with status failed,
    finite arrays and a message; a run whose logit differences grow past 1/eps
    (V = 300 I) stops there, later."""
    from tests._helpers import run_within

    Q, K, V = _masked_weights()
    m0 = np.array([[0.0, 0.0], [0.5, 0.1]])
    for att, means0, covs0, later in (
            (Masked(Q, K, V), 1e150 * m0, np.eye(2), False),
            (Masked(Q, K, V), 1e150 * m0, 1e150 * np.eye(2), False),
            (Masked(Q, K, 300 * np.eye(2)), m0, np.eye(2), True)):
        sol = run_within(60, gp.solve_masked_closure, att, means0, covs0, (0, 10))
        assert sol.status == "failed" and "logits differ" in sol.message, sol.message
        _assert_finite(sol)
        assert (sol.t_final > 0) == later
    # one covariance of 1e300 shared by the blocks: the blocks' logits differ little, the
    # field overflows in the first trial steps: failed at once, finite
    sol = run_within(60, gp.solve_masked_closure, Masked(Q, K, V), m0, 1e300 * np.eye(2),
                     (0, 10))
    assert sol.status == "failed" and sol.t_final == 0.0
    _assert_finite(sol)


def test_masked_closure_refuses_blocks_whose_mixture_overflows():
    """Block means of 1e300: the covariance of the whole sequence (returned, and the
    events' reference) overflows at t = 0, so the input is refused by name."""
    Q, K, V = _masked_weights()
    m0 = 1e300 * np.array([[0.0, 0.0], [0.5, 0.1]])
    with pytest.raises(ValueError, match="`means0` and `covs0` are too large"):
        gp.solve_masked_closure(Masked(Q, K, V), m0, np.eye(2), (0, 1))
    stack = Stack(Masked(Q, K, V), n_layers=2, h=0.5, mode="residual")
    with pytest.raises(ValueError, match="`mean0` and `cov0` are too large"):
        propagate_gaussian(stack, m0, np.eye(2))
