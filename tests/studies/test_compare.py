"""compare(), the Bures-Wasserstein helper and ``gaussian-pde compare``."""

import csv
import json

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde._common.gaussian import bures_wasserstein
from gaussian_pde.attention import names_with
from gaussian_pde.cli._main import main
from gaussian_pde.studies import (
    CompareReport,
    check_compare_memory,
    compare,
    compare_memory,
    fit_slope,
    stored_compare,
)


# ---------------------------------------------------------------- Bures-Wasserstein
def test_bw_closed_forms(rng):
    # 1-D: W2^2 = (m1 - m2)^2 + (s1 - s2)^2 with s the standard deviations
    assert bures_wasserstein([1.0], [[4.0]], [-2.0], [[9.0]]) == pytest.approx(np.sqrt(9 + 1))
    # commuting covariances: sum over eigen-directions of the 1-D formula
    c1, c2 = np.diag([1.0, 4.0]), np.diag([9.0, 0.0])  # singular second covariance
    assert bures_wasserstein(np.zeros(2), c1, np.ones(2), c2, squared=True) == pytest.approx(
        2 + (1 - 3) ** 2 + (2 - 0) ** 2)
    # identical Gaussians, symmetry, triangle inequality on random ones
    G = [rng.standard_normal((3, 3)) for _ in range(3)]
    covs = [g @ g.T for g in G]
    means = [rng.standard_normal(3) for _ in range(3)]
    # the squared distance of a Gaussian to itself is zero up to rounding (1e-12 x trace)
    w2 = bures_wasserstein(means[0], covs[0], means[0], covs[0], squared=True)
    assert w2 < 1e-12 * np.trace(covs[0])
    d01 = bures_wasserstein(means[0], covs[0], means[1], covs[1])
    assert d01 == pytest.approx(bures_wasserstein(means[1], covs[1], means[0], covs[0]))
    d12 = bures_wasserstein(means[1], covs[1], means[2], covs[2])
    d02 = bures_wasserstein(means[0], covs[0], means[2], covs[2])
    assert d02 <= d01 + d12 + 1e-12
    # batches broadcast
    out = bures_wasserstein(np.stack(means), np.stack(covs), means[0], covs[0])
    assert out.shape == (3,) and out[1] == pytest.approx(d01)


def test_bw_bad_input():
    with pytest.raises(ValueError, match="cov2"):
        bures_wasserstein(np.zeros(2), np.eye(2), np.zeros(2), np.eye(3))
    with pytest.raises(ValueError, match="mean1"):
        bures_wasserstein(np.zeros(3), np.eye(2), np.zeros(2), np.eye(2))


def test_fit_slope():
    n = np.array([100, 400, 1600])
    assert fit_slope(n, 3 * n**-0.5) == pytest.approx(-0.5)
    assert np.isnan(fit_slope(n, [np.nan, np.nan, 1.0]))


# ---------------------------------------------------------------- compare
def test_compare_error_decays_like_n_to_minus_half():
    """The fitted slope of error against n is -1/2 within 0.2 (n = 250..4000, 4 seeds).

    0.2 is about three times the seed-to-seed standard error of the slope observed for
    this set-up (``report.slope_sem`` ~ 0.04-0.07), and a method whose particles converge
    to a different limit would give a slope near 0.
    """
    Q = np.array([[1.0, 0.5]])
    att = gp.L2(Q, -Q, np.eye(2))
    mean0, cov0 = np.array([0.5, -0.3]), np.array([[1.0, 0.3], [0.3, 0.6]])
    rep = compare(att, mean0, cov0, n=[250, 1000, 4000], seeds=range(4),
                  t_eval=np.linspace(0, 0.6, 4), method="rk4", dt=0.2)
    assert rep.ode_status == "finished" and np.all(rep.status == "finished")
    for m in ("mean_error", "cov_error", "bw_relative"):
        assert rep.slopes[m] == pytest.approx(-0.5, abs=0.2), (m, rep.slopes, rep.slope_sem)
    # the errors are of the Monte Carlo size: BW within a few sqrt(d/n)
    assert np.nanmax(rep.bw_relative[-1]) < 5 * np.sqrt(2 / 4000)
    rows = rep.table()
    assert len(rows) == 3 * 4 and {"bw_relative", "bw_relative_sem", "ess_median"} <= set(rows[0])
    json.dumps(rep.to_dict(), allow_nan=False)  # open format, no NaN tokens


