r"""Measured error of the Gaussian closure against particles (docs/math.md section 6).

For each case (sigmoid attention, masked attention with position-dependent means, a
LayerNorm pre-norm block, a ReLU MLP block) in ``d = 2``, the closure ODE and the particle
system start from the same Gaussian and are compared over time by

* ``w2``: Bures-Wasserstein distance between the closure Gaussian and the particles'
  moment-matched Gaussian (for masked attention, the largest over position blocks);
* ``floor``: the same distance at ``t = 0`` (pure Monte Carlo error, ~ ``n^{-1/2}``);
* ``excess = max(w2 - floor, 0)``: the part attributable to the closure and to the growth
  of sampling error;
* ``non_gaussianity``: sliced W2 of the whitened particles to N(0, I) (0 for a Gaussian up
  to the Monte Carlo floor at ``t = 0``).
"""

from __future__ import annotations

import numpy as np

from .._common.gaussian import bures_wasserstein
from .._common.validation import validate_int, validate_positive
from ..attention import closure_study_attention, closure_study_types, dot_product_head
from ..closure import (
    MLP,
    LayerNorm,
    PreNorm,
    Stack,
    block_positions,
    propagate_gaussian,
    propagate_particles,
    solve_masked_closure,
)
from ..particles import particle_moments, sample_gaussian, simulate_particles

__all__ = ["CLOSURE_CASES", "closure_case", "measure_closure_error"]

#: the measured cases: every type without exact moments (the registry's), then softmax
#: behind LayerNorm and softmax plus a feed-forward map
CLOSURE_CASES = closure_study_types() + ("layernorm", "mlp")

_MEAN0 = np.array([0.5, -0.3])
_COV0 = np.array([[1.0, 0.3], [0.3, 0.6]])


def closure_case(name, strength=1.0):
    r"""The field of a case, fixed weights (seed 1) times ``strength``.

    Returns ``(field, mean0, cov0)``; for a type whose tokens carry positions
    (``"masked"``) the mean is the function
    :math:`\tau \mapsto (2\tau - 1, 0)` (position-dependent data).
    """
    if name not in CLOSURE_CASES:
        raise ValueError(f"`name` must be one of {CLOSURE_CASES}, got {name!r}.")
    strength = validate_positive(strength, "strength")
    rng = np.random.default_rng(1)
    Q, K, V = rng.standard_normal((3, 2, 2)) * 0.8
    W1, b1, W2 = rng.standard_normal((8, 2)), rng.standard_normal(8) * 0.5, rng.standard_normal((2, 8))
    if name == "layernorm":
        return PreNorm(LayerNorm(2), dot_product_head(strength * Q, K, V)), _MEAN0, _COV0
    if name == "mlp":
        return (dot_product_head(Q, K, 0.3 * V)
                + MLP(W1, b1, 0.4 * strength * W2, np.zeros(2))), _MEAN0, _COV0
    att = closure_study_attention(name, strength * Q, K, V)
    if att.uses_positions:
        return att, (lambda tau: np.stack([2 * tau - 1, 0 * tau], 1)), _COV0
    return att, _MEAN0, _COV0


def measure_closure_error(name, *, n=2000, seeds=(0, 1), t_final=1.0, n_times=10,
                          strength=1.0, n_blocks=4, n_per_dim=10, steps_per_interval=2,
                          progress=None):
    r"""Closure against particles for one case, several seeds.

    ``progress``: called with a short message after the closure solution and after each
    seed's particle run; ``None`` (the default): silent.

    Returns
    -------
    dict
        ``t`` (n_times + 1,), ``w2``, ``excess`` and ``non_gaussianity``, each of shape
        (len(seeds), n_times + 1), and ``floor`` (len(seeds),).
    """
    n = validate_int(n, "n", minimum=2)
    n_times = validate_int(n_times, "n_times", minimum=1)
    t_final = validate_positive(t_final, "t_final")
    field, mean0, cov0 = closure_case(name, strength)
    t = np.linspace(0, t_final, n_times + 1)
    h = t_final / n_times
    w2s, ngs = [], []
    if getattr(field, "uses_positions", False):     # tokens carry positions
        n = n - n % n_blocks
        pos = block_positions(n, n_blocks)
        centres = (np.arange(n_blocks) + 0.5) / n_blocks
        cl = solve_masked_closure(field, mean0(centres), cov0, (0, t_final), t_eval=t,
                                  n_per_dim=n_per_dim)
        if progress is not None:
            progress(f"closure: {name}")
        for seed in seeds:
            x0 = sample_gaussian(mean0, cov0, n, seed=seed, positions=pos)
            ps = simulate_particles(field, x0, (0, t_final), t_eval=t, method="rk4",
                                    dt=h / steps_per_interval, positions=pos, warn=False)
            w = np.zeros(t.size)
            for b, c in enumerate(centres):
                m, C = particle_moments(ps.x[:, pos == c])
                w = np.maximum(w, bures_wasserstein(cl.means[:, b], cl.covs[:, b], m, C))
            from ..particles import sliced_wasserstein_to_gaussian
            ngs.append([max(sliced_wasserstein_to_gaussian(x[pos == c]) for c in centres)
                        for x in ps.x])
            w2s.append(w)
            if progress is not None:
                progress(f"particles: {name}, seed {seed}")
    else:
        stack = Stack(field, n_layers=n_times, h=h, mode="continuous")
        g = propagate_gaussian(stack, mean0, cov0, n_per_dim=n_per_dim)
        if progress is not None:
            progress(f"closure: {name}")
        for seed in seeds:
            x0 = sample_gaussian(mean0, cov0, n, seed=seed)
            p = propagate_particles(stack, x0, steps_per_layer=steps_per_interval)
            w2s.append(bures_wasserstein(g.mean, g.cov, p.mean, p.cov))
            ngs.append(p.non_gaussianity)
            if progress is not None:
                progress(f"particles: {name}, seed {seed}")
    w2 = np.array(w2s)
    floor = w2[:, 0]
    return {"t": t, "w2": w2, "floor": floor,
            "excess": np.clip(w2 - floor[:, None], 0, None),
            "non_gaussianity": np.array(ngs)}
