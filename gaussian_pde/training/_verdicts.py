r"""Verdicts on the second paper's training claims, each criterion stated before its numbers.

One row per claim and pair of variants (docs/math.md 11.3). For each row, every case is
counted (never dropped): the criterion gives each case a ratio whose value above 1 speaks
for the claim; the row reports how many cases hold, the ratio's median and 10-90 %
range over cases, and a bootstrap 95 % interval of the median over seeds (seeds resampled
with replacement, all cases of a resampled seed kept together, 2000 resamples).

``drift``
    Without residuals the representation drifts from the input: per (task, depth, seed,
    rate, optimiser) where both runs are finite, ratio = :math:`(1 - \mathrm{CKA}_L)` of
    the model without residuals over that of its residual twin (the share of the input's
    linear structure lost by the last layer); holds when the ratio is at least 2. A second
    row per pair compares the error of the last layer's target probe,
    :math:`(1 - s_L)` with :math:`s` the held-out accuracy or :math:`R^2`. The uncentred
    step drift of earlier versions is reported beside, as a row of its own.
``explosion``
    Without LayerNorm training is unstable: per (task, depth, seed, optimiser), ratio =
    largest stable learning rate with normalisation over that without (a run is stable
    when it did not fail: finite, final held-out loss below chance); holds when the ratio
    is above 1 (on the x2 grid: at least 2). A model with no stable rate has rate 0 (the
    ratio is then infinite, or undefined when both have none: counted as not holding and
    listed). Beside it the same with the older relative criterion (first rate at which
    the training loss exceeds 10x its first value).
``simulator``
    The PDE simulator, lacking the stabilisers, trains worse than the Transformer that
    has them: per (task, depth, seed, rate, optimiser), the four outcomes of (simulator
    fails, pre-LN fails) are counted; the claim holds in the cases where the simulator
    fails and pre-LN does not; the same four outcomes against ``no_ln``.
``theory``
    The Gaussian theory predicts failure: for every run of a model without
    normalisation with a finite prediction, :math:`L^* < L` (the Gaussian blow-up depth
    through the layers' attentions from the embedded tokens' covariance, at
    initialisation) is
    taken as a prediction that the run fails, or that its activations grow
    (:math:`\operatorname{tr}\hat\Sigma_L/\operatorname{tr}\hat\Sigma_0 > 10` at
    initialisation); the agreement rate is the share of runs where prediction and outcome
    agree. Runs whose prediction is undetermined (the moment ODE could not be followed
    through a layer, :func:`~gaussian_pde.training.predicted_blowup_depth` gives NaN) are
    counted apart, as ``undetermined``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["verdicts", "DRIFT_RATIO", "DRIFT_PAIRS", "EXPLOSION_PAIRS", "GROWTH_LIMIT",
           "bootstrap_median"]

#: drift criterion: the lost share without residuals at least this multiple of with
DRIFT_RATIO = 2.0
#: activation growth counted as explosive in the theory check
GROWTH_LIMIT = 10.0
#: (without residuals, with residuals)
DRIFT_PAIRS = (("no_residual", "pre_ln"), ("neither", "no_ln"))
#: (without normalisation, with it): unscaled, scaled and gated branches against pre-LN
EXPLOSION_PAIRS = (("no_ln", "pre_ln"), ("no_ln", "post_ln"), ("neither", "no_residual"),
                   ("no_ln_sqrt", "pre_ln"), ("no_ln_depth", "pre_ln"), ("rezero", "pre_ln"),
                   ("no_ln", "no_ln_depth"))


def bootstrap_median(ratios, seeds, *, n_boot=2000, seed=0):
    """Bootstrap 95 % interval of the median ratio, resampling seeds (cases kept together)."""
    r = np.asarray(ratios, float)
    s = np.asarray(seeds)
    if r.size == 0:
        return (math.nan, math.nan)
    groups = [r[s == u] for u in np.unique(s)]
    rng = np.random.default_rng(seed)
    meds = []
    for _ in range(n_boot):
        pick = rng.integers(len(groups), size=len(groups))
        meds.append(np.percentile(np.concatenate([groups[i] for i in pick]), 50,
                                  method="closest_observation"))
    lo, hi = np.percentile(meds, [2.5, 97.5], method="closest_observation")
    return float(lo), float(hi)


def _row(claim, pair, criterion, cases, threshold, strict=False):
    ratios = np.array([c["ratio"] for c in cases], float)
    ok = [c["ratio"] > threshold if strict else c["ratio"] >= threshold for c in cases]
    for c, o in zip(cases, ok):
        c["holds"] = bool(o)
    fin = ratios[~np.isnan(ratios)]
    # no interpolation: an infinite ratio (no stable rate without the stabiliser) stays one
    q = (np.percentile(fin, [10, 50, 90], method="closest_observation") if fin.size
         else [math.nan] * 3)
    ci = bootstrap_median(fin, [c["seed"] for c in cases if not math.isnan(c["ratio"])])
    return dict(claim=claim, pair=pair, criterion=criterion,
                holds=int(sum(c["holds"] for c in cases)), total=len(cases),
                undefined=int(np.isnan(ratios).sum()), median=float(q[1]), p10=float(q[0]),
                p90=float(q[2]), ci95=ci, detail=cases)


def _key(r):
    return (r["depth"], r["seed"], r["learning_rate"], r.get("optim", "plain"))


def _paired(byv, a, b):
    other = {_key(r): r for r in byv[b]}
    return [(r, other[_key(r)]) for r in byv[a] if _key(r) in other]


def _lost(rec, key):
    v = rec["measures_final"][key]
    return 1.0 - float(np.asarray(v, float)[-1])


def _drift_rows(runs):
    rows = []
    specs = (("cka_input", "1 - CKA(X_L, X_0)"), ("probe_target", "1 - target probe score"),
             ("rel_step", "median uncentred step drift ‖X_l - X_l-1‖/‖X_l-1‖ (old metric)"))
    for a, b in DRIFT_PAIRS:
        for key, what in specs:
            cases = []
            for t, byv in runs.items():
                if a not in byv or b not in byv:
                    continue
                for ra, rb in _paired(byv, a, b):
                    if ra["divergence_step"] is not None or rb["divergence_step"] is not None:
                        cases.append(dict(task=t, depth=ra["depth"], seed=ra["seed"],
                                          learning_rate=ra["learning_rate"],
                                          optim=ra.get("optim"), ratio=math.nan,
                                          note="a run is not finite"))
                        continue
                    with np.errstate(all="ignore"):
                        if key == "rel_step":
                            va = float(np.nanmedian(ra["measures_final"][key]))
                            vb = float(np.nanmedian(rb["measures_final"][key]))
                        else:
                            va, vb = _lost(ra, key), _lost(rb, key)
                        ratio = va / vb if vb > 0 else (math.inf if va > 0 else math.nan)
                    cases.append(dict(task=t, depth=ra["depth"], seed=ra["seed"],
                                      learning_rate=ra["learning_rate"],
                                      optim=ra.get("optim"), ratio=ratio,
                                      without=va, with_=vb))
            rows.append(_row("drift", f"{a}/{b}",
                             f"{what}: {a} over {b} >= {DRIFT_RATIO:g} (final, both finite)",
                             cases, DRIFT_RATIO))
    return rows


def _stable_rate(records, chance, relative=False):
    if relative:
        bad = sorted(r["learning_rate"] for r in records
                     if r["relative_step"] is not None or r["divergence_step"] is not None)
        ok = [r["learning_rate"] for r in records
              if not bad or r["learning_rate"] < bad[0]]
        return max(ok) if ok else 0.0
    ok = [r["learning_rate"] for r in records if not r["failed"]]
    return max(ok) if ok else 0.0


def _groups(records):
    g = {}
    for r in records:
        g.setdefault((r["depth"], r["seed"], r.get("optim", "plain")), []).append(r)
    return g


def _explosion_rows(runs, chance):
    rows = []
    for a, b in EXPLOSION_PAIRS:
        for relative in (False, True):
            cases = []
            for t, byv in runs.items():
                if a not in byv or b not in byv:
                    continue
                ga, gb = _groups(byv[a]), _groups(byv[b])
                for k in sorted(set(ga) & set(gb)):
                    fa = _stable_rate(ga[k], chance[t], relative)
                    fb = _stable_rate(gb[k], chance[t], relative)
                    ratio = fb / fa if fa > 0 else (math.inf if fb > 0 else math.nan)
                    cases.append(dict(task=t, depth=k[0], seed=k[1], optim=k[2],
                                      stable_rate=fa, stable_rate_other=fb, ratio=ratio))
            crit = ("largest stable rate (loss 10x its start: unstable; older criterion)"
                    if relative else "largest stable rate (finite, final loss below chance)")
            rows.append(_row("explosion" + (" (relative)" if relative else ""), f"{a}/{b}",
                             f"{crit}: {b} over {a} > 1", cases, 1.0, strict=True))
    return rows


def _simulator_rows(runs):
    rows = []
    for t, byv in runs.items():
        for v in [v for v in byv if v.startswith("pde_")]:
            for ref in ("pre_ln", "no_ln"):
                if ref not in byv:
                    continue
                outcomes = {"both_ok": 0, "only_simulator_fails": 0, "only_other_fails": 0,
                            "both_fail": 0}
                cases = []
                for ra, rb in _paired(byv, v, ref):
                    fa, fb = ra["failed"], rb["failed"]
                    o = ("both_fail" if fa and fb else "only_simulator_fails" if fa
                         else "only_other_fails" if fb else "both_ok")
                    outcomes[o] += 1
                    cases.append(dict(task=t, depth=ra["depth"], seed=ra["seed"],
                                      learning_rate=ra["learning_rate"], optim=ra.get("optim"),
                                      outcome=o, holds=o == "only_simulator_fails"))
                rows.append(dict(claim="simulator", pair=f"{v}/{ref}", task=t,
                                 criterion=f"the simulator fails where {ref} does not "
                                           "(all four outcomes counted)",
                                 holds=outcomes["only_simulator_fails"], total=len(cases),
                                 outcomes=outcomes, detail=cases))
    return rows


def _theory_row(runs):
    cases, undetermined = [], 0
    for t, byv in runs.items():
        for v, recs in byv.items():
            for r in recs:
                if "L_star_init" not in r:
                    continue
                if math.isnan(r["L_star_init"]):
                    undetermined += 1
                    continue
                tr = np.asarray(r["measures_init"]["trace"], float)
                with np.errstate(all="ignore"):
                    growth = tr[-1] / tr[0]
                pred = bool(r["L_star_init"] < r["depth"])
                grew = bool(not np.isfinite(growth) or growth > GROWTH_LIMIT)
                cases.append(dict(task=t, variant=v, depth=r["depth"], seed=r["seed"],
                                  learning_rate=r["learning_rate"], optim=r.get("optim"),
                                  L_star=r["L_star_init"], L_star_final=r.get("L_star_final"),
                                  predicted=pred, failed=bool(r["failed"]), grew=grew,
                                  growth_init=float(growth),
                                  agrees_failure=pred == bool(r["failed"]),
                                  agrees_growth=pred == grew))
    n = len(cases)
    return dict(claim="theory", pair="L* < L",
                criterion="prediction L* < L (Gaussian blow-up depth through the layers' "
                          "attentions at init) against failure, and against growth tr S_L / tr S_0 > "
                          f"{GROWTH_LIMIT:g} at init",
                total=n, undetermined=undetermined,
                agree_failure=int(sum(c["agrees_failure"] for c in cases)),
                agree_growth=int(sum(c["agrees_growth"] for c in cases)),
                predicted=int(sum(c["predicted"] for c in cases)),
                failed=int(sum(c["failed"] for c in cases)), detail=cases)


def verdicts(results):
    """The paper's claims under the stated criteria (module docstring), every case counted.

    Returns ``{"drift": [rows], "explosion": [rows], "simulator": [rows], "theory": row}``;
    a row has ``criterion``, ``holds``, ``total``, the ratio's ``median``, ``p10``,
    ``p90`` and ``ci95`` (bootstrap over seeds), and its ``detail`` cases.
    """
    runs = results["runs"]
    chance = {t: results["tasks"][t]["chance"] for t in runs}
    return {"drift": _drift_rows(runs), "explosion": _explosion_rows(runs, chance),
            "simulator": _simulator_rows(runs), "theory": _theory_row(runs)}
