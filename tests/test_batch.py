"""Batch integration equals single-trajectory gp.solve.

Both integrators take DOP853 steps with the same error norm and step rule, so states agree
to rounding; the pinned tolerances (1e-8 relative) leave several orders of margin over the
~1e-13 seen. Blow-up times: both use the same 1/tr extrapolation, at slightly different
points (batch: step end; solve: located crossing), which is exact for the Riccati blow-up
up to the solver tolerance (1e-10) -> 1e-7.
"""

import numpy as np
import pytest

import gaussian_pde as gp
from _helpers import random_spd
from gaussian_pde._batch import solve_batch


def _mixed(rng, n, d):
    atts, covs = [], []
    for i in range(n):
        Q, K = rng.standard_normal((1, d)), rng.standard_normal((1, d))
        kind = [gp.Softmax, gp.L2, gp.Sinkhorn][i % 3]
        # softmax with V != I can stall on a stiff slow manifold (hits max_nfev); keep V = I
        V = np.eye(d) if kind is gp.Softmax else np.eye(d) + 0.2 * rng.standard_normal((d, d))
        att = kind(Q, K if i % 4 else -Q, V)
        if i % 5 == 4:
            att = gp.MultiHead([att, gp.Softmax(Q, -Q, np.eye(d))])
        atts.append(att)
        covs.append(random_spd(rng, d))
    return atts, np.array(covs)


@pytest.mark.parametrize("d", [2, 3])
def test_batch_equals_single(rng, d):
    atts, covs = _mixed(rng, 10, d)
    t_eval = np.linspace(0, 3, 13)
    bs = solve_batch(atts, covs, (0.0, 3.0), t_eval=t_eval, max_nfev=20_000)
    statuses = set()
    for i, att in enumerate(atts):
        s = gp.solve(att, None, covs[i], (0.0, 3.0), t_eval=t_eval, max_nfev=20_000)
        tr = bs.trajectory(i)
        assert tr.status == s.status, (i, s.message, tr.message)
        statuses.add(str(s.status))
        n = min(len(s.t), len(tr.t))
        scale = np.abs(s.cov[:n]).max()
        np.testing.assert_allclose(tr.cov[:n], s.cov[:n], rtol=0, atol=1e-8 * scale)
        if s.status == "blowup":
            assert tr.t_blowup == pytest.approx(s.t_blowup, rel=1e-7)
        else:
            np.testing.assert_allclose(tr.cov_final, s.cov_final, rtol=0,
                                       atol=1e-8 * np.abs(s.cov_final).max())
    assert "blowup" in statuses and "finished" in statuses  # some blow up, others go on


def test_batch_events_match_single(rng):
    q = np.array([[1.0, 0.3]])
    att = gp.Softmax(q, -q, np.eye(2))
    covs = np.array([random_spd(rng, 2) for _ in range(4)])
    for kw in ({"steady_tol": 1e-3}, {"rank_tol": 1e-2}):
        bs = solve_batch(att, covs, (0.0, 1e6), **kw)
        for i in range(4):
            s = gp.solve(att, None, covs[i], (0.0, 1e6), **kw)
            assert bs.status[i] == s.status
            assert bs.t_final[i] == pytest.approx(s.t_final, rel=1e-6)


def test_batch_input_forms_agree(rng):
    Qs = rng.standard_normal((6, 2, 3))
    Vs = np.eye(3) + 0.1 * rng.standard_normal((6, 3, 3))
    covs = np.array([random_spd(rng, 3) for _ in range(6)])
    atts = [gp.L2(Q, -Q, V) for Q, V in zip(Qs, Vs)]
    a = solve_batch(atts, covs, (0.0, 5.0))
    b = solve_batch({"kind": "l2", "Q": Qs, "K": -Qs, "V": Vs}, covs, (0.0, 5.0))
    np.testing.assert_allclose(a.cov_final, b.cov_final, rtol=1e-13, atol=1e-15)
    shared = solve_batch(atts[0], covs, (0.0, 5.0))
    single = gp.solve(atts[0], None, covs[3], (0.0, 5.0))
    np.testing.assert_allclose(shared.cov_final[3], single.cov_final, rtol=1e-9, atol=1e-12)


def test_batch_exact_blowup_times(rng):
    from gaussian_pde._exact import blowup_time

    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=0.5)
    covs = np.array([random_spd(rng, 2) for _ in range(5)])
    bs = solve_batch(att, covs, (0.0, 100.0))
    exact = [blowup_time(att, c) for c in covs]
    np.testing.assert_allclose(bs.t_blowup, exact, rtol=1e-7)


def test_batch_bad_input(rng):
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="`cov0s`"):
        solve_batch(att, np.empty((0, 2, 2)), (0, 1))
    with pytest.raises(ValueError, match="`cov0s`"):
        solve_batch(att, [np.eye(3)], (0, 1))
    with pytest.raises(ValueError, match="match"):
        solve_batch([att, att], [np.eye(2)], (0, 1))
    with pytest.raises(TypeError, match="attentions_or_weights"):
        solve_batch("softmax", [np.eye(2)], (0, 1))
    with pytest.raises(ValueError, match="`t_span`"):
        solve_batch(att, [np.eye(2)], (1, 0))
