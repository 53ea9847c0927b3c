"""Tests of gaussian_pde.analysis against cases with known outcomes.

Pinned numbers and where they come from:
* exact V = I softmax limits and blow-up times: docs/math.md section 4.1 (closed form,
  gaussian_pde._exact), never hard-coded;
* tolerances: the solver runs at rtol 1e-10 on the factor L, so blow-up times agree to
  ~1e-8; 1e-6 leaves margin.
"""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde import analysis as an
from gaussian_pde._common.linalg import psd_sqrt
from gaussian_pde._exact import blowup_time, exact_covariance
from tests._helpers import random_spd


def test_effective_rank_and_condition_number(rng):
    assert an.effective_rank(np.eye(3)) == pytest.approx(3.0)
    assert an.effective_rank(np.diag([2.0, 0.0, 0.0])) == pytest.approx(1.0)
    S = random_spd(rng, 4)
    w = np.linalg.eigvalsh(S)
    assert an.condition_number(S) == pytest.approx(w[-1] / w[0])
    assert an.condition_number(np.diag([1.0, 0.0])) == np.inf
    p = an.normalized_eigenvalues(np.stack([S, 2 * S]))
    assert p.shape == (2, 4)
    np.testing.assert_allclose(p.sum(-1), 1.0)
    np.testing.assert_allclose(p[0], p[1])
    assert np.all(np.diff(p, axis=-1) <= 0)
    np.testing.assert_allclose(np.trace(an.normalized_covariance(S)), 1.0)


def test_limit_rank_thresholds():
    S = np.diag([1.0, 1e-3, 1e-9])
    assert an.limit_rank(S, rtol=1e-6) == 2
    assert an.limit_rank(S, rtol=0.0, atol=0.1) == 1
    assert an.limit_rank(S, rtol=1e-12, atol=0.0) == 3
    np.testing.assert_array_equal(an.limit_rank(np.stack([S, np.eye(3)]), rtol=1e-6), [2, 3])


@pytest.mark.parametrize("kwargs, name", [({"rtol": 1.0}, "rtol"), ({"rtol": -0.1}, "rtol"),
                                          ({"atol": -1.0}, "atol"),
                                          ({"atol": float("nan")}, "atol")])
