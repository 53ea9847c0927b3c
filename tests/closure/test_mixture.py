"""The Gaussian-mixture closure: state, closed-form field, one-component exactness, events."""

import numpy as np
import pytest
import scipy.integrate as scipy_integrate
import sympy as sp

import gaussian_pde as gp
from derivations import _symbolic as S
from derivations import mixture as derivation
from gaussian_pde.closure import _mixture as mx
from gaussian_pde.closure._quadrature import gauss_hermite_gaussian


def _random_cov(rng, d, rank=None):
    B = rng.normal(size=(d, rank or d))
    return B @ B.T / d + (0 if rank else 0.1 * np.eye(d))


def _mixture_names():
    """Every registered type the mixture closure takes (a quadratic score, or a field
    against a mixture in closed form), then the types that sum heads."""
    from gaussian_pde.attention import has_hook

    return ([name for name, cls in gp.ATTENTIONS.items()
             if has_hook(cls, "quadratic_score") or has_hook(cls, "mixture_field")]
            + [name for name, cls in gp.ATTENTIONS.items() if has_hook(cls, "from_heads")])


MIXTURE_NAMES = _mixture_names()


# ------------------------------------------------------------------ the state


def test_mixture_validation():
    I2 = np.eye(2)
    with pytest.raises(ValueError, match="weights"):
        gp.GaussianMixture([0.5, 0.6], [[0, 0], [1, 1]], [I2, I2])
    with pytest.raises(ValueError, match="weights"):
        gp.GaussianMixture([1.5, -0.5], [[0, 0], [1, 1]], [I2, I2])
    with pytest.raises(ValueError, match="means"):
        gp.GaussianMixture([0.5, 0.5], [[0, 0]], [I2, I2])
    with pytest.raises(ValueError, match="covs"):
        gp.GaussianMixture([0.5, 0.5], [[0, 0], [1, 1]], [I2])
    with pytest.raises(ValueError, match="covs"):
        gp.GaussianMixture([0.5, 0.5], [[0, 0], [1, 1]], [I2, -I2])
    with pytest.raises(TypeError, match="mixture"):
        gp.solve_mixture(gp.Softmax.example(2, 0), (np.zeros(2), I2), (0, 1))
    with pytest.raises(TypeError, match="attention"):
        gp.solve_mixture(gp.Sinkhorn.example(2, 0),
                         gp.GaussianMixture([1.0], [[0, 0]], [I2]), (0, 1))
    with pytest.raises(ValueError, match="merge_tol"):
        gp.solve_mixture(gp.Softmax.example(2, 0),
                         gp.GaussianMixture([1.0], [[0, 0]], [I2]), (0, 1), merge_tol=-1)


def test_sample_keeps_labels_and_moments():
    rng = np.random.default_rng(1)
    mix = gp.GaussianMixture([0.2, 0.3, 0.5], rng.normal(size=(3, 2)) * 5,
                             [_random_cov(rng, 2) for _ in range(3)])
    x, lab = mix.sample(20_000, seed=2)
    assert x.shape == (20_000, 2)
    np.testing.assert_array_equal(np.bincount(lab), mix.counts(20_000))
    for k in range(3):
        np.testing.assert_allclose(x[lab == k].mean(0), mix.means[k], atol=0.05)
        np.testing.assert_allclose(np.cov(x[lab == k].T), mix.covs[k], atol=0.06)
    x2, _ = mix.sample(20_000, seed=2)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_allclose(np.cov(x.T, bias=True), mix.total_cov, rtol=0.03)


@pytest.mark.parametrize("k, err", [(5, ValueError), (-6, ValueError), (1.5, TypeError),
                                    ("0", TypeError), (None, TypeError), (True, TypeError)])
def test_component_refuses_a_bad_index(k, err):
    mix = gp.GaussianMixture([0.5, 0.5], [[0.0, 0.0], [1.0, 0.0]], [np.eye(2)] * 2)
    with pytest.raises(err, match="`k`"):
        mix.component(k)
    m, C = mix.component(-1)
    np.testing.assert_array_equal(m, [1.0, 0.0])
    np.testing.assert_array_equal(C, np.eye(2))


