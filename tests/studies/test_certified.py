"""certified_limit: the limit rank from the growth of Sigma^-1 (docs/math.md 4.5).

Checked: the exact V = I softmax solution P(t) = Sigma_0^-1 + 2ct Q^T Q (docs/math.md 4.1),
the bound d - rank(Q), the conserved N^T Sigma^-1 N, a sample of histogram settings with
V = R^T R against the package's covariance solver, the closed form of the limit where it
holds, a finite-time blow-up, the hypotheses of the theorem path, and the rejection of
heads without the conserved quantity.
"""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.studies._certified import (
    _unit_lower_inv,
    exact_precision_softmax,
    theorem_rank,
)
from gaussian_pde.studies._reproduce import _exact_limit, _hist_settings


def _settings(seed, d, n):
    Qs, Gs, Rs = _hist_settings(np.random.default_rng(seed), d, n)
    return Qs, Gs @ np.swapaxes(Gs, 1, 2), np.swapaxes(Rs, 1, 2) @ Rs


@pytest.mark.parametrize("d", [3, 4, 5])
def test_identity_softmax_matches_exact(d):
    Qs, covs, _ = _settings(1, d, 4)
    c = 1 / np.sqrt(d)
    atts = [gp.Softmax(Q, -Q, np.eye(d), scale=c) for Q in Qs]
    res = gp.certified_limits(atts, covs)
    for Q, cov, r in zip(Qs, covs, res):
        exact = _exact_limit(-2.0 * c * Q.T @ Q, cov)     # S = A + A^T for K = -Q, V = I
        assert r.outcome == "rank"
        assert r.rank == gp.analysis.limit_rank(exact, rtol=1e-8) == d - d // 2 == r.bound
        np.testing.assert_allclose(r.decay_rates, -1.0, atol=2e-2)   # 1/t decay
        np.testing.assert_allclose(r.limit, exact, atol=1e-5 * np.abs(exact).max())
        assert r.conserved_drift < 1e-5
        # V = I: N^T Sigma^-1 N and N^T Sigma^-1 (range Q^T) are constant, so the limit is
        # N (N^T Sigma_0^-1 N)^-1 N^T
        assert r.closed_form_gap < 1e-6
        np.testing.assert_allclose(r.pivot_exponents[:d // 2], 1.0, atol=1e-3)
    # the exact precision grows linearly: P(t) = P0 + 2ct Q^T Q
    P = exact_precision_softmax(Qs[0], covs[0], c, 10.0)
    np.testing.assert_allclose(P, np.linalg.inv(covs[0]) + 20 * c * Qs[0].T @ Qs[0])


def _kernel_closed_form(Q, cov0):
    N = np.linalg.svd(Q)[2][np.linalg.matrix_rank(Q):].T        # orthonormal basis of ker Q
    return N @ np.linalg.inv(N.T @ np.linalg.inv(cov0) @ N) @ N.T


@pytest.mark.parametrize("d, kind", [(3, gp.Softmax), (4, gp.L2), (5, gp.Softmax)])
def test_random_value_sample_decided(d, kind):
    # V = R^T R independent of Sigma_0 (the histogram panels): rank exactly d - rank(Q),
    # every setting decided, with its evidence
    Qs, covs, Vs = _settings(2, d, 4)
    atts = [kind(Q, -Q, V, scale=1 / np.sqrt(d)) for Q, V in zip(Qs, Vs)]
    for r in gp.certified_limits(atts, covs):
        assert r.outcome == "rank", r.message
        assert r.rank == r.bound == d - d // 2
        assert r.decay_rates.size == d // 2 and np.all(r.decay_rates < -0.25)
        # the surviving ones do not grow; one still decaying slowly is said so
        surv = r.exponents[d // 2:]
        assert np.all(surv < 0.05) and np.all(r.eigenvalues[d // 2:] > 0)
        if np.any(surv < -0.05):
            assert "not yet settled" in r.message
        assert r.conserved_drift < 1e-3
        assert r.lyapunov_increase is not None and r.lyapunov_increase < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("d, kind", [(3, gp.Softmax), (4, gp.L2), (5, gp.Softmax)])
def test_random_value_sample_matches_solver(d, kind):
    # the certified limit is where the package's covariance solver goes; the closed form
    # N (N^T Sigma_0^-1 N)^-1 N^T holds where every decay is 1/t
    Qs, covs, Vs = _settings(2, d, 6)
    atts = [kind(Q, -Q, V, scale=1 / np.sqrt(d)) for Q, V in zip(Qs, Vs)]
    for att, Q, cov, r in zip(atts, Qs, covs, gp.certified_limits(atts, covs)):
        assert r.outcome == "rank", r.message
        sol = gp.solve(att, None, cov, (0.0, 1e8), t_eval=[1e6, 1e8], rtol=1e-11, atol=1e-14)
        e6, e8 = (np.linalg.norm(c - r.limit) / np.linalg.norm(r.limit) for c in sol.cov)
        assert e8 < 1e-4 and e8 < e6                  # converging to the certified limit
        closed = _kernel_closed_form(Q, cov)
        gap = np.linalg.norm(r.limit - closed) / np.linalg.norm(r.limit)
        assert gap == pytest.approx(r.closed_form_gap, rel=1e-3, abs=1e-9)
        if np.all(np.abs(r.decay_rates + 1) < 0.05):
            assert gap < 1e-3


@pytest.mark.slow
def test_closed_form_fails_for_a_published_setting():
    # softmax, V = R^T R, d = 3, setting 46 with the replay's draw 51: the coupling
    # N^T Sigma^-1 R grows like t, the vanishing eigenvalue decays like 1/t^2, and the
    # limit (where solve goes) is far from N (N^T Sigma_0^-1 N)^-1 N^T, above it
    from gaussian_pde.studies import _published as pub

    d, i, k = 3, 46, 51
    qs, vs = pub.published_settings("softmax")[d]
    cov = pub._sigma0_draws(d, k + 1)[k]
    att = gp.Softmax(qs[i], -qs[i], vs[i], scale=1 / np.sqrt(d))
    r = gp.certified_limit(att, cov)
    assert r.outcome == "rank" and r.rank == 2
    np.testing.assert_allclose(r.decay_rates, -2.0, atol=0.05)
    closed = _kernel_closed_form(qs[i], cov)
    assert r.closed_form_gap > 0.1
    sol = gp.solve(att, None, cov, (0.0, 1e8), t_eval=[1e8], rtol=1e-11, atol=1e-14)
    assert np.linalg.norm(sol.cov[-1] - r.limit) < 1e-4 * np.linalg.norm(r.limit)
    assert np.linalg.eigvalsh(r.limit - closed)[0] > -1e-8      # Loewner: limit >= closed


def test_blowup_named():
    # K = +Q, V = I: A + A^T = 2c Q^T Q has a positive eigenvalue: Riccati blow-up at
    # t* = 1 / lambda_max(Sigma_0^1/2 (A + A^T) Sigma_0^1/2) (docs/math.md 4.1)
    Qs, covs, _ = _settings(3, 3, 1)
    att = gp.Softmax(Qs[0], Qs[0], np.eye(3), scale=1 / np.sqrt(3))
    r = gp.certified_limit(att, covs[0])
    assert r.outcome == "blowup", r.message
    assert r.rank is None and r.limit is None
    assert r.t_blowup == pytest.approx(gp.blowup_time(att, covs[0]), rel=1e-4)


def test_theorem_path_checks_its_hypotheses():
    Qs, covs, Vs = _settings(4, 4, 1)
    Q, cov, V = Qs[0], covs[0], Vs[0]
    c = 1 / np.sqrt(4)
    assert theorem_rank(gp.Softmax(Q, -Q, V, scale=c), cov) == 2
    assert theorem_rank(gp.L2(Q, -Q, np.eye(4), scale=c), cov) == 2
    # planted wrong inputs: V not positive definite, V not symmetric, K != -Q,
    # Sigma_0 of rank 3; the theorem says nothing about them
    w, u = np.linalg.eigh(V)
    assert theorem_rank(gp.Softmax(Q, -Q, u @ np.diag(np.r_[-w[0], w[1:]]) @ u.T, scale=c),
                        cov) is None
    assert theorem_rank(gp.Softmax(Q, -Q, V + np.triu(V, 1), scale=c), cov) is None
    assert theorem_rank(gp.Softmax(Q, Q, V, scale=c), cov) is None
    g = np.linalg.cholesky(cov)[:, :3]
    assert theorem_rank(gp.Softmax(Q, -Q, V, scale=c), g @ g.T) is None
    # and the integration refuses the rank-deficient Sigma_0 instead of guessing
    with pytest.raises(ValueError, match="positive definite"):
        gp.certified_limit(gp.Softmax(Q, -Q, V, scale=c), g @ g.T)


def test_unit_lower_inverse_keeps_tiny_entries():
    rng = np.random.default_rng(0)
    L = np.tril(rng.standard_normal((5, 5)), -1) + np.eye(5)
    L[2:, :2] *= 1e-12                      # the O(1/t) block L_NR at t ~ 1e12
    X = _unit_lower_inv(L[None])[0]
    np.testing.assert_allclose(X @ L, np.eye(5), atol=1e-14)
    # each tiny entry to its own relative accuracy (against the exact block formula)
    LRR, LNR, LNN = L[:2, :2], L[2:, :2], L[2:, 2:]
    ref = -np.linalg.inv(LNN) @ LNR @ np.linalg.inv(LRR)
    np.testing.assert_allclose(X[2:, :2], ref, rtol=1e-8)


def test_rejects_sinkhorn():
    Q = np.array([[1.0, 0.0]])
    with pytest.raises(TypeError, match="softmax and L2"):
        gp.certified_limit(gp.Sinkhorn(Q, -Q, np.eye(2)), np.eye(2))


def test_certify_published_mixes_dimensions():
    """The replay's settings of several d go to certified_limits together (regression: an
    np.array of their covariances raised on the ragged shapes)."""
    from gaussian_pde.studies._published_certified import certify_published

    paths = {"softmax": {"identity": {
        "3": [dict(status="converged", setting=0, draw=0, rank=1),
              dict(status="diverged", setting=1, draw=1, rank=None)],
        "4": [dict(status="converged", setting=0, draw=0, rank=2)]}}}
    res = certify_published(paths)
    assert res["n"] == 2
    p3, p4 = res["panels"]["softmax_identity_d3"], res["panels"]["softmax_identity_d4"]
    # softmax with V = I and K = -Q: the true limit has rank d - rank(Q) = 2 for d = 3, 4
    assert p3["settings"][0]["true"] == 2 and p4["settings"][0]["true"] == 2
    assert p3["published"][1] == 1 and p4["published"][2] == 1
    assert res["step_us"] > 0
    # the evidence of each true rank, and the panel's counts of it
    for p, d in ((p3, 3), (p4, 4)):
        row = p["settings"][0]
        assert len(row["decay_rates"]) == d // 2
        np.testing.assert_allclose(row["decay_rates"], -1.0, atol=0.05)   # V = I: 1/t
        assert row["closed_form_gap"] < 1e-3 and row["conserved_drift"] < 1e-3
        assert len(row["limit_eigenvalues"]) == d - d // 2
        assert p["undecided"] == 0 and p["below_bound"] == 0 and p["closed_form"] == 1
        # V = I: the closed form is the limit, counted at 0.1 without integrating
        assert row["closed_form_at_0.1"] == row["limit_at_0.1"]
        # a disagreement has a reason consistent with the limit counted at 0.1
        if row["reason"] == "threshold":
            assert row["limit_at_0.1"] == row["published"] and min(row["limit_eigenvalues"]) < 0.1
    from gaussian_pde.studies._published_certified import compact_table
    from gaussian_pde.studies._reproduce import _published_section

    tab = compact_table(res)
    assert [len(p["rows"]) for p in tab["panels"].values()] == [1, 1]
    assert all(len(r) == len(tab["columns"]) for p in tab["panels"].values() for r in p["rows"])
    text = "\n".join(_published_section(res))
    assert "softmax V=identity | 3 | 0 1 0 0 | 0 0 1 0 |" in text


@pytest.mark.parametrize("scale", [1e14, 1e16, 1e18])
@pytest.mark.parametrize("kind", [gp.Softmax, gp.L2])
def test_huge_initial_covariance_is_decided(kind, scale):
    # V = I, K = -Q, rank Q = 1: the limit has rank d - 1 = 2 at any scale of cov0 (for
    # softmax the dynamics is scale-free, t -> t / s); the first steps in log time are
    # of the order of 1 / scale
    Q = np.array([[0.6, -0.3, 0.8]])
    att = kind(Q, -Q, np.eye(3))
    res = gp.certified_limit(att, scale * np.eye(3))
    assert (res.outcome, res.rank) == ("rank", 2), res.message


def test_a_dimension_too_large_for_memory_is_refused_up_front():
    d = 400      # a Jacobian of 80201^2 entries per thread: ~100 GiB
    Q = np.ones((1, d)) / np.sqrt(d)
    with pytest.raises(ValueError, match=r"400-dimensional.*80200 factored unknowns.*GiB"):
        gp.certified_limit(gp.Softmax(Q, -Q, np.eye(d)), np.eye(d))
