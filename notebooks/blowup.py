# %% [markdown]
# # Finite-time blow-up: where particles stop following the ODE, and why
#
# **What this validates**: that near a finite-time blow-up the particles leave the exact
# solution for a stated reason (the softmax weights degenerate), and that the time where
# they leave moves towards $t^*$ as $n$ grows. The figure shows the error of the trace
# against the exact solution and the effective sample size, for several $n$.
#
# Softmax attention with $V = I$ has the exact solution
# $\Sigma(t) = (\Sigma_0^{-1} - t(A + A^T))^{-1}$, which blows up at
# $t^* = 1/\lambda_{\max}(\Sigma_0^{1/2}(A + A^T)\Sigma_0^{1/2})$ (docs/math.md section 4.1). A
# finite particle system cannot blow up in finite time (each velocity is an average of
# tokens): near $t^*$ the softmax weights degenerate, the effective sample size
# $(\sum w)^2/\sum w^2$ falls to a few tokens, and the particles leave the ODE. The time
# where they leave moves towards $t^*$ as $n$ grows. Set `GAUSSIAN_PDE_NOTEBOOK_QUICK=1`
# for a small, fast run.
#
# In the docs build the run at the largest $n$ is read from
# `docs/_static/results/notebooks/blowup.npz` (written by
# `python docs/make_results.py --notebooks`); the runs at the other $n$ are made when the
# page is built and must reproduce the stored ones.

# %%
import types
import warnings

import matplotlib.pyplot as plt
import numpy as np

import gaussian_pde as gp
from gaussian_pde import (
    ParticleDegeneracyWarning,
    blowup_time,
    exact_covariance,
    sample_gaussian,
    simulate_particles,
)
from gaussian_pde.studies import notebook_settings

#: numbers of tokens in the quick and the full mode; in the full mode the run at the largest
#: n is read from the stored one (see above) unless it is written (WRITE) or not there yet
settings = notebook_settings("blowup", quick_sizes=[100, 400, 1600],
                             full_sizes=[500, 2000, 8000, 32000])
QUICK, N, STORE, WRITE = settings.quick, list(settings.sizes), settings.store(), settings.write

att = gp.Softmax(np.array([[1.0, 0.5]]), np.array([[0.8, -0.2]]), np.eye(2))
mean0 = np.array([0.5, -0.3])
cov0 = np.array([[1.0, 0.3], [0.3, 0.6]])
t_star = blowup_time(att, cov0)
t_eval = np.linspace(0.0, 1.2 * t_star, 13 if QUICK else 49)
print(f"exact blow-up time t* = {t_star:.6f}")

# %%
FIELDS = ("t", "cov", "ess_median", "ess_min", "warned")


def run(n):
    """The particles from n tokens, and whether the degeneracy warning fired."""
    x0 = sample_gaussian(mean0, cov0, n, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ps = simulate_particles(att, x0, (0, t_eval[-1]), t_eval=t_eval, method="RK45",
                                rtol=1e-5, keep_positions=False)
    warned = any(issubclass(w.category, ParticleDegeneracyWarning) for w in caught)
    return types.SimpleNamespace(t=ps.t, cov=ps.cov, ess_median=ps.ess_median,
                                 ess_min=ps.ess_min, warned=np.array(warned))


if STORE is None or WRITE or not STORE.is_file():  # (no stored runs yet: all made here)
    runs = {n: run(n) for n in N}
    if WRITE:
        np.savez_compressed(STORE, **{f"{k}_{n}": getattr(runs[n], k) for n in N for k in FIELDS})
else:
    with np.load(STORE) as stored:
        runs = {n: types.SimpleNamespace(**{k: stored[f"{k}_{n}"] for k in FIELDS}) for n in N}
    for n in N[:-1]:  # made again here: the stored runs must be what this code computes
        again = run(n)
        for k in FIELDS:
            a, b = getattr(again, k), getattr(runs[n], k)
            assert a.shape == b.shape and np.allclose(a, b, rtol=1e-6, atol=1e-9), (n, k)
    print(f"run at n = {N[-1]} read from {STORE.name}; the runs at n = {N[:-1]}, made here, "
          "agree with the stored ones")
warned = {n: bool(runs[n].warned) for n in N}
for n in N:
    print(n, "steps to", runs[n].t[-1].round(4), "ESS warning:", warned[n])

# %% [markdown]
# Relative error of $\mathrm{tr}\,\Sigma$ against the exact solution, and the median ESS.
# "Leaves the ODE" is the first time where the error exceeds 20 %.

# %%
t_ok = t_eval[t_eval < t_star]
tr_exact = np.trace(exact_covariance(att, cov0, t_ok), axis1=1, axis2=2)
leave = {}
fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
for n, c in zip(N, plt.cm.viridis(np.linspace(0, 0.85, len(N)))):
    ps = runs[n]
    k = min(ps.t.size, t_ok.size)
    err = np.abs(np.trace(ps.cov[:k], axis1=1, axis2=2) / tr_exact[:k] - 1)
    bad = np.flatnonzero(err > 0.2)
    leave[n] = t_ok[bad[0]] if bad.size else t_ok[k - 1]
    axes[0].semilogy(ps.t, np.trace(ps.cov, axis1=1, axis2=2), "o-", ms=3, color=c,
                     label=f"particles n = {n}")
    axes[1].semilogy(t_ok[:k], np.maximum(err, 1e-4), "o-", ms=3, color=c, label=f"n = {n}")
    axes[2].semilogy(ps.t, ps.ess_median, "o-", ms=3, color=c, label=f"median, n = {n}")
    axes[2].semilogy(ps.t, ps.ess_min, ":", color=c)
axes[0].semilogy(t_ok, tr_exact, "k-", lw=1.5, label="exact ODE")
axes[1].axhline(0.2, color="0.5", ls="--", lw=1)
axes[2].axhline(10, color="tab:red", ls="--", lw=1, label="warning threshold")
for ax, title in zip(axes, [r"$\mathrm{tr}\,\Sigma(t)$", r"relative error of $\mathrm{tr}\,\Sigma$",
                            "effective sample size (dotted: min)"]):
    ax.axvline(t_star, color="k", ls="--", lw=1)
    ax.set_xlabel("t (depth); dashed: t*")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
fig.tight_layout()
fig.savefig(settings.figure_path(), dpi=90)
print("time where particles leave the ODE (20 % error in tr):", leave)

# %% [markdown]
# ## Checks
#
# * early on ($t \le t^*/3$) the trace agrees with the exact solution within 5 sampling
#   standard errors ($\sqrt{2/n}$ relative for a trace of a sample covariance, doubled for
#   the flow's growth);
# * the median ESS at $t^*$ has fallen by at least a factor 3 from $t = 0$, and the
#   degeneracy warning fired exactly for the runs whose median ESS went below 10 tokens;
# * every run leaves the ODE (20 % error in the trace) after $t^*/3$ and before $t^*$.

# %%
early = t_ok <= t_star / 3
for n in N:
    ps = runs[n]
    err = np.abs(np.trace(ps.cov[: early.sum()], axis1=1, axis2=2) / tr_exact[early] - 1)
    assert np.all(err < 10 * np.sqrt(2 / n)), (n, err)
    i_star = np.searchsorted(ps.t, t_star)
    assert ps.ess_median[min(i_star, ps.t.size - 1)] < ps.ess_median[0] / 3
    assert warned[n] == bool(np.any(ps.ess_median < 10))
    assert t_star / 3 < leave[n] < t_star, leave
print("all checks passed")
