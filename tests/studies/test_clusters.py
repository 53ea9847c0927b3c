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


@pytest.mark.slow
def test_error_bars_shrink_like_inverse_sqrt_n():
    """Weak attention, well-separated components: the closure is exact, errors are Monte Carlo."""
    att = C.cluster_attention("softmax", 2, q=0.1, seed=0)
    mix = C.cluster_mixture(2, 2, config="symmetric", radius=4.0, spread=0.3)
    ns, rms, slope = C.error_scaling(att, mix, np.linspace(0, 1.0, 3), (200, 800, 3200),
                                     range(8))
    assert -0.7 < slope < -0.3, (rms, slope)


@pytest.mark.slow
def test_cli_clusters_quick(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["clusters", "--quick", "--n", "100"]) == 0
    folder = tmp_path / "gaussian_pde_output" / "clusters"
    assert {p.name for p in folder.iterdir()} >= {"report.md", "ellipses.png",
                                                 "cluster_counts.png", "merge_times.png",
                                                 "summary.json"}
    summary = json.loads((folder / "summary.json").read_text())
    assert len(summary["cases"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 5
    assert main(["-q", "clusters", "--quick", "--n", "100"]) == 0
    assert capsys.readouterr().err == ""
