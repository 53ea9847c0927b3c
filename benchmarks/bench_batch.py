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
  mean), timed on ``--single`` trajectories and extrapolated to ``B`` (wall and CPU: on a
  loaded machine the CPU ratio is the one that load moves least);
* ``diffrax``: JAX + diffrax, ``Dopri8`` with a PID controller, ``vmap`` + ``jit`` over the
  trajectories of the same factor-form ODE; cold (compile included) and warm (the second
  call); at the loosest of rtol 1e-8, 1e-10, 1e-12 whose error is at most the batch's
  (equal accuracy); skipped with a message where JAX or diffrax are absent (the ``train``
  extra);
* the error of each against a tight reference (``solve_batch`` at rtol 1e-13, atol 1e-15,
  ``method="DOP853"``) on ``--ref`` trajectories: the largest relative Frobenius error of
  the final covariance;
* evaluations per trajectory and the time per evaluation (CPU time of the batch over its
  evaluations) against two floors measured in this run: the flops of one field evaluation
  (``2 (d + 2k) d m + 2 d^2 k + 2 d k m``) at the rate of a compiled loop of independent
  multiply-adds (``floor_scalar``) and at the rate of a large BLAS ``dgemm``
  (``floor_blas``), both on one core.

A first table times ``solve`` against ``solve_batch`` of one trajectory on the paper's
steady-state workload (:func:`batch_of_one`): whether the single solve should run on the
compiled batch core.

``--quick`` runs d = 3 and 5, B = 100 and 1000, both horizons, without a mean and with one
(a few minutes on an idle 2-core machine); ``--d``, ``--B``, ``--T``, ``--mean`` pick
other parts of the grid. Times are best of ``--rounds``.
"""

from __future__ import annotations

import argparse
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
    return float(np.max(np.linalg.norm(a - b, axis=(-2, -1)) / np.linalg.norm(b, axis=(-2, -1))))


def best(fn, rounds):
    out, t_best = None, math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        c0 = time.process_time()
        out = fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if wall < t_best:
            t_best, cpu_best = wall, cpu
    return out, t_best, cpu_best


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


def diffrax_run(Q, V, covs, means, T, rtol, atol):
    """Cold and warm times and final covariances of diffrax's Dopri8 (vmap + jit)."""
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
                                  stepsize_controller=ctrl, max_steps=200_000,
                                  saveat=diffrax.SaveAt(t1=True))
        return sol.ys[-1], sol.stats["num_steps"]

    f = jax.jit(jax.vmap(one))
    L0 = np.linalg.cholesky(covs + 1e-300 * np.eye(d))
    Z0 = L0 if not with_mean else np.concatenate([L0, means[:, :, None]], axis=2)
    args = (jnp.asarray(Z0), jnp.asarray(Q), jnp.asarray(V))
    t0 = time.perf_counter()
    Z, steps = f(*args)
    Z.block_until_ready()
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    Z, steps = f(*args)
    Z.block_until_ready()
    warm = time.perf_counter() - t0
    Z = np.asarray(Z)
    L = Z[:, :, :d]
    return cold, warm, L @ np.swapaxes(L, 1, 2), float(np.mean(np.asarray(steps)))


