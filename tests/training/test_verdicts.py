"""Verdicts on hand-made records: every case counted, ratios and outcomes as constructed."""

import math

import numpy as np
import pytest

from gaussian_pde.training._verdicts import bootstrap_median, verdicts

RATES = (0.1, 0.2, 0.4)


def _rec(depth, seed, lr, failed, cka=0.9, probe=0.8, l_star=None, growth=1.0):
    m = {"cka_input": np.array([1.0, cka]), "probe_target": np.array([0.5, probe]),
         "rel_step": np.array([0.5]), "trace": np.array([1.0, growth])}
    r = {"depth": depth, "seed": seed, "learning_rate": lr, "optim": "plain",
         "failed": failed, "divergence_step": None, "relative_step": 3 if failed else None,
         "eval_loss_final": 2.0 if failed else 0.5, "measures_final": m, "measures_init": m}
    if l_star is not None:
        r["L_star_init"] = l_star
    return r


def _results():
    runs = {"pre_ln": [], "no_ln": [], "no_residual": [], "pde_euler": []}
    for seed in (0, 1, 2):
        for lr in RATES:
            runs["pre_ln"].append(_rec(4, seed, lr, failed=False, cka=0.8))
            # no_ln is stable up to 0.1 only; it keeps as much of the input as pre-LN
            runs["no_ln"].append(_rec(4, seed, lr, failed=lr > 0.1, cka=0.8,
                                      l_star=2.0 if lr > 0.1 else 8.0, growth=100.0))
            # without residuals: 1 - CKA = 0.6 against 0.2, a ratio of 3
            runs["no_residual"].append(_rec(4, seed, lr, failed=False, cka=0.4))
            runs["pde_euler"].append(_rec(4, seed, lr, failed=lr == 0.4 or seed == 0,
                                          l_star=math.inf))
    return {"runs": {"mixture": runs}, "tasks": {"mixture": {"chance": 1.0}}}


def test_explosion_counts_the_largest_stable_rate():
    v = verdicts(_results())
    row = next(r for r in v["explosion"] if r["pair"] == "no_ln/pre_ln"
               and r["claim"] == "explosion")
    assert (row["holds"], row["total"]) == (3, 3)          # 0.4 / 0.1 in every seed
    assert row["median"] == pytest.approx(4.0) and row["ci95"] == (4.0, 4.0)


def test_drift_uses_the_lost_share_of_the_input():
    v = verdicts(_results())
    cka = next(r for r in v["drift"] if r["pair"] == "no_residual/pre_ln"
               and "CKA" in r["criterion"])
    assert (cka["holds"], cka["total"]) == (9, 9) and cka["median"] == pytest.approx(3.0)
    probe = next(r for r in v["drift"] if r["pair"] == "no_residual/pre_ln"
                 and "probe" in r["criterion"])
    assert probe["holds"] == 0 and probe["median"] == pytest.approx(1.0)


def test_simulator_counts_all_four_outcomes():
    v = verdicts(_results())
    for r in v["simulator"]:
        assert sum(r["outcomes"].values()) == r["total"] == 9
    pre = next(r for r in v["simulator"] if r["pair"] == "pde_euler/pre_ln")
    # fails at seed 0 (3 rates) and at 0.4 for seeds 1, 2; pre-LN never fails
    assert pre["outcomes"] == {"both_ok": 4, "only_simulator_fails": 5, "only_other_fails": 0,
                               "both_fail": 0}
    ref = next(r for r in v["simulator"] if r["pair"] == "pde_euler/no_ln")
    # no_ln fails at 0.2 and 0.4 in every seed
    assert ref["outcomes"] == {"both_ok": 2, "only_simulator_fails": 1, "only_other_fails": 2,
                               "both_fail": 4}


def test_theory_agreement_is_counted_per_run():
    t = verdicts(_results())["theory"]
    # no_ln: L* = 2 < 4 exactly where it fails (6 runs), L* = 8 where it trains (3): all
    # agree with failure; all grew (100x), so 6 agree with growth. pde_euler: L* = inf,
    # never predicted; it fails in 5 of 9 (4 agree), never grew (9 agree).
    assert t["total"] == 18 and t["predicted"] == 6
    assert t["agree_failure"] == 9 + 4 and t["agree_growth"] == 6 + 9
    assert t["undetermined"] == 0


def test_theory_counts_the_runs_it_could_not_predict():
    res = _results()
    for r in res["runs"]["mixture"]["no_ln"][:2]:
        r["L_star_init"] = math.nan
    t = verdicts(res)["theory"]
    assert (t["total"], t["undetermined"]) == (16, 2)


def test_bootstrap_interval_brackets_the_median():
    rng = np.random.default_rng(0)
    r = rng.lognormal(size=60)
    lo, hi = bootstrap_median(r, np.repeat(np.arange(20), 3))
    assert lo <= np.median(r) <= hi
    assert np.isnan(bootstrap_median([], [])[0])
