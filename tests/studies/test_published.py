"""Replay of the published histograms against a per-trajectory loop (docs/math.md 9)."""
# ruff: noqa: NPY002  (the published protocol is defined by the legacy global generator)

import json
import math
import pathlib

import numpy as np
import pytest

from gaussian_pde.studies import _published as pub
from gaussian_pde.studies import _published_kernel as kernel
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
    counts, path, stats = pub._replay_panel(kind, d, qs[:n], vs, h, tol, max_iter, n_max,
                                            n_settings=n)
    attempts, ranks = _sequential(kind, d, qs, vs, h, tol, max_iter, n_max, n)
    agree, whole = _compare(path, attempts, tol, max_iter)
    if whole:
        assert len(path) == len(attempts)
        assert counts == [ranks.count(r) for r in range(d + 1)]
        assert stats["attempts"] == len(attempts)
    assert agree >= 0.8 * len(attempts)
    assert stats["discarded"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(("val", "n"), [("identity", 10), ("random", 100)])
def test_replay_matches_the_loop_full_max_iter(val, n):
    """Softmax d = 3 with the published parameters, attempt by attempt against the
    published loop: the first 10 settings of V = I, and the whole V-random panel (113
    attempts, most of them with the projection acting at every step)."""
    d = 3
    par = pub.PANELS[("softmax", val)]
    h, tol, max_iter, n_max = par["h"][0], par["tol"], par["max_iter"], par["n_max"]
    qs, vs = pub.published_settings("softmax")[d]
    vs = [np.eye(d)] * n if val == "identity" else vs[:n]
    counts, path, _ = pub._replay_panel("softmax", d, qs[:n], vs, h, tol, max_iter, n_max,
                                        n_settings=n)
    attempts, ranks = _sequential("softmax", d, qs, vs, h, tol, max_iter, n_max, n)
    agree, whole = _compare(path, attempts, tol, max_iter)
    assert whole and agree == len(attempts)
    assert counts == [ranks.count(r) for r in range(d + 1)]


@pytest.mark.parametrize("kind", ["softmax", "l2"])
@pytest.mark.parametrize("d", [3, 4, 5])
def test_low_rank_field_equals_the_published_expressions(kind, d):
    rng = np.random.default_rng(d)
    qs, vs = pub.published_settings(kind)[d]
    r = d // 2
    scratch = [np.empty((r, d)), np.empty((d, r)), np.empty((d, r)), np.empty((d, d)),
               np.empty((r, r))]
    for m in (0, 41):
        g = rng.standard_normal((d, d))
        s = g @ g.T
        vv, a, kk2 = pub._constants(kind, qs[m], vs[m], d)
        want = pub._rhs(kind, s[None], vv[None], a[None],
                        None if kk2 is None else kk2[None])[0]
        q, qm, v, c = pub._row_constants(kind, qs[m], vs[m], d)
        kernel._field(s, q, qm, v, c, *scratch)
        w = scratch[3]
        np.testing.assert_allclose(w + w.T, want, rtol=1e-12, atol=1e-12 * abs(want).max())


def _with_eigenvalues(lam, seed=3):
    u, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((len(lam), len(lam))))
    return u, (u * lam) @ u.T


def test_cholesky_test_decides_positive_definiteness():
    low = np.zeros((4, 4))
    for lam0, want in ((1e-3, True), (1e-9, True), (-1e-9, False), (-0.5, False)):
        _, s = _with_eigenvalues(np.array([lam0, 0.3, 1.1, 2.5]))
        assert kernel._cholesky_ok(s, low, 4) is want
        if want:
            np.testing.assert_allclose(np.tril(low), np.linalg.cholesky(s), atol=1e-12)
    assert not kernel._cholesky_ok(np.full((2, 2), np.nan), np.zeros((2, 2)), 2)


@pytest.mark.parametrize("lam1", [-3e-5, -1e-15, 2e-7])
def test_tracked_eigenpair_gives_the_published_projection(lam1):
    """Inverse iteration from a nearby vector finds the smallest eigenpair to rounding;
    its rank-one correction is the eigendecomposition's projection."""
    d = 4
    u, s = _with_eigenvalues(np.array([lam1, 0.3, 1.1, 2.5]))
    ev = u[:, 0] + 1e-6 * np.random.default_rng(1).standard_normal(d)   # one step away
    ev /= np.linalg.norm(ev)
    got = kernel._track(s, ev, np.empty((d, d)), np.zeros((d, d)), np.empty(d), d)
    assert got == pytest.approx(lam1, abs=1e-15)
    assert abs(abs(ev @ u[:, 0]) - 1) < 1e-14
    if lam1 < 0:
        fixed = s + (kernel.CLIP - got) * np.outer(ev, ev)
        np.testing.assert_allclose(fixed, pub._project(s[None])[0], rtol=0, atol=1e-14)
        assert kernel._cholesky_ok(fixed, np.zeros((d, d)), d)
    # a start vector far from the eigenvector: the shifted matrix is indefinite
    bad = u[:, 3].copy()
    assert np.isnan(kernel._track(s, bad, np.empty((d, d)), np.zeros((d, d)),
                                  np.empty(d), d))


