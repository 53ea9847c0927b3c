"""The command-line conventions shared by every subcommand.

Default output folders (below ``./gaussian_pde_output``), progress on stderr and
``--quiet``, one-line errors with exit status 2, and the attention registry as the
source of the type choices. Every run uses its subcommand's small options (or, for the
reproduction, a stand-in for the study) so that each test takes a few seconds.
"""

import io
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from gaussian_pde import ATTENTIONS, Softmax
from gaussian_pde.cli import _main
from gaussian_pde.cli._compare import compare_examples
from gaussian_pde.cli._main import build_parser, main
from gaussian_pde.cli._main_job import default_examples
from gaussian_pde.cli._progress import Progress
from tests._helpers import TINY_SWEEP

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = pathlib.Path("gaussian_pde_output")
LINE = re.compile(r"^\[ *(\d+)/(\d+)\] \S.* \(\d+\.\d s\)$")


#: small options of each subcommand that writes into an output folder
SMALL = {
    "compare": ["compare", "--attention", "l2", "--n", "30", "60", "--seeds", "2",
                "--num-times", "3", "--t-end", "0.2"],
    "stabilizers": ["stabilizers", "--quick"],
    "examples": ["--examples"],
}


def progress_lines(err):
    """The progress lines of ``err``; checks that they count 1, 2, ... up to their total."""
    lines = [line for line in err.splitlines() if line.startswith("[")]
    for k, line in enumerate(lines, 1):
        m = LINE.match(line)
        assert m, line
        assert int(m.group(1)) == k and int(m.group(2)) == len(lines), line
    return lines


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty current directory."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fake_reproduce(calls):
    """A stand-in for :func:`gaussian_pde.studies.reproduce` that records its folder."""
    def reproduce(out, *, seed=0, quick=False, certify=False, progress=None):
        out = pathlib.Path(out)
        calls.append(out)
        if progress is not None:
            progress("regimes: zero")
        report = out / "report.md"
        report.write_text("# gaussian-pde reproduce (stand-in)\n")
        return dict(report=report, figures={},
                    timing=dict(compute_s=0.0, cpu_s=0.0, wall_s=0.0, speedup_wall=0.0))
    return reproduce


# ------------------------------------------------------------------ default output folders
@pytest.mark.parametrize("argv", [[], ["run"], ["--quiet"], ["reproduce"], ["-q", "reproduce"]])
def test_main_job_and_reproduce_default_to_gaussian_pde_output(in_tmp, monkeypatch, argv):
    calls, examples = [], []
    monkeypatch.setattr("gaussian_pde.studies.reproduce", fake_reproduce(calls))
    monkeypatch.setattr("gaussian_pde.cli._main_job.run_examples",
                        lambda args, append=False, progress=None: examples.append(args.out))
    assert main(argv + ["--quick"]) == 0
    assert calls == [OUT] and (in_tmp / OUT).is_dir()
    assert examples == ([] if "reproduce" in argv else [str(OUT)])


def test_examples_default_folder_and_progress(in_tmp, capsys):
    assert main(SMALL["examples"]) == 0
    assert (OUT / "trajectories.npz").exists() and (OUT / "report.md").exists()
    out, err = capsys.readouterr()
    assert "wrote the built-in examples" in out
    lines = progress_lines(err)
    assert len(lines) == len(default_examples()) + 1
    assert "example: softmax -> blowup" in lines[0]
    assert lines[-1].startswith(f"[{len(lines)}/{len(lines)}] figure: covariance_trajectories")


@pytest.mark.filterwarnings("ignore::gaussian_pde.particles._simulate.ParticleDegeneracyWarning")
def test_compare_default_folder_and_progress(in_tmp, capsys):
    assert main(SMALL["compare"]) == 0
    folder = OUT / "compare"
    assert (folder / "compare_l2.csv").exists() and (folder / "compare_l2.json").exists()
    lines = progress_lines(capsys.readouterr().err)
    # the moment ODE, 2 x 2 particle runs, the figures
    assert len(lines) == 6
    assert "moment ODE" in lines[0] and "particles: n = 60, seed 1" in lines[4]
    assert "figures:" in lines[5]


def test_stabilizers_default_folder_and_progress(in_tmp, capsys):
    assert main(SMALL["stabilizers"]) == 0
    folder = OUT / "stabilizers"
    assert {p.name for p in folder.iterdir()} >= {"summary.json", "report.md",
                                                   "stabilizers.png"}
    lines = progress_lines(capsys.readouterr().err)
    assert len(lines) == 7 and "stabilizers: residual/none" in lines[0]


