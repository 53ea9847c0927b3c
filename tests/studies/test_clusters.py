"""Clustering measures and the mixture-closure study against particles."""

import json

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.cli._main import main
from gaussian_pde.studies import _clusters as C


def test_w2_samples_exact_and_sliced():
    x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    y = x[[2, 0, 1]] + np.array([3.0, 4.0])          # a permuted translate
    assert abs(C.w2_samples(x, y) - 5.0) < 1e-12
    # sliced W2 of a translate: |shift| times the RMS of the projection
    assert 0.0 < C.w2_samples(x, y, method="sliced") <= 5.0 + 1e-12
    with pytest.raises(ValueError, match="method"):
        C.w2_samples(x, y, method="fast")
    with pytest.raises(ValueError, match="same shape"):
        C.w2_samples(x, y[:2])


def test_counts_merges_and_plateaus():
    t = np.arange(6.0)
    counts = np.array([4, 4, 2, 2, 2, 1])
    np.testing.assert_array_equal(C.merge_times(t, counts), [2.0, 2.0, 5.0])
    assert C.plateaus(t, counts) == [(4, 0.0, 1.0, 1.0), (2, 2.0, 4.0, 2.0), (1, 5.0, 5.0, 0.0)]
    mix = C.cluster_mixture(4, 2, config="symmetric", radius=3.0, spread=0.2)
    D = gp.closure._mixture.pairwise_bures_wasserstein(mix.means, mix.covs)
    side = 3.0 * np.sqrt(2)
    assert abs(D[0, 1] - side) < 1e-12
    assert C.mixture_cluster_counts(mix.means[None], mix.covs[None], 4.0)[0] == 4
    assert C.mixture_cluster_counts(mix.means[None], mix.covs[None], 4.5)[0] == 1
    x, _ = mix.sample(400, seed=0)
    assert C.particle_cluster_counts(x, 1.0) == 4
    assert C.particle_cluster_counts(x[None], 10.0)[0] == 1


def test_a_case_refuses_particles_whose_exact_w2_would_not_fit_in_memory():
    """The exact W2 holds an n x n cost matrix and its copy (16 n^2 bytes): 10^6 particles
    ask for 1.5e4 GiB, past half of any machine's memory; refused before the closure and
    the particles run. The sliced distance needs no such matrix."""
    att = C.cluster_attention("softmax", 2, q=0.7, seed=0)
    mix = C.cluster_mixture(2, 2, config="symmetric")
    with pytest.raises(ValueError, match=r"`n` asks for 1\.49e\+04 GiB of arrays"):
        C.run_case(att, mix, np.linspace(0, 1, 3), n=10**6)
    assert C.check_case_memory(10**6, w2_method="sliced") == 10**6
    with pytest.raises(ValueError, match="`--n` must be at least 2"):
        C.check_case_memory(1, "--n")


def test_small_case_measures():
    att = C.cluster_attention("softmax", 2, q=0.7, seed=0)
    mix = C.cluster_mixture(2, 2, config="symmetric")
    run = C.run_case(att, mix, np.linspace(0, 1, 3), n=120, n_per_dim=4)
    assert run.w2.shape == run.w2_floor.shape == (3,)
    assert run.component_error.shape == (3, 2)
    assert np.all(run.w2 < 3 * run.w2_floor + 0.2)
    assert run.clusters_mixture[0] == 2 == run.clusters_particles[0]


def test_configurations_validate():
    with pytest.raises(ValueError, match="kind"):
        C.cluster_attention("sinkhorn", 2)
    with pytest.raises(ValueError, match="value"):
        C.cluster_attention("l2", 2, value="zero")
    with pytest.raises(ValueError, match="config"):
        C.cluster_mixture(3, 2, config="ring")
    mix = C.cluster_mixture(8, 3, seed=1)
    assert mix.K == 8 and mix.d == 3


def test_moment_errors_and_slope_interval():
    rng = np.random.default_rng(0)
    m, c = rng.normal(size=(3, 2)), np.stack([np.eye(2)] * 3)
    w = np.array([0.2, 0.3, 0.5])
    e = C.moment_errors(m, c, m, c, w)
    assert all(abs(float(v)) < 1e-7 for v in e.values())
    e = C.moment_errors(m + [3.0, 4.0], c, m, c, w)          # every mean off by 5
    assert abs(e["mean"] - 5.0) < 1e-12 and abs(e["bw"] - 5.0) < 1e-6 and e["cov"] == 0
    ns = np.array([100, 400, 1600])
    errs = [np.full(5, 2.0 / np.sqrt(n)) for n in ns]      # an exact n^-1/2 law
    slope, (lo, hi), rms = C.slope_with_interval(ns, errs)
    assert abs(slope + 0.5) < 1e-12 and abs(lo + 0.5) < 1e-12 and abs(hi + 0.5) < 1e-12
    np.testing.assert_allclose(rms, 2.0 / np.sqrt(ns))


