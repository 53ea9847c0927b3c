"""The step loops of gp.solve against scipy.integrate.solve_ivp and against each other.

``_stepper.integrate`` drives SciPy's own solver classes, so it must take the same steps
as ``solve_ivp`` and find the same events; ``integrate_fortran`` (Hairer's Fortran codes)
must agree to the tolerance, including events it hands to a Python replay.
"""

import types

import numpy as np
import pytest
from scipy.integrate import DOP853, LSODA, RK45, solve_ivp

import gaussian_pde as gp
from gaussian_pde.integrate._scipy_loop import integrate_fortran, integrate_scipy

#: the registered types with exact moment equations whose covariance equation is mean-free
MEAN_FREE = [name for name, cls in gp.ATTENTIONS.items()
             if cls.gaussian_preserving and not cls.field_sees_mean]


def _instance(name, rng, d, k):
    """A random instance of ``name``: a head of query, key and value matrices alone with
    ``k``-row query and key matrices (scores of order one); a sum of heads, or a head with
    further weights (biases), by its class's ``example`` (all its weights random)."""
    cls = gp.ATTENTIONS[name]
    if (not issubclass(cls, gp.SingleHeadAttention)
            or cls.weight_names != gp.SingleHeadAttention.weight_names):
        return cls.example(d, rng)
    return cls(rng.standard_normal((k, d)), rng.standard_normal((k, d)),
               rng.standard_normal((d, d)) / np.sqrt(d))


#: those whose (random) instance has a closed-form Jacobian, sums of heads included
EXACT = [name for name in MEAN_FREE
         if _instance(name, np.random.default_rng(0), 3, 2).exact_jacobian]


def oscillator(t, y):
    return np.array([y[1], -y[0] - 0.1 * y[1]])


def crossing(t, y):
    return y[0]


def peak(t, y):
    return y[1]


crossing.terminal, crossing.direction = False, 0.0
peak.terminal, peak.direction = True, 1.0
Y0 = np.array([1.0, 0.0])


@pytest.mark.parametrize("cls", [DOP853, RK45, LSODA])
def test_loop_takes_solve_ivps_steps(cls):
    ref = solve_ivp(oscillator, (0, 20), Y0, method=cls, rtol=1e-8, atol=1e-10)
    seg = integrate_scipy(oscillator, cls, 0.0, 20.0, Y0, rtol=1e-8, atol=1e-10)
    assert seg.status == 0
    np.testing.assert_array_equal(seg.t, ref.t)
    np.testing.assert_array_equal(seg.y, ref.y.T)


@pytest.mark.parametrize("cls", [DOP853, RK45, LSODA])
def test_loop_events_and_t_eval_match_solve_ivp(cls):
    t_eval = np.linspace(0, 20, 41)
    late = lambda t, y: y[0] - 0.5 * np.exp(-0.05 * t)  # noqa: E731
    late.terminal, late.direction = True, 1.0
    evs = [crossing, late]
    ref = solve_ivp(oscillator, (0, 20), Y0, method=cls, rtol=1e-9, atol=1e-11,
                    t_eval=t_eval, events=evs)
    seg = integrate_scipy(oscillator, cls, 0.0, 20.0, Y0, rtol=1e-9, atol=1e-11, t_eval=t_eval,
                    events=evs)
    assert ref.status == seg.status == 1 and seg.fired == 1
    np.testing.assert_array_equal(seg.t, ref.t)
    np.testing.assert_allclose(seg.y, ref.y.T, rtol=0, atol=1e-14)
    for mine, theirs in zip(seg.t_events, ref.t_events):
        np.testing.assert_allclose(mine, theirs, rtol=1e-13)
    # zero crossings near pi/2 and 3 pi/2 (shifted by the damping) before `late` stops it
    assert seg.t_events[0].size == 2 and seg.t_events[0][0] == pytest.approx(1.62, abs=0.01)


