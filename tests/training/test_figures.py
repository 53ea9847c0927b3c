"""The training figures' smoothing (no JAX needed)."""

import numpy as np
import pytest

from gaussian_pde.training._figures import running_mean


@pytest.mark.parametrize("window", [1, 3, 7, 50])
def test_running_mean_is_the_trailing_mean(window):
    y = np.random.default_rng(0).lognormal(size=40)
    want = [np.mean(y[max(0, i - window + 1):i + 1]) for i in range(y.size)]
    np.testing.assert_allclose(running_mean(y, window), want, rtol=1e-12)


def test_running_mean_stops_at_the_first_non_finite_value():
    y = np.array([1.0, 2.0, 3.0, np.inf, 1.0, 2.0])
    out = running_mean(y, 2)
    np.testing.assert_allclose(out[:3], [1.0, 1.5, 2.5])
    assert np.all(np.isnan(out[3:]))
    assert np.all(np.isnan(running_mean([np.nan, 1.0], 5)))
