"""`gaussian-pde reproduce --quick` end to end: files, counts, classified outcomes.

Numbers checked are derived, not pinned: histogram counts must sum to the number of
settings (10 per dimension in --quick, gaussian_pde.studies.reproduce), and for softmax
with V = I the accurate rank is the exact d - rank(Q) = d - floor(d/2) (docs/math.md section 4.1),
and every true rank (certified where the classification at t = 1e8 does not decide) is
d - rank(Q) (docs/math.md 4.5).
"""

import json
import os

import numpy as np
import pytest

from gaussian_pde.analysis import Outcome
from gaussian_pde.cli._main import main
from gaussian_pde.studies import unit_trace_grid


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("repro")
    assert main(["reproduce", "--quick", "--certify", "--seed", "3", "--out", str(out)]) == 0
    return out


def test_files_exist(quick_run):
    names = {p.name for p in quick_run.iterdir()}
    for f in ("report.md", "results.json", "histograms.npz", "rank_histograms.png",
              "eigenvalue_flows.png", "regimes_softmax.png", "regimes_l2.png",
              "regimes_multihead.png", "regimes_sinkhorn.png"):
        assert f in names
        assert (quick_run / f).stat().st_size > 0
    assert not [n for n in names if n.endswith(".tmp") or n.startswith(".")]
    report = (quick_run / "report.md").read_text()
    for f in names:
        if f.endswith(".png"):
            assert f"]({f})" in report


def test_histogram_counts_and_outcomes(quick_run):
    res = json.loads((quick_run / "results.json").read_text())
    n = res["config"]["n_settings"]
    for key, h in res["histogram_counts"].items():
        d = int(key.rsplit("_", 1)[1])
        for proto in ("true", "accurate"):
            r = np.array(h[proto])
            assert r.size == n                               # counts sum to the settings
            assert np.bincount(np.where(r < 0, d + 1, r), minlength=d + 2).sum() == n
            assert np.all(r <= d)
        assert len(h["outcome"]) == n and all(h["outcome"])  # every trajectory classified
        if key.startswith("softmax_I_"):
            assert np.all(np.array(h["accurate"]) == d - d // 2)
        # V = I or V = R^T R (SPD), K = -Q: the true limit has rank d - rank(Q) exactly
        # (docs/math.md 4.5); every true rank is that one (decided, never below it), and
        # none of them rests on the theorem alone: the certified integration decides
        # whatever the classification at t = 1e8 leaves open
        t = np.array(h["true"])
        assert np.all(t == d - d // 2), (key, h["true"], h["source"])
        assert "theorem" not in h["source"], (key, h["source"], h["outcome"])
    kinds = {o.value for o in Outcome}
    for key, trajs in res["regimes"].items():
        assert len(trajs) == res["config"]["n_grid"][key.split("/")[0]]
        assert all(t["outcome"] in kinds and t["message"] for t in trajs)


@pytest.mark.slow
def test_deterministic_given_seed(quick_run, tmp_path):
    assert main(["reproduce", "--quick", "--certify", "--seed", "3", "--out", str(tmp_path)]) == 0
    a = json.loads((quick_run / "results.json").read_text())["histogram_counts"]
    b = json.loads((tmp_path / "results.json").read_text())["histogram_counts"]
    assert a == b


def test_v_independent_of_sigma0():
    # V = R^T R is drawn from its own matrix R, not from the G of Sigma_0 = G G^T
    from gaussian_pde.studies._reproduce import _hist_settings

    Qs, Gs, Rs = _hist_settings(np.random.default_rng(0), 4, 5)
    assert Qs.shape == (5, 2, 4) and Gs.shape == Rs.shape == (5, 4, 4)
    assert not np.allclose(Gs, Rs)


def test_report_reads_published_counts(tmp_path):
    from gaussian_pde.studies._reproduce import _read_published

    assert _read_published(tmp_path) is None
    (tmp_path / "published_histograms.json").write_text(
        json.dumps({"softmax": {"identity": {"3": [3, 48, 49, 0]}}}))
    assert _read_published(tmp_path) == {("softmax", "identity", "3"): [3, 48, 49, 0]}


def test_unwritable_output_folder(tmp_path):
    bad = tmp_path / "file"
    bad.write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "--quick", "--out", str(bad / "sub")])
    assert exc.value.code == 2
    if os.geteuid() != 0:  # root can write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        with pytest.raises(SystemExit):
            main(["reproduce", "--quick", "--out", str(ro)])


