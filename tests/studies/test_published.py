"""Replay of the published histograms against a per-trajectory loop (docs/math.md 9)."""
# ruff: noqa: NPY002  (the published protocol is defined by the legacy global generator)

import json
import math

import numpy as np
import pytest

from gaussian_pde.studies import _published as pub
from gaussian_pde.studies import published_histograms


def _sequential(kind, d, qs, vs, h, tol, max_iter, n_max, n_settings):
    """The published driver, attempt after attempt, with the global legacy generator."""
    np.random.seed(41)
    i, attempts, ranks = 0, [], []
    for _ in range(n_max):
        g = np.random.randn(d, d)
        res = pub.reference_attempt(kind, qs[i], vs[i], g @ g.T, h, tol, max_iter)
        attempts.append((i, res["status"], res["iterations"], res["rank"]))
        if res["status"] == "converged":
            if res["rank"] <= (d + 1) // 2:
                ranks.append(res["rank"])
            i += 1
        if i == n_settings:
            break
    return attempts, ranks


def test_settings_follow_the_global_legacy_stream():
    np.random.seed(40)
    rep = np.repeat([3, 4, 5], 100)
    qs = [np.random.randn(d // 2, d) for d in rep]
    np.random.seed(27)
    vs = [np.random.randn(d, d) for d in rep]
    vs = [np.dot(v.T, v) for v in vs]
    got = pub.published_settings("l2")
    for j, d in enumerate((3, 4, 5)):
        for m in (0, 57, 99):
            assert np.array_equal(got[d][0][m], qs[100 * j + m])
            assert np.array_equal(got[d][1][m], vs[100 * j + m])
    np.random.seed(41)
    draws = [np.random.randn(4, 4) for _ in range(7)]
    assert np.array_equal(pub._sigma0_draws(4, 7), np.array([g @ g.T for g in draws]))


def _near(rec, tol, max_iter):
    """Whether a 1% change of a threshold could change the attempt's outcome."""
    if rec["status"] == "converged":
        return (any(abs(e / pub.RANK_THRESHOLD - 1.0) < pub.NEAR for e in rec["eigenvalues"])
                or rec["stop_iteration"] >= (1 - pub.NEAR) * max_iter
                or abs(rec["norm_prev"] / tol - 1.0) < 1e-10)
    if rec["status"] == "max_iter":
        return rec["norm_min"] < tol * (1 + pub.NEAR)
    return abs(rec["trace"] / pub.TRACE_MAX - 1.0) < pub.NEAR


def _compare(path, attempts, tol, max_iter):
    """Attempts on which the replay and the loop agree, up to the first near-boundary
    attempt where they differ (after it the draws of later settings differ)."""
    agree = 0
    for rec, (i, status, iters, rank) in zip(path, attempts):
        same = (rec["setting"], rec["status"], rec["rank"]) == (i, status, rank)
        if not same:
            assert _near(rec, tol, max_iter), (rec, (i, status, iters, rank))
            return agree, False
        if status != "max_iter":
            # rounding moves the stop by a few iterations at most
            assert abs(rec["stop_iteration"] - iters) <= max(3, 1e-3 * iters)
        agree += 1
    return agree, True


@pytest.mark.parametrize(("kind", "val", "d", "h", "tol", "max_iter", "n_max", "n"), [
    ("softmax", "identity", 3, 0.09, 1e-4, 1500, 25, 10),
    ("softmax", "random", 3, 0.09, 5e-5, 2500, 40, 5),
    ("l2", "random", 4, 0.15, 5e-5, 1500, 30, 4),
])
def test_replay_matches_the_loop_with_redraws(kind, val, d, h, tol, max_iter, n_max, n):
    """Status, rank and stop iteration of every attempt of the sequential path against
    the published loop; small max_iter forces redraws, V random exercises the floor rows
    (the projection acts at every step)."""
    qs, vs = pub.published_settings(kind)[d]
    vs = [np.eye(d)] * n if val == "identity" else vs[:n]
    counts, path, stats = pub._replay_panel(kind, d, qs[:n], vs, h, tol, max_iter,
                                            n_max, n_settings=n, pool_size=32)
    attempts, ranks = _sequential(kind, d, qs, vs, h, tol, max_iter, n_max, n)
    agree, whole = _compare(path, attempts, tol, max_iter)
    if whole:
        assert len(path) == len(attempts)
        assert counts == [ranks.count(r) for r in range(d + 1)]
        assert stats["attempts"] == len(attempts)
    assert agree >= 0.8 * len(attempts)
    assert stats["discarded"] > 0


@pytest.mark.slow
def test_replay_matches_the_loop_full_max_iter():
    """First 10 settings of softmax, V = I, d = 3 with the published max_iter."""
    d, n, h, tol, max_iter = 3, 10, 0.09, 1e-4, 60000
    qs, _ = pub.published_settings("softmax")[d]
    vs = [np.eye(d)] * n
    counts, path, _ = pub._replay_panel("softmax", d, qs[:n], vs, h, tol, max_iter, 1000,
                                        n_settings=n, pool_size=32)
    attempts, ranks = _sequential("softmax", d, qs, vs, h, tol, max_iter, 1000, n)
    agree, whole = _compare(path, attempts, tol, max_iter)
    assert whole and agree == len(attempts)
    assert counts == [ranks.count(r) for r in range(d + 1)]


@pytest.mark.parametrize("kind", ["softmax", "l2"])
@pytest.mark.parametrize("d", [3, 4, 5])
def test_low_rank_field_equals_the_published_expressions(kind, d):
    rng = np.random.default_rng(d)
    qs, vs = pub.published_settings(kind)[d]
    for m in (0, 41):
        g = rng.standard_normal((d, d))
        s = g @ g.T
        vv, a, kk2 = pub._constants(kind, qs[m], vs[m], d)
        want = pub._rhs(kind, s[None], vv[None], a[None],
                        None if kk2 is None else kk2[None])[0]
        qp, qm, vp, c = pub._row_constants(kind, qs[m], vs[m], d)
        sp = np.eye(5)
        sp[:d, :d] = s
        got = pub._fast_rhs(sp[..., None], qp[..., None], qm[..., None], vp[..., None],
                            np.array([c]))[..., 0]
        np.testing.assert_allclose(got[:d, :d], want, rtol=1e-12, atol=1e-12 * abs(want).max())
        assert not got[d:].any() and not got[:, d:].any()


def test_floor_rows_apply_the_published_projection():
    """A row with one eigenvalue at the floor: the tracked eigenpair and the rank-one
    correction give the eigendecomposition's projection, and a negative eigenvalue
    well above the floor is clipped too."""
    rng = np.random.default_rng(3)
    d = 4
    u, _ = np.linalg.qr(rng.standard_normal((d, d)))
    qs, vs = pub.published_settings("softmax")[d]
    p = pub._Panel(0, "softmax", "random", d, qs[:2], vs[:2], 0.06, 5e-5, 100, 10, 2, 8, "t")
    eng = pub._Engine([p])
    eng._append([eng._fresh(p, (0, 0)), eng._fresh(p, (1, 1))])
    for lam1 in (-3e-5, 2e-7):
        lam = np.array([lam1, 0.3, 1.1, 2.5])
        s = (u * lam) @ u.T
        s_new = np.repeat(np.eye(5)[..., None], 2, axis=-1)
        s_new[:d, :d, 0] = s
        eng.floor[:] = [True, False]
        eng.floor_idx = np.array([0])
        eng.mu2[:] = 0.29
        old = u[:, 0] + 1e-3 * rng.standard_normal(d)
        eng.u[:, 0] = 0.0
        eng.u[:d, 0] = old / np.linalg.norm(old)
        bad = eng._floor_rows(s_new, np.zeros(2))
        assert len(bad) == 0
        want = pub._project(s[None])[0]
        np.testing.assert_allclose(s_new[:d, :d, 0], want, rtol=0, atol=1e-12)
        assert abs(abs(eng.u[:d, 0] @ u[:, 0]) - 1) < 1e-12
    eng.mu2[:] = 0.0                        # bound on the second eigenvalue exhausted
    assert list(eng._floor_rows(s_new, np.zeros(2))) == [0]


def test_json_shape_and_counts(tmp_path, monkeypatch):
    small = {key: {**par, "max_iter": 3000, "n_max": 12} for key, par in pub.PANELS.items()}
    monkeypatch.setattr(pub, "PANELS", small)
    lines = []
    res = pub.write_published_histograms(tmp_path, n_settings=3, progress=lines.append)
    hist = json.loads((tmp_path / "published_histograms.json").read_text())
    details = json.loads((tmp_path / "published_histograms_details.json").read_text())
    assert hist == res["histograms"]
    assert len(lines) == 12
    assert set(hist) == {"softmax", "l2"}
    for kind in hist:
        assert set(hist[kind]) == {"identity", "random"}
        for val in hist[kind]:
            assert set(hist[kind][val]) == {"3", "4", "5"}
            for ds, counts in hist[kind][val].items():
                d = int(ds)
                assert len(counts) == d + 1
                assert 0 <= sum(counts) <= 3
                assert all(c == 0 for c in counts[math.ceil(d / 2) + 1:])
                st = details[kind][val][ds]
                assert st["attempts"] <= 12
                assert st["converged"] - st["not_recorded"] == sum(counts)
                assert st["attempts"] == st["converged"] + st["discarded"]


def test_public_function_one_panel():
    res = published_histograms(types=("l2",), ds=(3,), values=("identity",), n_settings=4)
    counts = res["histograms"]["l2"]["identity"]["3"]
    assert len(counts) == 4 and sum(counts) <= 4 and counts[3] == 0


@pytest.mark.slow
def test_full_replay_counts():
    """The three softmax V = I panels in full (the V-random panels take up to 10,000
    attempts of 90,000 steps each: run them with ``gaussian-pde reproduce --protocol
    published``)."""
    res = published_histograms(types=("softmax",), values=("identity",))
    for kind in ("softmax",):
        for val in ("identity",):
            for d in (3, 4, 5):
                counts = res["histograms"][kind][val][str(d)]
                assert len(counts) == d + 1 and sum(counts) <= 100
                assert all(c == 0 for c in counts[math.ceil(d / 2) + 1:])


def test_residual_forecast_of_a_power_law():
    """observe: |r| = C m^-p through two marks gives the iteration where |r| = tol."""
    panel = pub._Panel(0, "softmax", "identity", 3, [], [], 0.09, 1e-4, 60000, 10, 0, 8, "x")
    C, p = 1e3, 1.5

    def n2(m):
        return (C * m ** -p) ** 2

    m0 = pub._FORECAST_FROM
    panel.observe((0, 0), m0 // 2, n2(m0 // 2))       # too early: nothing
    assert not panel.marks
    panel.observe((0, 0), m0, n2(m0))
    panel.observe((0, 0), 2 * m0, n2(2 * m0))
    m_star = (C / 1e-4) ** (1 / p)                     # C m^-p = tol
    assert panel.hints[(0, 0)] == pytest.approx(m_star / 60000, rel=1e-9)
    assert panel.marks[(0, 0)][0] == 2 * m0            # the mark moved on doubling
    # a residual that does not decay is forecast to fail
    panel.observe((0, 1), m0, 1.0)
    panel.observe((0, 1), 2 * m0, 1.0)
    assert panel.hints[(0, 1)] == np.inf
    assert panel._hinted((0, 1), 0.3) == pub._FORECAST_PF[1]
    # a barely decaying one is forecast past max_iter without overflowing
    panel.observe((0, 3), m0, 1.0)
    panel.observe((0, 3), 2 * m0, 1.0 - 1e-12)
    assert panel.hints[(0, 3)] == np.inf
    assert panel._hinted((0, 2), 0.3) == 0.3


def test_replay_path_does_not_depend_on_the_forecast(monkeypatch):
    """The forecast only orders the speculation: with it on from the first iterations,
    and with it off, the sequential path is the same, attempt by attempt."""
    d, n, h, tol, max_iter, n_max = 3, 5, 0.09, 5e-5, 2500, 40
    qs, vs = pub.published_settings("softmax")[d]

    def replay():
        return pub._replay_panel("softmax", d, qs[:n], vs[:n], h, tol, max_iter, n_max,
                                 n_settings=n, pool_size=8)

    monkeypatch.setattr(pub, "_FORECAST_FROM", 16)
    used = []
    hinted = pub._Panel._hinted

    def counting(self, key, pf):
        used.append(key in self.hints)
        return hinted(self, key, pf)

    monkeypatch.setattr(pub._Panel, "_hinted", counting)
    on = replay()
    assert sum(used) > 0               # the forecast did order the speculation
    monkeypatch.setattr(pub._Panel, "_hinted", lambda self, key, pf: pf)
    off = replay()
    assert on[0] == off[0]
    strip = [{k: r[k] for k in ("setting", "draw", "status", "stop_iteration", "rank")}
             for r in on[1]]
    assert strip == [{k: r[k] for k in ("setting", "draw", "status", "stop_iteration",
                                        "rank")} for r in off[1]]