def test_sweep_run_defaults_to_a_folder_named_after_the_spec(in_tmp, capsys):
    spec = in_tmp / "tiny.toml"
    spec.write_text(TINY_SWEEP)
    assert main(["sweep", "run", str(spec), "--inprocess"]) == 0
    folder = OUT / "sweep" / "tiny"
    assert (folder / "manifest.json").exists()
    out, err = capsys.readouterr()
    assert "1 task(s) computed" in out and str(folder) in out
    assert "sweep [" in err                          # the sweep's progress bar
    # summarize draws into the results folder by default
    assert main(["sweep", "summarize", str(folder)]) == 0
    assert (folder / "summary.png").stat().st_size > 1000
    # resumed, quietly: nothing left to compute, nothing on stderr
    assert main(["--quiet", "sweep", "run", str(spec), "--inprocess"]) == 0
    out, err = capsys.readouterr()
    assert "0 task(s) computed, 1 already stored" in out and err == ""


def test_help_documents_the_defaults(capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    for name, default in [("run", "gaussian_pde_output"), ("reproduce", "gaussian_pde_output"),
                          ("compare", "gaussian_pde_output/compare"),
                          ("stabilizers", "gaussian_pde_output/stabilizers")]:
        text = " ".join(sub[name].format_help().split())
        assert f"(default: {default})" in text, name
        assert "--quiet" in text, name
    sweep_run = next(a for a in sub["sweep"]._actions if a.dest == "sweep_command").choices["run"]
    text = " ".join(sweep_run.format_help().split())
    assert "gaussian_pde_output/sweep/SPEC" in text and "--quiet" in text


# ------------------------------------------------------------------ --quiet
@pytest.mark.parametrize("argv", [["--quiet"] + SMALL["stabilizers"],
                                  SMALL["stabilizers"] + ["-q"]])
def test_quiet_turns_progress_off(in_tmp, capsys, argv):
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == "" and "drift/none" in out     # the results still go to stdout
    assert (OUT / "stabilizers" / "report.md").exists()


@pytest.mark.parametrize("argv, quiet", [
    ([], False), (["-q"], True), (["--quiet", "--quick"], True), (["--quick", "--quiet"], True),
    (["compare", "-q"], True), (["-q", "compare"], True), (["compare"], False),
    (["sweep", "run", "x.toml", "--quiet"], True), (["-q", "sweep", "summarize", "r"], True),
    (["stabilizers", "--quiet"], True), (["reproduce"], False),
])
def test_quiet_is_accepted_everywhere(argv, quiet):
    argv = _main._with_default_command(argv, _main._available())
    args = build_parser().parse_args(argv)
    assert args.quiet is quiet


def test_progress_as_a_subprocess():
    """Progress is flushed to the real stderr of the command; ``--quiet`` removes it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    code = ("import sys; from gaussian_pde.cli._progress import Progress; "
            "p = Progress(2); p('one'); print('result'); p('two')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.stdout == "result\n"
    assert [line.split(" (")[0] for line in proc.stderr.splitlines()] == ["[1/2] one",
                                                                            "[2/2] two"]


def test_progress_reporter_format():
    stream = io.StringIO()
    p = Progress(12, stream=stream)
    for k in range(3):
        p(f"step {k}")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("[ 1/12] step 0 (") and lines[2].startswith("[ 3/12] step 2 (")
    assert all(LINE.match(line) for line in lines)
    q = Progress(1, stream=stream)
    q("a")
    q("b")                                          # more steps than announced
    assert stream.getvalue().splitlines()[-1].startswith("[2/2] b (")
    r = Progress(stream=stream)
    r("no total")
    assert stream.getvalue().splitlines()[-1].startswith("[1] no total (")


# ------------------------------------------------------------------ one-line errors, exit 2
def _one_line_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gaussian-pde") and "Traceback" not in err
    return err


OUT_COMMANDS = {
    "run": ["--quick"],
    "run --examples": ["--examples"],
    "reproduce": ["reproduce", "--quick"],
    "compare": SMALL["compare"],
    "stabilizers": SMALL["stabilizers"],
    "sweep run": ["sweep", "run", "SPEC", "--inprocess"],
}


@pytest.mark.parametrize("name", list(OUT_COMMANDS))
@pytest.mark.parametrize("where", ["file", "below a file"])
def test_out_that_is_a_file_is_refused(in_tmp, capsys, name, where):
    blocker = in_tmp / "blocker"
    blocker.write_text("x")
    (in_tmp / "SPEC").write_text(TINY_SWEEP)
    out = blocker if where == "file" else blocker / "sub"
    err = _one_line_exit_2(capsys, OUT_COMMANDS[name] + ["--out", str(out)])
    assert "`--out`" in err and str(out) in err
    assert not (in_tmp / OUT).exists()              # refused before any work


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0,
                    reason="needs POSIX permissions (root may write anywhere)")
@pytest.mark.parametrize("name", list(OUT_COMMANDS))
def test_out_without_write_permission_is_refused(in_tmp, capsys, name):
    ro = in_tmp / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    (in_tmp / "SPEC").write_text(TINY_SWEEP)
    try:
        for out in (ro, ro / "sub"):
            err = _one_line_exit_2(capsys, OUT_COMMANDS[name] + ["--out", str(out)])
            assert "`--out`" in err and "permission" in err
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("name", ["run --examples", "stabilizers", "sweep run"])
def test_out_reported_unwritable_is_refused(in_tmp, monkeypatch, capsys, name):
    """The same with the permission check answered "no" (so that it runs as root too)."""
    ro = in_tmp / "ro"
    ro.mkdir()
    (in_tmp / "SPEC").write_text(TINY_SWEEP)
    real = os.access
    monkeypatch.setattr("gaussian_pde.cli._options.os.access",
                        lambda p, mode: False if pathlib.Path(p) == ro else real(p, mode))
    for out in (ro, ro / "sub"):
        err = _one_line_exit_2(capsys, OUT_COMMANDS[name] + ["--out", str(out)])
        assert "`--out`" in err and "permission" in err
    assert list(ro.iterdir()) == []


def test_plot_below_a_file_is_refused(in_tmp, capsys):
    (in_tmp / "blocker").write_text("x")
    err = _one_line_exit_2(capsys, ["sweep", "summarize", "results", "--plot",
                                    str(in_tmp / "blocker" / "fig.png")])
    assert "`--plot`" in err


@pytest.mark.parametrize("argv", [["--bogus"], ["-q", "--bogus"], ["compare", "--bogus"],
                                  ["compare", "--seeds", "many"], ["bogus"],
                                  ["stabilizers", "--seed"], ["sweep"],
                                  ["compare", "--attention", "nope"]])
def test_bad_flags_give_one_line(capsys, argv):
    err = _one_line_exit_2(capsys, argv)
    assert "error:" in err and "--help" in err


def test_bad_out_as_a_subprocess(tmp_path):
    """The installed command's view: one line on stderr, exit status 2, nothing on stdout."""
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "gaussian_pde", "stabilizers", "--out",
                           str(blocker)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"gaussian-pde stabilizers: error: `--out` is an existing file, "
                           f"not a folder: {blocker}.\n")