@pytest.mark.parametrize("kwargs, err, name", [
    ({"stratified": "no"}, TypeError, "stratified"), ({"stratified": 0}, TypeError, "stratified"),
    ({"n": 10**12}, ValueError, "`n`.*GiB"), ({"n": 2.5}, TypeError, "`n`"),
    ({"n": 0, "stratified": False}, ValueError, "`n`"),
])
def test_sample_refuses_bad_options_up_front(kwargs, err, name):
    mix = gp.GaussianMixture([0.5, 0.5], [[0.0, 0.0], [1.0, 0.0]], [np.eye(2)] * 2)
    with pytest.raises(err, match=name):
        mix.sample(**{"n": 10, **kwargs})


def test_multinomial_sample_keeps_labels_and_moments():
    rng = np.random.default_rng(3)
    mix = gp.GaussianMixture([0.2, 0.8], rng.normal(size=(2, 2)) * 5,
                             [_random_cov(rng, 2) for _ in range(2)])
    x, lab = mix.sample(40_000, seed=4, stratified=False)
    assert np.all(np.diff(lab) >= 0)
    # multinomial counts: within 5 standard deviations of n w_k
    assert abs(np.mean(lab == 1) - 0.8) < 5 * np.sqrt(0.16 / 40_000)
    for k in range(2):
        np.testing.assert_allclose(np.cov(x[lab == k].T), mix.covs[k], atol=0.08)


# ------------------------------------------------------------------ the field


@pytest.mark.parametrize("name", [n for n in gp.ATTENTIONS if n in derivation.SCORES])
def test_log_partition_matches_sympy(name):
    """The vectorised log Z_k and m_k against the SymPy derivation (explicit d = 2 weights);
    the derivation's log Z holds the score at y = 0, r(x), which the closure leaves out."""
    subs, points = derivation.subs_2d()
    terms = derivation.log_partition(derivation.SCORES[name])
    f = lambda m: np.array(sp.Matrix(m).evalf(), dtype=float)   # noqa: E731
    Q, K, V, c = f(subs[S.Q]), f(subs[S.K]), f(subs[S.V]), float(subs[S.scale])
    att = gp.ATTENTIONS[name](Q, K, V, scale=c)
    head, = gp.attention.quadratic_heads(att)
    alpha, Sigma = f(subs[S.alpha]).ravel(), f(subs[S.Sigma])
    X = np.array(points, dtype=float)
    log_z, m = mx.component_log_partition(head.A, head.H, alpha[None], Sigma[None], X)
    for i, p in enumerate(points):
        lz_sym, m_sym = derivation.evaluate(terms, subs, p)
        r = att.score_matrix(X[i:i + 1], np.zeros((1, X.shape[1])))[0, 0]
        assert abs(log_z[0, i] + r - float(lz_sym)) < 1e-13
        np.testing.assert_allclose(m[0, i], f(m_sym).ravel(), atol=1e-13)


@pytest.mark.parametrize("name", MIXTURE_NAMES)
def test_velocity_matches_definition_on_nodes(name):
    """Closed form against the attention average over a fine Gauss-Hermite discretisation."""
    rng = np.random.default_rng(3)
    d = 2
    att = gp.ATTENTIONS[name].example(d, rng)
    mix = gp.GaussianMixture([0.3, 0.7], [[-1.0, 0.5], [1.0, -0.2]],
                             [0.3 * _random_cov(rng, d), 0.2 * _random_cov(rng, d, rank=1)])
    Y, logw = [], []
    for k in range(2):
        y, w = gauss_hermite_gaussian(mix.means[k], mix.covs[k], 30)
        Y.append(y)
        logw.append(np.log(mix.weights[k]) + np.log(w))
    Y, logw = np.concatenate(Y), np.concatenate(logw)
    X = rng.normal(size=(7, d))
    ref = att.definition_field(Y, logw, X)
    np.testing.assert_allclose(gp.mixture_velocity(att, mix, X), ref, rtol=1e-9, atol=1e-10)