def test_grid_validation():
    g = unit_trace_grid(2, 5)
    assert g.shape == (11, 2, 2)
    np.testing.assert_allclose(np.trace(g, axis1=1, axis2=2), 1.0)
    assert np.all(np.linalg.eigvalsh(g) > 0)
    with pytest.raises(ValueError, match="`n_angles`"):
        unit_trace_grid(2, 0)
    with pytest.raises(ValueError, match="`r_max`"):
        unit_trace_grid(2, 3, r_max=1.0)


def test_parallel_equals_serial():
    # the two-process split of the full run (one child integrates some of the histograms)
    # gives the serial results bit for bit: every draw is made before the split
    from gaussian_pde.studies._regimes import _regime_attentions
    from gaussian_pde.studies._reproduce import _compute, _hist_settings

    def run(parallel):
        rng = np.random.default_rng(5)
        drawn = {"plane": _regime_attentions("plane")}   # the quickest family suffices here
        settings = {d: _hist_settings(rng, d, 2) for d in (3, 4)}
        grid = {"plane": unit_trace_grid(1, 1)[:1]}
        return _compute(rng, grid, 3, drawn, settings, parallel)

    (reg_s, hist_s), (reg_p, hist_p) = run(False), run(True)
    assert list(hist_s) == list(hist_p)
    for k in hist_s:
        for key in ("true", "accurate", "limit_paper_threshold", "bound"):
            np.testing.assert_array_equal(hist_s[k][key], hist_p[k][key])
        assert hist_s[k]["outcome"] == hist_p[k]["outcome"]
    for k in reg_s:
        assert [str(o.outcome) for o in reg_s[k]["outcomes"]] == \
            [str(o.outcome) for o in reg_p[k]["outcomes"]]
        np.testing.assert_array_equal(reg_s[k]["covs"], reg_p[k]["covs"])



# ----------------------------------------------------------------------------------------
# the figure stage
# ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def figure_stage(tmp_path_factory):
    """The six figures of a quick run, drawn serially: their files, Figure objects and
    the strings that the renderer drew into each PNG.

    Regimes of the quick grids (every family and type); rank histograms of 10 random
    ranks per panel, and published counts summing to 10.
    """
    from matplotlib.backends.backend_agg import RendererAgg

    from gaussian_pde.studies import _regimes as G
    from gaussian_pde.studies import _reproduce as R

    regimes = G._run_regimes(G.regime_grids("quick"), 10)
    rng = np.random.default_rng(1)
    hists = {(k, v, d): {"true": rng.integers(-1, d + 1, 10)}
             for k, v in R._PANELS for d in R._HIST_DS}
    published = {R._PUB_KEY[(k, v)] + (str(d),): rng.multinomial(10, np.full(d + 1, 1 / (d + 1)))
                  for k, v in R._PANELS for d in R._HIST_DS}
    out = tmp_path_factory.mktemp("figures")
    figs, drawn, save, draw_text = {}, {}, R.save_figure, RendererAgg.draw_text

    def keep(fig, path, **kwargs):
        figs[path.stem] = fig
        drawn[path.stem] = []
        return save(fig, path, **kwargs)

    def record(self, gc, x, y, s, *args, **kwargs):
        drawn[list(drawn)[-1]].append(s)     # the figure being saved
        return draw_text(self, gc, x, y, s, *args, **kwargs)

    mp = pytest.MonkeyPatch()
    mp.setattr(R, "save_figure", keep)
    mp.setattr(RendererAgg, "draw_text", record)
    try:
        paths, seconds = R._figures(out, regimes, hists, R._HIST_DS, published=published)
    finally:
        mp.undo()
    return dict(regimes=regimes, hists=hists, published=published, out=out, paths=paths,
                figs=figs, drawn=drawn, seconds=seconds)


