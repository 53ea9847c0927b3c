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


@pytest.mark.slow
def test_cli_full_study(tmp_path, capsys):
    """The full study, as `gaussian-pde train` runs it: every (task, variant, seed, rate)
    trained and measured, every verdict counted over the cases its criterion names."""
    from gaussian_pde.cli._train import FULL

    assert main(["train", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    cfg = s["config"]
    n_seeds, n_rates = len(cfg["seeds"]), len(cfg["learning_rates"])
    assert n_seeds == FULL["seeds"] >= 5 and tuple(cfg["learning_rates"]) == FULL["learning_rates"]
    for task in cfg["tasks"]:
        for variant in cfg["variants"]:
            runs = s["runs"][task][variant]
            assert sorted((r["seed"], r["learning_rate"]) for r in runs) == sorted(
                (seed, lr) for seed in cfg["seeds"] for lr in cfg["learning_rates"])
            for r in runs:       # a diverged run has a step; a finished one a finite loss
                assert r["divergence_step"] is not None or np.isfinite(r["eval_loss_final"])
    v = s["verdicts"]
    n_tasks = len(cfg["tasks"])
    # explosion: per task and seed, each of the 3 pairs (no_ln/pre_ln, no_ln/post_ln,
    # neither/no_residual); drift: per task, seed and rate, the 2 residual pairs where
    # both trained; simulator: per task, seed and rate, the 4 simulators
    assert v["explosion"]["total"] == n_tasks * n_seeds * 3
    assert v["drift"]["total"] <= n_tasks * n_seeds * n_rates * 2
    sim = v["simulator"]
    assert sim["total"] + sim["both_diverged"] <= n_tasks * n_seeds * n_rates * 4
    for claim in ("drift", "explosion", "simulator"):
        assert 0 <= v[claim]["holds"] <= v[claim]["total"]
        assert len(v[claim]["detail"]) == v[claim]["total"]
    assert (tmp_path / "verdicts.md").read_text().startswith("| claim |")
    for name in ["bridge.png"] + [f"{k}_{t}.png" for k in ("training", "drift")
                                  for t in cfg["tasks"]]:
        assert (tmp_path / name).stat().st_size > 5000
    assert "report:" in capsys.readouterr().err
