"""The shared RK4 step: its order, its exactness on cubics, and its finiteness guard."""

import numpy as np
import pytest

from gaussian_pde._common.runge_kutta import equal_steps, rk4_march, rk4_step


def test_exact_for_a_cubic_in_time():
    """y' = p(t) with deg p = 3 is Simpson's rule, which RK4 reduces to: exact."""
    def p(t, y):
        return np.array([1.0 - 2.0 * t + 3.0 * t ** 2 - 4.0 * t ** 3])

    def antiderivative(t):
        return t - t ** 2 + t ** 3 - t ** 4

    y = rk4_step(p, 0.3, np.array([2.0]), 0.7)
    assert y[0] == pytest.approx(2.0 + antiderivative(1.0) - antiderivative(0.3), rel=1e-14)


def test_fourth_order_on_a_rotation():
    """y' = Jy, J a rotation generator: halving h divides the error by about 2^4."""
    J = np.array([[0.0, -1.0], [1.0, 0.0]])
    y0 = np.array([1.0, 0.5])
    exact = np.array([[np.cos(2.0), -np.sin(2.0)], [np.sin(2.0), np.cos(2.0)]]) @ y0
    errors = [np.linalg.norm(rk4_march(lambda t, y: J @ y, y0, (0.0, 2.0), h)[-1] - exact)
              for h in (0.2, 0.1, 0.05)]
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert np.all((ratios > 14) & (ratios < 18)), ratios


def test_march_lands_on_every_output_time():
    seen = []

    def f(t, y):
        seen.append(t)
        return np.ones_like(y)

    out = rk4_march(f, np.zeros(1), (0.0, 0.25, 1.0), 0.1)
    assert [o[0] for o in out] == pytest.approx([0.0, 0.25, 1.0], rel=1e-14)
    assert max(seen) <= 1.0 + 1e-15


def test_equal_steps_are_the_fewest_no_longer_than_h_max():
    assert equal_steps(1.0, 0.1) == (10, 0.1)
    m, h = equal_steps(1.0, 0.3)
    assert m == 4 and h == 0.25
    assert equal_steps(0.01, 1.0) == (1, 0.01)


def test_the_guard_stops_before_a_non_finite_stage_reaches_the_field():
    calls = []

    def f(t, y):
        calls.append(y.copy())
        assert np.all(np.isfinite(y)), "the field saw a non-finite state"
        return y * 1e300

    with np.errstate(over="ignore"):   # the first slope overflows
        assert rk4_step(f, 0.0, np.array([1e10]), 1.0, finite=True) is None
        assert len(calls) == 1
        with pytest.raises(AssertionError, match="non-finite"):   # unguarded, it reaches f
            rk4_step(f, 0.0, np.array([1e10]), 1.0)


def test_the_guard_rejects_a_non_finite_result():
    def f(t, y):
        return np.full_like(y, 1e308)

    assert rk4_step(f, 0.0, np.array([0.0]), 1.0, finite=True) is None
