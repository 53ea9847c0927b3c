"""The event loop of gp.solve: scipy.integrate.solve_ivp with the package's events.

A named method with user events runs ``solve_ivp`` itself: the same steps as a direct
call on the same right-hand side, the same event times; the package adds its events
and the evaluation budget, which stops at the end of the step that spends it.
"""

import numpy as np
import pytest
from scipy.integrate import DOP853, solve_ivp

import gaussian_pde as gp
from gaussian_pde._common.linalg import psd_factor
from gaussian_pde.integrate._moment_field import moment_jacobian
from gaussian_pde.integrate._solve import _System


def _case(seed=0, d=3):
    rng = np.random.default_rng(seed)
    Q, G = rng.standard_normal((2, d)), rng.standard_normal((d, d))
    return gp.Softmax(Q, -Q, G.T @ G / d), G @ G.T / d


def _half_trace(t, mean, cov):
    """A user event: the trace passes half its initial value (not terminal)."""
    return np.trace(cov) - _half_trace.level


@pytest.mark.parametrize("method", ["DOP853", "RK45", "LSODA", "Radau"])
def test_a_named_method_takes_solve_ivps_steps(method):
    """The stored times are those of ``solve_ivp`` on the same field, bit for bit, and a
    user event lands where ``solve_ivp`` locates it."""
    att, cov0 = _case()
    _half_trace.level = 0.5 * np.trace(cov0)
    sol = gp.solve(att, None, cov0, (0, 5.0), method=method, events=[_half_trace])
    system = _System(att, False)
    y0 = psd_factor(cov0).ravel()
    kw = {"jac": moment_jacobian(att, False)} if method in ("LSODA", "Radau") else {}

    def event(t, y):
        return _half_trace(t, None, system.mean_and_cov(y)[1])

    ref = solve_ivp(system.fun, (0, 5.0), y0, method=method, rtol=1e-10, atol=1e-12,
                    events=[event], **kw)
    assert sol.status == "finished" and ref.status == 0
    np.testing.assert_array_equal(sol.t, ref.t)
    np.testing.assert_array_equal(sol.factor[-1].ravel(), ref.y[:, -1])
    np.testing.assert_array_equal(sol.t_events["_half_trace"], ref.t_events[0])


def test_the_budget_stops_at_the_end_of_the_step_that_spends_it():
    """``max_nfev``: the run stops ``failed`` at a step end of the unbounded run, the
    first whose evaluations pass the budget, with that step's state."""
    att, cov0 = _case(1)
    full = gp.solve(att, None, cov0, (0, 50.0), method="DOP853", events=[_never])
    budget = full.nfev // 2
    short = gp.solve(att, None, cov0, (0, 50.0), method="DOP853", events=[_never],
                     max_nfev=budget)
    assert full.status == "finished" and budget > 100
    assert short.status == "failed"
    assert f"{budget} right-hand-side evaluations" in short.message
    assert budget < short.nfev <= budget + 12     # an accepted DOP853 step: 12
    k = int(np.searchsorted(full.t, short.t_final))
    assert full.t[k] == short.t_final
    np.testing.assert_array_equal(short.t, full.t[:k + 1])
    np.testing.assert_array_equal(short.cov_final, full.cov[k])


def _never(t, mean, cov):
    """A user event that never fires."""
    return 1.0


def test_solve_methods_agree_on_the_paper_workload():
    """SciPy's DOP853, RK45, LSODA with the exact Jacobian, Radau and the Rosenbrock path
    agree on a d = 5 run with V = G^T G to 1e-8."""
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


def test_compiled_solves_in_threads_match_serial():
    """Solves give bit-identical results when they run in parallel threads (Dask workers
    may be threaded): the engine's default, and the event loop with a user event and a
    named explicit method (SciPy's LSODA, the event loop's ``"auto"``, serves one problem
    at a time in a process: it raises ``IntegratorConcurrencyError`` in threads)."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(0)
    cases = []
    for i in range(16):
        Q, G = rng.standard_normal((2, 3)), rng.standard_normal((3, 3))
        cases.append((gp.Softmax(Q, -Q, G.T @ G / 3), G @ G.T / 3, [_never] * (i % 2)))

    def run(case):
        att, cov0, events = case
        sol = gp.solve(att, None, cov0, (0, 30), t_eval=np.linspace(0, 30, 7), events=events,
                       method="DOP853" if events else "auto")
        return sol.cov, str(sol.status), sol.nfev

    serial = [run(c) for c in cases]
    with ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(run, cases))
    for (c1, s1, n1), (c2, s2, n2) in zip(serial, parallel):
        np.testing.assert_array_equal(c1, c2)
        assert s1 == s2 and n1 == n2


def test_a_span_below_lsodas_step_ends_at_the_budget():
    """A span so short that LSODA's first step does not move t (``t + h == t``): every
    step end after the first look counts against the budget, so the run stops ``failed``
    at the budget instead of stepping in place for ever."""
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    s = gp.solve(att, None, np.eye(2), (0.0, 1e-300), events=[lambda t, mean, cov: 1.0],
                 max_nfev=500)
    assert s.status == "failed" and s.nfev <= 510 and "500" in s.message