@pytest.mark.parametrize("method", ["DOP853", "RK45"])
@pytest.mark.parametrize("use_t_eval", [True, False])
def test_compiled_agrees_with_python_stepping(method, use_t_eval):
    t_eval = np.linspace(0, 20, 41) if use_t_eval else None
    kw = dict(rtol=1e-10, atol=1e-12, t_eval=t_eval, events=[crossing, peak])
    py = integrate_scipy(oscillator, {"DOP853": DOP853, "RK45": RK45}[method], 0.0, 20.0, Y0, **kw)
    fo = integrate_fortran(oscillator, method, 0.0, 20.0, Y0, **kw)
    assert fo.status == py.status == 1 and fo.fired == py.fired == 1
    # peak (terminal, y[1] increasing through 0) first fires at the trough, t ~ pi
    assert fo.t_final == pytest.approx(py.t_final, rel=1e-9)
    assert fo.t_final == pytest.approx(np.pi, rel=0.01)
    np.testing.assert_allclose(fo.t_events[0], py.t_events[0], rtol=1e-9)
    np.testing.assert_allclose(fo.y_final, py.y_final, rtol=1e-8, atol=1e-10)
    if use_t_eval:
        np.testing.assert_array_equal(fo.t, t_eval[t_eval <= fo.t_final])
        np.testing.assert_allclose(fo.y, py.y, rtol=1e-8, atol=1e-10)
    else:   # every step end, strictly increasing, ending at the event
        assert fo.t[0] == 0.0 and np.all(np.diff(fo.t) > 0) and fo.t[-1] == fo.t_final


def test_compiled_integrates_past_the_last_output_time():
    """Output stops at t_eval[-1] but the run (and its events) goes on to t1."""
    fo = integrate_fortran(oscillator, "DOP853", 0.0, 20.0, Y0, rtol=1e-10, atol=1e-12,
                            t_eval=np.array([0.0, 0.5]), events=[peak])
    assert fo.status == 1 and fo.t_final == pytest.approx(np.pi, rel=0.01)
    np.testing.assert_array_equal(fo.t, [0.0, 0.5])


def test_compiled_budget_and_failure():
    calls = []

    def counted(t, y):
        calls.append(t)
        return oscillator(t, y)

    fo = integrate_fortran(counted, "DOP853", 0.0, 1e4, Y0, rtol=1e-10, atol=1e-12,
                            budget=lambda t, y: len(calls) <= 200)
    assert fo.status == 2 and 0 < fo.t_final < 1e4 and fo.t[-1] == fo.t_final
    assert len(calls) < 200 + 2 * 13      # stopped at the end of the step that spent it

    def explode(t, y):
        return y * y
    fo = integrate_fortran(explode, "DOP853", 0.0, 2.0, np.array([1.0]), rtol=1e-10,
                            atol=1e-12)
    # y = 1/(1 - t): the last accepted step ends at the singularity, up to rounding
    assert fo.status == -1 and "dop853" in fo.message and fo.t_final < 1.0 + 1e-9


def test_solve_methods_agree_on_the_paper_workload():
    """Compiled DOP853, Python DOP853 (a class), LSODA with the exact Jacobian, Radau and
    the Rosenbrock path agree on a d = 5 run with V = G^T G to 1e-8."""
    rng = np.random.default_rng(4)
    d = 5
    Q, G = rng.standard_normal((2, d)), rng.standard_normal((d, d))
    att = gp.Softmax(Q, -Q, G.T @ G, scale=1 / np.sqrt(d))
    cov0, T = G @ G.T, 50.0
    ref = gp.solve(att, None, cov0, (0, T), t_eval=[T], rtol=1e-13, atol=1e-16,
                   method=DOP853).cov[-1]
    for method in ("DOP853", "RK45", "LSODA", "Radau", "rosenbrock"):
        sol = gp.solve(att, None, cov0, (0, T), t_eval=[T], rtol=1e-11, atol=1e-13,
                       method=method)
        assert sol.status == "finished", method
        err = np.linalg.norm(sol.cov[-1] - ref) / np.linalg.norm(ref)
        assert err < 1e-8, (method, err)


