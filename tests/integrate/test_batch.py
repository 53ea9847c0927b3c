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
from gaussian_pde.attention import names_with
from gaussian_pde.integrate._batch import solve_batch
from tests._helpers import accelerating_sinkhorn_case, random_spd


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


# ----------------------------------------------------------------------------------------
# method="rosenbrock" (RODAS4P2) and method="auto" (per-trajectory switch)
# ----------------------------------------------------------------------------------------
# References are DOP853 runs at rtol 1e-12 (non-stiff: its states agree with gp.solve to
# ~1e-13, see above). RODAS4P2 is order 4: at rtol 1e-10 it stays within ~1e-9 relative of
# them on these problems; the pinned 1e-7 leaves two orders of margin.

def _paper_settings(rng, n, d):
    """The paper's stiff rank-histogram setting: K = -Q, V = G^T G, Sigma_0 = G G^T."""
    Qs = rng.standard_normal((n, d // 2, d))
    Gs = rng.standard_normal((n, d, d))
    w = {"kind": "softmax", "Q": Qs, "K": -Qs, "V": np.swapaxes(Gs, 1, 2) @ Gs,
         "scale": np.full(n, 1 / np.sqrt(d))}
    return w, Gs @ np.swapaxes(Gs, 1, 2)


def test_rosenbrock_matches_dop853_nonstiff(rng):
    atts, covs = _mixed(rng, 8, 2)
    t_eval = np.linspace(0, 2, 9)
    ref = solve_batch(atts, covs, (0.0, 2.0), t_eval=t_eval, rtol=1e-12, atol=1e-14,
                      method="DOP853")
    ros = solve_batch(atts, covs, (0.0, 2.0), t_eval=t_eval, rtol=1e-10, atol=1e-14,
                      method="rosenbrock")
    assert list(ros.status) == list(ref.status)
    assert ros.implicit.all() and not ref.implicit.any()
    scale = np.nanmax(np.abs(ref.cov), axis=(1, 2, 3))[:, None, None, None]
    np.testing.assert_allclose(ros.cov / scale, ref.cov / scale, rtol=0, atol=1e-7)
    fin = ref.status != "blowup"
    np.testing.assert_allclose(ros.cov_final[fin], ref.cov_final[fin], rtol=1e-7, atol=1e-12)
    blow = ~fin
    np.testing.assert_allclose(ros.t_blowup[blow], ref.t_blowup[blow], rtol=1e-7)


def _stiff_settings(seeds, d=5):
    """Paper settings (d = 5) that turn stiff after t ~ 1e3 (checked: DOP853's steps grow
    like 0.004 t there); drawn one seed each so that the cases do not depend on order."""
    Qs, Vs, covs = [], [], []
    for seed in seeds:
        r = np.random.default_rng(seed)
        Q, G = r.standard_normal((d // 2, d)), r.standard_normal((d, d))
        Qs.append(Q)
        Vs.append(G.T @ G)
        covs.append(G @ G.T)
    Qs = np.array(Qs)
    return ({"kind": "softmax", "Q": Qs, "K": -Qs, "V": np.array(Vs),
             "scale": np.full(len(seeds), 1 / np.sqrt(d))}, np.array(covs))


def test_rosenbrock_matches_dop853_stiff():
    w, covs = _stiff_settings([0, 3])
    T = 1e5
    t_eval = np.geomspace(1e-2, T, 8)
    kw = dict(t_eval=t_eval, atol=1e-14, max_nfev=None)
    ref = solve_batch(w, covs, (0.0, T), rtol=1e-12, method="DOP853", **kw)
    dop = solve_batch(w, covs, (0.0, T), rtol=1e-8, method="DOP853", **kw)
    scale = np.abs(ref.cov).max(axis=(1, 2, 3))[:, None, None, None]
    for method in ("auto", "rosenbrock"):
        sol = solve_batch(w, covs, (0.0, T), rtol=1e-8, method=method, **kw)
        assert (sol.status == "finished").all() and sol.implicit.all()
        np.testing.assert_allclose(sol.cov / scale, ref.cov / scale, rtol=0, atol=1e-7)
        if method == "auto":
            # stiff: RODAS4P2's steps are limited by accuracy, DOP853's by stability (seen:
            # 309 and 433 steps against 1016 and 776; the gain grows with the horizon and
            # with looser tolerances)
            assert np.all(sol.nsteps < 0.75 * dop.nsteps), (sol.nsteps, dop.nsteps)


def test_auto_mixes_methods_within_a_batch(rng):
    # two stiff paper settings (switch to RODAS4P2) and three non-stiff blow-ups (stay DOP853)
    w, covs = _stiff_settings([0, 3])
    atts = [gp.Softmax(Q, K, V, scale=1 / np.sqrt(5)) for Q, K, V in
            zip(w["Q"], w["K"], w["V"])] + [gp.Softmax(np.eye(5), np.eye(5), np.eye(5))] * 3
    covs = np.concatenate([covs, [random_spd(rng, 5) for _ in range(3)]])
    t_eval = np.geomspace(1e-3, 1e5, 17)
    kw = dict(t_eval=t_eval, rtol=1e-8, atol=1e-14, max_nfev=None)
    sol = solve_batch(atts, covs, (0.0, 1e5), method="auto", **kw)
    ref = solve_batch(atts, covs, (0.0, 1e5), method="DOP853", **kw)
    assert list(sol.implicit) == [True] * 2 + [False] * 3
    assert list(sol.status) == list(ref.status) == ["finished"] * 2 + ["blowup"] * 3
    # the blow-ups took exactly the DOP853 steps
    np.testing.assert_array_equal(sol.nsteps[2:], ref.nsteps[2:])
    np.testing.assert_allclose(sol.t_blowup[2:], ref.t_blowup[2:], rtol=1e-12)
    ok = np.isfinite(ref.cov)
    assert np.array_equal(ok, np.isfinite(sol.cov))
    scale = np.nanmax(np.abs(ref.cov), axis=(1, 2, 3))[:, None, None, None]
    np.testing.assert_allclose((sol.cov / scale)[ok], (ref.cov / scale)[ok], rtol=0,
                               atol=1e-6)


def test_rosenbrock_exact_blowup_times(rng):
    from gaussian_pde._exact import blowup_time

    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=0.5)
    covs = np.array([random_spd(rng, 2) for _ in range(5)])
    bs = solve_batch(att, covs, (0.0, 100.0), method="rosenbrock", rtol=1e-8)
    assert (bs.status == "blowup").all()
    exact = [blowup_time(att, c) for c in covs]
    np.testing.assert_allclose(bs.t_blowup, exact, rtol=1e-6)


def test_rosenbrock_events_match_single(rng):
    q = np.array([[1.0, 0.3]])
    att = gp.Softmax(q, -q, np.eye(2))
    covs = np.array([random_spd(rng, 2) for _ in range(4)])
    for kw in ({"steady_tol": 1e-3}, {"rank_tol": 1e-2}):
        bs = solve_batch(att, covs, (0.0, 1e6), method="rosenbrock", rtol=1e-9, **kw)
        for i in range(4):
            s = gp.solve(att, None, covs[i], (0.0, 1e6), **kw)
            assert bs.status[i] == s.status
            assert bs.t_final[i] == pytest.approx(s.t_final, rel=1e-6)


def test_rosenbrock_keeps_psd_and_rank(rng):
    # rank-2 initial covariances in d = 4, stiff paper setting, long horizon
    w, _ = _paper_settings(rng, 3, 4)
    F = rng.standard_normal((3, 4, 2))
    covs = F @ np.swapaxes(F, 1, 2)
    t_eval = np.geomspace(1e-2, 1e6, 17)
    sol = solve_batch(w, covs, (0.0, 1e6), t_eval=t_eval, method="rosenbrock", rtol=1e-8)
    assert (sol.status == "finished").all()
    np.testing.assert_array_equal(sol.cov, np.swapaxes(sol.cov, -1, -2))   # L L^T
    lam = np.linalg.eigvalsh(sol.cov)
    top = lam[..., -1:]
    assert np.all(lam >= -1e-12 * top)
    # the rank never exceeds the initial rank 2: two eigenvalues stay at rounding level
    assert np.all(lam[..., :2] <= 1e-12 * top)


def test_bad_method(rng):
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="`method`"):
        solve_batch(att, [np.eye(2)], (0, 1), method="Radau")


@pytest.mark.parametrize("method", ["DOP853", "rosenbrock"])
def test_batch_confirms_blowups_like_solve(method):
    """The Sinkhorn case of test_solve.test_accelerating_exponential_growth_is_not_blowup
    (a first estimate that looks finite) is not a blow-up in a batch either, next to a
    true one."""
    soft = gp.Softmax(np.eye(5)[:2], np.eye(5)[:2], np.eye(5), scale=1.0)
    sink, cov0 = accelerating_sinkhorn_case()
    atts = [sink, gp.MultiHead([soft])]
    bs = solve_batch(atts, np.array([cov0, np.eye(5)]), (0, 20.0), method=method,
                     rtol=1e-8, max_nfev=200_000)
    assert bs.status[0] == "finished" and np.isnan(bs.t_blowup[0])
    # softmax, V = I, Sigma_0 = I: t* = 1 / lambda_max(A + A^T) = 1/2
    assert bs.status[1] == "blowup" and bs.t_blowup[1] == pytest.approx(0.5, rel=1e-6)


# ------------------------------------------------------------------ extreme scales


def test_batch_covariance_of_1e300_ends_quickly():
    """Regression: an L2 covariance of 1e300 spent max_nfev (over 20 s) on rejected steps
    with a NaN step size. The field is finite there now (SVD gain); the run stops with a
    status and a message and no inf/NaN."""
    from tests._helpers import run_within

    for att in (gp.L2.example(2, 0), gp.Softmax.example(2, 0)):
        sol = run_within(20, solve_batch, att, 1e300 * np.eye(2)[None], (0, 1))
        assert sol.message[0]
        assert np.all(np.isfinite(sol.cov_final)) and np.all(np.isfinite(sol.factor_final))
        assert sol.status[0] in ("failed", "blowup", "finished")


def test_batch_rate_that_overflows_at_the_start_fails_at_once():
    """A field that is not finite at the initial covariance stops the row at t0 (status
    failed, with a message) instead of attempting steps until max_nfev."""
    att = gp.Softmax.example(2, 0)
    sol = solve_batch(att, np.stack([np.eye(2), 1e300 * np.eye(2)]), (0, 0.1))
    assert sol.status[0] == "finished" and sol.status[1] == "failed"
    assert "not finite" in sol.message[1] and sol.nfev[1] < 10


def test_batch_weights_with_k_zero_are_refused():
    """Regression: stacked weights with k = 0 (Q, K of shape (0, d)) gave an infinite
    default scale and NaN rates, and the batch hung on rejected steps."""
    Z = np.zeros((0, 3))
    stackable = [name for name in names_with(gaussian_preserving=True)   # the kinds stacked
                 if getattr(gp.ATTENTIONS[name], "weight_names", None)       # Q, K, V take
                 == ("Q", "K", "V", "scale")]
    assert stackable
    for kind in stackable:
        with pytest.raises(ValueError, match=r"`Q`.*k >= 1"):
            solve_batch({"kind": kind, "Q": Z, "K": Z, "V": np.eye(3)}, np.eye(3)[None],
                        (0, 1))
    with pytest.raises(ValueError, match="scale"):
        solve_batch({"kind": "l2", "Q": np.eye(3), "K": np.eye(3), "V": np.eye(3),
                     "scale": np.inf}, np.eye(3)[None], (0, 1))


def test_batch_singular_covariance_keeps_its_null_space_exactly(rng):
    """The batch factors a singular covariance with exact zero columns, as solve does."""
    C = rng.standard_normal((4, 2))
    att = gp.Sinkhorn.example(4, 1)
    sol = solve_batch(att, (C @ C.T)[None], (0, 1))
    assert np.sum(np.all(sol.factor_final[0] == 0, axis=0)) == 2