def test_compare_detects_a_wrong_ode():
    """Against another attention's ODE the error does not decay (the slope is near 0)."""
    Q = np.array([[1.0, 0.5]])
    att = gp.L2(Q, -Q, np.eye(2))
    wrong = gp.L2(Q, -Q, 1.3 * np.eye(2))
    mean0, cov0 = np.array([0.5, -0.3]), np.array([[1.0, 0.3], [0.3, 0.6]])

    class Swapped(gp.L2):
        name = gp.L2.name

        def particle_kernel(self, x, opts):
            return wrong.particle_kernel(x, opts)

    rep = compare(Swapped(Q, -Q, np.eye(2)), mean0, cov0, n=[250, 1000, 4000], seeds=range(2),
                  t_eval=np.linspace(0, 0.6, 4), method="rk4", dt=0.2)
    assert rep.slopes["cov_error"] > -0.25
    del att


@pytest.mark.parametrize("name", names_with(gaussian_preserving=False))
def test_compare_non_gaussian_types(name):
    """No ODE to compare with: the distances to Gaussians only; a type with positions
    takes a mean that depends on them (the first token then attends to itself alone)."""
    mean0, cov0 = np.array([0.5, -0.3]), np.array([[1.0, 0.3], [0.3, 0.6]])
    cls = gp.ATTENTIONS[name]
    att = cls.example(2, np.random.default_rng(0))
    if not cls.uses_positions:
        rep = compare(att, mean0, cov0, n=[100, 200], seeds=range(2),
                      t_eval=np.linspace(0, 0.5, 3), method="rk4", dt=0.25)
        assert rep.ode_cov is None and rep.cov_error is None and rep.slopes == {}
        assert np.all(np.isfinite(rep.sliced_w2)) and np.all(np.isfinite(rep.kurtosis))
        assert "cov_error" not in rep.metrics and "sliced_w2" in rep.metrics
    else:
        rep = compare(att, lambda tau: mean0 + np.outer(tau, [1.0, 0.0]), cov0, n=[100],
                      seeds=[0], t_eval=[0.0, 0.5], method="rk4", dt=0.25)
        assert rep.ode_cov is None and rep.cov_error is None
        assert rep.mean.shape == (1, 1, 2, 2) and rep.ess_min[0, 0, 0] == pytest.approx(1.0)


def _fields_equal(a, b):
    import dataclasses

    for f in dataclasses.fields(CompareReport):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype.kind == y.dtype.kind and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), f.name
        elif isinstance(x, dict):
            assert x.keys() == y.keys() and np.allclose(list(x.values()), list(y.values()),
                                                        equal_nan=True), f.name
        else:
            assert x == y, f.name


@pytest.mark.parametrize("name", ["softmax", "sigmoid"])
def test_report_saves_and_loads_exactly(tmp_path, name):
    """Every field round-trips through the NPZ file (None fields, NaN, strings, slopes)."""
    att = gp.ATTENTIONS[name].example(2, np.random.default_rng(0))
    rep = compare(att, np.zeros(2), np.eye(2), n=[20, 40], seeds=range(2),
                  t_eval=np.linspace(0, 0.2, 3), method="rk4", dt=0.05)
    rep.save(tmp_path / "r.npz")
    _fields_equal(rep, CompareReport.load(tmp_path / "r.npz"))
    np.savez(tmp_path / "other.npz", x=np.zeros(2))
    with pytest.raises(ValueError, match="path"):
        CompareReport.load(tmp_path / "other.npz")


