"""solve_batch against what a user would compare it with, at equal accuracy.

Run: ``python benchmarks/bench_batch.py [--quick] [--json PATH]``.

Workload (softmax covariance ODE, seeded draws): ``d`` in {3, 5, 8}, ``k = d``,
``K = -Q``, ``V = R^T R / d``, ``Sigma_0 = G G^T / d``, ``t`` in ``[0, T]`` with
``T`` in {10, 200} (the stiff tail of the slow convergence), ``B`` in {100, 1000, 10000},
without a mean and with one (``mean_0`` standard normal), the package's default
tolerances (rtol 1e-10, atol 1e-12). For every workload:

* ``batch``: :func:`gaussian_pde.solve_batch` (wall time and CPU time of the process;
  its ``path``: the compiled integrator, parallel over the machine's cores);
* ``loop``: a loop over the default :func:`gaussian_pde.solve` (``mean0=None`` without a
  mean), timed on ``--single`` trajectories and extrapolated to ``B``, warm (one untimed
  solve first) and best of ``--rounds`` as the batch is (wall and CPU: on a loaded
  machine the CPU ratio is the one that load moves least); after the batch, so with the
  kernel compiled for the shape, as a user's loop has from its 64th solve on;
* ``diffrax``: JAX + diffrax, ``Dopri8`` with a PID controller, ``vmap`` + ``jit`` over the
  trajectories of the same factor-form ODE, ``throw=False`` and a step cap per lane
  (``--jax-max-steps``); cold (compile included) and warm (from the second call, wall and
  CPU); at the loosest of rtol 1e-8, 1e-10, 1e-12 (atol = rtol / 100) whose error is at
  most the batch's (equal accuracy), every tolerance tried recorded; the lanes that
  succeed (diffrax's result and a finite state at ``T``) and those that spent the cap;
  up to ``--jax-max-b`` trajectories; skipped with a message where JAX or diffrax are
  absent (the ``train`` extra);
* the errors of each against a tight reference (``solve_batch`` at rtol 1e-13, atol
  1e-15, ``method="DOP853"``) on the first ``--ref`` trajectories: the largest relative
  Frobenius error of the final covariance and the largest relative error of the final
  mean, over the trajectories that reach ``T`` in both runs. A mean that overflows
  float64 stops its trajectory at a time that depends on the tolerance; those are
  counted (``compared/stopped/ref stopped``), not compared;
* evaluations per trajectory and the time per evaluation (CPU time of the batch over its
  evaluations) against two floors measured in this run: the flops of one field evaluation
  (``2 (d + 2k) d m + 2 d^2 k + 2 d k m``) at the rate of a compiled loop of independent
  multiply-adds (``floor_scalar``) and at the rate of a large BLAS ``dgemm``
  (``floor_blas``), both on one core;
* linearity: the batch's CPU seconds per trajectory at every ``B`` of a workload.

A first table times ``solve`` against ``solve_batch`` of one trajectory on the paper's
steady-state workload (:func:`batch_of_one`): whether the single solve should run on the
compiled batch core.

The record (``docs/_static/results/benchmarks/bench_batch.json``, or ``--json PATH``) is
written after every workload, so a long run that is stopped keeps what it measured;
``--max-seconds`` starts no workload after that time and lists those not run (the
workloads run by increasing ``B``, so it cuts the largest).
``--quick`` runs d = 3 and 5, B = 100 and 1000, both horizons, without a mean and with one
(a few minutes on an idle 2-core machine); ``--d``, ``--B``, ``--T``, ``--mean`` pick
other parts of the grid. Times are best of ``--rounds`` (diffrax warm: of one call), and
of as many calls as fill ``--min-time`` seconds where the calls are shorter (at most 50).
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import numpy as np

import gaussian_pde as gp


def workload(rng, B, d, with_mean):
    Q = rng.standard_normal((B, d, d))
    R = rng.standard_normal((B, d, d))
    G = rng.standard_normal((B, d, d))
    V = np.swapaxes(R, 1, 2) @ R / d
    atts = [gp.Softmax(Q[b], -Q[b], V[b]) for b in range(B)]
    covs = G @ np.swapaxes(G, 1, 2) / d
    means = rng.standard_normal((B, d)) if with_mean else None
    return atts, covs, means, (Q, V)


def rel_err(a, b):
    """Largest relative Frobenius (or Euclidean) error of the stack ``a`` against ``b``."""
    if len(b) == 0:
        return None
    axes = tuple(range(1, np.ndim(b)))
    # in units of each entry's largest element: a mean near 1e300 must not overflow the norm
    s = np.max(np.abs(b), axis=axes, keepdims=True)
    s = np.where(s > 0, s, 1.0)
    return float(np.max(np.linalg.norm((a - b) / s, axis=axes)
                        / np.linalg.norm(b / s, axis=axes)))


def best(fn, rounds, min_time=0.0):
    """``(result, wall, cpu)``: the best wall time of ``rounds`` calls, and its CPU time.

    Short calls repeat until ``min_time`` seconds have passed as well (at most
    :data:`MAX_REPEATS` calls): one or two calls of a few milliseconds measure the
    machine's noise more than the code.
    """
    out, t_best, cpu_best = None, math.inf, math.inf
    spent, n = 0.0, 0
    while n < rounds or (spent < min_time and n < MAX_REPEATS):
        t0 = time.perf_counter()
        c0 = time.process_time()
        out = fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if wall < t_best:
            t_best, cpu_best = wall, cpu
        spent += wall
        n += 1
    return out, t_best, cpu_best


#: the most calls :func:`best` makes to fill ``min_time``
MAX_REPEATS = 50


def floors():
    """Flop rates of one core: a compiled multiply-add loop and a large dgemm."""
    from numba import njit

    @njit(cache=False)
    def fma(n, x):
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
        for _ in range(n):
            a0 = a0 * x + 1.0
            a1 = a1 * x + 1.0
            a2 = a2 * x + 1.0
            a3 = a3 * x + 1.0
            a4 = a4 * x + 1.0
            a5 = a5 * x + 1.0
            a6 = a6 * x + 1.0
            a7 = a7 * x + 1.0
        return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7

    fma(10, 0.5)
    n = 20_000_000
    t = min(_timed(lambda: fma(n, 0.999999)) for _ in range(3))
    scalar = 16 * n / t
    try:
        from threadpoolctl import threadpool_limits
        limit = threadpool_limits(1)
    except ImportError:
        limit = None
    A = np.random.default_rng(0).standard_normal((800, 800))
    t = min(_timed(lambda: A @ A) for _ in range(3))
    if limit is not None:
        limit.unregister()
    return scalar, 2 * 800 ** 3 / t


def _timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def field_flops(d, k, m):
    return 2 * (d + 2 * k) * d * m + 2 * d * d * k + 2 * d * k * m


def diffrax_run(Q, V, covs, means, T, rtol, atol, max_steps, min_time=0.0):
    """diffrax's Dopri8 (PID controller, vmap + jit) on the factor-form ODE of every lane.

    Cold (compile included) and warm (the second call, repeated for at least ``min_time``
    seconds, best of those, as :func:`best`) wall times, the warm call's CPU time, the
    final covariances and means, and per lane: success (diffrax's result ``successful``
    and a finite state at ``T``; ``throw=False``, so one lane that fails or spends its
    ``max_steps`` does not stop the others) and the steps taken.
    """
    import diffrax
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    d = covs.shape[-1]
    c = 1.0 / math.sqrt(d)
    with_mean = means is not None

    def rhs(t, Z, args):
        Qb, Vb = args
        L = Z[:, :d]
        P = (c * Vb) @ L
        A = P @ (-(Qb @ L)).T
        out = A @ (Qb @ Z)
        if with_mean:
            out = out.at[:, d].add(Vb @ Z[:, d])
        return out

    term = diffrax.ODETerm(rhs)
    solver = diffrax.Dopri8()
    ctrl = diffrax.PIDController(rtol=rtol, atol=atol)

    def one(Z0, Qb, Vb):
        sol = diffrax.diffeqsolve(term, solver, 0.0, T, None, Z0, args=(Qb, Vb),
                                  stepsize_controller=ctrl, max_steps=max_steps,
                                  saveat=diffrax.SaveAt(t1=True), throw=False)
        ok = (sol.result == diffrax.RESULTS.successful) & jnp.all(jnp.isfinite(sol.ys[-1]))
        return sol.ys[-1], sol.stats["num_steps"], ok

    f = jax.jit(jax.vmap(one))
    L0 = np.linalg.cholesky(covs + 1e-300 * np.eye(d))
    Z0 = L0 if not with_mean else np.concatenate([L0, means[:, :, None]], axis=2)
    args = (jnp.asarray(Z0), jnp.asarray(Q), jnp.asarray(V))
    t0 = time.perf_counter()
    Z, steps, ok = f(*args)
    Z.block_until_ready()
    cold = time.perf_counter() - t0

    def call():
        out = f(*args)
        out[0].block_until_ready()
        return out

    (Z, steps, ok), warm, warm_cpu = best(call, 1, min_time)
    Z, steps, ok = np.asarray(Z), np.asarray(steps), np.asarray(ok)
    L = Z[:, :, :d]
    return dict(cold_s=cold, warm_s=warm, warm_cpu_s=warm_cpu, cov=L @ np.swapaxes(L, 1, 2),
                mean=Z[:, :, d] if with_mean else None, ok=ok, lanes_ok=int(ok.sum()),
                lanes=int(ok.size), lanes_capped=int(np.sum(steps >= max_steps)),
                steps_mean=float(np.mean(steps)), steps_max=int(np.max(steps)))

def errors(cov, mean, reached, ref):
    """Errors against the reference over the trajectories that reach ``T`` in both runs.

    ``cov`` (and ``mean``) are the first ``n`` trajectories of a run, ``reached`` whether
    each reached ``T``, ``ref`` the reference's solution of at least those ``n``. A
    trajectory whose mean overflows stops at a time that depends on the tolerance, so its
    final state is not comparable: those are counted (``stopped``, and the reference's
    ``ref_stopped``), not compared.
    """
    n = len(cov)
    ref_ok = np.asarray(ref.status[:n].astype(str) == "finished")
    reached = np.asarray(reached, dtype=bool)
    both = reached & ref_ok
    out = dict(compared=int(both.sum()), stopped=int((~reached).sum()),
               ref_stopped=int((~ref_ok).sum()),
               err_cov=rel_err(cov[both], ref.cov_final[:n][both]))
    if mean is not None:
        out["err_mean"] = rel_err(mean[both], ref.mean_final[:n][both])
    return out


def _worst(e):
    """The larger of a run's covariance and mean errors (None where nothing compared)."""
    vals = [e.get("err_cov"), e.get("err_mean")]
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def _timed_loop(atts, means, covs, T, ns, B, rounds, min_time):
    """A loop over the default ``solve`` on ``ns`` trajectories, extrapolated to ``B``.

    Warm and timed as the batch is (:func:`best`): one untimed solve first loads the
    compiled kernels that the process has not used yet.
    """
    def one(i):
        return gp.solve(atts[i], None if means is None else means[i], covs[i], (0.0, T))

    one(0)
    out, wall, cpu = best(lambda: [one(i) for i in range(ns)], rounds, min_time)
    return out, wall / ns * B, cpu / ns * B


