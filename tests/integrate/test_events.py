"""The one definition of the events (integrate/_events.py), on problems with exact answers."""

import numpy as np
import pytest

from gaussian_pde import Status
from gaussian_pde.integrate._events import (
    CONFIRM_GROWTH,
    MAX_GROWTH,
    blowup_extrapolate,
    blowup_signature,
    blowup_verdict,
    event_options,
    rank_first,
    rank_gap,
    steady_gap,
)


@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0, 3.0])
def test_power_law_gives_the_exact_blowup_time(beta):
    """u = C (t* - t)^beta: p = (beta - 1)/beta and t - u/(u'(1 - p)) = t* exactly."""
    t_star, C, t = 2.5, 0.7, 1.9
    u = C * (t_star - t) ** beta
    du = -beta * C * (t_star - t) ** (beta - 1)
    du2 = beta * (beta - 1) * C * (t_star - t) ** (beta - 2)
    ts, p, finite = blowup_signature(t, u, du, du2)
    assert finite and p == pytest.approx((beta - 1) / beta, abs=1e-12)
    assert ts == pytest.approx(t_star, rel=1e-12)


def test_exponential_and_polynomial_growth_have_no_finite_time_signature():
    t = 3.0
    for u, du, du2 in [(np.exp(-t), -np.exp(-t), np.exp(-t)),        # p = 1
                       (t**-2, -2 * t**-3, 6 * t**-4)]:              # p = 3/2
        assert not blowup_signature(t, u, du, du2)[2]


def test_extrapolation_from_the_trace_and_a_probe_step():
    """Riccati blow-up tr = 1/(t* - t): the probe-step estimate is exact to rounding."""
    t_star, t, h = 1.0, 0.99, 1e-7
    tr, dtr = 1 / (t_star - t), 1 / (t_star - t) ** 2
    tr2, dtr2 = 1 / (t_star - t - h), 1 / (t_star - t - h) ** 2
    ts, finite = blowup_extrapolate(t, tr, dtr, tr2, dtr2, h)
    assert finite and ts == pytest.approx(t_star, rel=1e-9)
    # vectorised, and a shrinking trace is never a blow-up
    ts, finite = blowup_extrapolate(np.array([t, t]), np.array([tr, 1.0]),
                                    np.array([dtr, -1.0]), np.array([tr2, 1.0]),
                                    np.array([dtr2, -1.0]), np.array([h, h]))
    assert finite.tolist() == [True, False]


def test_verdict_confirms_only_an_estimate_that_holds_further_up():
    status, (suspected, limit) = blowup_verdict(1.0, True, 0.99, 1e8, None)
    assert status is None and suspected == (1.0, 0.99) and limit == 1e8 * CONFIRM_GROWTH
    status, msg = blowup_verdict(1.0 + 1e-5, True, 0.9999, limit, suspected)
    assert status == Status.BLOWUP and "t* = 1.00001" in msg
    # an estimate that drifts by more than 1% of the time left starts over
    status, (again, _) = blowup_verdict(1.2, True, 0.9999, limit, suspected)
    assert status is None and again == (1.2, 0.9999)
    # growth without a finite-time signature is followed until MAX_GROWTH, then fails
    status, msg = blowup_verdict(np.nan, False, 5.0, MAX_GROWTH, None)
    assert status == Status.FAILED and "not as a finite-time" in msg


def test_steady_gap_is_negative_exactly_at_the_criterion():
    cov, dcov = np.eye(2), 1e-3 * np.eye(2)
    norm = np.linalg.norm(dcov)
    assert steady_gap(cov, dcov, None, 1.01 * norm) < 0 < steady_gap(cov, dcov, None,
                                                                      0.99 * norm)
    assert steady_gap(cov, dcov, 1.01 * norm / np.sqrt(2), 0.0) < 0
    stack = np.stack([dcov, 10 * dcov])
    assert (steady_gap(np.stack([cov, cov]), stack, None, 2 * norm) < 0).tolist() == [True,
                                                                                      False]


def test_rank_events_watch_the_smallest_eigenvalue_above_the_threshold():
    cov0 = np.diag([1.0, 1e-6, 0.5])          # the 1e-6 direction is already below 1e-3
    first = rank_first(cov0, 1e-3)
    assert first == 1                          # ascending index of 0.5 / 1.5
    assert rank_gap(np.diag([1.0, 0.0, 0.5]), first, 1e-3) > 0
    assert rank_gap(np.diag([1.0, 0.0, 1e-4]), first, 1e-3) < 0
    assert rank_first(np.diag([0.0, 0.0]), 0.1) == 2    # nothing to collapse: event off


@pytest.mark.parametrize("kwargs, match", [
    ({"blowup_threshold": 1.0}, "greater than 1"),
    ({"blowup_threshold": np.nan}, "blowup_threshold"),
    ({"steady_tol": -1.0}, "steady_tol"),
    ({"steady_atol": -1e-3}, "steady_atol"),
    ({"rank_tol": 1.5}, "rank_tol"),
])
def test_event_options_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        event_options(**kwargs)


def test_steady_event_is_on_with_either_tolerance():
    assert not event_options().steady_on
    assert event_options(steady_tol=1e-6).steady_on
    assert event_options(steady_atol=1e-3).steady_on

