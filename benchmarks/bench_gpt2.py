"""GPT-2 small through the Gaussian bridge: load + stack + propagate, and Monte Carlo agreement.

A checkpoint of GPT-2 small's shape (d = 768, 12 layers, 12 heads, FFN 3,072; random
weights from :func:`gaussian_pde.training.random_gpt2_state_dict`, ``--scale``) is saved as
``.npz``, loaded with ``load_gpt2(path, 12)``, stacked with
``.stack(layernorm=True, ffn=True, offsets=True)`` and propagated with
``gp.propagate_gaussian(stack, mean0, cov0)``; each step is timed (wall, best of
``--repeat``). The model itself (:func:`gaussian_pde.training.gpt2_forward`, full attention)
then runs ``--sequences`` sequences of ``--tokens`` tokens drawn from ``N(mean0, cov0)``,
and every one of the 25 states is compared with the Gaussian's:

* each sequence's error (mean: ``|m_hat - m|``; covariance: ``|S_hat - S|_F``; the
  768 variances: ``|diag(S_hat - S)|``, which a closure bias of a few per cent would show
  against their Monte Carlo error of sqrt(2/n)) over the
  spread between the sequences (``|m_hat_r - m_hat_s| / sqrt(2)``): about 1 where the two
  agree within Monte Carlo error, larger by a bias. The attention update is itself an
  average over the ``n`` tokens, so the error of the tokens' mean is not
  ``sqrt(tr S / n)``: the sequences measure it;
* how far the layers move the mean, in units of ``sqrt(tr S / n)`` (the comparison's
  power).

Run with one BLAS thread on a shared machine (``OPENBLAS_NUM_THREADS=1``): LAPACK's
eigensolver with more threads than free cores runs many times slower.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/bench_gpt2.py [--tokens N]
        [--sequences R] [--scale S] [--repeat K] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _record import best_of, write_record  # noqa: E402

import gaussian_pde as gp  # noqa: E402
from gaussian_pde.training import gpt2_forward, load_gpt2, random_gpt2_state_dict  # noqa: E402

D, N_LAYER, N_HEAD, FFN = 768, 12, 12, 3072
#: the budget for load + stack + propagate on two shared cores, seconds
BUDGET_S = 60.0


def _against_spread(samples, want):
    r"""Each sequence's error against the spread between sequences, per state.

    With :math:`R` independent sequences :math:`\hat\theta_r` of one statistic, the RMS of
    :math:`\|\hat\theta_r - \theta\|` over the RMS of :math:`\|\hat\theta_r - \hat\theta_s\|/\sqrt2`
    (pairs :math:`r < s`): about 1 when :math:`\theta` is their common expectation (the
    error is Monte Carlo), above 1 by a bias. The norms of a d-dimensional statistic
    concentrate, so two sequences suffice at d = 768.
    """
    R = samples.shape[0]
    ax = tuple(range(2, samples.ndim))
    err = np.sqrt(np.mean(np.sum((samples - want) ** 2, axis=ax), axis=0))
    pairs = [np.sum((samples[r] - samples[s]) ** 2, axis=tuple(range(1, samples.ndim - 1)))
             / 2 for r in range(R) for s in range(r + 1, R)]
    return err / np.sqrt(np.mean(pairs, axis=0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--sequences", type=int, default=2)
    ap.add_argument("--scale", type=float, default=0.05,
                    help="standard deviation of the weights (GPT-2 initialises at 0.02)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    sd = random_gpt2_state_dict(D, N_LAYER, N_HEAD, ffn=FFN, scale=args.scale,
                                bias_scale=args.scale, rng=rng)
    mean0 = 0.5 * rng.standard_normal(D)
    A = rng.standard_normal((D, D)) / np.sqrt(D)
    cov0 = A @ A.T + 0.5 * np.eye(D)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "gpt2_small_shape.npz"
        np.savez(path, **sd)
        ck, t_load = best_of(lambda: load_gpt2(path, N_HEAD), args.repeat)
    stack, t_stack = best_of(lambda: ck.stack(layernorm=True, ffn=True, offsets=True),
                             args.repeat)
    sol, t_prop = best_of(lambda: gp.propagate_gaussian(stack, mean0, cov0), args.repeat)
    total = t_load + t_stack + t_prop
    print(f"load {t_load:.2f} s, stack {t_stack:.2f} s, propagate {t_prop:.2f} s "
          f"(total {total:.1f} s, budget {BUDGET_S:g} s); status {sol.status}", flush=True)
    n = args.tokens
    chol = np.linalg.cholesky(cov0)
    means, covs = [], []
    t = time.perf_counter()
    for _ in range(args.sequences):
        toks = gpt2_forward(sd, mean0 + rng.standard_normal((n, D)) @ chol.T, N_HEAD)
        means.append(toks.mean(axis=1))
        covs.append(np.array([np.cov(y.T, bias=True) for y in toks]))
    t_model = time.perf_counter() - t
    means, covs = np.array(means), np.array(covs)
    mean_ratio = _against_spread(means, sol.mean)
    cov_ratio = _against_spread(covs, sol.cov)
    var_ratio = _against_spread(np.diagonal(covs, axis1=-2, axis2=-1),
                                np.diagonal(sol.cov, axis1=-2, axis2=-1))
    se = np.sqrt(np.trace(sol.cov, axis1=1, axis2=2) / n)
    move = np.linalg.norm(sol.mean - sol.mean[0], axis=1) / se
    trace = np.trace(sol.cov, axis1=1, axis2=2)
    print(f"model: {args.sequences} x {n} tokens in {t_model:.1f} s; error / Monte Carlo "
          f"spread: covariance {cov_ratio.min():.3f}..{cov_ratio.max():.3f}, variances "
          f"{var_ratio.min():.3f}..{var_ratio.max():.3f}, mean "
          f"{mean_ratio.min():.3f}..{mean_ratio.max():.3f}; mean moved "
          f"{move.max():.1f} x sqrt(tr S / n); tr S {trace[0]:.1f} -> {trace[-1]:.1f}",
          flush=True)
    payload = {
        "shape": {"d": D, "n_layer": N_LAYER, "n_head": N_HEAD, "ffn": FFN},
        "weight_scale": args.scale, "tokens": n, "sequences": args.sequences,
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "load_average_1min": os.getloadavg()[0],
        "load_s": t_load, "stack_s": t_stack, "propagate_s": t_prop, "total_s": total,
        "budget_s": BUDGET_S, "status": str(sol.status), "model_s": t_model,
        "cov_error_over_spread": cov_ratio, "var_error_over_spread": var_ratio,
        "mean_error_over_spread": mean_ratio,
        "mean_moved_over_se": move, "trace": trace,
    }
    payload["tables"] = [
        {"title": "GPT-2 small's shape (d = 768, 12 layers, 12 heads, FFN 3,072; random "
                  f"weights of scale {args.scale:g}): load + stack + propagate_gaussian "
                  f"(best of {args.repeat}, BLAS threads "
                  f"{payload['blas_threads'] or 'default'}, load average "
                  f"{payload['load_average_1min']:.1f})",
         "columns": ["load s", "stack s", "propagate s", "total s", "budget s", "status"],
         "rows": [[f"{t_load:.2f}", f"{t_stack:.2f}", f"{t_prop:.2f}", f"{total:.1f}",
                   f"{BUDGET_S:g}", str(sol.status)]]},
        {"title": f"Its 25 Gaussian states against the model's own tokens ({args.sequences} "
                  f"sequences of {n}, full attention): about 1 = within Monte Carlo error",
         "columns": ["state", "cov error / MC spread", "variances' error / MC spread",
                     "mean error / MC spread", "mean moved / sqrt(tr S / n)", "tr S"],
         "rows": [[str(k), f"{cov_ratio[k]:.3f}", f"{var_ratio[k]:.3f}",
                   f"{mean_ratio[k]:.3f}", f"{move[k]:.1f}", f"{trace[k]:.1f}"]
                  for k in range(len(trace))]},
    ]
    write_record("bench_gpt2", payload, args.json)


if __name__ == "__main__":
    main()