def _diffrax_columns(row, Q, V, covs, means, T, ref, nref, a):
    """The loosest diffrax tolerance at the batch's accuracy or better, and each one tried."""
    target = _worst(row["batch_errors"])
    tried = []
    for rtol in (1e-8, 1e-10, 1e-12):
        try:
            r = diffrax_run(Q, V, covs, means, T, rtol, rtol * 1e-2, a.jax_max_steps,
                           a.min_time)
        except Exception as exc:   # noqa: BLE001 - recorded: a failure is a result too
            tried.append(dict(rtol=rtol, failed=f"{type(exc).__name__}: "
                              + str(exc).splitlines()[0][:200]))
            break
        ok, cov, mean = r.pop("ok"), r.pop("cov"), r.pop("mean")
        r.update(rtol=rtol, errors=errors(cov[:nref], None if mean is None else mean[:nref],
                                          ok[:nref], ref))
        tried.append(r)
        err = _worst(r["errors"])
        if target is None or (err is not None and err <= target):
            break
    row["diffrax_tried"] = tried
    good = [r for r in tried if "failed" not in r]
    if good:
        r = good[-1]
        row.update(diffrax_rtol=r["rtol"], diffrax_cold_s=r["cold_s"],
                   diffrax_warm_s=r["warm_s"], diffrax_warm_cpu_s=r["warm_cpu_s"],
                   diffrax_err=_worst(r["errors"]), diffrax_lanes_ok=r["lanes_ok"],
                   diffrax_lanes_capped=r["lanes_capped"],
                   diffrax_steps_mean=r["steps_mean"], diffrax_steps_max=r["steps_max"],
                   speedup_vs_diffrax_warm=r["warm_s"] / row["batch_s"],
                   cpu_speedup_vs_diffrax_warm=r["warm_cpu_s"] / row["batch_cpu_s"])
    else:
        row["diffrax_failed"] = tried[-1]["failed"]


