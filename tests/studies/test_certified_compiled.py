"""certified_limits: the compiled log-time loop against the NumPy reference.

Both paths share the set-up, field, RODAS4 tableau, step control and decision; the
compiled one sums in another order, so its states differ from the reference's at the
level of rounding amplified by the step-size control. Checked: identical verdicts
(outcome and rank) and fitted exponents within ``EXPONENT_TOL`` on random published
settings of every panel (softmax and L2, V = I and random V, d = 3, 4, 5), on a multi-head
sum and on a finite-time blow-up; and the whole published protocol (slow).
"""

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.studies import _published as pub

#: largest difference of a fitted exponent between the paths (the fits span two decades
#: of checkpoints integrated to rtol = 1e-6, so the two paths differ far below this)
EXPONENT_TOL = 1e-5


def _setting(kind, val, d, i, k):
    qs, vs = pub.published_settings(kind)[d]
    v = np.eye(d) if val == "identity" else vs[i]
    att = (gp.Softmax(qs[i], -qs[i], v, scale=1 / np.sqrt(d)) if kind == "softmax"
           else gp.L2(qs[i], -qs[i], v / np.sqrt(d), scale=1.0))
    return att, pub._sigma0_draws(d, k + 1)[k]


def _panels(per_panel, rng=None):
    out = []
    for kind in ("softmax", "l2"):
        for val in ("identity", "random"):
            for d in pub.DIMENSIONS:
                idx = range(per_panel) if rng is None else rng.choice(100, per_panel, False)
                out += [_setting(kind, val, d, int(i), int(i)) for i in idx]
    return out


def _assert_same(new, old):
    assert [r.path for r in new] == ["compiled"] * len(new)
    assert [r.path for r in old] == ["numpy"] * len(old)
    changed = [(i, a.outcome, a.rank, b.outcome, b.rank) for i, (a, b) in
               enumerate(zip(new, old)) if (a.outcome, a.rank) != (b.outcome, b.rank)]
    assert changed == []
    for a, b in zip(new, old):
        np.testing.assert_allclose(a.exponents, b.exponents, rtol=0, atol=EXPONENT_TOL)
        np.testing.assert_allclose(a.pivot_exponents, b.pivot_exponents, rtol=0,
                                   atol=EXPONENT_TOL)
        if a.limit is not None:
            np.testing.assert_allclose(a.limit, b.limit, rtol=0,
                                       atol=1e-6 * np.abs(b.limit).max())


def test_compiled_matches_numpy_on_every_panel():
    rng = np.random.default_rng(7)
    jobs = _panels(1, rng)
    atts, covs = [a for a, _ in jobs], [c for _, c in jobs]
    _assert_same(gp.certified_limits(atts, covs, compiled=True),
                 gp.certified_limits(atts, covs, compiled=False))


def test_compiled_matches_numpy_on_a_multi_head_sum():
    rng = np.random.default_rng(3)
    d = 4
    Q = rng.standard_normal((2, d))
    R = rng.standard_normal((d, d))
    att = gp.MultiHead([gp.Softmax(Q, -Q, np.eye(d), scale=0.5),
                        gp.L2(Q, -Q, R.T @ R / d, scale=1.0)])
    G = rng.standard_normal((3, d, d))
    covs = list(G @ np.swapaxes(G, 1, 2) + 0.1 * np.eye(d))
    _assert_same(gp.certified_limits(att, covs, compiled=True),
                 gp.certified_limits(att, covs, compiled=False))


def test_compiled_matches_numpy_on_a_blowup():
    Q = np.array([[1.0, 0.0]])
    att = gp.Softmax(Q, Q, np.eye(2))          # K = Q: the covariance blows up
    new = gp.certified_limit(att, np.eye(2))
    old = gp.certified_limits([att], [np.eye(2)], compiled=False)[0]
    assert new.outcome == old.outcome
    assert new.steps == old.steps
    assert new.t_blowup == pytest.approx(old.t_blowup, rel=1e-9)


@pytest.mark.slow
def test_compiled_matches_numpy_on_the_published_protocol():
    jobs = _panels(100)
    atts, covs = [a for a, _ in jobs], [c for _, c in jobs]
    _assert_same(gp.certified_limits(atts, covs, compiled=True),
                 gp.certified_limits(atts, covs, compiled=False))
