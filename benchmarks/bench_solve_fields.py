"""Benchmark: ``gp.solve`` with each type's compiled field against a type without one.

Where a type supplies a compiled field (:meth:`gaussian_pde.Attention.compiled_field`,
the one ``gp.solve_batch`` integrates), ``gp.solve``'s default runs in
``gp.solve_batch``'s compiled engine, one trajectory to its end. The baseline is
what a type without compiled fields gets: the event loop alone, on the NumPy reference
field (:func:`gaussian_pde.integrate._moment_field.reference_field`: the derivation's
``factor_rhs`` and ``moment_rhs``). Each type is run a second time as a subclass whose
``compiled_field`` returns None, in the same process, interleaved, so the ratio does not depend on the
machine's speed that day; the two take different steps (the engine's DOP853, then
RODAS4P2 once stiff; the event loop's ``"auto"``, SciPy's LSODA), so the evaluation
counts differ. A third column runs ``gp.solve_batch`` on the same setting as a batch of one:
on a run without events or stiffness it is the same computation as ``gp.solve``.

Settings: every Gaussian-preserving type of the registry, d in ``--dims``, ``--seeds``
draws each (Q, K standard normal k x d with k = d, V = R / sqrt(d), Sigma_0 = G G^T / d,
first without a mean (except where the type's field needs one), then with the mean
0.5 sqrt(diag Sigma_0) for every type),
over 20 natural time units (``20 / (|V| (1 + |A||Sigma_0| + c|K|^2|Sigma_0|))``) with
the defaults of ``gp.solve``. Per type: CPU per evaluation of both runs, the ratio of
their CPU (total over the settings, and the median per setting), how many statuses and
evaluation counts agree, and the largest relative difference of the final covariances
and blow-up times (different steps: the runs' tolerance).

Run:  python benchmarks/bench_solve_fields.py [--dims 2 4 6 8] [--seeds 10] [--rounds 3]
      [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _record import best_of, write_record  # noqa: E402

import gaussian_pde as gp  # noqa: E402
from gaussian_pde.attention import names_with  # noqa: E402

T_NATURAL = 20.0


def numpy_only(cls):
    """``cls`` as a type without compiled fields (what the contract's defaults give)."""
    return type(cls.__name__, (cls,), {"compiled_field": lambda self: None})


def setting(rng, name, d, with_mean):
    """``(attention, same attention with NumPy fields, cov0, mean0, t_end)``."""
    def heads(n):
        out = []
        for _ in range(n):
            Q, K = rng.standard_normal((2, d, d))
            V = rng.standard_normal((d, d)) / np.sqrt(d)
            out.append((Q, K, V))
        return out

    cls = gp.ATTENTIONS[name]
    if issubclass(cls, gp.SingleHeadAttention):
        (w,) = heads(1)
        att, ref = cls(*w), numpy_only(cls)(*w)
    else:                           # a sum of a softmax and an L2 head
        ws = heads(2)
        pair = (gp.ATTENTIONS["softmax"], gp.ATTENTIONS["l2"])
        att = cls([c(*w) for c, w in zip(pair, ws)])
        ref = cls([numpy_only(c)(*w) for c, w in zip(pair, ws)])
    G = rng.standard_normal((d, d))
    cov0 = G @ G.T / d
    mean0 = 0.5 * np.sqrt(np.diag(cov0)) if with_mean or att.field_sees_mean else None
    c = np.linalg.norm(cov0, 2)
    rate = sum(np.linalg.norm(h.V, 2) * (1 + np.linalg.norm(h.A, 2) * c
                                         + h.scale * np.linalg.norm(h.K, 2) ** 2 * c)
               for h in getattr(att, "heads", (att,)))
    return att, ref, cov0, mean0, T_NATURAL / rate


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


def measure(name, dims, seeds, rounds, with_mean):
    rows = []
    for d in dims:
        rng = np.random.default_rng(1000 * d + 17)
        for _ in range(seeds):
            att, ref, cov0, mean0, t1 = setting(rng, name, d, with_mean)
            batch_kw = {} if mean0 is None else {"mean0s": mean0[None]}
            runs = {
                "compiled": functools.partial(gp.solve, att, mean0, cov0, (0.0, t1)),
                "numpy": functools.partial(gp.solve, ref, mean0, cov0, (0.0, t1)),
                "batch": functools.partial(gp.solve_batch, att, cov0[None], (0.0, t1),
                                           **batch_kw),
            }
            for fn in runs.values():     # untimed: kernels loaded
                fn()
            # CPU: both cores of the batch count
            res = {k: best_of(fn, rounds, clock=time.process_time)
                   for k, fn in runs.items()}
            (a, ta), (b, tb), (o, to) = res["compiled"], res["numpy"], res["batch"]
            both_blow = a.t_blowup is not None and b.t_blowup is not None
            rows.append(dict(
                d=d, status=str(a.status), same_status=a.status == b.status,
                same_nfev=a.nfev == b.nfev, nfev=a.nfev, nfev_numpy=b.nfev,
                cpu=ta, cpu_numpy=tb, cpu_batch=to,
                cov_diff=rel(a.cov_final, b.cov_final) if a.status == b.status == "finished"
                else None,
                tb_diff=abs(a.t_blowup - b.t_blowup) / a.t_blowup if both_blow else None,
                batch_status_agrees=str(o.status[0]) == str(a.status)))
    return rows


def summary(name, rows):
    nfev, nfev_np = sum(r["nfev"] for r in rows), sum(r["nfev_numpy"] for r in rows)
    cpu, cpu_np = sum(r["cpu"] for r in rows), sum(r["cpu_numpy"] for r in rows)
    cpu_b = sum(r["cpu_batch"] for r in rows)
    cov = [r["cov_diff"] for r in rows if r["cov_diff"] is not None]
    tbs = [r["tb_diff"] for r in rows if r["tb_diff"] is not None]
    return dict(
        type=name, settings=len(rows),
        us_per_eval_compiled=1e6 * cpu / nfev, us_per_eval_numpy=1e6 * cpu_np / nfev_np,
        numpy_over_compiled=cpu_np / cpu,
        median_numpy_over_compiled=float(np.median([r["cpu_numpy"] / r["cpu"] for r in rows])),
        statuses_agree=sum(r["same_status"] for r in rows),
        nfev_agree=sum(r["same_nfev"] for r in rows),
        max_cov_diff=max(cov) if cov else None, max_tblowup_diff=max(tbs) if tbs else None,
        batch_of_one_over_solve=cpu_b / cpu,
        median_batch_of_one_over_solve=float(np.median([r["cpu_batch"] / r["cpu"]
                                                        for r in rows])),
        batch_statuses_agree=sum(r["batch_status_agrees"] for r in rows))


COLUMNS = [("type", "type", None), ("settings", "settings", None),
           ("us_per_eval_compiled", "us/eval compiled (CPU)", ".2f"),
           ("us_per_eval_numpy", "us/eval NumPy (CPU)", ".2f"),
           ("numpy_over_compiled", "NumPy / compiled (total)", ".2f"),
           ("median_numpy_over_compiled", "NumPy / compiled (median)", ".2f"),
           ("statuses_agree", "same status", None), ("nfev_agree", "same evaluations", None),
           ("max_cov_diff", "max rel diff final cov", ".1e"),
           ("max_tblowup_diff", "max rel diff blow-up time", ".1e"),
           ("batch_of_one_over_solve", "batch of one / solve (total)", ".2f"),
           ("median_batch_of_one_over_solve", "batch of one / solve (median)", ".2f"),
           ("batch_statuses_agree", "batch of one: same status", None)]


def _cell(v, spec):
    return "-" if v is None else (format(v, spec) if spec else str(v))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=int, nargs="+", default=[2, 4, 6, 8])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    tables, summaries, raw = [], {}, {}
    for with_mean in (False, True):
        label = "with_mean" if with_mean else "without_mean"
        table = []
        # the package's own types (an installed plugin's constructor may take more weights)
        for name in [n for n in names_with(gaussian_preserving=True)
                     if gp.ATTENTIONS[n].__module__.startswith("gaussian_pde.")]:
            rows = measure(name, args.dims, args.seeds, args.rounds, with_mean)
            raw[f"{name} {label}"] = rows
            s = summary(name, rows)
            table.append(s)
            print(label, "  ".join(f"{lab}: {_cell(s[key], spec)}" for key, lab, spec in COLUMNS),
                  flush=True)
        summaries[label] = table
        tables.append(dict(
            title=("gp.solve: the compiled core and field against a type without them, per type, "
                   + ("with a mean" if with_mean else "without a mean (linear: with)")
                   + " (CPU, best of the rounds; batch of one: gp.solve_batch of the same "
                     "setting)"),
            columns=[lab for _, lab, _ in COLUMNS],
            rows=[[_cell(s[key], spec) for key, _, spec in COLUMNS] for s in table]))
    payload = dict(dims=args.dims, seeds=args.seeds, rounds=args.rounds, tables=tables,
                   summary=summaries, settings=raw)
    print("wrote", write_record("bench_solve_fields", payload, args.json))


if __name__ == "__main__":
    main()