def test_split_component_is_the_same_measure():
    rng = np.random.default_rng(4)
    att = gp.MultiHead.example(3, rng)
    m, C = rng.normal(size=3), _random_cov(rng, 3)
    one = gp.GaussianMixture([1.0], [m], [C])
    two = gp.GaussianMixture([0.25, 0.75], [m, m], [C, C])
    X = rng.normal(size=(5, 3))
    np.testing.assert_allclose(gp.mixture_velocity(att, two, X),
                               gp.mixture_velocity(att, one, X), rtol=1e-13, atol=1e-14)


# ------------------------------------------------------------------ one component = exact ODE


@pytest.mark.parametrize("name", MIXTURE_NAMES)
@pytest.mark.parametrize("d", [2, 3])
def test_one_component_is_the_moment_ode(name, d):
    rng = np.random.default_rng(10 * d + MIXTURE_NAMES.index(name))
    att = gp.ATTENTIONS[name].example(d, rng)
    m, C = rng.normal(size=d), _random_cov(rng, d)
    mix = gp.GaussianMixture([1.0], [m], [C])
    dm, _, dC = mx.mixture_closure_terms(att, mix)
    em, eC = gp.moment_rhs(att, m, C)
    np.testing.assert_allclose(dm[0], em, rtol=1e-13, atol=1e-13 * np.abs(em).max())
    np.testing.assert_allclose(dC[0], eC, rtol=1e-12, atol=1e-13 * np.abs(eC).max())
    t = np.linspace(0, 0.5, 6)
    sol = gp.solve_mixture(att, mix, (0, 0.5), t_eval=t, rtol=1e-12, atol=1e-13)
    ref = gp.solve(att, m, C, (0, 0.5), t_eval=t, rtol=1e-12, atol=1e-13)
    assert sol.status == "finished" and sol.success
    np.testing.assert_allclose(sol.means[:, 0], ref.mean, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(sol.covs[:, 0], ref.cov, rtol=1e-9, atol=1e-10)
    assert sol.means.shape == (6, 1, d) and sol.covs.shape == (6, 1, d, d)


def test_one_component_blowup_verdict_as_solve():
    """Softmax, V = I: the exact Riccati blow-up; same status and time as gp.solve."""
    Q = np.array([[1.0, 0.3]])
    att = gp.Softmax(Q, Q, np.eye(2))
    C = np.array([[1.0, 0.2], [0.2, 0.5]])
    sol = gp.solve_mixture(att, gp.GaussianMixture([1.0], [[0.0, 0.0]], [C]), (0, 10),
                           n_per_dim=2, rtol=1e-10, atol=1e-12)
    ref = gp.solve(att, None, C, (0, 10))
    assert sol.status == "blowup" == ref.status
    assert abs(sol.t_blowup - ref.t_blowup) < 1e-6 * ref.t_blowup


def test_singular_component():
    rng = np.random.default_rng(5)
    att = gp.L2.example(3, rng)
    C = _random_cov(rng, 3, rank=1)
    mix = gp.GaussianMixture([0.5, 0.5], [[0, 0, 0], [3, 0, 0]], [C, np.eye(3)])
    sol = gp.solve_mixture(att, mix, (0, 1))
    assert sol.success
    assert np.linalg.matrix_rank(sol.covs_final[0], tol=1e-8) == 1


# ------------------------------------------------------------------ events


def _converging_pair():
    """Softmax, V = I, K = -Q: each cluster moves at the other's mean, so they converge."""
    Q = np.array([[1.0, 0.0]])
    att = gp.Softmax(Q, -Q, np.eye(2))
    mix = gp.GaussianMixture([0.5, 0.5], [[-2.0, 0.0], [2.0, 0.0]], [0.1 * np.eye(2)] * 2)
    return att, mix


def test_merge_event_records_and_stops():
    att, mix = _converging_pair()
    t = np.linspace(0, 3, 61)
    sol = gp.solve_mixture(att, mix, (0, 3), t_eval=t, merge_tol=1.0)
    assert sol.status == "finished"
    assert sol.merge_times.size == 1
    tm = sol.merge_times[0]
    # the event time is where the pair's distance crosses the tolerance
    dist = [mx.pairwise_bures_wasserstein(m, c)[0, 1] for m, c in zip(sol.means, sol.covs)]
    i = np.searchsorted(-np.asarray(dist), -1.0)
    assert sol.t[i - 1] <= tm <= sol.t[i]
    stop = gp.solve_mixture(att, mix, (0, 3), merge_tol=1.0, stop_at_merge=True)
    assert stop.status == "event" and "merge" in stop.message
    assert abs(stop.t_final - tm) < 1e-6
    d_final = mx.pairwise_bures_wasserstein(stop.means_final, stop.covs_final)[0, 1]
    assert abs(d_final - 1.0) < 1e-6


def test_merge_heights_count_clusters():
    pts = np.array([0.0, 1.0, 5.0, 5.5, 20.0])
    D = np.abs(pts[:, None] - pts[None])
    h = mx.merge_heights(D)
    np.testing.assert_allclose(h, [0.5, 1.0, 4.0, 14.5])
    assert 1 + np.sum(h > 2.0) == 3


# ------------------------------------------------------------------ exact reductions


def _stiff_softmax(seed):
    """Softmax with K != -Q where the explicit steps stall: seed 53 finishes at t = 1 under
    gp.solve (after its switch to stiff steps), seed 18 blows up at t = 0.83."""
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.standard_normal((2, 2)) * s for s in (2, 2, 3))
    return gp.Softmax(Q, K, V)