def test_em_fit_and_crossing_times():
    mix = C.cluster_mixture(3, 2, config="symmetric", radius=3.0, spread=0.3)
    x, _ = mix.sample(900, seed=1)
    w, m, c = C.fit_gaussian_mixture(x, 3)
    order = np.argsort(np.arctan2(m[:, 1], m[:, 0]) % (2 * np.pi))
    np.testing.assert_allclose(m[order], mix.means, atol=0.06)
    np.testing.assert_allclose(c[order], mix.covs, atol=0.03)
    np.testing.assert_allclose(w[order], mix.weights, atol=1e-3)
    counts, heights = C.particle_clusters(np.stack([x, 0.05 * x]), 1.0, 3)
    assert counts.tolist() == [3, 1] and heights.shape == (2, 2)
    t = np.array([0.0, 1.0, 2.0, 3.0])
    h = np.array([[3.0, 5.0], [1.0, 4.0], [1.5, 2.0], [0.5, 0.0]])   # h0 re-crosses: once
    np.testing.assert_allclose(C.crossing_times(t, h, 2.0), [0.5, 2.0])
    assert C.merge_time_gap([0.5, 2.0], [0.6], 3.0) == pytest.approx(1.0)
    assert C.merge_time_gap([], [], 3.0) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("case", [(4, "symmetric", "l2"), (4, "random", "multihead")])
def test_merge_times_agree(case):
    """Particles (EM fit, the closure's rule and tolerance) merge when the closure does.

    Tolerance: 0.15 in depth (merges fall between t = 0.4 and 2.1; output step 0.1).
    """
    K, config, kind = case
    att = C.cluster_attention(kind, 2, q=0.7, seed=6)
    mix = C.cluster_mixture(K, 2, config=config, seed=6)
    run = C.run_case(att, mix, np.linspace(0, 3, 31), n=400, seed=6)
    assert run.merge_times_mixture.size == 3 == run.merge_times_particles.size
    np.testing.assert_allclose(run.merge_times_mixture, run.closure.merge_times, atol=2e-3)
    assert run.merge_gap < 0.15, (run.merge_times_mixture, run.merge_times_particles)
    assert run.clusters_mixture[-1] == run.clusters_particles[-1] == 1


@pytest.mark.slow
def test_error_bars_shrink_like_inverse_sqrt_n():
    """One component, softmax: the closure is the exact moment ODE, errors are Monte Carlo.

    The slope of the RMS moment error (Gaussian-fit W2) against n lies in [-0.6, -0.4]
    and its 95% bootstrap interval holds -1/2; a closure off by a constant 0.05 in its
    mean fails both against the same particles.
    """
    att, mix, t_end = C.scaling_case()
    res = C.error_scaling(att, mix, t_end, (100, 200, 400, 800), (64, 64, 48, 32))
    slope, (lo, hi), rms = res.fit("bw")
    assert -0.6 <= slope <= -0.4 and lo <= -0.5 <= hi, (slope, lo, hi, rms)
    assert hi - lo < 0.25
    for metric in ("mean", "cov"):
        s, (a, b), _ = res.fit(metric)
        assert -0.6 <= s <= -0.4 and a <= -0.5 <= b, (metric, s, a, b)
    wrong, (a, b), _ = res.fit("bw", ref_means=res.closure_means + 0.05)
    assert wrong > -0.4 and not a <= -0.5 <= b, (wrong, a, b)


@pytest.mark.slow
def test_cli_clusters_quick(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["clusters", "--quick", "--n", "100"]) == 0
    folder = tmp_path / "gaussian_pde_output" / "clusters"
    assert {p.name for p in folder.iterdir()} >= {"report.md", "ellipses_d2.png",
                                                 "ellipses_d3.png", "cluster_counts.png",
                                                 "merge_times.png", "scaling.png",
                                                 "summary.json"}
    summary = json.loads((folder / "summary.json").read_text())
    assert len(summary["cases"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 5
    assert main(["-q", "clusters", "--quick", "--n", "100"]) == 0
    assert capsys.readouterr().err == ""