@pytest.mark.parametrize("with_mean", [False, True])
@pytest.mark.parametrize("kind", EXACT)
def test_exact_jacobian_matches_finite_differences(kind, with_mean, rng):
    """The exact Jacobian of the factor form, and of the mean's rows ``[L | mean]``."""
    from gaussian_pde.integrate._solve import _factor_jacobian

    d, k = 3, 2
    att = _instance(kind, rng, d, k)
    jac = _factor_jacobian(att, with_mean)
    m = d + 1 if with_mean else d

    def f(v):   # the generated moment equations, in the state layout [L | mean]
        Z = v.reshape(d, m)
        L = Z[:, :d]
        out = np.empty((d, m))
        out[:, :d] = att.factor_rhs(L)
        if with_mean:
            out[:, d] = gp.moment_rhs(att, Z[:, d], L @ L.T)[0]
        return out.ravel()

    y = rng.standard_normal(d * m)
    h = 1e-6
    fd = np.column_stack([(f(y + h * e) - f(y - h * e)) / (2 * h) for e in np.eye(d * m)])
    np.testing.assert_allclose(jac(0.0, y), fd, rtol=1e-6, atol=1e-7)
    for name in set(MEAN_FREE) - set(EXACT):    # no closed form: differences
        assert _factor_jacobian(_instance(name, rng, d, k), with_mean) is None, name


#: every type of the package with exact moment equations (a field that sees the mean
#: included, with the mean only)
BUILT_IN = [name for name, cls in gp.ATTENTIONS.items()
            if cls.gaussian_preserving and cls.__module__.startswith("gaussian_pde.")]


def _without_compiled_field(att):
    """``att`` as an instance of a subclass without a compiled field (the reference path)."""
    cls = type(att)
    bare = type(cls.__name__, (cls,), {"compiled_field": lambda self: None})
    clone = object.__new__(bare)
    clone.__dict__.update(att.__dict__)
    return clone


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("kind", BUILT_IN)
def test_event_loop_field_is_the_compiled_kernel_and_the_numpy_reference(kind, k, rng):
    """The event loop's right-hand side is the type's compiled kernel, bit for bit, and
    agrees with the derivation's NumPy reference (``factor_rhs``, ``moment_rhs``) to
    1e-12 relative; its Jacobian is the compiled Jacobian kernel's; a type without a
    compiled field gets the reference itself."""
    from gaussian_pde.integrate._fused import (
        compiled_field_values,
        fortran_rhs,
        moment_jacobian,
        reference_field,
    )

    d = 4
    att = _instance(kind, rng, d, k)
    compiled = att.compiled_field()
    assert compiled is not None
    L, mean = rng.standard_normal((d, d)), rng.standard_normal(d)
    for with_mean in (False, True) if not att.field_sees_mean else (True,):
        m = d + 1 if with_mean else d
        Z = np.column_stack([L, mean]) if with_mean else L.copy()
        # the derivation's equations, independently of reference_field's assembly
        ref = np.empty((d, m))
        if with_mean:
            cov = L @ L.T
            ref[:, :d] = att.field_matrix_with_mean(cov, mean) @ L
            ref[:, d] = gp.moment_rhs(att, mean, cov)[0]
        else:
            ref[:] = att.factor_rhs(L)
        np.testing.assert_allclose(reference_field(att, with_mean)(Z), ref, rtol=1e-13,
                                   atol=1e-14 * np.abs(ref).max())
        counter = types.SimpleNamespace(nfev=0)
        rhs = fortran_rhs(att, with_mean, counter)
        first = rhs(0.0, Z.ravel())
        np.testing.assert_array_equal(first, compiled_field_values(compiled, with_mean)(Z).ravel())
        np.testing.assert_allclose(first, ref.ravel(), rtol=1e-12,
                                   atol=1e-12 * np.abs(ref).max())
        # one buffer, overwritten at the next call, shared with rhs.field
        assert rhs(0.0, 2.0 * Z.ravel()) is first and counter.nfev == 2
        assert np.shares_memory(rhs.field(Z), first)
        np.testing.assert_array_equal(rhs.field(Z).ravel(), rhs(0.0, Z.ravel()))
        # the Jacobian: the compiled kernel's, where it has a closed form
        jac = moment_jacobian(att, with_mean)
        assert (jac is not None) == compiled.exact_jacobian == att.exact_jacobian
        if jac is not None:
            J = np.empty((d * m, d * m))
            assert compiled.jac(compiled.params, d, m, Z.ravel(), J, np.zeros(compiled.ws_size))
            np.testing.assert_array_equal(jac(0.0, Z.ravel()), J)
        # without a compiled field: the reference, and no closed-form Jacobian
        bare = _without_compiled_field(att)
        rhs = fortran_rhs(bare, with_mean, counter)
        np.testing.assert_array_equal(rhs(0.0, Z.ravel()), reference_field(att, with_mean)(Z).ravel())
        assert moment_jacobian(bare, with_mean) is None and not bare.exact_jacobian
    # a non-finite trial state gives NaN (a rejected step), never a LAPACK error
    with np.errstate(all="ignore"):
        for field in (reference_field(att, True), compiled_field_values(compiled, True)):
            bad = field(np.full((d, d + 1), np.inf))
            assert bad.shape == (d, d + 1)