def test_limit_rank_rejects_bad_thresholds(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        an.limit_rank(np.eye(2), **kwargs)


@pytest.mark.parametrize("d, k", [(2, 1), (3, 1), (4, 2), (5, 2)])
def test_classifier_rank_limit_matches_exact_v_identity(rng, d, k):
    # exact: Sigma(t) = R (I - tC)^-1 R with C = R(A + A^T)R <= 0; the limit has rank d - rank(Q)
    Q = rng.standard_normal((k, d))
    cov0 = random_spd(rng, d)
    att = gp.Softmax(Q, -Q, np.eye(d), scale=1 / np.sqrt(d))
    sol = gp.solve(att, None, cov0, (0.0, 1e8))
    oc = an.classify_solution(sol, attention=att, rtol=1e-6)
    assert oc.outcome == an.Outcome.RANK, oc.message
    assert oc.rank == d - np.linalg.matrix_rank(Q)
    # the limit estimate is the state at t = 1e8; the classifier guarantees a remaining
    # relative change below settle_tol = 1e-2 per kept eigenvalue, so compare to 1e-2
    far = exact_covariance(att, cov0, 1e12)
    np.testing.assert_allclose(oc.limit, far, atol=1e-2 * np.abs(far).max())
    # and the state itself agrees with the exact solution at the same time (solver accuracy)
    np.testing.assert_allclose(sol.cov_final, exact_covariance(att, cov0, sol.t_final),
                               atol=1e-6 * np.abs(far).max())


def test_classifier_blowup_time_and_direction(rng):
    d = 3
    Q = rng.standard_normal((d, d))
    att = gp.Softmax(Q, Q, np.eye(d))          # A + A^T = 2c Q^T Q > 0: blow-up
    cov0 = random_spd(rng, d)
    sol = gp.solve(att, None, cov0, (0.0, 10.0))
    oc = an.classify_solution(sol, attention=att)
    assert oc.outcome == an.Outcome.BLOWUP
    assert oc.t_blowup == pytest.approx(blowup_time(att, cov0), rel=1e-6)
    R = psd_sqrt(cov0)
    w, U = np.linalg.eigh(R @ (att.A + att.A.T) @ R)
    v = R @ U[:, -1]
    v /= np.linalg.norm(v)
    assert abs(oc.direction_vector @ v) == pytest.approx(1.0, abs=1e-6)
    assert oc.rank == 1


def test_classifier_blowup_from_samples_only(rng):
    # no solver status: the finite-time signature of 1/tr decides; t* from the exact solution
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    cov0 = random_spd(rng, 2)
    ts = blowup_time(att, cov0)
    t = ts * (1 - np.concatenate([[1.0], np.geomspace(0.5, 1e-10, 60)]))
    covs = exact_covariance(att, cov0, t)
    oc = an.classify_trajectory(t, covs)
    assert oc.outcome == an.Outcome.BLOWUP
    assert oc.t_blowup == pytest.approx(ts, rel=1e-6)


def test_classifier_zero(rng):
    Q = rng.standard_normal((2, 2))
    att = gp.Softmax(Q, -Q, np.eye(2))         # A + A^T < 0: Sigma -> 0 like 1/t
    sol = gp.solve(att, None, random_spd(rng, 2), (0.0, 1e8))
    oc = an.classify_solution(sol, attention=att)
    assert oc.outcome == an.Outcome.ZERO, oc.message
    assert oc.rank == 0


def test_classifier_undecided_not_guessed(rng):
    # far from the limit (t = 1): eigenvalues still move -> undecided, with the reason
    q = np.array([[1.0, 0.0]])
    att = gp.Softmax(q, -q, np.eye(2))
    sol = gp.solve(att, None, np.eye(2), (0.0, 1.0))
    oc = an.classify_solution(sol, attention=att)
    assert oc.outcome == an.Outcome.UNDECIDED
    assert "moving" in oc.message
    # a failed solve is never classified
    oc = an.classify_trajectory([0.0, 1.0], [np.eye(2), 1e9 * np.eye(2)], status="failed")
    assert oc.outcome == an.Outcome.UNDECIDED


def test_classifier_bad_input():
    with pytest.raises(ValueError, match="`settle_tol`"):
        an.classify_trajectory([0.0, 1.0], [np.eye(2)] * 2, settle_tol=2.0)
    with pytest.raises(ValueError, match="`cov`"):
        an.classify_trajectory([0.0, 1.0], [np.eye(2)] * 3)
    with pytest.raises(TypeError, match="`solution`"):
        an.classify_solution("not a solution")


def test_bures_wasserstein(rng):
    # 1-D: W2^2 = (m1 - m2)^2 + (s1 - s2)^2; commuting covariances: sum of squared sd gaps
    assert an.bures_wasserstein([1.0], [[4.0]], [0.0], [[1.0]]) == pytest.approx(np.sqrt(2.0))
    S1, S2 = np.diag([1.0, 9.0]), np.diag([4.0, 1.0])
    assert an.bures_wasserstein(np.zeros(2), S1, np.zeros(2), S2, squared=True) == \
        pytest.approx(1.0 + 4.0)
    A, B = random_spd(rng, 3), random_spd(rng, 3, rank=1)
    m = rng.standard_normal(3)
    # W2^2 of identical Gaussians is zero up to rounding of tr(A) (~1e-15 relative)
    assert an.bures_wasserstein(m, A, m, A, squared=True) == pytest.approx(
        0.0, abs=1e-12 * np.trace(A))
    assert an.bures_wasserstein(m, A, 0 * m, B) == pytest.approx(
        an.bures_wasserstein(0 * m, B, m, A), rel=1e-8)
    with pytest.raises(ValueError, match="`cov2`"):
        an.bures_wasserstein(m, A, m, np.eye(2))


def test_classifier_zero_from_slow_algebraic_decay(rng):
    """Sigma(t) = (Sigma_0^-1 + t S)^-1 with S > 0 (softmax, K = -Q, V = I, exact, docs/math.md
    section 4.1) seen only up to t = 30: the trace has fallen by about one decade and every
    eigenvalue decays like 1/t, so the limit is zero; a rank-1 limit (S singular) is not."""
    Q = rng.standard_normal((2, 2))
    att = gp.Softmax(Q, -Q, np.eye(2))
    cov0 = np.eye(2)
    t = np.geomspace(1e-3, 30.0, 60)
    covs = gp.exact_covariance(att, cov0, t)
    S = -(att.A + att.A.T)
    assert np.trace(covs[-1]) > 1e-3 * np.trace(cov0)  # the old 1e-3 rule would not decide
    assert np.trace(covs[-1]) <= 0.1 * np.trace(cov0)
    oc = an.classify_trajectory(t, covs, attention=att)
    assert oc.outcome == an.Outcome.ZERO, oc.message
    q = Q[:1]
    att1 = gp.Softmax(q, -q, np.eye(2))
    oc1 = an.classify_trajectory(t, gp.exact_covariance(att1, cov0, t), attention=att1)
    assert oc1.outcome != an.Outcome.ZERO
    assert np.all(np.linalg.eigvalsh(S) > 0)


def test_classify_trajectory_refuses_bad_times_status_and_attention():
    I2 = np.eye(2)
    with pytest.raises(ValueError, match="strictly increasing"):
        gp.classify_trajectory([1.0, 0.0, 2.0], [I2, I2, I2])
    with pytest.raises(ValueError, match="`status` must be one of"):
        gp.classify_trajectory([0.0, 1.0], [I2, I2], status="bogus")
    with pytest.raises(TypeError, match="`attention` must be an attention"):
        gp.classify_trajectory([0.0, 1.0], [I2, I2], attention="softmax")
    out = gp.classify_trajectory([0.0, 1.0], [I2, I2], status=gp.Status.FINISHED)
    assert out.outcome in set(gp.Outcome)


@pytest.mark.parametrize("t_blowup, err", [(-0.5, ValueError), (1 + 2j, TypeError),
                                           ("1.0", TypeError), (True, TypeError),
                                           (np.array([1.0, 2.0]), TypeError)])
def test_classify_trajectory_refuses_a_bad_blowup_time(rng, t_blowup, err):
    cov = np.stack([random_spd(rng, 2)] * 2)
    with pytest.raises(err, match="`t_blowup`"):
        an.classify_trajectory([0.0, 1.0], cov, status="blowup", t_blowup=t_blowup)
    with pytest.raises(err, match="`t_blowup`"):   # also before t[0] = 2 when t starts later
        an.classify_trajectory([2.0, 3.0], cov, status="blowup",
                               t_blowup=1.0 if err is ValueError else t_blowup)


def test_classify_solution_of_a_batch_classifies_every_trajectory(rng):
    # K = Q, V = I: A + A^T > 0, every trajectory blows up at its exact time
    d = 3
    Q = rng.standard_normal((d, d))
    att = gp.Softmax(Q, Q, np.eye(d))
    covs = np.stack([random_spd(rng, d) for _ in range(3)])
    batch = gp.solve_batch(att, covs, (0.0, 10.0))
    out = an.classify_solution(batch, attention=att)
    assert isinstance(out, list) and len(out) == 3
    for i, oc in enumerate(out):
        one = an.classify_solution(gp.solve(att, None, covs[i], (0.0, 10.0)), attention=att)
        assert oc.outcome == one.outcome == an.Outcome.BLOWUP
        assert oc.t_blowup == pytest.approx(blowup_time(att, covs[i]), rel=1e-6)


def test_classify_solution_of_a_batch_without_its_trajectory_says_what_to_pass(rng):
    """K = -Q: no blow-up, so classifying needs the trajectory. A batch solved without
    `t_eval` kept only its final states: a ValueError says to pass `t_eval`; with it,
    one outcome per trajectory, the same as classifying each trajectory alone."""
    d = 2
    Q = rng.standard_normal((1, d))
    att = gp.Softmax(Q, -Q, np.eye(d))
    covs = np.stack([random_spd(rng, d) for _ in range(3)])
    with pytest.raises(ValueError, match=r"`solution`.*without `t_eval`.*t_eval="):
        an.classify_solution(gp.solve_batch(att, covs, (0.0, 5.0)))
    t_eval = np.linspace(0.0, 5.0, 21)
    batch = gp.solve_batch(att, covs, (0.0, 5.0), t_eval=t_eval)
    for attention in (att, [att] * 3):
        out = an.classify_solution(batch, attention=attention)
        assert len(out) == 3
        for i, oc in enumerate(out):
            assert oc == an.classify_solution(batch.trajectory(i), attention=att)
    with pytest.raises(ValueError, match="`attention` must be one attention or one per "
                                         r"trajectory \(3\), got 2"):
        an.classify_solution(batch, attention=[att, att])
