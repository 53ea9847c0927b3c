"""The engine's plain-state layout (``integrate_states``) on a field with an exact solution.

The linear field :math:`\\dot y = a \\odot y` (rates ``a`` packed in ``params``) has
:math:`y(t) = e^{at}y_0`; its measure :math:`g(y) = |y|^2` stops a row past its limit.
Checked: the states at ``t_eval`` (where the steps land) against the exact solution, the
growth stop between the last step end below the limit and the first above it, and rows
with their own weights.
"""

import numpy as np
import pytest

numba = pytest.importorskip("numba")

from gaussian_pde.attention import compiled_signatures  # noqa: E402
from gaussian_pde.integrate import _compiled_engine as cb  # noqa: E402


def _linear(P, d, m, y, out, ws):
    g = 0.0
    for i in range(d * m):
        out[i] = P[i] * y[i]
        g += y[i] * y[i]
    ws[0] = g


def _linear_jac(P, d, m, y, J, ws):
    n = d * m
    for i in range(n):
        for j in range(n):
            J[i, j] = P[i] if i == j else 0.0
    return True


def _kernels():
    rhs_sig, jac_sig = compiled_signatures()
    return (numba.njit(rhs_sig, cache=True)(_linear), numba.njit(jac_sig, cache=True)(_linear_jac))


def test_states_at_t_eval_are_the_exact_solution():
    rates = np.array([[-1.0, 0.5, -20.0], [0.3, -2.0, 0.0]])
    y0 = np.array([[1.0, 2.0, -1.0], [0.5, 1.0, 3.0]])
    t_eval = np.array([0.0, 0.1, 0.7, 2.0, 3.0])
    states, code, steps, t_final = cb.integrate_states(
        (*_kernels(), rates, 1), y0, t_eval, [np.inf, np.inf], rtol=1e-9, atol=1e-9,
        max_nfev=100_000)
    assert list(code) == ["finished"] * 2 and np.all(steps > 0)
    np.testing.assert_array_equal(t_final, 3.0)
    np.testing.assert_array_equal(states[:, 0], y0)
    exact = np.exp(rates[:, None, :] * t_eval[None, :, None]) * y0[:, None, :]
    np.testing.assert_allclose(states, exact, rtol=1e-7, atol=1e-9)


def test_growth_stops_where_the_measure_passes_the_limit():
    """|y(t)|^2 = e^{2t} passes 10 at t* = log(10)/2: the row stops at the end of the first
    step past it, later output times NaN; the other row (no limit) runs to the end."""
    rates = np.array([[1.0, 1.0]])
    y0 = np.array([[1.0, 0.0], [0.6, 0.8]])
    t_eval = np.linspace(0.0, 3.0, 31)
    states, code, steps, t_final = cb.integrate_states(
        (*_kernels(), rates, 1), y0, t_eval, [10.0, np.inf], rtol=1e-8, atol=1e-8,
        max_nfev=100_000)
    assert list(code) == ["growth", "finished"]
    t_star = 0.5 * np.log(10.0)
    reached = t_eval <= t_final[0]
    assert t_final[0] >= t_star and not reached[-1]
    # the step before the stop ended below the limit: output up to it is finite and exact
    assert np.all(np.isfinite(states[0, reached])) and np.all(np.isnan(states[0, ~reached]))
    np.testing.assert_allclose(states[0, reached, 0], np.exp(t_eval[reached]), rtol=1e-6)
    assert np.sum(states[0, reached] ** 2, axis=1).max() <= np.exp(2 * t_final[0]) * (1 + 1e-6)
    np.testing.assert_allclose(states[1, -1], np.exp(3.0) * y0[1], rtol=1e-6)


def test_the_budget_stops_a_row():
    rates = np.array([[-1.0]])
    _, code, _, t_final = cb.integrate_states((*_kernels(), rates, 1), [[1.0]], [0.0, 10.0],
                                              [np.inf], rtol=1e-12, atol=1e-12, max_nfev=30)
    assert code[0] == "budget" and 0.0 < t_final[0] < 10.0