def measure(B, d, T, with_mean, a, have_jax):
    """One workload: the batch, the loop, diffrax, their errors, evaluations and floors."""
    rng = np.random.default_rng(1000 * d + B + (7 if with_mean else 0))
    atts, covs, means, (Q, V) = workload(rng, B, d, with_mean)
    kw = {} if means is None else {"mean0s": means}
    sol, wall, cpu = best(lambda: gp.solve_batch(atts, covs, (0.0, T), **kw), a.rounds,
                          a.min_time)
    nref = min(a.ref, B)
    ref = gp.solve_batch(atts[:nref], covs[:nref], (0.0, T), rtol=1e-13, atol=1e-15,
                         method="DOP853", max_nfev=None,
                         **({} if means is None else {"mean0s": means[:nref]}))
    reached = sol.status.astype(str) == "finished"
    e_batch = errors(sol.cov_final[:nref], None if means is None else sol.mean_final[:nref],
                     reached[:nref], ref)
    ns = min(a.single, B)
    loop, t_loop, cpu_loop = _timed_loop(atts, means, covs, T, ns, B, a.rounds,
                                          a.min_time)
    nl = min(ns, nref)
    e_loop = errors(np.array([s.cov_final for s in loop[:nl]]),
                    None if means is None else np.array([s.mean_final for s in loop[:nl]]),
                    np.array([str(s.status) == "finished" for s in loop[:nl]]), ref)
    nfev = float(np.mean(sol.nfev))
    m = d + 1 if with_mean else d
    row = dict(B=B, d=d, T=T, mean=with_mean, path=sol.path,
               statuses={s: int(n) for s, n in zip(*np.unique(sol.status.astype(str),
                                                                   return_counts=True))},
               batch_s=wall, batch_cpu_s=cpu, loop_s=t_loop, loop_timed=ns,
               speedup_vs_loop=t_loop / wall, loop_cpu_s=cpu_loop,
               cpu_speedup_vs_loop=cpu_loop / cpu, batch_errors=e_batch, loop_errors=e_loop,
               err_batch=_worst(e_batch), err_loop=_worst(e_loop),
               nfev_per_trajectory=nfev, implicit_fraction=float(np.mean(sol.implicit)),
               time_per_eval_s=cpu / (nfev * B), flops_per_eval=field_flops(d, d, m))
    row["floor_scalar_s"] = row["flops_per_eval"] / a.rate_scalar
    row["floor_blas_s"] = row["flops_per_eval"] / a.rate_blas
    row["over_floor_scalar"] = row["time_per_eval_s"] / row["floor_scalar_s"]
    if have_jax and B <= a.jax_max_b:
        _diffrax_columns(row, Q, V, covs, means, T, ref, nref, a)
    elif have_jax:
        row["diffrax_skipped"] = f"B > --jax-max-b {a.jax_max_b}"
    return row


