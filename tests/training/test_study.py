"""The training study: the verdicts on a tiny study (default tier) and the command (slow)."""

import json

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")

from gaussian_pde.cli._main import main  # noqa: E402
from gaussian_pde.training import run_training_study, verdicts, write_training_study  # noqa: E402


def test_cli_bad_seeds_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--seeds", "0", "--out", "/nonexistent/x/../y"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seeds" in err[0]


@pytest.mark.slow
def test_small_study_writes_report_and_verdicts(tmp_path):
    res = run_training_study(variants=("pre_ln", "no_ln", "no_residual", "neither",
                                       "pde_euler"),
                             seeds=(0, 1), learning_rates=(1e-3, 1e-1), n_steps=20, batch=8,
                             depth=2, eval_batch=16, bridge_tokens=(32, 128),
                             bridge_sequences=2, optimize=False)
    v = verdicts(res)
    assert v["drift"]["total"] <= 2 * 2 * 2 * 2 and v["explosion"]["total"] == 2 * 2 * 2
    sim = v["simulator"]
    assert sim["total"] + sim["both_diverged"] <= 2 * 2 * 2 and sim["holds"] <= sim["total"]
    write_training_study(res, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "## Verdicts" in text and "| drift |" in text
    names = [f"{kind}_{t}.png" for kind in ("training", "drift") for t in res["config"]["tasks"]]
    for name in names + ["bridge.png"]:
        assert (tmp_path / name).stat().st_size > 5000
    assert (tmp_path / "verdicts.md").read_text().startswith("| claim |")
    s = json.loads((tmp_path / "summary.json").read_text())
    b = s["bridge"]["regression"]["no_ln"]["attention"]
    assert b["exact"] and np.all(np.isfinite(b["cov_err"][0]))


@pytest.mark.slow
def test_cli_quick(tmp_path, capsys):
    assert main(["train", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text().startswith("# Training study")
    err = capsys.readouterr().err
    assert "train: mixture/pre_ln" in err and "report:" in err
