"""Every output path of every subcommand is checked by writing, before any work.

``os.access`` says yes to root for ``/proc`` or ``/sys`` (and for a read-only mount), so
the check creates and deletes a probe file. The study behind each subcommand is replaced
by a stand-in that fails the test if it is reached: a refusal must come first.
"""

import os
import pathlib

import pytest

from gaussian_pde.cli._main import main
from tests._helpers import TINY_SWEEP

#: subcommand -> (argv before --out, the study function a run would reach first)
COMMANDS = {
    "run": (["--quick"], "gaussian_pde.studies._reproduce.reproduce"),
    "run --examples": (["--examples"], "gaussian_pde.cli._main_job.solve"),
    "reproduce": (["reproduce", "--quick"], "gaussian_pde.studies._reproduce.reproduce"),
    "reproduce published": (["reproduce", "--protocol", "published"],
                            "gaussian_pde.studies._published.published_histograms"),
    "compare": (["compare", "--attention", "l2", "--n", "30", "60", "--seeds", "2"],
                "gaussian_pde.studies._compare.compare"),
    "stabilizers": (["stabilizers", "--quick"],
                    "gaussian_pde.studies._stabilizers.run_study"),
    "clusters": (["clusters", "--quick"], "gaussian_pde.studies._clusters.run_clusters"),
    "sweep run": (["sweep", "run", "SPEC", "--inprocess"], "gaussian_pde.sweep.run_sweep"),
}

#: folders that exist but take no files (Linux)
UNWRITABLE = [p for p in ("/proc", "/sys") if os.path.isdir(p)]


def _work_must_not_start(monkeypatch, target):
    def reached(*args, **kwargs):
        raise AssertionError(f"{target} ran before the output check")
    monkeypatch.setattr(target, reached)


def _one_line_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert err.count("\n") == 1 and err.startswith("gaussian-pde") and "Traceback" not in err
    return err


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "SPEC").write_text(TINY_SWEEP)
    return tmp_path


@pytest.mark.skipif(not UNWRITABLE, reason="needs /proc or /sys")
@pytest.mark.parametrize("name", list(COMMANDS))
@pytest.mark.parametrize("below", [False, True])
def test_out_that_takes_no_files_is_refused_before_work(in_tmp, monkeypatch, capsys, name,
                                                        below):
    argv, target = COMMANDS[name]
    _work_must_not_start(monkeypatch, target)
    for root in UNWRITABLE:
        out = pathlib.Path(root) / "gaussian_pde_out" if below else pathlib.Path(root)
        err = _one_line_exit_2(capsys, argv + ["--out", str(out)])
        assert "`--out`" in err and str(root) in err


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_failing_probe_is_refused_before_work(in_tmp, monkeypatch, capsys, name):
    """The same where creating a file fails although permissions say yes (any platform)."""
    argv, target = COMMANDS[name]
    _work_must_not_start(monkeypatch, target)
    ro = in_tmp / "ro"
    ro.mkdir()
    import gaussian_pde._common.io as io

    real = io.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and pathlib.Path(dir) == ro:
            raise OSError(30, "Read-only file system")
        return real(*args, dir=dir, **kwargs)
    monkeypatch.setattr(io.tempfile, "mkstemp", mkstemp)
    err = _one_line_exit_2(capsys, argv + ["--out", str(ro)])
    assert "`--out`" in err and "Read-only file system" in err
    assert list(ro.iterdir()) == []


@pytest.mark.skipif(not UNWRITABLE, reason="needs /proc or /sys")
def test_sweep_summarize_plot_that_takes_no_file_is_refused_before_loading(in_tmp,
                                                                          monkeypatch, capsys):
    _work_must_not_start(monkeypatch, "gaussian_pde.sweep.load_results")
    for root in UNWRITABLE:
        err = _one_line_exit_2(capsys, ["sweep", "summarize", "results", "--plot",
                                        f"{root}/x.png"])
        assert "`--plot`" in err and root in err


def test_the_probe_leaves_nothing_behind(in_tmp, capsys):
    out = in_tmp / "new" / "folder"
    assert main(["-q", "--examples", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["covariance_trajectories.png",
                                                     "report.md", "trajectories.npz"]