def test_two_negative_eigenvalues_fail_the_certificate():
    """With two negative eigenvalues the matrix corrected along the tracked eigenvector
    still fails the Cholesky test (interlacing), so the kernel falls back to the
    published eigendecomposition."""
    d = 4
    u, s = _with_eigenvalues(np.array([-2e-6, -1e-6, 1.1, 2.5]))
    ev = u[:, 0].copy()
    lam1 = kernel._track(s, ev, np.empty((d, d)), np.zeros((d, d)), np.empty(d), d)
    assert lam1 == pytest.approx(-2e-6, rel=1e-6)
    fixed = s + (kernel.CLIP - lam1) * np.outer(ev, ev)
    assert not kernel._cholesky_ok(fixed, np.zeros((d, d)), d)


def test_an_overshooting_first_step_matches_the_loop():
    """A step so long that two eigenvalues overshoot below zero: projected twice at the
    floor, as the loop does."""
    q = np.array([[1.0, 0.5, -0.3, 0.2], [0.1, -0.8, 0.4, 0.9]])
    ref = pub.reference_attempt("softmax", q, np.eye(4), np.eye(4), 2.0, 1e-6, 200)
    got = pub._run_attempt("softmax", pub._row_constants("softmax", q, np.eye(4), 4),
                           np.eye(4), 2.0, 1e-6, 200)
    assert (got["status"], got["rank"], got["stop_iteration"]) == \
        (ref["status"], ref["rank"], ref["iterations"]) == ("converged", 2, 1)
    np.testing.assert_allclose(got["eigenvalues"], ref["eigenvalues"], rtol=0, atol=1e-14)


def test_compiled_kernel_equals_its_python_source():
    """The kernel without Numba (plain Python, the fallback) gives the same numbers."""
    qs, vs = pub.published_settings("l2")[5]
    consts = pub._row_constants("l2", qs[3], vs[3], 5)
    s0 = pub._sigma0_draws(5, 2)[1]
    args = (*consts, s0, 0.15, 5e-5, 400, pub.TRACE_MAX)
    fast = kernel.attempt(*args)
    slow = getattr(kernel.attempt, "py_func", kernel.attempt)(*args)
    assert fast[:2] == slow[:2]
    np.testing.assert_allclose(fast[6], slow[6], rtol=1e-13, atol=1e-15)
    assert pub.CLIP == kernel.CLIP


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
def test_full_replay_gives_the_recorded_histograms():
    """All twelve panels in full (seconds with the compiled kernel) reproduce the counts
    recorded in docs/_static/results/reproduce/published_histograms.json, with every recorded count within the
    histogram's range."""
    res = published_histograms()
    root = pathlib.Path(__file__).resolve().parents[2]
    recorded = json.loads((root / "docs" / "_static" / "results" / "reproduce"
                                 / "published_histograms.json").read_text())
    assert res["histograms"] == recorded
    for kind, by_val in res["histograms"].items():
        for val, by_d in by_val.items():
            for ds, counts in by_d.items():
                d = int(ds)
                st = res["details"][kind][val][ds]
                assert sum(counts) == st["converged"] - st["not_recorded"] <= 100
                assert all(c == 0 for c in counts[math.ceil(d / 2) + 1:])


@pytest.mark.parametrize("kwargs, match", [
    ({"types": ("sinkhorn",)}, "`types`"),
    ({"types": "softmax"}, "`types`"),
    ({"types": ()}, "`types`"),
    ({"types": ("softmax", "softmax")}, "`types`"),
    ({"values": ("diagonal",)}, "`values`"),
    ({"values": "identity"}, "`values`"),
    ({"values": []}, "`values`"),
    ({"ds": ()}, "`ds`"),
    ({"ds": (6,)}, "`ds`"),
    ({"ds": 3}, "`ds`"),
    ({"ds": (3.5,)}, "`ds`"),
    ({"n_settings": 0}, "`n_settings`"),
    ({"n_settings": -1}, "`n_settings`"),
    ({"n_settings": 101}, "`n_settings`"),
    ({"n_settings": 2.0}, "`n_settings`"),
    ({"progress": "print"}, "`progress`"),
    ({"return_paths": "no"}, "`return_paths`"),
])
def test_published_histograms_refuses_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        published_histograms(**kwargs)


def test_write_published_histograms_checks_out_before_the_replay(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(pub, "_replay_panel", lambda *a, **k: calls.append(a))
    afile = tmp_path / "a_file"
    afile.write_text("x")
    with pytest.raises(ValueError, match="`out`"):
        pub.write_published_histograms(afile, n_settings=1)
    with pytest.raises(ValueError, match="`out`"):
        pub.write_published_histograms("/proc/gaussian_pde_out", n_settings=1)
    with pytest.raises(TypeError, match="`types`"):
        pub.write_published_histograms(tmp_path / "new", types="l2")
    assert calls == [] and not (tmp_path / "new").exists()
