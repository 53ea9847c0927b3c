# %% [markdown]
# # Many clusters: the Gaussian-mixture closure against particles
#
# **What this validates**: the Gaussian-mixture closure against labelled particles
# (exact for one component; W2, per-component moments and cluster counts otherwise). The
# figure shows the components' ellipses from both.
#
# A mixture $\sum_k w_k\mathcal N(\alpha_k,\Sigma_k)$ is moved by `gp.solve_mixture`
# (per-component Gaussian closure with the closed-form field against a mixture) and, from
# a labelled sample, by `gp.simulate_particles`. We check: one component is the exact
# moment ODE; the W2 distance between particles and mixture stays near its Monte Carlo
# floor; per-component moments agree; cluster counts agree. Set
# `GAUSSIAN_PDE_NOTEBOOK_QUICK=1` for a small, fast run.

# %%
import matplotlib.pyplot as plt
import numpy as np

import gaussian_pde as gp
from gaussian_pde.studies import _clusters as C
from gaussian_pde.studies import notebook_settings

settings = notebook_settings("clusters")
QUICK = settings.quick
N = 200 if QUICK else 800

# %% one component: the exact moment ODE
att = gp.MultiHead.example(2, 0)
m0, S0 = np.array([0.3, -0.2]), np.array([[1.0, 0.2], [0.2, 0.5]])
one = gp.solve_mixture(att, gp.GaussianMixture([1.0], [m0], [S0]), (0, 0.5), rtol=1e-12,
                       atol=1e-13)
ref = gp.solve(att, m0, S0, (0, 0.5), rtol=1e-12, atol=1e-13)
err_one = np.abs(one.covs_final[0] - ref.cov_final).max()
print(f"one component vs gp.solve: {err_one:.2e}")

# %% two clusters drawn together (softmax, K = -Q)
att = C.cluster_attention("softmax", 2, q=0.7, seed=0)
mix = C.cluster_mixture(3, 2, config="symmetric")
t_eval = np.linspace(0, 2.0, 9 if QUICK else 21)
run = C.run_case(att, mix, t_eval, n=N, n_per_dim=6)
print("W2", np.round(run.w2, 3))
print("floor", np.round(run.w2_floor, 3))
print("clusters mixture", run.clusters_mixture, "particles", run.clusters_particles)

fig, axes = plt.subplots(1, 3, figsize=(10, 3.3))
for ax, i in zip(axes, (0, len(run.t) // 2, len(run.t) - 1)):
    x = run.particles.x[i]
    ax.scatter(x[:, 0], x[:, 1], c=run.labels, s=3, cmap="tab10", alpha=0.5)
    for k in range(mix.K):
        C._ellipse(ax, run.closure.means[i, k], run.closure.covs[i, k], color="k")
    ax.set_title(f"t = {run.t[i]:.2f}")
fig.tight_layout()
fig.savefig(settings.figure_path("ellipses"), dpi=100)

# %% checks
assert err_one < 1e-9
assert np.all(run.w2 < 2.0 * run.w2_floor + 0.1)
assert run.component_error.max() < 0.5
assert run.clusters_mixture[0] == mix.K
