"""Particle Monte Carlo of the Transformer PDE: tokens moved by the attention's own velocity.

What the other subpackages need of particles they import from here: the simulator and its
result, the Gaussian sampler, and the moments and Gaussianity measures of a cloud of tokens.
"""

from ._simulate import (
    PARTICLE_METHODS,
    ParticleDegeneracyWarning,
    ParticleDiagnostics,
    ParticleSolution,
    SinkhornConvergenceWarning,
    excess_kurtosis,
    particle_moments,
    sample_gaussian,
    simulate_particles,
    sliced_wasserstein_to_gaussian,
)

__all__ = [
    "PARTICLE_METHODS", "ParticleDegeneracyWarning", "ParticleDiagnostics", "ParticleSolution",
    "SinkhornConvergenceWarning", "excess_kurtosis", "particle_moments", "sample_gaussian",
    "simulate_particles", "sliced_wasserstein_to_gaussian",
]