def batch_of_one(seeds, T, repeat):
    """``solve`` against ``solve_batch`` of one trajectory (compiled) on the paper workload.

    The paper's steady-state setting (d = 5, Q in R^{2x5}, K = -Q, V = G^T G,
    Sigma_0 = G G^T, scale 1/sqrt(d); the seeds of ``benchmarks/bench_solve.py``), to
    ``T``, defaults only, interleaved ``repeat`` times, best of each (wall, and CPU: on a
    loaded machine the CPU time is the one that load moves least); the error of both
    against a DOP853 reference at rtol 1e-13.
    """
    rows = []
    for seed in seeds:
        r = np.random.default_rng(seed)
        Q, G = r.standard_normal((2, 5)), r.standard_normal((5, 5))
        att, cov0 = gp.Softmax(Q, -Q, G.T @ G, scale=1 / np.sqrt(5)), G @ G.T
        ref = gp.solve_batch(att, cov0[None], (0.0, T), rtol=1e-13, atol=1e-15,
                             method="DOP853", max_nfev=None).cov_final[0]
        runs = {"solve": functools.partial(gp.solve, att, None, cov0, (0.0, T)),
                "batch": functools.partial(gp.solve_batch, att, cov0[None], (0.0, T))}
        t = {name: [math.inf, math.inf] for name in runs}
        out = {}
        for _ in range(repeat):
            for name, fn in runs.items():
                out[name], wall, cpu = best(fn, 1)
                t[name] = [min(t[name][0], wall), min(t[name][1], cpu)]
        s, b = out["solve"], out["batch"]
        rows.append(dict(seed=seed, T=T, solve_s=t["solve"][0], batch_of_one_s=t["batch"][0],
                         solve_cpu_s=t["solve"][1], batch_of_one_cpu_s=t["batch"][1],
                         batch_over_solve=t["batch"][0] / t["solve"][0],
                         batch_over_solve_cpu=t["batch"][1] / t["solve"][1],
                         solve_nfev=int(s.nfev), batch_nfev=int(b.nfev[0]),
                         err_solve=rel_err(s.cov_final[None], ref[None]),
                         err_batch=rel_err(b.cov_final[:1], ref[None])))
        x = rows[-1]
        print(f"paper seed {seed}, T={T:g}: solve {1e3 * x['solve_cpu_s']:.1f} ms CPU "
              f"({s.nfev} evals, err {x['err_solve']:.1e}), batch of one "
              f"{1e3 * x['batch_of_one_cpu_s']:.1f} ms CPU ({b.nfev[0]} evals, err "
              f"{x['err_batch']:.1e}): x{x['batch_over_solve_cpu']:.2f} (wall "
              f"x{x['batch_over_solve']:.2f})", flush=True)
    return rows


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _line(row):
    """One row of the printed table (and of the record's table)."""
    be, le = row["batch_errors"], row["loop_errors"]
    if "diffrax_warm_s" in row:
        jx = [f"{row['diffrax_warm_s']:.3f}", f"{row['diffrax_cold_s']:.2f}",
              f"{row['diffrax_rtol']:.0e}", _fmt(row["diffrax_err"], ".1e"),
              f"{row['diffrax_lanes_ok']}/{row['B']} ({row['diffrax_lanes_capped']} capped)",
              f"{row['speedup_vs_diffrax_warm']:.1f}",
              f"{row['cpu_speedup_vs_diffrax_warm']:.1f}"]
    else:
        why = row.get("diffrax_failed") or row.get("diffrax_skipped") or "not installed"
        jx = [why, "-", "-", "-", "-", "-", "-"]
    return [str(row["d"]), f"{row['T']:g}", "yes" if row["mean"] else "no", str(row["B"]),
            f"{be['compared']}/{be['stopped']}/{be['ref_stopped']}",
            f"{row['batch_s']:.3f}", _fmt(be["err_cov"], ".1e"), _fmt(be.get("err_mean"), ".1e"),
            f"{row['loop_s']:.2f}", _fmt(le["err_cov"], ".1e"),
            f"{row['speedup_vs_loop']:.1f}", f"{row['cpu_speedup_vs_loop']:.1f}", *jx,
            f"{row['nfev_per_trajectory']:.0f}", f"{1e9 * row['time_per_eval_s']:.0f}",
            f"{row['over_floor_scalar']:.1f}"]