@pytest.mark.parametrize("with_mean", [False, True])
@pytest.mark.parametrize("kind", BUILT_IN)
def test_event_loop_jacobian_against_central_differences(kind, with_mean, rng):
    """``moment_jacobian`` (the compiled closed form) against central differences of the
    NumPy reference field, for every built-in type that has one."""
    from gaussian_pde.integrate._differences import central_jacobian
    from gaussian_pde.integrate._fused import moment_jacobian, reference_field

    d = 3
    att = _instance(kind, rng, d, 2)
    if att.field_sees_mean and not with_mean:
        pytest.skip("no covariance-only state")
    jac = moment_jacobian(att, with_mean)
    if not att.exact_jacobian:
        assert jac is None
        return
    m = d + 1 if with_mean else d
    Z = rng.standard_normal((d, m)) / 2
    ref = central_jacobian(reference_field(att, with_mean), Z)
    np.testing.assert_allclose(jac(0.0, Z.ravel()), ref, rtol=1e-6,
                               atol=1e-7 * np.abs(ref).max())


def stiff_linear(t, y):
    """y' = A y with eigenvalues -1 and -1e4: stiff once the fast mode has decayed."""
    return STIFF_A @ y


STIFF_A = np.array([[-1.0, 1.0], [0.0, -1e4]])


@pytest.mark.parametrize("compiled", [True, False])
def test_auto_hands_a_stiff_run_to_the_stiff_solver(compiled):
    """DOP853 with the stiffness test, then LSODA (given the Jacobian) from where the run
    turned stiff: the same answer as the exact one (within the absolute tolerance: the
    exact y(T) is 2e-22) for a fraction of the evaluations."""
    from scipy.linalg import expm

    calls = []

    def fun(t, y):
        calls.append(t)
        return stiff_linear(t, y)

    jac = lambda t, y: STIFF_A  # noqa: E731
    y0, T = np.array([1.0, 1.0]), 50.0
    kw = dict(rtol=1e-10, atol=1e-12, stiff=LSODA, jac=jac)
    if compiled:
        seg = integrate_fortran(fun, "DOP853", 0.0, T, y0, nfev=lambda: len(calls), **kw)
    else:
        seg = integrate_scipy(fun, DOP853, 0.0, T, y0, **kw)
    assert seg.status == 0 and seg.stiff_from is not None and 0 < seg.stiff_from < 1.0
    np.testing.assert_allclose(seg.y_final, expm(T * STIFF_A) @ y0, rtol=1e-7, atol=1e-12)
    n_auto = len(calls)
    calls.clear()
    plain = integrate_scipy(fun, DOP853, 0.0, T, y0, rtol=1e-10, atol=1e-12)
    assert plain.stiff_from is None and n_auto < len(calls) / 10


