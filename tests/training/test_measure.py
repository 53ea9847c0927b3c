"""Per-layer measures: CKA's invariances, probes on known targets, the centred change."""

import numpy as np
import pytest

from gaussian_pde.training._measure import (
    attention_spread,
    drift_metrics,
    information_metrics,
    linear_cka,
    ridge_probe,
)


@pytest.fixture
def rng():
    return np.random.default_rng(11)


def test_cka_is_one_for_rotations_and_scalings_and_small_for_independent(rng):
    x = rng.standard_normal((500, 6))
    q, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    assert linear_cka(x, 1e8 * x @ q + 3.0) == pytest.approx(1.0, abs=1e-12)
    # independent clouds: E CKA ~ d1 d2 / (N sqrt(d1 d2)) = sqrt(36)/500 = 0.012
    assert linear_cka(x, rng.standard_normal((500, 6))) < 0.05
    assert np.isnan(linear_cka(x, np.full((500, 6), np.inf)))


def test_probes_score_known_targets(rng):
    f = rng.standard_normal((400, 5))
    w = rng.standard_normal(5)
    assert ridge_probe(f, f @ w) > 0.99                 # a linear target: R^2 near 1
    assert ridge_probe(f, rng.standard_normal(400)) < 0.05   # noise: R^2 near 0 or below
    labels = (f @ w > 0).astype(int)                     # linearly separable classes
    assert ridge_probe(f, labels, classes=True) > 0.95
    assert abs(ridge_probe(f, rng.integers(2, size=400), classes=True) - 0.5) < 0.15
    assert np.isnan(ridge_probe(np.full((10, 2), np.nan), np.zeros(10)))


def test_centred_change_ignores_a_common_shift(rng):
    x0 = rng.standard_normal((8, 10, 3))
    toks = np.stack([x0, x0 + 5.0, 2.0 * (x0 + 5.0)])
    d = drift_metrics(toks)
    assert d["centred_step"][0] == pytest.approx(0.0, abs=1e-12)   # a shift
    assert d["rel_step"][0] > 1.0                                  # counted by the old metric
    assert d["centred_step"][1] == pytest.approx(1.0)              # a doubling: |X| more
    info = information_metrics(toks, x0[:, -1, 0], readout="last")
    np.testing.assert_allclose(info["cka_input"], 1.0, atol=1e-12)
    np.testing.assert_allclose(info["probe_input"], 1.0, atol=1e-3)


def test_attention_spread_matches_gaussian_keys(rng):
    """Gaussian keys: the measured effective fraction tends to exp(-a^T S a) for large n."""
    d, n = 3, 2000
    Q = 0.4 * rng.standard_normal((1, d, d))
    K = 0.4 * rng.standard_normal((1, d, d))
    L = rng.standard_normal((d, d)) * 0.5
    x = rng.standard_normal((2, n, d)) @ L.T + 0.3
    r = attention_spread(Q, K, x, 1.0)
    assert 0.05 < r["predicted"] < 0.95
    # the ratio estimator's error is O(n^-1/2 e^{a^T S a}) per query: a few per cent here
    assert r["measured"] == pytest.approx(r["predicted"], rel=0.1)
    assert r["tokens_needed"] == pytest.approx(np.exp(r["spread"]))
    assert np.isnan(attention_spread(Q, K, np.full((1, 4, d), np.nan), 1.0)["measured"])
