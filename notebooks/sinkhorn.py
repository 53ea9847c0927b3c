# %% [markdown]
# # Sinkhorn attention: moment ODE against particles
#
# **What this validates**: the exact Sinkhorn moment ODE (closed-form mean, singular
# $A$) against particles with a full Sinkhorn scaling: the error decays like $n^{-1/2}$.
# The figures show the moments against time and the error against $n$.
#
# Sinkhorn attention uses the doubly stochastic scaling of $e^{s(x_i, x_j)}$ (log-domain
# Sinkhorn, blocked, warm-started); the Gaussian closed form is exact, also for singular A
# (k = 1 < d = 2 here). The marginal error of the scaling is reported.
#
# The particles start i.i.d. from $\mathcal N(\alpha_0, \Sigma_0)$; their moments are
# compared with `gaussian_pde.solve` for several numbers of tokens $n$ and seeds. The
# Monte Carlo error must decay like $n^{-1/2}$ (docs/math.md section 8). Set
# `GAUSSIAN_PDE_NOTEBOOK_QUICK=1` for a small, fast run (the test suite does).
#
# Each particle velocity is a full Sinkhorn scaling of an $n \times n$ kernel, so the full
# run stops at $n = 4000$ (the other notebooks go to 8000).
#
# In the docs build the runs at the largest $n$ are read from
# `docs/_static/results/notebooks/` (written by `python docs/make_results.py --notebooks`);
# the moment ODE and the runs at the other $n$ are made when the page is built and must
# reproduce the stored ones (`gaussian_pde.studies.stored_compare`).

# %%
import numpy as np

import gaussian_pde as gp
from gaussian_pde.studies import mean_field_check_failures, notebook_compare, notebook_settings

#: numbers of tokens and seeds in the quick and the full mode; in the full mode the runs at
#: the largest n are read from the stored ones (see above)
settings = notebook_settings("sinkhorn", quick_sizes=[100, 300, 900], full_sizes=[250, 1000, 4000],
                             quick_seeds=3, full_seeds=5)
QUICK = settings.quick

# %% [markdown]
# ## The example

# %%
Q = np.array([[1.0, 0.5]])
att = gp.Sinkhorn(Q, np.array([[-0.8, 0.2]]), np.array([[1.0, 0.3], [-0.2, 0.7]]))
mean0 = np.array([0.5, -0.3])
cov0 = np.array([[1.0, 0.3], [0.3, 0.6]])
T_END = 1.0
t_eval = np.linspace(0.0, T_END, 3 if QUICK else 11)
sol = gp.solve(att, mean0, cov0, (0.0, T_END), t_eval=t_eval)
print(att, sol.status)

# %% [markdown]
# ## Particles against the ODE (error bars: standard error over seeds)

# %%
report = notebook_compare(settings, att, mean0, cov0, t_eval=t_eval, method="rk4",
                          dt=T_END / (4 if QUICK else 40))
print("slopes of error against n:", {k: round(v, 3) for k, v in report.slopes.items()})
print("seed-to-seed standard errors:", {k: round(v, 3) for k, v in report.slope_sem.items()})

# %% [markdown]
# ## Checks
#
# * the fitted slope of every error against $n$ is $-1/2$ within three seed-to-seed
#   standard errors of the slope plus 0.1;
# * at the largest $n$ the covariance error stays within 5 standard errors of a sample
#   covariance, $\sqrt{2/n}$ relative, at every time;
# * the particles stay near-Gaussian: the sliced $W_2$ distance to the fitted Gaussian
#   stays within twice its value at $t = 0$ (the Monte Carlo floor of a Gaussian sample).

# %%
failures = mean_field_check_failures(report)
assert not failures, failures
assert np.nanmax(report.sinkhorn_error) < 1e-7  # the default tolerance 1e-8, with margin
print("all checks passed")
