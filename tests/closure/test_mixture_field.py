"""The mixture closure on the compiled engine: its field kernel and its runs.

The kernel (:mod:`gaussian_pde.closure._mixture_field`) is held to the NumPy closure
(``_mixture._closure``) and to the total covariance and its rate written directly; the
engine's runs (``solve_mixture``'s default for two or more distinct components) to the
event loop's (``method="LSODA"``, :func:`scipy.integrate.solve_ivp`), to
:func:`gaussian_pde.solve` where the mixture is a Gaussian, and to linear attention's
exact blow-up time.
"""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.attention import quadratic_heads
from gaussian_pde.closure import _mixture as mx
from gaussian_pde.closure import _mixture_field as mf
from gaussian_pde.closure._engine import standard_nodes

from .test_mixture import MIXTURE_NAMES


def _random_mixture(rng, K, d, point=False):
    w = rng.random(K) + 0.3
    B = rng.normal(size=(K, d, d)) * 0.5
    if point:
        B[0] = 0.0
    return gp.GaussianMixture(w / w.sum(), rng.normal(size=(K, d)),
                              B @ np.swapaxes(B, 1, 2))


@pytest.mark.parametrize("name", MIXTURE_NAMES)
def test_kernel_is_the_closure_to_rounding(name):
    """The compiled rate equals the NumPy closure's; F F^T and its rate are the total
    covariance and the rate of ``_MixtureSystem.cov_and_rate``."""
    rhs, _ = mf.kernels()
    rng = np.random.default_rng(31)
    for d in (1, 2, 3):
        for K, point in ((2, False), (3, True), (5, False)):
            att = gp.ATTENTIONS[name].example(d, rng)
            mix = _random_mixture(rng, K, d, point)
            heads = quadratic_heads(att, fields=True)
            Z, W = standard_nodes(d, 5)
            L = mix.factors()
            dm, dL = mx._closure(heads, np.log(mix.weights), mix.means, L, Z, W)
            y = np.concatenate([mix.means.ravel(), L.ravel()])
            out = np.empty_like(y)
            ws = np.zeros(mf.ws_size(d, K))
            rhs(mf.pack(heads, mix.weights, Z, W)[0], y.size, 1, y, out, ws)
            ref = np.concatenate([dm.ravel(), dL.ravel()])
            np.testing.assert_allclose(out, ref, rtol=0, atol=1e-13 * np.max(np.abs(ref)))
            q = K * (d + 1)
            F = ws[1:1 + d * q].reshape(d, q)
            dF = ws[1 + d * q:1 + 2 * d * q].reshape(d, q)
            system = mx._MixtureSystem(heads, mix.weights, d, 5)
            cov, rate = system.cov_and_rate(y)
            scale = np.max(np.abs(cov))
            np.testing.assert_allclose(F @ F.T, cov, rtol=0, atol=1e-13 * scale)
            np.testing.assert_allclose(dF @ F.T + F @ dF.T, rate, rtol=0,
                                       atol=1e-12 * np.max(np.abs(rate)))
            assert ws[0] == pytest.approx(np.trace(cov), rel=1e-13)
            # m = 0: the measures alone, the same bits, the rate left alone
            ws2, out2 = np.zeros_like(ws), np.full_like(out, np.nan)
            rhs(mf.pack(heads, mix.weights, Z, W)[0], y.size, 0, y, out2, ws2)
            np.testing.assert_array_equal(ws2[:1 + d * q], ws[:1 + d * q])
            assert np.all(np.isnan(out2))


def _pair(seed, name="softmax", K=2, d=2):
    rng = np.random.default_rng(seed)
    att = gp.ATTENTIONS[name].example(d, rng)
    w = rng.random(K) + 0.3
    B = rng.normal(size=(K, d, d)) * 0.4
    mix = gp.GaussianMixture(w / w.sum(), rng.normal(size=(K, d)),
                             B @ np.swapaxes(B, 1, 2) + 0.05 * np.eye(d))
    return att, mix


def _against_the_event_loop(att, mix, span, **kw):
    new = gp.solve_mixture(att, mix, span, **kw)
    old = gp.solve_mixture(att, mix, span, method="LSODA", **kw)
    assert new.status == old.status, (new.message, old.message)
    if old.status == "blowup":
        assert abs(new.t_blowup - old.t_blowup) <= 1e-6 * old.t_blowup
    else:
        # an event's time moves with the trajectory's error (a slow crossing: steady state)
        assert new.t_final == pytest.approx(old.t_final, rel=1e-4)
        scale = np.max(np.abs(old.covs_final))
        np.testing.assert_allclose(new.covs_final, old.covs_final, rtol=0, atol=1e-5 * scale)
        np.testing.assert_allclose(new.means_final, old.means_final, rtol=0,
                                   atol=1e-5 * (1 + np.max(np.abs(old.means_final))))
    return new, old


