"""The re-factoring look of gp.solve: the bound that skips its SVD never changes its answer."""

import numpy as np
import pytest

from gaussian_pde._common import factor_rotation as rotation
from gaussian_pde._common.factor_rotation import cancellation_exceeds, cancellation_excess


def _graded_factor(rng, d, spread, scale):
    """A factor whose columns cancel: F L0 with F strongly graded."""
    U, _ = np.linalg.qr(rng.standard_normal((d, d)))
    F = U @ np.diag(np.logspace(0, spread, d)) @ U.T
    return scale * F @ rng.standard_normal((d, d))


@pytest.mark.parametrize("level", [1e-3, 0.1, 10.0])
def test_cancellation_exceeds_agrees_with_the_excess(level, rng):
    checked = exceeded = 0
    for _ in range(400):
        d = int(rng.integers(2, 7))
        L = _graded_factor(rng, d, rng.uniform(0, 14), 10.0 ** rng.uniform(-3, 6))
        for atol, rtol in ((1e-12, 1e-10), (1e-8, 1e-6), (0.0, 1e-10)):
            want = bool(cancellation_excess(L, atol, rtol) > level)
            assert cancellation_exceeds(L, atol, rtol, level) == want
            assert cancellation_exceeds(L, atol, rtol, level, fro2=float(np.sum(L * L))) == want
            checked += 1
            exceeded += want
    assert 0 < exceeded < checked          # both answers occur


def test_cancellation_exceeds_skips_the_svd_only_where_the_bound_decides(rng, monkeypatch):
    calls = []
    svd = np.linalg.svd

    def counting(*args, **kwargs):
        calls.append(1)
        return svd(*args, **kwargs)

    monkeypatch.setattr(rotation.np.linalg, "svd", counting)
    L = rng.standard_normal((5, 5))          # |L|_F ~ 5: eps |L|_F / atol ~ 1e-3
    assert not cancellation_exceeds(L, 1e-12, 1e-10, 0.1)
    assert not calls
    assert not cancellation_exceeds(1e6 * L, 1e-12, 1e-10, 0.1)   # bound open: SVD
    assert len(calls) == 1
    bad = L.copy()
    bad[0, 0] = np.nan                        # not finite: False, as NaN > level is
    assert not cancellation_exceeds(bad, 1e-12, 1e-10, 0.1)