def test_stiff_trial_keeps_a_cheaper_and_drops_a_dearer_stiff_solver():
    """The trial compares costs per unit time from TRIAL_STEPS steps on: a stiff solver
    cheaper than the explicit rate stays (no later check gives it up), one dearer at every
    check is given up at TRIAL_MAX_STEPS, not before; the explicit rate is scaled by the
    stiffness of the state."""
    from gaussian_pde.integrate import _scipy_loop

    def run(evals_per_step, h, stiffness=None, y0=None, steps=400):
        n = [0]
        trial = _scipy_loop.stiff_trial(10.0, lambda: n[0], lambda: 0, stiffness, y0)
        for i in range(1, steps + 1):
            n[0] += evals_per_step
            if trial(i * h, np.array([float(i)])):
                return i
        return None

    # cost (2 + STEP_COST) / h against an explicit 10 evaluations per unit time
    cheap_h = 2 * (2 + _scipy_loop.STEP_COST) / 10.0
    assert run(2, cheap_h) is None
    assert run(2, cheap_h / 4) == _scipy_loop.TRIAL_MAX_STEPS
    # the same stiff solver against explicit steps that the stiffness makes 8 times dearer
    # as the run goes on (sigma grows with y = step number): it pays after all
    grows = lambda y: 1.0 + 7.0 * (y[0] >= _scipy_loop.TRIAL_STEPS)  # noqa: E731
    assert run(2, cheap_h / 4, grows, np.array([0.0])) is None


def test_handover_step():
    from gaussian_pde.integrate._scipy_loop import handover_step

    assert handover_step(0.5, 1.0, 3.0) == 0.5
    assert handover_step(5.0, 1.0, 3.0) == 2.0
    assert handover_step(None, 1.0, 3.0) is None and handover_step(0.0, 1.0, 3.0) is None
    assert handover_step(0.5, 3.0, 3.0) is None


