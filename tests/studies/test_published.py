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


@pytest.mark.parametrize(("max_iter", "n_max"), [(60000, 1000), (1500, 25)])
def test_replay_matches_the_loop_with_redraws(max_iter, n_max):
    """First 10 settings of softmax, V = I, d = 3; max_iter = 1500 forces redraws."""
    d, n = 3, 10
    qs, _ = pub.published_settings("softmax")[d]
    vs = [np.eye(d)] * n
    h, tol = 0.09, 1e-4
    counts, path, stats = pub._replay_panel("softmax", d, qs[:n], vs, h, tol, max_iter,
                                            n_max, n_settings=n, pool_size=32)
    attempts, ranks = _sequential("softmax", d, qs, vs, h, tol, max_iter, n_max, n)
    assert [(r["setting"], r["status"], r["stop_iteration"], r["rank"]) for r in path] \
        == attempts
    assert counts == [ranks.count(r) for r in range(d + 1)]
    if max_iter == 1500:
        assert stats["discarded"] > 0
    assert stats["attempts"] == len(attempts)


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
