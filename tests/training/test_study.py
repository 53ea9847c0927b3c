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


def test_seeds_whose_held_out_batches_exceed_the_memory_are_refused(capsys):
    """Every seed keeps a held-out batch per task (the mixture task's 32 sequences: 16 kB,
    the bytes of one batch drawn here); 10^8 seeds need 1.5e3 GiB of them, past half of
    any machine's memory: refused with the size, before any training."""
    from gaussian_pde.training import check_study_memory, get_task

    batch = get_task("mixture").sample(np.random.default_rng(0), 32, "train")
    per_seed = sum(np.asarray(b).nbytes for b in batch)
    assert check_study_memory(3, tasks=("mixture",), eval_batch=32) == 3 * per_seed
    with pytest.raises(SystemExit) as e:
        main(["train", "--quick", "--seeds", "1e8", "--out", "/nonexistent/x/../y"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1
    assert f"`--seeds` = 100000000 seeds would need at least {1e8 * per_seed / 2**30:.3g} GiB" \
        in err[0]


@pytest.mark.slow
def test_small_study_writes_report_and_verdicts(tmp_path):
    res = run_training_study(tasks=("mixture", "regression"),
                             variants=("pre_ln", "no_ln", "no_ln_depth", "no_residual",
                                       "neither", "pde_euler"),
                             depths=(2, 4), depth=2, seeds=(0, 1),
                             learning_rates=(1e-3, 1e-1), n_steps=20, batch=8, width=4,
                             eval_batch=16, bridge_tokens=(32, 128), bridge_sequences=2,
                             bridge_rates=(1e-3, 1e-1), optimize=False)
    runs = res["runs"]
    # mixture sweeps depths 2 and 4, regression trains at depth 2; 2 optimiser settings
    assert len(runs["mixture"]["pre_ln"]) == 2 * 2 * 2 * 2
    assert len(runs["regression"]["pre_ln"]) == 1 * 2 * 2 * 2
    for r in runs["mixture"]["no_ln"]:
        assert r["failed"] == (not np.isfinite(r["eval_loss_final"])
                               or r["eval_loss_final"] >= res["tasks"]["mixture"]["chance"])
        assert r["layer_grad_norm_start"].shape == (r["depth"],)
        assert "L_star_init" in r and "L_star_final" in r
    assert "L_star_init" not in runs["mixture"]["pre_ln"][0]
    v = verdicts(res)
    for row in v["drift"] + v["explosion"]:
        assert 0 <= row["holds"] <= row["total"] == len(row["detail"])
    for row in v["simulator"]:
        assert sum(row["outcomes"].values()) == row["total"]
    # explosion: per task, depth, seed and optimiser setting, every case
    row = next(r for r in v["explosion"] if r["pair"] == "no_ln/pre_ln")
    assert row["total"] == (2 + 1) * 2 * 2
    write_training_study(res, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "## Verdicts" in text and "| drift |" in text and "**Failure**" in text
    names = [f"{kind}_{t}.png" for kind in ("training", "drift", "stability", "layer_grads")
             for t in res["config"]["tasks"]]
    for name in names + ["bridge.png", "theory.png"]:
        assert (tmp_path / name).stat().st_size > 5000
    assert (tmp_path / "verdicts.md").read_text().startswith("| claim |")
    s = json.loads((tmp_path / "summary.json").read_text())
    b = s["bridge"]["regression"]["no_ln"]["attention"]
    assert b["exact"] and np.all(np.isfinite(b["cov_err"][0]))
    # the bridge over every seed and both rates: one summary per (seed, rate)
    scope = s["bridge_scope"]["mixture"]["no_ln"]
    assert {(c["seed"], c["learning_rate"]) for c in scope} == {
        (sd, lr) for sd in (0, 1) for lr in (1e-3, 1e-1)}
    assert "### The bridge over every seed and two learning rates" in text


def _same(x, y):
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(_same(u, v) for u, v in zip(x, y, strict=True))
    if isinstance(x, (np.ndarray, float, np.floating)):
        return np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
    return x == y


@pytest.mark.slow
def test_the_study_on_two_processes_equals_the_study_on_one():
    """Each group trains from its seeds alone: the records, bridges and verdicts do not
    depend on how many processes train them (nor in which order they finish)."""
    kw = dict(tasks=("mixture",), variants=("pre_ln", "no_ln", "pde_euler"), depths=(2, 4),
              depth=2, seeds=(0, 1), learning_rates=(1e-3, 1e-2, 1e-1), n_steps=10, batch=4,
              width=8, optims=("plain",), eval_batch=16, bridge_tokens=(16, 32),
              bridge_sequences=2, optimize=False)
    one = run_training_study(workers=1, **kw)
    two = run_training_study(workers=2, **kw)
    assert _same(one, two)
    assert len(one["bridge_scope"]["mixture"]["no_ln"]) == 2 * 2
    assert _same(verdicts(one), verdicts(two))


def test_bad_workers_are_refused_before_any_work():
    from gaussian_pde.training import check_study_workers

    with pytest.raises(ValueError, match="`workers` must be at least 1"):
        run_training_study(workers=0)
    with pytest.raises(TypeError, match="`workers` must be an integer"):
        check_study_workers(2.5)
    with pytest.raises(ValueError, match="GiB"):
        check_study_workers(10**8, "--workers")


def test_bad_task_rates_are_refused_before_any_work():
    with pytest.raises(ValueError, match=r"`task_rates\['text'\]\[1\]` must be a finite positive"):
        run_training_study(task_rates={"text": (1e-3, -1.0)})
    with pytest.raises(TypeError, match=r"`task_rates\['text'\]\[0\]` must be a real number"):
        run_training_study(task_rates={"text": ("fast",)})
    with pytest.raises(ValueError, match="`task_rates` must name tasks of `tasks`"):
        run_training_study(tasks=("mixture",), task_rates={"text": (1e-3,)})


def test_a_task_with_its_own_rates_trains_and_bridges_at_them():
    """`task_rates` replaces the study's grid for that task: its runs are at its rates, its
    bridge at the nearest of them to `bridge_learning_rate`; the config records both."""
    res = run_training_study(tasks=("mixture",), variants=("no_ln",), depths=(1,), depth=1,
                             seeds=(0,), learning_rates=(1e-3, 1e-1),
                             task_rates={"mixture": (3e-2,)}, n_steps=3, batch=4, width=4,
                             optims=("plain",), eval_batch=8, bridge_tokens=(16,),
                             bridge_sequences=1, theory=False, optimize=False)
    assert res["config"]["task_rates"] == {"mixture": [3e-2]}
    assert res["config"]["bridge_learning_rate"] == 1e-3
    assert [r["learning_rate"] for r in res["runs"]["mixture"]["no_ln"]] == [3e-2]
    assert res["tasks"]["mixture"]["bridge_learning_rate"] == 3e-2
    assert [c["learning_rate"] for c in res["bridge_scope"]["mixture"]["no_ln"]] == [3e-2]


@pytest.mark.slow
def test_cli_quick(tmp_path, capsys):
    assert main(["train", "--quick", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text().startswith("# Training study")
    err = capsys.readouterr().err
    assert "train: mixture/pre_ln L=2 plain" in err and "report:" in err


@pytest.mark.slow
@pytest.mark.full_study
def test_cli_full_study(tmp_path, capsys):
    """The full study, as `gaussian-pde train` runs it: every (task, variant, depth, seed,
    rate, optimiser setting) trained and measured, every verdict counting every case."""
    from gaussian_pde.cli._train import FULL

    assert main(["train", "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    cfg = s["config"]
    rates = cfg["learning_rates"]
    assert len(rates) >= 11 and rates[-1] / rates[0] >= 1e3
    for task in cfg["tasks"]:
        for variant, runs in s["runs"][task].items():
            sweep = task == cfg["sweep_task"] and variant in cfg["sweep_variants"]
            want = set()
            for L in (cfg["depths"] if sweep else [cfg["depth"]]):
                seeds = cfg["seeds"][:cfg["large_depth_seeds"]] if L >= cfg["large_depth"] \
                    else cfg["seeds"]
                optims = cfg["task_optims"].get(task, cfg["optims"])
                grid = cfg["task_rates"].get(task, rates)
                want |= {(L, sd, lr, o) for sd in seeds for lr in grid for o in optims}
            got = {(r["depth"], r["seed"], r["learning_rate"], r["optim"]) for r in runs}
            assert got == want, (task, variant)
    assert len(cfg["seeds"]) == FULL["seeds"]
    for ref in s["tasks"].values():
        assert ref["chance"] > 0
    # the tasks are learned: regression within 2x of its Bayes risk, text below the bigram
    best = {t: min(r["eval_loss_final"] for runs in s["runs"][t].values() for r in runs)
            for t in cfg["tasks"]}
    assert best["regression"] <= 2 * s["tasks"]["regression"]["bayes_risk"][0]
    assert best["text"] < s["tasks"]["text"]["bigram"]
    v = s["verdicts"]
    for row in v["drift"] + v["explosion"]:
        assert 0 <= row["holds"] <= row["total"] == len(row["detail"])
    assert (tmp_path / "verdicts.md").read_text().startswith("| claim |")
    assert "report:" in capsys.readouterr().err


def test_groups_whose_batches_exceed_the_memory_are_refused_before_training():
    """A group holds its seeds' batches (12 bytes a number): a million steps of the text
    task's one-hot sequences need about a terabyte; refused with the size, nothing trained."""
    with pytest.raises(ValueError, match=r"training batches of 1 groups .* GiB"):
        run_training_study(tasks=("mixture",), variants=("pre_ln",), depths=(2,), depth=2,
                           seeds=(0,), n_steps=10**9, batch=64, optims=("plain",))