# seeds of _pair (found by running them): a blow-up, a finish, a steady state at
# t = 10.5 and a rank collapse at t = 0.77
@pytest.mark.parametrize("seed, name, kw, status", [
    (1, "softmax", {}, "blowup"),
    (3, "l2", {}, "finished"),
    (6, "l2", {"steady_tol": 1e-2}, "steady"),
    (6, "softmax", {"rank_tol": 0.05}, "rank_collapse"),
])
def test_engine_against_the_event_loop(seed, name, kw, status):
    att, mix = _pair(seed, name)
    new, old = _against_the_event_loop(att, mix, (0, 12), **kw)
    assert new.status == status
    if status in ("steady", "rank_collapse"):
        assert new.t_events[status] == pytest.approx([new.t_final])
        assert old.t_events[status] == pytest.approx([old.t_final])


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(24))
def test_engine_against_the_event_loop_many(seed):
    name = MIXTURE_NAMES[seed % len(MIXTURE_NAMES)]
    att, mix = _pair(100 + seed, name, K=2 + seed % 3, d=2 + seed % 2)
    kw = [{}, {"steady_tol": 1e-3}, {"rank_tol": 0.02}][seed % 3]
    _against_the_event_loop(att, mix, (0, 5), **kw)


def test_two_identical_components_on_the_engine_are_solve(monkeypatch):
    """Kept apart (no reduction), two copies of a Gaussian follow its moment ODE: the
    field is affine on it and the quadrature exact; the blow-up time is solve's."""
    monkeypatch.setattr(mx, "_distinct", lambda m: (np.arange(m.K), np.arange(m.K)))
    Q = np.array([[1.0, 0.3], [0.0, 0.5]])
    att = gp.Softmax(Q, Q, np.eye(2))
    C = np.array([[1.0, 0.2], [0.2, 0.5]])
    m0 = np.array([0.3, -0.1])
    mix = gp.GaussianMixture([0.3, 0.7], [m0, m0], [C, C])
    t = np.linspace(0, 0.2, 5)
    sol = gp.solve_mixture(att, mix, (0, 10), t_eval=t, rtol=1e-10, atol=1e-12)
    ref = gp.solve(att, m0, C, (0, 10), t_eval=t)
    assert sol.status == ref.status == "blowup"
    assert abs(sol.t_blowup - ref.t_blowup) < 1e-6 * ref.t_blowup
    np.testing.assert_array_equal(sol.t, ref.t)
    for k in range(2):
        np.testing.assert_allclose(sol.covs[:, k], ref.cov, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(sol.means[:, k], ref.mean, rtol=1e-7, atol=1e-9)


def test_linear_attention_blows_up_at_the_exact_time():
    r"""Linear attention, V = I: every component moves by :math:`M = PA` with the total
    second moment :math:`P`, which follows :math:`P' = PAP + PA^TP`, so
    :math:`t^* = 1/\lambda_{\max}(P_0^{1/2}(A + A^T)P_0^{1/2})` (``gaussian_pde/attention/_linear.py``)."""
    rng = np.random.default_rng(8)
    Q, K = rng.normal(size=(2, 3, 3))
    att = gp.get_attention("linear")(Q, K, np.eye(3))
    mix = _random_mixture(rng, 3, 3)
    P0 = mix.total_cov + np.outer(mix.total_mean, mix.total_mean)
    A = att.scale * K.T @ Q
    R = mx.psd_sqrt(P0)
    t_star = 1.0 / np.linalg.eigvalsh(R @ (A + A.T) @ R)[-1]
    # the compiled kernel takes it by its capability (second_moment_map), not its name
    from gaussian_pde.attention import quadratic_heads
    from gaussian_pde.closure import _mixture_field

    heads = quadratic_heads(att, fields=True)
    assert _mixture_field.pack(heads, mix.weights, np.zeros((1, 3)), np.ones(1)) is not None
    sol = gp.solve_mixture(att, mix, (0, 2 * t_star), rtol=1e-10, atol=1e-12)
    assert sol.status == "blowup"
    assert abs(sol.t_blowup - t_star) < 1e-6 * t_star


def test_budget_and_t_eval():
    att, mix = _pair(3, "l2", K=3)
    t = np.linspace(0, 4, 9)
    sol = gp.solve_mixture(att, mix, (0, 4), t_eval=t)
    np.testing.assert_array_equal(sol.t, t)
    old = gp.solve_mixture(att, mix, (0, 4), t_eval=t, method="LSODA")
    np.testing.assert_allclose(sol.covs, old.covs, rtol=0, atol=1e-6)
    short = gp.solve_mixture(att, mix, (0, 4), t_eval=t, max_nfev=60)
    assert short.status == "failed" and "gave up after 60" in short.message
    # the budget is checked after each step: at most one more step's evaluations
    assert 60 < short.nfev <= 60 + 16
    assert short.t_final < 4 and np.all(short.t <= short.t_final)
    np.testing.assert_array_equal(short.t, t[:short.t.size])


def test_a_stiff_run_is_handed_to_lsoda():
    """Multi-head, K = 2 in d = 3 (a seeded setting found stiff at t = 1.86): the field has
    no closed-form Jacobian, so the engine stops where Hairer's test fires and LSODA runs
    it from the start, as ``method="LSODA"`` does; the evaluations of both are counted."""
    rng = np.random.default_rng(1069)
    att = gp.MultiHead.example(3, rng)
    w = rng.random(2) + 0.3
    means = rng.normal(size=(2, 3)) * (0.5 + rng.random())
    B = rng.normal(size=(2, 3, 3)) * 0.4
    mix = gp.GaussianMixture(w / w.sum(), means, B @ np.swapaxes(B, 1, 2) + 0.05 * np.eye(3))
    kw = dict(rtol=1e-8, atol=1e-10, steady_tol=1e-3)
    sol = gp.solve_mixture(att, mix, (0, 4), **kw)
    ref = gp.solve_mixture(att, mix, (0, 4), method="LSODA", **kw)
    assert sol.status == ref.status == "finished"
    assert "stiff from t = 1.86" in sol.message and "LSODA" in sol.message
    assert sol.nfev > ref.nfev
    np.testing.assert_array_equal(sol.covs_final, ref.covs_final)


# ------------------------------------------------------------------ merge events


def test_the_kernels_merge_values_are_the_merge_heights(rng):
    """Called with ``m = -1`` the kernel leaves, after the room of the rate of ``F``, each
    single-linkage merge height of the components' Bures-Wasserstein distances minus
    ``merge_tol``: :func:`merge_heights` of :func:`pairwise_bures_wasserstein`, point masses
    and d = 1 included."""
    rhs, _ = mf.kernels()
    for K, d, point in [(2, 1, False), (3, 2, True), (4, 3, False), (5, 2, False), (6, 3, True)]:
        mix = _random_mixture(rng, K, d, point)
        att = gp.Softmax.example(d, rng)
        Z, W = standard_nodes(d, 2)
        P = mf.pack(quadratic_heads(att, fields=True), mix.weights, Z, W, merge_tol=0.7)[0]
        y = np.concatenate([mix.means.ravel(), mix.factors().ravel()])
        ws = np.full(mf.ws_size(d, K, merges=True), np.nan)
        rhs(P, y.size, -1, y, np.zeros(y.size), ws)
        ref = mx.merge_heights(mx.pairwise_bures_wasserstein(mix.means, mix.covs)) - 0.7
        got = ws[1 + 2 * d * K * (d + 1):]
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * (1 + np.abs(ref).max()))