_COLUMNS = ["d", "T", "mean", "B", "compared/stopped/ref stopped", "batch s", "batch err cov",
            "batch err mean", "loop s", "loop err cov", "x loop", "x loop (CPU)",
            "diffrax warm s", "diffrax cold s", "diffrax rtol", "diffrax err", "diffrax lanes ok",
            "x diffrax warm", "x diffrax warm (CPU)", "evals/traj", "ns/eval", "x floor"]


def _linearity(rows):
    """Seconds per trajectory against ``B`` for every workload measured at several ``B``."""
    lin = {}
    for key in sorted({(r["d"], r["T"], r["mean"]) for r in rows}):
        sel = sorted((r for r in rows if (r["d"], r["T"], r["mean"]) == key),
                     key=lambda r: r["B"])
        per = [r["batch_cpu_s"] / r["B"] for r in sel]
        lin[str(key)] = {"B": [r["B"] for r in sel], "cpu_s_per_trajectory": per,
                         "max_over_min": max(per) / min(per)}
    return lin


def _grid(a):
    ds, Bs = ((3, 5), (100, 1000)) if a.quick else ((3, 5, 8), (100, 1000, 10000))
    ds, Bs, Ts = a.d or ds, a.B or Bs, a.T or (10.0, 200.0)
    means = {"both": (False, True), "no": (False,), "yes": (True,)}[a.mean]
    return ds, Bs, Ts, means