def measure(B, d, T, with_mean, a, have_jax):
    rng = np.random.default_rng(1000 * d + B + (7 if with_mean else 0))
    atts, covs, means, (Q, V) = workload(rng, B, d, with_mean)
    kw = {} if means is None else {"mean0s": means}
    sol, wall, cpu = best(lambda: gp.solve_batch(atts, covs, (0.0, T), **kw), a.rounds)
    nref = min(a.ref, B)
    ref = gp.solve_batch(atts[:nref], covs[:nref], (0.0, T), rtol=1e-13, atol=1e-15,
                         method="DOP853", max_nfev=None,
                         **({} if means is None else {"mean0s": means[:nref]}))
    err_batch = rel_err(sol.cov_final[:nref], ref.cov_final)
    ns = min(a.single, B)
    t0, c0 = time.perf_counter(), time.process_time()
    loop = [gp.solve(atts[i], None if means is None else means[i], covs[i], (0.0, T))
            for i in range(ns)]
    t_loop = (time.perf_counter() - t0) / ns * B
    cpu_loop = (time.process_time() - c0) / ns * B
    nl = min(ns, nref)
    err_loop = rel_err(np.array([s.cov_final for s in loop[:nl]]), ref.cov_final[:nl])
    nfev = float(np.mean(sol.nfev))
    m = d + 1 if with_mean else d
    row = dict(B=B, d=d, T=T, mean=with_mean, path=sol.path,
               statuses={s: int(n) for s, n in zip(*np.unique(sol.status.astype(str),
                                                                   return_counts=True))},
               batch_s=wall, batch_cpu_s=cpu, loop_s=t_loop, loop_timed=ns,
               speedup_vs_loop=t_loop / wall, loop_cpu_s=cpu_loop,
               cpu_speedup_vs_loop=cpu_loop / cpu, err_batch=err_batch, err_loop=err_loop,
               nfev_per_trajectory=nfev, implicit_fraction=float(np.mean(sol.implicit)),
               time_per_eval_s=cpu / (nfev * B), flops_per_eval=field_flops(d, d, m))
    row["floor_scalar_s"] = row["flops_per_eval"] / a.rate_scalar
    row["floor_blas_s"] = row["flops_per_eval"] / a.rate_blas
    row["over_floor_scalar"] = row["time_per_eval_s"] / row["floor_scalar_s"]
    if have_jax and B <= a.jax_max_b:
        for rtol in (1e-8, 1e-10, 1e-12):
            try:
                cold, warm, cov_j, steps = diffrax_run(Q, V, covs, means, T, rtol, rtol * 1e-2)
            except Exception as exc:   # noqa: BLE001 - e.g. its step budget, on a mean that overflows
                row["diffrax_failed"] = f"rtol {rtol:g}: {type(exc).__name__}: " + (
                    "maximum number of solver steps" if "max_steps" in str(exc)
                    else str(exc).splitlines()[0][:200])
                break
            err_j = rel_err(cov_j[:nref], ref.cov_final)
            row.update(diffrax_rtol=rtol, diffrax_cold_s=cold, diffrax_warm_s=warm,
                       diffrax_err=err_j, diffrax_steps=steps,
                       speedup_vs_diffrax_warm=warm / wall)
            if err_j <= err_batch:
                break
    return row


