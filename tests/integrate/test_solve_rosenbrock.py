"""`gp.solve(..., method="rosenbrock")`: one trajectory of the batched RODAS4P2.

Exact references (docs/math.md section 4.1, softmax with V = I): Sigma(t) =
(Sigma_0^-1 - t (A + A^T))^-1 and its blow-up time. RODAS4P2 at rtol 1e-10 reaches ~1e-11
relative on the covariance, and at rtol 1e-8 ~3e-11 on the blow-up time; the pinned 1e-8 and 1e-6
are the package's accuracy targets.
"""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde._exact import blowup_time, exact_covariance
from tests._helpers import random_spd


def test_exact_covariance_before_blowup(rng):
    att = gp.Softmax(rng.standard_normal((3, 3)), rng.standard_normal((3, 3)), np.eye(3))
    cov0 = random_spd(rng, 3)
    t_star = blowup_time(att, cov0)
    T = 0.5 * t_star if np.isfinite(t_star) else 1.0
    t_eval = np.linspace(0, T, 5)
    sol = gp.solve(att, None, cov0, (0, T), t_eval=t_eval, method="rosenbrock")
    assert sol.status == "finished" and sol.success
    np.testing.assert_array_equal(sol.t, t_eval)
    assert sol.mean is None
    for t, c in zip(sol.t, sol.cov):
        ex = exact_covariance(att, cov0, t)
        assert np.linalg.norm(c - ex) <= 1e-8 * np.linalg.norm(ex)
    np.testing.assert_allclose(sol.factor @ np.swapaxes(sol.factor, 1, 2), sol.cov,
                               rtol=1e-10, atol=1e-12)


def test_blowup_time_exact(rng):
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=0.5)
    for _ in range(3):
        cov0 = random_spd(rng, 2)
        sol = gp.solve(att, None, cov0, (0, 100), method="rosenbrock", rtol=1e-8)
        assert sol.status == "blowup"
        assert sol.t_blowup == pytest.approx(blowup_time(att, cov0), rel=1e-6)
        assert list(sol.t_events) == ["blowup"]
        # without t_eval: the initial and the final state
        assert sol.t[0] == 0 and sol.t[-1] == sol.t_final
        np.testing.assert_allclose(sol.cov[0], cov0)


def test_steady_and_rank_events_match_dop853(rng):
    q = np.array([[1.0, 0.3]])
    att = gp.Softmax(q, -q, np.eye(2))
    cov0 = random_spd(rng, 2)
    for kw, name in (({"steady_tol": 1e-3}, "steady"), ({"rank_tol": 1e-2}, "rank_collapse")):
        ros = gp.solve(att, None, cov0, (0, 1e6), method="rosenbrock", rtol=1e-9, **kw)
        dop = gp.solve(att, None, cov0, (0, 1e6), **kw)
        assert ros.status == dop.status == name
        assert ros.t_final == pytest.approx(dop.t_final, rel=1e-6)
        assert ros.t_events[name][0] == ros.t_final
        np.testing.assert_allclose(ros.cov_final, dop.cov_final, rtol=1e-6, atol=1e-9)


def test_stiff_paper_setting_matches_dop853():
    # the paper's d = 5 workload (benchmarks/bench_solve.py, seed 0) to t = 1e4
    r = np.random.default_rng(0)
    Q, G = r.standard_normal((2, 5)), r.standard_normal((5, 5))
    att = gp.Softmax(Q, -Q, G.T @ G, scale=1 / np.sqrt(5))
    cov0 = G @ G.T
    t_eval = [1.0, 1e2, 1e4]
    ref = gp.solve(att, None, cov0, (0, 1e4), t_eval=t_eval, rtol=1e-12, atol=1e-14)
    ros = gp.solve(att, None, cov0, (0, 1e4), t_eval=t_eval, rtol=1e-8, atol=1e-14,
                   method="rosenbrock")
    assert ros.status == ref.status == "finished"
    scale = np.abs(ref.cov).max()
    np.testing.assert_allclose(ros.cov, ref.cov, rtol=0, atol=1e-7 * scale)


def test_rosenbrock_is_covariance_only(rng):
    att = gp.L2(np.eye(2), -np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="covariance only"):
        gp.solve(att, np.zeros(2), np.eye(2), (0, 1), method="rosenbrock")
    with pytest.raises(ValueError, match="`events`"):
        gp.solve(att, None, np.eye(2), (0, 1), method="rosenbrock",
                 events=[lambda t, m, c: c[0, 0] - 0.5])
    with pytest.raises(ValueError, match="`cov0`"):
        gp.solve(att, None, -np.eye(2), (0, 1), method="rosenbrock")
    with pytest.raises(ValueError, match="`method`"):
        gp.solve(att, None, np.eye(2), (0, 1), method="rosenbrok")


def test_scipy_methods_unchanged(rng):
    # the SciPy path is untouched: DOP853 still reaches the exact solution with a mean
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=0.5)
    cov0 = random_spd(rng, 2)
    T = 0.5 * blowup_time(att, cov0)
    sol = gp.solve(att, np.ones(2), cov0, (0, T), t_eval=[T])
    np.testing.assert_allclose(sol.cov[-1], exact_covariance(att, cov0, T), rtol=1e-8)
    assert sol.mean.shape == (1, 2)