def _arguments():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--single", type=int, default=30, help="trajectories of the loop timed")
    p.add_argument("--ref", type=int, default=30, help="trajectories of the tight reference")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--min-time", type=float, default=0.5,
                   help="seconds a timing repeats for at least (calls shorter than that)")
    p.add_argument("--jax-max-b", type=int, default=10_000,
                   help="largest B that runs the diffrax column")
    p.add_argument("--jax-max-steps", type=int, default=20_000,
                   help="diffrax's step cap per lane (max_steps)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="start no new workload after this many seconds (those left are listed)")
    p.add_argument("--one", type=int, default=None, help="seeds of the batch-of-one table")
    p.add_argument("--d", type=int, nargs="+", help="dimensions (overrides the grid's)")
    p.add_argument("--B", type=int, nargs="+", help="batch sizes (overrides the grid's)")
    p.add_argument("--T", type=float, nargs="+", help="horizons (default 10 200)")
    p.add_argument("--mean", choices=("both", "no", "yes"), default="both")
    p.add_argument("--json", default=None)
    return p.parse_args()


def _one_table(one):
    """The batch-of-one table of the record (one row per paper seed)."""
    cols = ["seed", "T", "solve ms CPU", "batch of one ms CPU", "batch / solve (CPU)",
            "solve evals", "batch evals", "solve err", "batch err"]
    rows = [[str(x["seed"]), f"{x['T']:g}", f"{1e3 * x['solve_cpu_s']:.2f}",
             f"{1e3 * x['batch_of_one_cpu_s']:.2f}", f"{x['batch_over_solve_cpu']:.2f}",
             str(x["solve_nfev"]), str(x["batch_nfev"]), _fmt(x["err_solve"], ".1e"),
             _fmt(x["err_batch"], ".1e")] for x in one]
    return {"title": "solve against solve_batch of one trajectory (the paper's steady-state "
            "workload, d = 5; best of the interleaved repeats)", "columns": cols, "rows": rows}


def main():
    a = _arguments()
    start = time.perf_counter()
    try:
        import diffrax  # noqa: F401
        import jax  # noqa: F401
        have_jax = True
    except ImportError:
        have_jax = False
        print("JAX or diffrax not installed (the `train` extra: pip install "
              "'gaussian_pde[train]'): the diffrax column is skipped")
    a.rate_scalar, a.rate_blas = floors()
    print(f"floors: {a.rate_scalar / 1e9:.2f} Gflop/s (compiled multiply-adds), "
          f"{a.rate_blas / 1e9:.2f} Gflop/s (dgemm), one core")
    ds, Bs, Ts, means = _grid(a)
    gp.solve_batch(gp.Softmax.example(2, 0), np.eye(2)[None], (0, 1))   # load the compiled code
    n_one = a.one if a.one is not None else (3 if a.quick or a.d else 10)
    one = batch_of_one(range(n_one), 300.0, a.rounds + 1)
    from _record import write_record

    # the cheap workloads first, so that --max-seconds cuts the largest B
    todo = [(d, T, mu, B) for B in Bs for d in ds for T in Ts for mu in means]
    rows, path = [], None
    print("| " + " | ".join(_COLUMNS) + " |")
    print("|" + "---|" * len(_COLUMNS))
    for i, (d, T, with_mean, B) in enumerate(todo):
        if a.max_seconds is not None and time.perf_counter() - start > a.max_seconds:
            break
        rows.append(measure(B, d, T, with_mean, a, have_jax))
        print("| " + " | ".join(_line(rows[-1])) + " |", flush=True)
        left = [dict(d=d_, T=T_, mean=m_, B=B_) for d_, T_, m_, B_ in todo[i + 1:]]
        payload = {"quick": a.quick, "grid": {"d": list(ds), "B": list(Bs), "T": list(Ts),
                                              "mean": list(means)},
                   "have_jax": have_jax, "rate_scalar_flops": a.rate_scalar,
                   "rate_blas_flops": a.rate_blas, "jax_max_b": a.jax_max_b,
                   "jax_max_steps": a.jax_max_steps,
                   "tables": [{"title": "solve_batch against a loop of solve and diffrax "
                               "(errors over the trajectories that reach T in both runs)",
                               "columns": _COLUMNS, "rows": [_line(r) for r in rows]},
                              _one_table(one)],
                   "rows": rows, "not_run": left, "batch_of_one": one,
                   "linearity": _linearity(rows)}
        path = write_record("bench_batch", payload, a.json)   # after every row
    print(f"wrote {path}" + (f"; {len(todo) - len(rows)} workloads not run (--max-seconds)"
                             if len(rows) < len(todo) else ""))


if __name__ == "__main__":
    main()