def batch_of_one(seeds, T, repeat):
    """``solve`` against ``solve_batch`` of one trajectory (compiled) on the paper workload.

    The paper's steady-state setting (d = 5, Q in R^{2x5}, K = -Q, V = G^T G,
    Sigma_0 = G G^T, scale 1/sqrt(d); the seeds of ``benchmarks/bench_solve.py``), to
    ``T``, defaults only, interleaved ``repeat`` times, best of each; the error of both
    against a DOP853 reference at rtol 1e-13.
    """
    rows = []
    for seed in seeds:
        r = np.random.default_rng(seed)
        Q, G = r.standard_normal((2, 5)), r.standard_normal((5, 5))
        att, cov0 = gp.Softmax(Q, -Q, G.T @ G, scale=1 / np.sqrt(5)), G @ G.T
        ref = gp.solve_batch(att, cov0[None], (0.0, T), rtol=1e-13, atol=1e-15,
                             method="DOP853", max_nfev=None).cov_final[0]
        t_s = t_b = math.inf
        for _ in range(repeat):
            t0 = time.perf_counter()
            s = gp.solve(att, None, cov0, (0.0, T))
            t_s = min(t_s, time.perf_counter() - t0)
            t0 = time.perf_counter()
            b = gp.solve_batch(att, cov0[None], (0.0, T))
            t_b = min(t_b, time.perf_counter() - t0)
        rows.append(dict(seed=seed, T=T, solve_s=t_s, batch_of_one_s=t_b,
                         batch_over_solve=t_b / t_s, solve_nfev=int(s.nfev),
                         batch_nfev=int(b.nfev[0]), err_solve=rel_err(s.cov_final, ref),
                         err_batch=rel_err(b.cov_final[0], ref)))
        print(f"paper seed {seed}, T={T:g}: solve {1e3 * t_s:.1f} ms ({s.nfev} evals, err "
              f"{rows[-1]['err_solve']:.1e}), batch of one {1e3 * t_b:.1f} ms "
              f"({b.nfev[0]} evals, err {rows[-1]['err_batch']:.1e}): "
              f"x{t_b / t_s:.2f}", flush=True)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--single", type=int, default=30, help="trajectories of the loop timed")
    p.add_argument("--ref", type=int, default=30, help="trajectories of the tight reference")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--jax-max-b", type=int, default=10_000)
    p.add_argument("--d", type=int, nargs="+", help="dimensions (overrides the grid's)")
    p.add_argument("--B", type=int, nargs="+", help="batch sizes (overrides the grid's)")
    p.add_argument("--T", type=float, nargs="+", help="horizons (default 10 200)")
    p.add_argument("--mean", choices=("both", "no", "yes"), default="both")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    try:
        import diffrax  # noqa: F401
        import jax  # noqa: F401
        have_jax = True
    except ImportError:
        have_jax = False
        print("JAX or diffrax not installed (the `train` extra): the diffrax column is skipped")
    a.rate_scalar, a.rate_blas = floors()
    print(f"floors: {a.rate_scalar / 1e9:.2f} Gflop/s (compiled multiply-adds), "
          f"{a.rate_blas / 1e9:.2f} Gflop/s (dgemm), one core")
    ds, Bs = ((3, 5), (100, 1000)) if a.quick else ((3, 5, 8), (100, 1000, 10000))
    ds, Bs, Ts = a.d or ds, a.B or Bs, a.T or (10.0, 200.0)
    means = {"both": (False, True), "no": (False,), "yes": (True,)}[a.mean]
    rows = []
    gp.solve_batch(gp.Softmax.example(2, 0), np.eye(2)[None], (0, 1))   # load the compiled code
    one = batch_of_one(range(3) if a.quick or a.d else range(10), 300.0, a.rounds + 1)
    for d in ds:
        for T in Ts:
            for with_mean in means:
                for B in Bs:
                    row = measure(B, d, T, with_mean, a, have_jax)
                    rows.append(row)
                    jx = (f"diffrax warm {row['diffrax_warm_s']:.3f} s (cold "
                          f"{row['diffrax_cold_s']:.2f}, rtol {row['diffrax_rtol']:.0e}, "
                          f"err {row['diffrax_err']:.1e}) x{row['speedup_vs_diffrax_warm']:.1f}"
                          if "diffrax_warm_s" in row else
                          f"diffrax {row.get('diffrax_failed', '-')}")
                    print(f"d={d} T={T:g} mean={with_mean!s:5} B={B:5d}: batch "
                          f"{row['batch_s']:.3f} s (err {row['err_batch']:.1e}), loop "
                          f"{row['loop_s']:.2f} s x{row['speedup_vs_loop']:.1f} (CPU "
                          f"x{row['cpu_speedup_vs_loop']:.1f}); {jx}; "
                          f"{row['nfev_per_trajectory']:.0f} evals/traj, "
                          f"{1e9 * row['time_per_eval_s']:.0f} ns/eval = "
                          f"{row['over_floor_scalar']:.1f} x floor", flush=True)
    lin = {}
    for key in {(r["d"], r["T"], r["mean"]) for r in rows}:
        sel = sorted((r for r in rows if (r["d"], r["T"], r["mean"]) == key),
                     key=lambda r: r["B"])
        per = [r["batch_s"] / r["B"] for r in sel]
        lin[str(key)] = {"B": [r["B"] for r in sel], "s_per_trajectory": per,
                         "max_over_min": max(per) / min(per)}
    from _record import write_record

    payload = {"quick": a.quick, "grid": {"d": list(ds), "B": list(Bs), "T": list(Ts),
                                          "mean": list(means)},
               "rate_scalar_flops": a.rate_scalar, "rate_blas_flops": a.rate_blas,
               "rows": rows, "batch_of_one": one, "linearity": lin}
    path = write_record("bench_batch", payload, a.json)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
