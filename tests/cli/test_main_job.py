"""The main job (``gaussian-pde`` with no arguments): reproduction report plus the
built-in 2-D examples, whose trajectories are checked against the package's own
invariants and the exact softmax blow-up time."""

import numpy as np
import pytest

from gaussian_pde.cli._main import main
from gaussian_pde.cli._main_job import default_examples
from gaussian_pde.integrate._exact import blowup_time


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


def test_default_run_writes_reproduction_and_examples(tmp_path):
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    report = _check_examples(tmp_path)
    assert report.startswith("# gaussian-pde reproduce")      # the reproduction comes first
    assert (tmp_path / "regimes_softmax.png").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_examples_alone(tmp_path):
    assert main(["--examples", "--out", str(tmp_path)]) == 0
    report = _check_examples(tmp_path)
    assert report.startswith("# Built-in 2-D examples")
    assert not (tmp_path / "regimes_softmax.png").exists()


def test_bad_output_folder(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["--examples", "--out", str(blocker)])
    assert exc.value.code == 2
