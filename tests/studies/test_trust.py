"""The closure-bias measure (closure against particles, Monte Carlo separated) and the trust map."""

import json

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.attention import quadratic_heads as _heads
from gaussian_pde.cli._main import main
from gaussian_pde.studies import _clusters as C
from gaussian_pde.studies import _trust as T


@pytest.mark.parametrize("kind", C.CLUSTER_ATTENTIONS)
def test_batched_velocity_is_the_particle_velocity(kind):
    att = C.cluster_attention(kind, 3, value="random", q=1.3, seed=2)
    x = 2.0 * np.random.default_rng(0).normal(size=(3, 40, 3))
    v = T.batched_particle_velocity(_heads(att), x)
    for s in range(3):
        np.testing.assert_allclose(v[s], att.particle_velocity(x[s])[0], atol=1e-12)


def test_batched_velocity_of_every_quadratic_score(rng):
    """Every registered type with a quadratic score (a linear term ``g`` included)."""
    from gaussian_pde.attention import names_with

    names = names_with(quadratic_score=True)
    assert len(names) >= 3
    x = rng.normal(size=(2, 30, 3))
    for name in names:
        att = gp.ATTENTIONS[name].example(3, rng)
        v = T.batched_particle_velocity(_heads(att), x)
        for s in range(2):
            np.testing.assert_allclose(v[s], att.particle_velocity(x[s])[0], atol=1e-12,
                                       err_msg=name)


def test_relative_deviation_units():
    m = np.array([[1.0, 2.0], [-1.0, 0.5]])
    c = np.stack([0.25 * np.eye(2), np.diag([0.5, 1.0])])
    w = np.array([0.3, 0.7])
    assert np.all(T.relative_deviation(m, c, m, c, w) == 0)
    s2 = w @ np.trace(c, axis1=1, axis2=2)
    u = np.array([0.3, -0.4])                                # every mean off by |u| = 0.5
    delta = T.relative_deviation(m + u, c, m, c, w)
    assert delta.shape == (2 * (2 + 4),)
    assert abs(np.linalg.norm(delta) - 0.5 / np.sqrt(s2)) < 1e-12
    # an isotropic component, covariance perturbed: |delta| is the linearised BW distance
    m1, c1 = np.zeros((1, 3)), 0.49 * np.eye(3)[None]
    E = 1e-4 * np.array([[1.0, 0.3, 0.0], [0.3, -2.0, 0.1], [0.0, 0.1, 0.5]])
    bw = gp.bures_wasserstein(m1[0], c1[0] + E, m1[0], c1[0])
    rel = np.linalg.norm(T.relative_deviation(m1, c1 + E, m1, c1, [1.0]))
    assert abs(rel * np.sqrt(3 * 0.49) / bw - 1) < 1e-3


def test_empirical_start_and_validation():
    mix = C.cluster_mixture(3, 2, config="random", seed=4)
    x, lab = mix.sample(60, seed=1)
    start = T.empirical_start(x, lab, 3)
    np.testing.assert_allclose(start.weights, np.bincount(lab) / 60)
    np.testing.assert_allclose(start.means[1], x[lab == 1].mean(0))
    np.testing.assert_allclose(start.covs[2], np.cov(x[lab == 2].T, bias=True), atol=1e-14)
    with pytest.raises(ValueError, match="labels"):
        T.empirical_start(x, np.where(lab == 2, 0, lab), 3)
    att = C.cluster_attention("l2", 2)
    t = np.linspace(0, 1, 3)
    with pytest.raises(ValueError, match="`n`"):
        T.closure_bias(att, mix, t, n=8)
    with pytest.raises(ValueError, match="seeds"):
        T.closure_bias(att, mix, t, seeds=2)
    with pytest.raises(ValueError, match="t_eval"):
        T.closure_bias(att, mix, [0.0, 0.0])
    with pytest.raises(TypeError, match="mixture"):
        T.closure_bias(att, "mixture", t)


def test_bias_holds_zero_where_the_closure_is_exact():
    """One Gaussian, L2: the closure is the moment ODE; the error is Monte Carlo only.

    The single runs' error is far from 0 and shrinks with n (by 2 for 4n, within the
    noise of 16 runs), yet the bias interval holds 0 and lies below one run's error.
    """
    att = C.cluster_attention("l2", 2, q=1.0, seed=0)
    one = gp.GaussianMixture([1.0], [[0.5, -0.2]], [[[0.5, 0.1], [0.1, 0.2]]])
    res = T.closure_bias(att, one, np.linspace(0.0, 1.0, 3), n=64, seeds=16)
    b, (lo, hi), mc = res.at()
    assert lo <= 0.0 <= hi, (b, lo, hi)
    assert 1.5 < res.rms[0, -1] / res.rms[1, -1] < 2.7, res.rms
    assert hi < 0.6 * res.rms[0, -1], (hi, res.rms)
    assert abs(b) < mc and res.rms[0, 0] < 1e-6             # no offset at t = 0


@pytest.mark.slow
def test_bias_is_resolved_where_the_closure_is_not_exact():
    """Two close components, strong L2 attention: the field bends across each component.

    The bias is resolved above zero at t = 2, while the one-Gaussian control with the same
    attention and the mixture's total moments holds zero.
    """
    att = C.cluster_attention("l2", 2, q=4.0, seed=0)
    mix = C.cluster_mixture(2, 2, config="symmetric", radius=1.0)
    t = np.linspace(0.0, 2.0, 3)
    b, (lo, hi), _ = T.closure_bias(att, mix, t, seed=1).at()
    assert lo > 0.0, (b, lo, hi)
    one = gp.GaussianMixture([1.0], [mix.total_mean], [mix.total_cov])
    cb, (clo, chi), _ = T.closure_bias(att, one, t, seed=1).at()
    assert clo <= 0.0 <= chi, (cb, clo, chi)


@pytest.mark.slow
def test_cli_trust_quick(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["-q", "clusters", "--trust", "--quick"]) == 0
    folder = tmp_path / "gaussian_pde_output" / "clusters"
    assert {p.name for p in folder.iterdir()} >= {"trust.md", "trust_map.png", "trust.json"}
    cells = json.loads((folder / "trust.json").read_text())["cells"]
    assert len(cells) == 12
    for c in cells:
        assert c["lo"] <= c["bias"] <= c["hi"]
        if c["kind"] == "softmax":
            assert c["control_lo"] <= 0.0 <= c["control_hi"], c