def _cluster_case(name):
    from gaussian_pde.studies._clusters import cluster_attention, cluster_cases, cluster_mixture

    (c,) = [c for c in cluster_cases(False) if c["name"] == name]
    return (cluster_attention(c["kind"], c["d"], value=c["value"], q=0.7, seed=c["seed"]),
            cluster_mixture(c["K"], c["d"], config=c["config"], seed=c["seed"]))


@pytest.mark.parametrize("name", ["K6-d3-random-l2-Videntity", "K8-d3-symmetric-softmax-Vrandom"])
def test_merge_events_run_on_the_engine_as_on_the_event_loop(name, monkeypatch):
    """Two of the clusters study's cases (five and seven merges, two of them at the same
    time by symmetry): the default runs on the engine, which locates each merge on its
    dense output; the event loop's DOP853 (:func:`scipy.integrate.solve_ivp`, its root
    finding) on the same problem finds the same times. With ``stop_at_merge`` the engine
    stops at the first, where the smallest height is the tolerance."""
    att, mix = _cluster_case(name)
    kw = dict(n_per_dim=4, rtol=1e-10, atol=1e-12, merge_tol=1.0)
    ref = gp.solve_mixture(att, mix, (0, 4), method="DOP853", **kw)
    with monkeypatch.context() as m:
        m.setattr(mx, "integrate_system", lambda *a, **k: pytest.fail("the event loop ran"))
        sol = gp.solve_mixture(att, mix, (0, 4), **kw)
        stop = gp.solve_mixture(att, mix, (0, 4), stop_at_merge=True, **kw)
    assert sol.status == ref.status == "finished"
    assert sol.merge_times.size == ref.merge_times.size >= 5
    np.testing.assert_allclose(sol.merge_times, ref.merge_times, rtol=0, atol=1e-7)
    assert stop.status == "event"
    assert stop.message == f"terminal event 'merge' at t = {sol.merge_times[0]:.10g}"
    np.testing.assert_array_equal(stop.merge_times, sol.merge_times[:1])
    assert stop.t_final == sol.merge_times[0]
    h = mx.merge_heights(mx.pairwise_bures_wasserstein(stop.means_final, stop.covs_final))
    assert abs(h[0] - 1.0) < 1e-7
    # room for one time only: the engine runs the trajectory again, with room for all
    from gaussian_pde.integrate import _compiled_engine as cb

    runs, run = [], cb._run
    monkeypatch.setattr(cb, "_run", lambda *a: runs.append(run(*a)))
    monkeypatch.setattr(cb, "GAP_ROOM", 0.01)
    again = gp.solve_mixture(att, mix, (0, 4), **kw)
    assert len(runs) == 2
    np.testing.assert_array_equal(again.merge_times, sol.merge_times)
    assert again.nfev == sol.nfev
