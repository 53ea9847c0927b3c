# %% [markdown]
# # Multi-head attention: moment ODE against particles
#
# **What this validates**: the exact multi-head moment ODE against particles: the error
# of the particles' moments decays like $n^{-1/2}$ and stays within sampling error. The
# figures show the moments against time and the error against $n$.
#
# Multi-head attention sums the heads' velocity fields; here a softmax head and an L2
# head in d = 3 with a singular interaction matrix (k = 1 < d).
#
# The particles start i.i.d. from $\mathcal N(\alpha_0, \Sigma_0)$; their moments are
# compared with `gaussian_pde.solve` for several numbers of tokens $n$ and seeds. The
# Monte Carlo error must decay like $n^{-1/2}$ (docs/math.md section 8). Set
# `GAUSSIAN_PDE_NOTEBOOK_QUICK=1` for a small, fast run (the test suite does).
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
settings = notebook_settings("multihead", quick_sizes=[100, 400, 1600], full_sizes=[500, 2000, 8000],
                             quick_seeds=3, full_seeds=5)
QUICK = settings.quick

# %% [markdown]
# ## The example

# %%
q1 = np.array([[1.0, 0.5, -0.3]])
q2 = np.array([[0.2, -0.4, 1.0]])
V = np.array([[1.0, 0.3, 0.0], [-0.2, 0.7, 0.1], [0.0, 0.1, 0.8]])
att = gp.MultiHead([gp.Softmax(q1, -q1, np.eye(3)), gp.L2(q2, -q2, V)])
mean0 = np.array([0.5, -0.3, 0.2])
cov0 = np.array([[1.0, 0.3, 0.1], [0.3, 0.6, 0.0], [0.1, 0.0, 0.8]])
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
print("all checks passed")