def test_stored_compare_reads_the_long_runs_and_checks_the_short_ones(tmp_path, monkeypatch):
    att = gp.Softmax(np.array([[1.0, 0.5]]), -np.array([[0.8, -0.2]]), np.eye(2))
    args = (att, np.array([0.5, -0.3]), np.array([[1.0, 0.3], [0.3, 0.6]]))
    kw = dict(n=[20, 40, 80], seeds=range(2), t_eval=np.linspace(0, 0.2, 3), method="rk4",
              dt=0.05)
    path = tmp_path / "r.npz"
    with pytest.warns(UserWarning, match="no stored report"):
        _fields_equal(stored_compare(path, *args, **kw), compare(*args, **kw))
    assert not path.exists()
    written = stored_compare(path, *args, write=True, **kw)
    _fields_equal(written, compare(*args, **kw))
    made = []
    real = compare.__globals__["compare"]

    def counting(*a, **k):
        made.append(list(k["n"]))
        return real(*a, **k)

    monkeypatch.setitem(stored_compare.__globals__, "compare", counting)
    _fields_equal(stored_compare(path, *args, **kw), written)
    assert made == [[20, 40]]                 # the largest n is read, not run
    with pytest.raises(ValueError, match="other arguments"):
        stored_compare(path, *args, **{**kw, "seeds": range(3)})
    # a stored run that this code does not reproduce (here: moved by 1e-3) is refused
    moved = CompareReport.load(path)
    moved.cov[0] *= 1 + 1e-3
    moved.save(path)
    with pytest.raises(ValueError, match="do not reproduce"):
        stored_compare(path, *args, **kw)


def test_compare_bad_input():
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match="n.*at least 2"):
        compare(att, np.zeros(2), np.eye(2), n=[1])
    with pytest.raises(ValueError, match="t_eval"):
        compare(att, np.zeros(2), np.eye(2), n=[10], t_eval=[1.0, 0.5])
    with pytest.raises(ValueError, match="mean0"):
        compare(att, np.zeros(3), np.eye(2), n=[10])


def test_compare_refuses_sizes_too_large_for_the_memory_before_any_work():
    """Half the machine's memory is the limit (validate_allocation): 10^9 tokens, 10^12
    sliced-W2 directions and 10^8 output times are far past it on any machine; the
    message names the size and the argument."""
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(ValueError, match=r"`n` up to 1000000000 tokens.*GiB"):
        compare(att, np.zeros(2), np.eye(2), n=[10, 10**9])
    with pytest.raises(ValueError, match=r"`n_directions` 1000000000000 would need .*GiB"):
        compare(att, np.zeros(2), np.eye(2), n=[10, 20], n_directions=10**12)
    with pytest.raises(ValueError, match=r"`--num-times` 100000000 output times would need"):
        check_compare_memory(2, 500, 3, 5, 10**8, names=("`--n`", "`--seeds`", "`--num-times`"))
    assert check_compare_memory(2, 500, 3, 5, 11) == compare_memory(2, 500, 3, 5, 11)


def test_compare_memory_bounds_the_reports_arrays():
    """The estimate holds at least the report's own arrays and one run's kept tokens
    (8 n d bytes per output time), and grows linearly with the output times."""
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    t_eval = np.linspace(0.0, 0.1, 4)
    rep = compare(att, np.zeros(2), np.eye(2), n=(10, 20), seeds=range(2), t_eval=t_eval,
                  n_directions=8, ess_threshold=0.0)
    held = sum(getattr(rep, m).nbytes for m in ("mean", "cov", *rep.metrics))
    need = compare_memory(2, 20, 2, 2, t_eval.size, n_directions=8)
    assert held + 8 * 20 * 2 * t_eval.size < need
    base = compare_memory(2, 20, 2, 2, 0, n_directions=8)
    assert base == 16 * 20 * 8
    assert compare_memory(2, 20, 2, 2, 8, 8) - base == 2 * (need - base)