def _legend(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_figure_stage_writes_six_pngs(figure_stage):
    from gaussian_pde.studies._regimes import N_FIGURES

    paths = figure_stage["paths"]
    assert len(paths) == N_FIGURES + 1 == 6
    assert set(paths) == set(figure_stage["figs"])
    for name, path in paths.items():
        assert path == figure_stage["out"] / f"{name}.png"
        head = path.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        w, h = int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")
        fig = figure_stage["figs"][name]
        # saved at the resolution the figure was made at (DPI), at its size
        assert (w, h) == tuple(round(x * fig.dpi) for x in fig.get_size_inches())


def test_regime_figures_content(figure_stage):
    """One panel per family of each type; each panel: every trajectory of its grid (one
    collection), its starts, a title with the family and the outcome counts, a legend."""
    from gaussian_pde.studies import _regimes as G

    regimes, figs = figure_stage["regimes"], figure_stage["figs"]
    grids = G.regime_grids("quick")
    for name in G.REGIME_TYPES:
        fams = [f for f in G.FAMILIES if (f, name) in regimes]
        axes = figs[f"regimes_{name}"].axes
        assert len(axes) == len(fams)
        for ax, family in zip(axes, fams):
            n = len(grids[family])
            title = ax.get_title().splitlines()
            assert title == [G._TITLES[family],
                             G.outcome_counts(regimes[(family, name)]["outcomes"])]
            if family in G.CONE:
                assert ax.name == "3d"
                trajs = [c for c in ax.collections if type(c).__name__ == "Line3DCollection"
                         and c.get_linewidth()[0] == 1.0]
                assert len(trajs) == 1 and len(trajs[0].get_segments()) == n
                assert [ax.get_xlabel(), ax.get_ylabel(), ax.get_zlabel()] == \
                    ["$a-b$", "$2c$", "$a+b$"]
                assert set(_legend(ax)) >= {"trajectory", r"$\Sigma_0$", "end"}
                assert ("limit line" in _legend(ax)) == (family in ("line", "two_lines"))
            else:
                assert ax.name == "rectilinear"
                (trajs,) = [c for c in ax.collections if type(c).__name__ == "LineCollection"]
                assert len(trajs.get_segments()) == n
                starts = [ln for ln in ax.get_lines() if ln.get_marker() == "o"
                          and len(ln.get_xdata()) == n]
                assert len(starts) == 2                      # the starts and the ends
                outcomes = {str(o.outcome) for o in regimes[(family, name)]["outcomes"]}
                labels = set(_legend(ax)) - {r"$\Sigma_0$"}
                assert {lab.split(",")[0] for lab in labels} == outcomes
                assert "tr" in ax.get_xlabel() and "tr" in ax.get_ylabel()


def test_flow_and_histogram_figures_content(figure_stage):
    from gaussian_pde.attention import REGIME_FLOW_TYPE
    from gaussian_pde.studies import _regimes as G
    from gaussian_pde.studies import _reproduce as R

    fams = [f for f in G.FAMILIES if (f, REGIME_FLOW_TYPE) in figure_stage["regimes"]]
    axes = [ax for ax in figure_stage["figs"]["eigenvalue_flows"].axes if ax.get_visible()]
    assert len(axes) == len(fams)
    for ax, family in zip(axes, fams):
        assert [ln.get_label() for ln in ax.get_lines()] == ["largest (median)",
                                                             "smallest (median)"]
        assert G._TITLES[family].splitlines()[0] in ax.get_title()
        assert ax.get_yscale() == "log" and ax.get_ylim() == (G._VANISHED, 1.5)
    axes = figure_stage["figs"]["rank_histograms"].axes
    assert len(axes) == len(R._HIST_DS) * len(R._PANELS)
    for i, d in enumerate(R._HIST_DS):
        for j, panel in enumerate(R._PANELS):
            ax = axes[4 * i + j]
            assert f"d = {d}" in ax.get_title()
            assert ax.get_xlabel() == "rank of the limit covariance"
            assert _legend(ax) == ["published", "true"]
            pub, true = ax.containers
            assert len(pub) == len(true) == d + 2          # ranks 0..d and "?"
            assert [b.get_height() for b in pub][:d + 1] == \
                list(figure_stage["published"][R._PUB_KEY[panel] + (str(d),)])
            counts = np.bincount(np.where(figure_stage["hists"][panel + (d,)]["true"] < 0,
                                          d + 1, figure_stage["hists"][panel + (d,)]["true"]),
                                 minlength=d + 2)
            assert [b.get_height() for b in true] == list(counts)


def test_figures_draw_what_a_reader_reads(figure_stage):
    """Every title, axis label, legend entry and bar label of the six figures is drawn
    into its PNG (as the renderer's text calls show), as often as there are panels."""
    from collections import Counter

    from gaussian_pde.attention import REGIME_FLOW_TYPE
    from gaussian_pde.studies import _regimes as G
    from gaussian_pde.studies import _reproduce as R

    regimes, drawn = figure_stage["regimes"], figure_stage["drawn"]
    for name in G.REGIME_TYPES:
        want = Counter()
        for family in [f for f in G.FAMILIES if (f, name) in regimes]:
            outcomes = regimes[(family, name)]["outcomes"]
            want.update([G._TITLES[family], G.outcome_counts(outcomes), r"$\Sigma_0$"])
            if family in G.CONE:
                want.update(["$a-b$", "$2c$", "$a+b$", "trajectory", "end"])
            else:
                want.update([r"$(a-b)/\mathrm{tr}\,\Sigma$", r"$2c/\mathrm{tr}\,\Sigma$"])
                want.update({str(o.outcome) for o in outcomes} - {"rank"})
        assert Counter(drawn[f"regimes_{name}"]) >= want, name
        assert f"{name}: the paper's 2-D families (published draws)" in drawn[f"regimes_{name}"]
    fams = [f for f in G.FAMILIES if (f, REGIME_FLOW_TYPE) in regimes]
    want = Counter({"t (depth)": len(fams), r"eigenvalues of $\Sigma/\mathrm{tr}\,\Sigma$":
                    len(fams), "largest (median)": len(fams), "smallest (median)": len(fams)})
    assert Counter(drawn["eigenvalue_flows"]) >= want
    want = Counter()
    for d in R._HIST_DS:
        for panel in R._PANELS:
            true = figure_stage["hists"][panel + (d,)]["true"]
            counts = np.bincount(np.where(true < 0, d + 1, true), minlength=d + 2)
            pub = figure_stage["published"][R._PUB_KEY[panel] + (str(d),)]
            want.update(str(c) for c in [*pub, *counts] if c)       # the bar labels
            want.update(["rank of the limit covariance", "number of settings", "published",
                         "true", "?"])
    assert Counter(drawn["rank_histograms"]) >= want


def test_figures_on_two_processes_equal_serial(figure_stage, tmp_path):
    """The figure stage on two processes (a forked child drawing from the end of the list)
    writes the serial run's files pixel for pixel, after this process has drawn (and
    opened its fonts); each figure is timed in the process that drew it."""
    from PIL import Image

    from gaussian_pde.studies import _reproduce as R

    paths, seconds = R._figures(tmp_path, figure_stage["regimes"], figure_stage["hists"],
                                R._HIST_DS, published=figure_stage["published"], processes=2)
    assert list(paths) == list(figure_stage["paths"])
    assert set(seconds) == set(paths) and all(w > 0 and c > 0 for w, c in seconds.values())
    for name, path in paths.items():
        assert path == tmp_path / f"{name}.png"
        a = np.asarray(Image.open(path))
        b = np.asarray(Image.open(figure_stage["paths"][name]))
        assert a.shape == b.shape and (a == b).all(), name


def test_figure_processes_validated(tmp_path):
    from gaussian_pde.studies._regimes import draw_figures

    with pytest.raises(ValueError, match="processes"):
        draw_figures([], tmp_path, None, processes=3)
    with pytest.raises(ValueError, match="processes"):
        draw_figures([], tmp_path, None, processes=0)



@pytest.mark.parametrize("failure", ["child raises", "no child"])
def test_figures_drawn_here_when_the_child_fails(tmp_path, failure, monkeypatch):
    """A child process that fails, or that cannot start (as in a daemonic process),
    leaves its share of the figures to this process."""
    import multiprocessing.context

    from gaussian_pde._common.io import save_figure
    from gaussian_pde.studies._regimes import draw_figures

    parent = os.getpid()

    def draw(fig):
        if os.getpid() != parent:
            raise RuntimeError("the child fails")
        fig.set_size_inches(1, 1)
        fig.add_subplot().plot([0, 1])

    if failure == "no child":
        def refuse(self):
            raise AssertionError("daemonic processes are not allowed to have children")

        monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", refuse)
    tasks = [(f"f{i}", draw) for i in range(4)]
    seen = []
    paths, seconds = draw_figures(tasks, tmp_path, save_figure, processes=2,
                                  progress=seen.append)
    assert list(paths) == [name for name, _ in tasks]
    assert all(p.is_file() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths.values())
    assert sorted(seen) == [f"figure: f{i}.png" for i in range(4)] and set(seconds) == set(paths)
