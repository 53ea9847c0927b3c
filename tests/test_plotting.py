"""Plotting: every function draws, validates its input, and the package does not import matplotlib."""

import subprocess
import sys

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from gaussian_pde import plotting  # noqa: E402


@pytest.fixture
def trajs(rng):
    G = rng.standard_normal((3, 2, 2))
    c0 = G @ np.swapaxes(G, -1, -2)
    t = np.linspace(0, 1, 20)
    covs = c0[:, None] * (1 + t)[None, :, None, None]
    covs[0, 15:] = np.nan                       # a trajectory that stopped
    return t, covs


def test_cone_and_disk_coordinates():
    S = np.array([[3.0, 1.0], [1.0, 1.0]])
    np.testing.assert_allclose(plotting.cone_coordinates(S), [2.0, 2.0, 4.0])
    np.testing.assert_allclose(plotting.disk_coordinates(S), [0.5, 0.5])
    u = np.array([0.6, 0.8])                    # rank one: on the circle
    assert np.linalg.norm(plotting.disk_coordinates(np.outer(u, u))) == pytest.approx(1.0)


def test_plots_draw(trajs):
    import matplotlib.pyplot as plt

    t, covs = trajs
    ax = plotting.plot_cone_trajectories(covs, limit_direction=[1.0, 0.0], title="cone")
    assert ax.get_zlabel()
    ax = plotting.plot_disk_trajectories(covs, outcomes=["rank", "blowup", "undecided"])
    assert ax.get_legend() is not None
    ax = plotting.plot_eigenvalue_flow(t, covs)
    assert ax.get_yscale() == "log"
    ax = plotting.plot_rank_histogram({"a": [1, 2, 2, -1], "b": [2, 2, 2, 2]}, 3)
    assert len(ax.patches) == 2 * 5
    plt.close("all")


@pytest.mark.parametrize("fun", [plotting.plot_cone_trajectories,
                                 plotting.plot_disk_trajectories, plotting.cone_coordinates])
def test_non_2x2_rejected(fun):
    with pytest.raises(ValueError, match="2 x 2"):
        fun(np.ones((4, 3, 3)))


def test_bad_histogram_input():
    with pytest.raises(ValueError, match="`ranks`"):
        plotting.plot_rank_histogram({}, 3)
    with pytest.raises(ValueError, match="above d"):
        plotting.plot_rank_histogram({"a": [5]}, 3)


def test_package_import_does_not_import_matplotlib():
    code = "import sys, gaussian_pde; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_eigenvalue_flow_summary_is_labelled_and_fits_the_unit_interval():
    """Summary mode: one labelled median line per ordered eigenvalue of Sigma / tr Sigma,
    every value in (0, 1], the largest line above the smallest, the axis topped near 1."""
    import matplotlib.pyplot as plt

    t = np.linspace(0.0, 5.0, 20)
    rng = np.random.default_rng(0)
    covs = []
    for _ in range(7):
        g = rng.standard_normal((3, 3))
        s0 = g @ g.T + 0.1 * np.eye(3)
        covs.append([s0 * np.exp(np.array([2.0, 0.0, -1.0]) * tt)[None, :] @ np.eye(3)
                     for tt in t])
    covs = np.array(covs)
    covs = 0.5 * (covs + np.swapaxes(covs, -1, -2))
    covs[0, 5] = np.nan                      # a NaN sample is skipped
    ax = plotting.plot_eigenvalue_flow(t, covs, summary=True)
    lines = ax.get_lines()
    assert [ln.get_label() for ln in lines] == ["largest (median)", "2nd largest (median)",
                                                "smallest (median)"]
    ys = [ln.get_ydata() for ln in lines]
    assert all(np.all((y > 0) & (y <= 1)) for y in ys)
    assert np.all(ys[0] >= ys[-1])
    assert ax.get_ylim()[1] <= 1.5
    plt.close("all")