# ------------------------------------------------------------------ the attention registry
def test_type_choices_come_from_the_registry():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    attention = next(a for a in sub["compare"]._actions if a.dest == "attention")
    assert list(attention.choices) == list(ATTENTIONS)
    assert list(compare_examples()) == list(ATTENTIONS)   # every built-in type has one
    # the main job's examples: the Gaussian-preserving ones with a constant mean, in the
    # registry's order
    expected = [n for n, cls in ATTENTIONS.items() if cls.gaussian_preserving
                and not callable(cls.example_setting()["mean0"])]
    assert list(default_examples()) == expected and expected


class Toy(Softmax):
    """A registered type the command line knows nothing else about."""

    name = "toy"


@pytest.mark.filterwarnings("ignore::gaussian_pde.particles._simulate.ParticleDegeneracyWarning")
def test_a_newly_registered_type_is_a_choice(in_tmp, monkeypatch, capsys):
    monkeypatch.setitem(ATTENTIONS, "toy", Toy)
    err = _one_line_exit_2(capsys, ["compare", "--attention", "toy"])
    assert "no built-in example" in err and "--weights" in err
    weights = in_tmp / "toy.json"
    q = np.array([[1.0, 0.5]])
    weights.write_text(json.dumps({"Q": q.tolist(), "K": (-q).tolist(), "V": np.eye(2).tolist()}))
    assert main(["-q", "compare", "--attention", "toy", "--weights", str(weights), "--n", "30",
                 "60", "--seeds", "2", "--num-times", "2", "--t-end", "0.1"]) == 0
    assert (OUT / "compare" / "compare_toy.json").exists()
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("error, says", [
    (MemoryError("Unable to allocate 23.8 GiB for an array with shape (40000, 40000) and "
                 "data type float64"), "out of memory: Unable to allocate 23.8 GiB"),
    (MemoryError("Allocation failed (probably too large)"),
     "an allocation in compiled code failed (the size asked for is not known)"),
    (MemoryError(), "the size asked for is not known"),
    (PermissionError(13, "Permission denied", "res/results.zarr"),
     "Permission denied: res/results.zarr"),
])
def test_an_error_deep_in_a_command_is_one_line(monkeypatch, capsys, error, says):
    """A MemoryError (NumPy's names the size, compiled code's does not) or an OSError
    anywhere in a command: one line on stderr, exit status 2, no traceback."""
    from gaussian_pde.cli import _stabilizers

    def fails(args):
        raise error
    monkeypatch.setattr(_stabilizers, "run", fails)
    with pytest.raises(SystemExit) as exc:
        main(["stabilizers", "--quick"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("gaussian-pde stabilizers: error: ") and says in err, err
