# %% [markdown]
# # Masked (causal) attention: positions matter
#
# **What this validates**: masked attention against the softmax ODE where they must
# agree (position-independent data), and how far a position-dependent mean moves the
# particles from it. The figures show the moments of both runs.
#
# Tokens carry positions $\tau\in[0,1]$; a token attends to tokens at $\tau'\le\tau$.
# With position-independent data the mean field equals unmasked softmax (docs/math.md
# section 3.4), which this notebook checks against `gaussian_pde.solve` for softmax; with a
# position-dependent mean $\alpha(\tau)$ Gaussians are not preserved and the particles
# are the reference. Set `GAUSSIAN_PDE_NOTEBOOK_QUICK=1` for a small, fast run.
#
# In the docs build the runs at the largest $n$ are read from
# `docs/_static/results/notebooks/` (written by `python docs/make_results.py --notebooks`);
# the moment ODE and the runs at the other $n$ are made when the page is built and must
# reproduce the stored ones (`gaussian_pde.studies.stored_compare`).

# %%
import numpy as np

import gaussian_pde as gp
from gaussian_pde import Masked
from gaussian_pde.studies import notebook_compare, notebook_settings

#: numbers of tokens and seeds in the quick and the full mode; in the full mode the runs at
#: the largest n are read from the stored ones (see above: masked_flat.npz, masked_ramp.npz)
settings = notebook_settings("masked", quick_sizes=[100, 400, 1600], full_sizes=[500, 2000, 8000],
                             quick_seeds=3, full_seeds=5)
QUICK, N, SEEDS = settings.quick, settings.sizes, settings.seeds

Q = np.array([[1.0, 0.5]])
att = Masked(Q, -Q, np.eye(2))
mean0 = np.array([0.5, -0.3])
cov0 = np.array([[1.0, 0.3], [0.3, 0.6]])
T_END = 1.0
t_eval = np.linspace(0.0, T_END, 3 if QUICK else 11)
dt = T_END / (4 if QUICK else 40)

# %% [markdown]
# ## Position-independent data: the softmax ODE

# %%
flat = notebook_compare(settings, att, mean0, cov0, "flat", t_eval=t_eval, method="rk4", dt=dt,
                        figures=("moments",))
sol = gp.solve(gp.Softmax(Q, -Q, np.eye(2)), mean0, cov0, (0, T_END), t_eval=t_eval)
cov_m = flat.cov[-1].mean(axis=0)  # seed average at the largest n, (T, d, d)
cov_se = flat.cov[-1].std(axis=0, ddof=1) / np.sqrt(len(SEEDS))
z = np.abs(cov_m - sol.cov) / np.maximum(cov_se, 1e-12)
print("largest |masked - softmax ODE| in seed standard errors:", round(float(z.max()), 2))

# %% [markdown]
# ## Position-dependent mean $\alpha(\tau) = \alpha_0 + (\tau - 1/2)(2, -1)$

# %%
def mean_of_tau(tau):
    return mean0 + np.outer(tau - 0.5, [2.0, -1.0])


ramp = notebook_compare(settings, att, mean_of_tau, cov0, "ramp", t_eval=t_eval, method="rk4",
                        dt=dt, figures=("moments", "diagnostics"))

# %% [markdown]
# ## Checks
#
# * position-independent data: masked particles agree with the softmax ODE within 5 seed
#   standard errors plus 5 sampling standard errors of one run, $\sqrt{2/n}$ relative;
# * the first token only attends to itself: minimum ESS is 1;
# * with the ramp, the covariance differs from the position-free run by more than its
#   Monte Carlo error (positions matter).

# %%
tol = 5 * cov_se + 5 * np.sqrt(2 / N[-1]) * np.abs(sol.cov)
assert np.all(np.abs(cov_m - sol.cov) < tol), (cov_m, sol.cov)
assert np.allclose(flat.ess_min, 1.0)
diff = np.abs(ramp.cov[-1, :, -1].mean(0) - flat.cov[-1, :, -1].mean(0)).max()
assert diff > 5 * (ramp.cov[-1, :, -1].std(0, ddof=1).max() / np.sqrt(len(SEEDS))), diff
print("all checks passed")