def test_slopes_of_runs_that_stop_at_once_are_those_of_the_initial_draw():
    """Output times far beyond the dynamics' range (every run leaves the floating-point
    range in its first step): the slopes are fitted over t = 0 alone, finite, and equal
    to those of a comparison at t = 0 only (the same seeded draws)."""
    att = gp.L2(np.eye(2), np.eye(2), np.eye(2))
    kw = dict(n=(10, 20), seeds=range(2), method="rk4", ess_threshold=0.0)
    far = compare(att, np.zeros(2), np.eye(2), t_eval=[0.0, 5e307, 1e308], dt=2e306, **kw)
    assert (far.status != "finished").all()
    start = compare(att, np.zeros(2), np.eye(2), t_eval=[0.0], **kw)
    assert far.slope_times.tolist() == start.slope_times.tolist() == [0.0]
    assert far.slopes == start.slopes and all(np.isfinite(v) for v in far.slopes.values())


# ---------------------------------------------------------------- CLI
#: one type with exact moments (the error figures) and one with positions (none)
CLI_TYPES = (names_with(gaussian_preserving=True, mean_generator=True)[:1]
             + names_with(uses_positions=True)[:1])


@pytest.mark.filterwarnings("ignore::gaussian_pde.particles._simulate.ParticleDegeneracyWarning")
@pytest.mark.parametrize("name", CLI_TYPES)
def test_cli_compare_writes_table_and_figures(tmp_path, name):
    rc = main(["compare", "--attention", name, "--n", "60", "120", "--seeds", "2",
               "--num-times", "3", "--t-end", "0.2", "--out", str(tmp_path)])
    assert rc == 0
    stem = tmp_path / f"compare_{name}"
    with open(f"{stem}.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 * 3 and float(rows[0]["n"]) == 60
    data = json.loads((tmp_path / f"compare_{name}.json").read_text())
    assert data["attention"] == name and data["settings"]["seeds"] == 2
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    exact = gp.ATTENTIONS[name].gaussian_preserving
    want = {"moments", "diagnostics"} | ({"errors", "scaling"} if exact else set())
    assert pngs == sorted(f"compare_{name}_{w}.png" for w in want)
    assert not list(tmp_path.glob(".*.tmp*"))  # atomic writes left no temporary files


@pytest.mark.filterwarnings("ignore::gaussian_pde.particles._simulate.ParticleDegeneracyWarning")
def test_cli_compare_says_over_which_times_the_slopes_are_fitted(tmp_path, capsys):
    """A --t-end far beyond the dynamics' range: finite slopes of the initial draw, said
    so; a single --n: no slopes, and no NaN in the line."""
    base = ["-q", "compare", "--attention", "l2", "--seeds", "2", "--num-times", "3"]
    assert main([*base, "--n", "10", "20", "--t-end", "1e308", "--out", str(tmp_path)]) == 0
    line = capsys.readouterr().out
    assert "at t = 0 only, the initial draw" in line and "nan" not in line
    data = json.loads((tmp_path / "compare_l2.json").read_text())
    assert data["slope_times"] == [0.0] and None not in data["slopes"].values()
    assert main([*base, "--n", "10", "--t-end", "0.1", "--out", str(tmp_path)]) == 0
    line = capsys.readouterr().out
    assert "no slopes of error against n" in line and "nan" not in line
    assert main([*base, "--n", "10", "20", "--t-end", "0.1", "--out", str(tmp_path)]) == 0
    assert "slopes of error against n over t in [0, 0.1]: mean_error" in capsys.readouterr().out


def test_cli_compare_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--attention", "softmax", "--seeds", "0", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "--seeds" in capsys.readouterr().err
    # too large for the memory: refused with the size, before the output folder is made
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--attention", "softmax", "--num-times", "1e8",
              "--out", str(tmp_path / "res")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "`--num-times` 100000000 output times would need" in err
    assert "GiB" in err and not (tmp_path / "res").exists()