def test_compiled_solves_in_threads_match_serial():
    """The Fortran path gives bit-identical results when solves run in parallel threads
    (Dask workers may be threaded)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(0)
    cases = []
    for _ in range(16):
        Q, G = rng.standard_normal((2, 3)), rng.standard_normal((3, 3))
        cases.append((gp.Softmax(Q, -Q, G.T @ G / 3), G @ G.T / 3))

    def run(case):
        sol = gp.solve(case[0], None, case[1], (0, 30), t_eval=np.linspace(0, 30, 7))
        return sol.cov, str(sol.status), sol.nfev

    serial = [run(c) for c in cases]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(run, cases))
    for (c1, s1, n1), (c2, s2, n2) in zip(serial, parallel):
        np.testing.assert_array_equal(c1, c2)
        assert s1 == s2 and n1 == n2


def test_solve_uses_the_fortran_codes_only_for_few_output_times():
    """With method="DOP853", dense t_eval goes to SciPy's Python DOP853 (same steps as
    passing the class); t_eval=None or a final time goes to the Fortran code (different
    step sequence)."""
    from gaussian_pde.integrate._scipy_loop import MAX_LANDINGS, use_fortran

    att = gp.L2(np.array([[1.0, 0.5]]), np.array([[0.8, -0.2]]), np.eye(2))
    cov0 = np.array([[1.0, 0.3], [0.3, 0.6]])
    dense = np.linspace(0, 5, 41)
    a = gp.solve(att, None, np.eye(2) + cov0, (0, 5), t_eval=dense, method="DOP853")
    b = gp.solve(att, None, np.eye(2) + cov0, (0, 5), t_eval=dense, method=DOP853)
    assert a.nfev == b.nfev
    np.testing.assert_array_equal(a.cov, b.cov)
    assert use_fortran("DOP853", None, 0.0) and use_fortran("RK45", [0.0, 5.0], 0.0)
    assert use_fortran("DOP853", np.linspace(0, 5, MAX_LANDINGS + 1), 0.0)
    assert not use_fortran("DOP853", np.linspace(0, 5, MAX_LANDINGS + 2), 0.0)
    assert not use_fortran(DOP853, None, 0.0) and not use_fortran("LSODA", None, 0.0)


def test_step_radius_bounds_agree_with_the_eigenvalues(rng, monkeypatch):
    from gaussian_pde.integrate import _scipy_loop
    from gaussian_pde.integrate._fused import moment_jacobian

    eigvals = np.linalg.eigvals
    calls = []

    def counting(J):
        calls.append(1)
        return eigvals(J)

    monkeypatch.setattr(_scipy_loop.np.linalg, "eigvals", counting)
    for k in range(600):
        n = int(rng.integers(2, 30))
        J = rng.standard_normal((n, n))
        if k % 2:
            J *= 10.0 ** rng.uniform(-3, 3, size=(n, n))
        rho = np.max(np.abs(eigvals(J)))
        for h in (0.5, 0.999, 1.001, 2.0, 6.0):
            assert _scipy_loop.step_radius_at_least(J, h / rho, 1.0) == (h / rho * rho >= 1.0)
    # the Jacobians of the paper workload where the stiffness check runs (h rho ~ 4 to 8)
    calls.clear()
    for seed in range(10):
        qr = np.random.default_rng(seed)
        Q = qr.standard_normal((2, 5))
        G, R = qr.standard_normal((5, 5)), qr.standard_normal((5, 5))
        att = gp.Softmax(Q, -Q, R.T @ R, scale=1 / np.sqrt(5))
        J = moment_jacobian(att, False)(0.0, np.linalg.cholesky(G @ G.T).ravel())
        rho = np.max(np.abs(eigvals(J)))
        for h_rho in (1.0, 4.0, 8.0):
            assert _scipy_loop.step_radius_at_least(J, h_rho / rho, 2.0) == (h_rho >= 2.0)
    assert len(calls) < 10                   # the bounds decide nearly all of them


def _never(t, mean, cov):
    """A user event that never fires."""
    return 1.0


@pytest.mark.parametrize("params, verdict", [
    (("softmax", 4, 1, 4, -1.095148134398361, 3.6723361010755156, True, 3823361713),
     "finished"),
    (("softmax", 5, 5, 5, -0.5896893437567936, 5.806135026310667, False, 2231634222),
     "blowup")])
def test_auto_leaves_a_stabilised_run_that_crawls_at_its_stability_bound(params, verdict):
    """Two settings of the seeded invariant loop on the event loop's ``"auto"`` (a user
    event keeps a run there): after a lost LSODA trial the stabilised DOP853 held
    h rho(J) at 3 to 5 with hardly a rejection, so neither stiffness test fired, and it
    spent its 50,000 evaluations. The periodic h rho(J) look of the stabilised run hands
    it to LSODA again, which reaches LSODA's own verdict within the budget."""
    from tests.integrate.test_invariants import BUDGET, _build, horizon

    att, cov0 = _build(params)
    t1 = horizon(att, cov0)
    lsoda = gp.solve(att, None, cov0, (0.0, t1), method="LSODA", max_nfev=BUDGET)
    auto = gp.solve(att, None, cov0, (0.0, t1), max_nfev=BUDGET, events=[_never])
    assert str(lsoda.status) == verdict, lsoda.message
    assert str(auto.status) == verdict and auto.nfev < BUDGET, auto.message
    assert "stiff from t" in auto.message
    if verdict == "blowup":
        assert abs(auto.t_blowup - lsoda.t_blowup) <= 1e-3 * lsoda.t_blowup
    else:
        err = np.linalg.norm(auto.cov_final - lsoda.cov_final) / np.linalg.norm(lsoda.cov_final)
        assert err < 1e-5
