# %% [markdown]
# # Closure error against particles
#
# **What this validates**: where the Gaussian closure (Stein's lemma with Gauss-Hermite
# quadrature, docs/math.md section 6) follows the particles for fields that do not keep
# Gaussians Gaussian. Sigmoid attention, masked attention with position-dependent means, a
# LayerNorm pre-norm block and a softmax + ReLU-MLP block
# (`gaussian_pde.studies.measure_closure_error`), d = 2, t in [0, 1]; the figure shows the
# closure's distance from the particles against time, next to its Monte Carlo floor.
# `w2`: Bures-Wasserstein distance between closure and particle moments; `floor`: its value
# at t = 0 (Monte Carlo); `excess`: growth above the floor; `non_gaussianity`: sliced W2 of
# whitened particles to N(0, I). Quick mode: `GAUSSIAN_PDE_NOTEBOOK_QUICK=1`.

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

from gaussian_pde.studies import CLOSURE_CASES, measure_closure_error

QUICK = os.environ.get("GAUSSIAN_PDE_NOTEBOOK_QUICK") == "1"
kw = dict(n=300, seeds=(0,), n_times=4, n_per_dim=6) if QUICK else dict(n=2000, seeds=(0, 1, 2))
strengths = (1.0,) if QUICK else (1.0, 2.5)
res = {(name, s): measure_closure_error(name, strength=s, **kw)
       for name in CLOSURE_CASES for s in strengths}
for (name, s), r in res.items():
    print(f"{name:10s} strength {s}: max w2 {r['w2'].max():.4f}, floor {r['floor'].mean():.4f}, "
          f"max excess {r['excess'].max():.4f}, non-Gaussianity at t=1 {r['non_gaussianity'][:, -1].mean():.3f}")

# %% [markdown]
# ## Closure against particles, case by case
#
# Solid: the Bures-Wasserstein distance between the closure's moments and the particles'
# (mean over seeds); dotted: its value at t = 0, the Monte Carlo floor of the sample.

# %%
fig, axes = plt.subplots(1, len(strengths), figsize=(5.2 * len(strengths), 3.8), squeeze=False)
for ax, s in zip(axes[0], strengths):
    for i, name in enumerate(CLOSURE_CASES):
        r = res[(name, s)]
        t_r = np.asarray(r["t"], float)
        ax.plot(t_r, r["w2"].mean(axis=0), "-", color=f"C{i}", lw=1.6, label=name)
        ax.axhline(r["floor"].mean(), color=f"C{i}", ls=":", lw=1.0)
    ax.set(title=f"strength {s}", xlabel="t", ylabel="W2(closure, particles)", yscale="log")
    ax.legend(fontsize=9)
fig.tight_layout()

# %% [markdown]
# Regimes (full run, n = 2000): the sigmoid closure is
# within Monte Carlo error (excess < 0.01); LayerNorm and the ReLU MLP block drift away
# at ~0.08-0.13 by t = 1 as the particles become non-Gaussian; masked attention with
# position-dependent means has the largest closure error (excess ~ 0.13 per block), the
# blocks' mixture being far from Gaussian.

# %% [markdown]
# Checks: every distance is finite; at strength 1 every closure stays within W2 = 1 of the
# particles. Full run only: the sigmoid closure stays within Monte Carlo error at both
# strengths, and every other closure error grows with the strength of the nonlinearity
# (masked reaches W2 ~ 2.8 at strength 2.5).

# %%
for (name, s), r in res.items():
    assert np.all(np.isfinite(r["w2"]))
    if s == 1.0:
        assert r["w2"].max() < 1.0, (name, r["w2"].max())
if not QUICK:
    assert max(res[("sigmoid", s)]["excess"].max() for s in strengths) < 0.02
    for name in CLOSURE_CASES:
        if name != "sigmoid":
            assert res[(name, 2.5)]["excess"].max() > res[(name, 1.0)]["excess"].max(), name
print("all checks passed")