def _one_component_cases():
    rng = np.random.default_rng(7)
    m, C = np.array([0.1, -0.2]), np.array([[0.5, 0.1], [0.1, 0.4]])
    return [(_stiff_softmax(53), np.zeros(2), 0.5 * np.eye(2)),
            (_stiff_softmax(18), np.zeros(2), 0.5 * np.eye(2)),
            (gp.L2.example(2, rng), m, C), (gp.MultiHead.example(2, rng), m, C)]


@pytest.mark.parametrize("case", range(4))
@pytest.mark.parametrize("tol", [{}, {"rtol": 1e-10, "atol": 1e-12}])
def test_one_component_equals_solve(case, tol):
    """Same statuses, times, evaluations and events as gp.solve (the same run)."""
    att, m, C = _one_component_cases()[case]
    t_eval = np.linspace(0.0, 0.8, 9)

    def trace_one(t, mean, cov):     # a user event on the covariance
        return np.trace(cov) - 1.2
    opts = dict(tol, t_eval=t_eval, events=[trace_one], steady_tol=1e-6)
    ref = gp.solve(att, m, C, (0, 1), **{"rtol": 1e-8, "atol": 1e-10, **opts})
    sol = gp.solve_mixture(att, gp.GaussianMixture([1.0], [m], [C]), (0, 1), **opts)
    assert sol.status == ref.status and sol.message == ref.message
    assert sol.t_final == pytest.approx(ref.t_final, rel=1e-8)
    assert sol.t_events.keys() == ref.t_events.keys()
    for key in ref.t_events:
        np.testing.assert_allclose(sol.t_events[key], ref.t_events[key], rtol=1e-8)
    np.testing.assert_allclose(sol.covs[:, 0], ref.cov, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(sol.means[:, 0], ref.mean, rtol=1e-8, atol=1e-12)
    assert sol.success       # the stiff settings: LSODA's stiff steps, not a stall


@pytest.mark.parametrize("seed, status", [(53, "finished"), (18, "blowup")])
def test_one_component_at_its_defaults_ends_as_solve_at_its_defaults(seed, status):
    """Each solver at its own default options: a one-component mixture stops where and as
    gp.solve does (the stiff seed 53 stalled at t = 0.14 after 50,000 evaluations when the
    mixture closure integrated one component itself; gp.solve finishes at t = 1)."""
    att, C = _stiff_softmax(seed), 0.5 * np.eye(2)
    ref = gp.solve(att, None, C, (0, 1))
    sol = gp.solve_mixture(att, gp.GaussianMixture([1.0], [[0.0, 0.0]], [C]), (0, 1))
    assert sol.status == ref.status == status
    assert sol.t_final == pytest.approx(ref.t_final, rel=1e-6)


def test_identical_components_equal_one():
    att = _stiff_softmax(53)
    C = 0.5 * np.eye(2)
    one = gp.solve_mixture(att, gp.GaussianMixture([1.0], [[0.0, 0.0]], [C]), (0, 1))
    two = gp.solve_mixture(att, gp.GaussianMixture([0.3, 0.7], [[0.0, 0.0]] * 2, [C, C]),
                           (0, 1))
    assert two.status == one.status == "finished" and two.nfev == one.nfev
    np.testing.assert_array_equal(two.means, np.repeat(one.means, 2, axis=1))
    np.testing.assert_array_equal(two.covs, np.repeat(one.covs, 2, axis=1))
    np.testing.assert_array_equal(two.weights, [0.3, 0.7])
    # three components, two of them the same: the two-component mixture, copied back
    rng = np.random.default_rng(2)
    att = gp.L2.example(2, rng)
    means, covs = [[0.0, 0.0], [2.0, 0.5]], [C, 0.3 * np.eye(2)]
    pair = gp.solve_mixture(att, gp.GaussianMixture([0.5, 0.5], means, covs), (0, 0.5),
                            merge_tol=0.5)
    trio = gp.solve_mixture(att, gp.GaussianMixture([0.2, 0.5, 0.3], [means[0], means[1],
                                                                       means[0]],
                                                    [covs[0], covs[1], covs[0]]),
                            (0, 0.5), merge_tol=0.5)
    np.testing.assert_array_equal(trio.means, pair.means[:, [0, 1, 0]])
    np.testing.assert_array_equal(trio.covs_final, pair.covs_final[[0, 1, 0]])
    np.testing.assert_array_equal(trio.merge_times, pair.merge_times)


@pytest.mark.parametrize("name", MIXTURE_NAMES)
def test_point_masses_stay_exact(name):
    """Point masses are particles: alpha_k' = V sum_j pi_j(alpha_k) m_j(alpha_k), with the
    particle system integrated from its definition; their factors stay exactly zero."""
    from scipy.integrate import solve_ivp

    rng = np.random.default_rng(11)
    att = gp.ATTENTIONS[name].example(2, rng)
    w = np.array([0.2, 0.3, 0.5])
    x0 = rng.normal(size=(3, 2))
    zero = np.zeros((3, 2, 2))
    t = np.linspace(0, 0.5, 6)
    sol = gp.solve_mixture(att, gp.GaussianMixture(w, x0, zero), (0, 0.5), t_eval=t,
                           rtol=1e-11, atol=1e-13)
    assert sol.status == "finished"
    assert not np.any(sol.factors) and not np.any(sol.covs)

    def particles(_, y):
        x = y.reshape(3, 2)
        return gp.mixture_velocity(att, gp.GaussianMixture(w, x, zero), x).ravel()
    ref = solve_ivp(particles, (0, 0.5), x0.ravel(), t_eval=t, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(sol.means.reshape(6, -1), ref.y.T, rtol=1e-8, atol=1e-10)
    # beside a spread component, the point mass keeps a zero factor too
    mix = gp.GaussianMixture([0.4, 0.6], [[0.0, 0.0], [1.0, 0.5]], [np.zeros((2, 2)),
                                                                    0.2 * np.eye(2)])
    both = gp.solve_mixture(att, mix, (0, 0.5), t_eval=t)
    assert not np.any(both.factors[:, 0]) and np.all(np.trace(both.covs[:, 1], axis1=1,
                                                               axis2=2) > 0)


def test_compiled_and_blocked_fields_agree():
    """Many components take the compiled row-by-row softmax, few the blocked NumPy path."""
    rng = np.random.default_rng(3)
    att = gp.MultiHead.example(2, rng)
    K = 300
    mix = gp.GaussianMixture(np.full(K, 1 / K), rng.normal(size=(K, 2)) * 2,
                             [_random_cov(rng, 2) for _ in range(K)])
    X = rng.normal(size=(1000, 2)) * 2
    heads = gp.attention.quadratic_heads(att)
    fast = mx._velocity(heads, np.log(mix.weights), mix.means, mix.covs, X)
    assert X.shape[0] * K >= mx._COMPILED_PAIRS
    slow = np.concatenate([mx._velocity(heads, np.log(mix.weights), mix.means, mix.covs,
                                        X[i:i + 1]) for i in range(0, 1000, 97)])
    np.testing.assert_allclose(fast[::97], slow, rtol=1e-12, atol=1e-12)


def _twenty_thousand(monkeypatch):
    """``(attention, mixture, K)``: K = 20,000 components in d = 2; any work fails the test."""
    rng = np.random.default_rng(4)
    att = gp.Softmax.example(2, rng)
    K = 20_000
    mix = gp.GaussianMixture(np.full(K, 1 / K), rng.normal(size=(K, 2)),
                             np.broadcast_to(0.1 * np.eye(2), (K, 2, 2)))
    for runner in ("integrate_system", "_solve_engine"):     # the event loop, the engine
        monkeypatch.setattr(mx, runner, lambda *a, **k: pytest.fail("work started"))
    return att, mix, K


def test_too_many_components_refused_or_announced_up_front(monkeypatch):
    att, mix, K = _twenty_thousand(monkeypatch)
    with pytest.raises(ValueError, match=r"K = 20000 components.*pairwise.* GiB"):
        gp.solve_mixture(att, mix, (0, 0.01), merge_tol=0.1)
    # without merges the memory is O(K n^d): the run is announced with its estimate
    small = gp.GaussianMixture(mix.weights[:400] * K / 400, mix.means[:400], mix.covs[:400])
    monkeypatch.setattr(mx, "_ANNOUNCE_S", 0.0)

    class Started(Exception):
        pass

    def started(*args, **kwargs):
        raise Started
    monkeypatch.setattr(mx, "_solve_engine", started)
    with pytest.warns(UserWarning, match=r"400 components x 64 nodes.*one evaluation takes "
                                         r"about .* s here"), pytest.raises(Started):
        gp.solve_mixture(att, small, (0, 0.01))


@pytest.mark.parametrize("method, held", [("auto", 1), ("LSODA", 1), ("BDF", 4),
                                          ("Radau", 7), (scipy_integrate.BDF, 4)])
def test_the_jacobians_of_an_implicit_method_are_counted_up_front(monkeypatch, method, held):
    """K = 20,000 in d = 2 is N = 120,000 unknowns: one dense Jacobian is N^2 doubles."""
    att, mix, K = _twenty_thousand(monkeypatch)
    from gaussian_pde._common import validation
    monkeypatch.setattr(validation, "_memory_bytes", lambda: 64 * 2**30)   # any machine
    gib = held * (K * 6) ** 2 * 8 / 2**30
    with pytest.raises(ValueError, match=rf"{held} dense 120000 x 120000 .*\({gib:.3g} GiB"):
        gp.solve_mixture(att, mix, (0, 0.01), method=method)


def test_the_event_loop_takes_a_run_whose_engine_scratch_does_not_fit(monkeypatch):
    """Memory for LSODA's one Jacobian-sized array but not for the engine's two: the
    default runs on the event loop instead of refusing."""
    rng = np.random.default_rng(4)
    att = gp.Softmax.example(2, rng)
    K = 200
    mix = gp.GaussianMixture(np.full(K, 1 / K), rng.normal(size=(K, 2)),
                             np.broadcast_to(0.1 * np.eye(2), (K, 2, 2)))
    from gaussian_pde._common import validation
    n = K * 6
    monkeypatch.setattr(validation, "_memory_bytes", lambda: 3 * n * n * 8)   # half: 1.5 arrays
    monkeypatch.setattr(mx, "_solve_engine", lambda *a, **k: pytest.fail("engine started"))

    class Started(Exception):
        pass

    def started(*args, **kwargs):
        raise Started
    monkeypatch.setattr(mx, "integrate_system", started)
    with pytest.raises(Started):
        gp.solve_mixture(att, mix, (0, 0.01))


def test_twenty_thousand_components_refused_up_front_by_memory_or_time(monkeypatch):
    """K = 20,000 in d = 2, default options: on a machine with memory for the Jacobian,
    the time of the fewest evaluations refuses it (the limit lowered to stand for a
    machine of any speed)."""
    att, mix, K = _twenty_thousand(monkeypatch)
    from gaussian_pde._common import validation
    monkeypatch.setattr(validation, "_memory_bytes", lambda: 64 * 2**30)
    with pytest.raises(ValueError, match=r"^`mixture` with K = 20000 .* GiB") as exc:
        gp.solve_mixture(att, mix, (0, 0.01))
    assert "\n" not in str(exc.value)
    monkeypatch.setattr(validation, "_memory_bytes", lambda: 2**50)
    monkeypatch.setattr(mx, "_REFUSE_S", 1e-9)
    with pytest.raises(ValueError, match=r"^`mixture` with K = 20000 components of 64 nodes "
                                         r"in d = 2 needs about \S+ s per evaluation .* h or "
                                         r"more for a run") as exc:
        gp.solve_mixture(att, mix, (0, 0.01))
    assert "\n" not in str(exc.value)


def test_a_thousand_components_still_run_in_d2():
    rng = np.random.default_rng(4)
    att = gp.Softmax.example(2, rng)
    K = 1000
    mix = gp.GaussianMixture(np.full(K, 1 / K), rng.normal(size=(K, 2)),
                             np.broadcast_to(0.1 * np.eye(2), (K, 2, 2)))
    sol = gp.solve_mixture(att, mix, (0, 0.01))
    assert str(sol.status) == "finished" and np.all(np.isfinite(sol.covs_final))


def test_a_singular_P_k_gives_no_field_and_the_event_loop_ends_the_run():
    r"""A trial state past a blow-up can make :math:`P_k = I + \Sigma_kH` singular
    (here :math:`H = -\Sigma^{-1}`, so :math:`P = 0`): no field there (NaN), not
    NumPy's ``LinAlgError``; a named method's run then ends ``failed`` at the blow-up the
    engine finds, with its message, instead of raising."""
    c, B, logdet = mx.component_terms(np.eye(2), -np.eye(2), np.zeros((1, 2)), np.eye(2)[None])
    assert np.isnan(c).all() and np.isnan(B).all() and np.isnan(logdet).all()
    rng = np.random.default_rng(1079)           # a multi-head mixture that blows up
    att = gp.ATTENTIONS["multihead"].example(2, rng)
    w = rng.random(3) + 0.3
    means = rng.normal(size=(3, 2)) * (0.5 + rng.random())
    Bs = rng.normal(size=(3, 2, 2)) * 0.4
    mix = gp.GaussianMixture(w / w.sum(), means, Bs @ np.swapaxes(Bs, 1, 2) + 0.05 * np.eye(2))
    engine = gp.solve_mixture(att, mix, (0.0, 4.0), rtol=1e-8, atol=1e-10)
    assert engine.status == "blowup"
    named = gp.solve_mixture(att, mix, (0.0, 4.0), rtol=1e-8, atol=1e-10, method="LSODA")
    assert named.status == "failed" and "floating-point range" in named.message
    assert abs(named.t_final - engine.t_blowup) < 1e-6 * engine.t_blowup
