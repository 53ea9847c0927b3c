"""The main job (``gaussian-pde`` with no arguments): reproduction report plus the
built-in 2-D examples, whose trajectories are checked against the package's own
invariants and the exact softmax blow-up time."""

import numpy as np
import pytest

from gaussian_pde._exact import blowup_time
from gaussian_pde.cli._main import main
from gaussian_pde.cli._main_job import default_examples
from gaussian_pde.cli._progress import COMPILING
from gaussian_pde.cli._reproduce import progress_steps
from gaussian_pde.studies import REGIMES


def _check_examples(out):
    data = np.load(out / "trajectories.npz")
    examples = default_examples()
    for name, (_, mean0, cov0, horizon) in examples.items():
        t, mean, cov = data[f"{name}_t"], data[f"{name}_mean"], data[f"{name}_cov"]
        assert t[0] == 0 and np.all(np.diff(t) > 0) and t[-1] <= horizon
        np.testing.assert_allclose(cov[0], cov0, rtol=1e-12)
        np.testing.assert_allclose(mean[0], mean0, rtol=1e-12)
        np.testing.assert_allclose(cov, np.swapaxes(cov, 1, 2), rtol=1e-13, atol=0)
        w = np.linalg.eigvalsh(cov)
        assert np.all(w[:, 0] >= -1e-12 * w[:, -1])
    report = (out / "report.md").read_text()
    assert "Built-in 2-D examples" in report and "](covariance_trajectories.png)" in report
    assert (out / "covariance_trajectories.png").stat().st_size > 10_000
    # softmax example (V = I) blows up; its time in the report matches the exact t*
    att, _, cov0, _ = examples["softmax"]
    t_star = blowup_time(att, cov0)
    section = report[report.index("Built-in 2-D examples"):]
    row = next(line for line in section.splitlines() if line.startswith("| softmax |"))
    assert "blowup" in row and f"{t_star:.8g}" in row
    return report


# the full main job (about 20 s on an idle machine): in the slow run, next to the quick one
@pytest.mark.slow
def test_default_run_writes_reproduction_and_examples(tmp_path, capsys):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    report = _check_examples(tmp_path)
    assert report.startswith("# gaussian-pde reproduce")      # the reproduction comes first
    assert (tmp_path / "regimes_softmax.png").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    # one progress line per step on stderr, numbered up to the announced total
    # (and, where Numba compiles in this process, the one line that says so)
    lines = capsys.readouterr().err.splitlines()
    assert lines.count(COMPILING) <= 1
    lines = [line for line in lines if line != COMPILING]
    steps = progress_steps() + len(default_examples()) + 1
    assert len(lines) == steps
    assert [line.split("] ")[0] for line in lines] == [f"[{k:>2}/{steps}" for k in
                                                       range(1, steps + 1)]
    messages = [line.split("] ", 1)[1].rsplit(" (", 1)[0] for line in lines]
    n = len(REGIMES)
    assert messages[:n] == [f"regimes: {r}" for r in REGIMES]
    assert messages[n:n + 3] == [f"histograms: d = {d}" for d in (3, 4, 5)]
    assert messages[n + 3] == "figure: regimes_softmax.png"
    assert messages[-1] == "figure: covariance_trajectories.png"


def test_examples_alone(tmp_path, capsys):
    assert main(["--examples", "--quiet", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""                      # --quiet: no progress
    report = _check_examples(tmp_path)
    assert report.startswith("# Built-in 2-D examples")
    assert not (tmp_path / "regimes_softmax.png").exists()


def test_bad_output_folder(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["--examples", "--out", str(blocker)])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (f"gaussian-pde run: error: `--out` is an existing "
                                       f"file, not a folder: {blocker}.\n")


def test_reproduce_after_the_main_job_keeps_the_examples(tmp_path):
    """One report per folder: a later ``reproduce`` keeps the examples section, once."""
    assert main(["--examples", "--quiet", "--out", str(tmp_path)]) == 0
    assert main(["reproduce", "--quick", "--quiet", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# gaussian-pde reproduce")
    assert report.count("Built-in 2-D examples") == 1
    assert main(["--quick", "--quiet", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "report.md").read_text()
    assert report.count("Built-in 2-D examples") == 1
    assert "replayed in this run in" in report or "published_histograms.json" in report
