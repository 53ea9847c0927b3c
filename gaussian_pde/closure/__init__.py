"""Closures: moment equations where a Gaussian does not stay Gaussian, and depth stacks.

What the other subpackages need of the closures they import from here: the Gaussian
closure and its fields and blocks (``_engine``, ``_blocks``), the block-causal closure of
masked attention (``_masked``), the Gaussian-mixture closure (``_mixture``), and the
stacks of layers run on Gaussians or on particles (``_depth``).
"""

from ._blocks import MLP, Affine, LayerNorm, Normalization, PreNorm, RMSNorm, TraceNorm
from ._depth import MODES, DepthSolution, Stack, propagate_gaussian, propagate_particles
from ._engine import (
    DEFAULT_N_PER_DIM,
    AttentionField,
    Field,
    FieldSum,
    as_field,
    closure_moment_rhs,
    closure_terms,
    logistic_normal_moments,
    solve_closure,
    standard_nodes,
)
from ._masked import (
    MaskedClosureSolution,
    block_positions,
    masked_closure_rhs,
    masked_field,
    mixture_moments,
    solve_masked_closure,
    validate_blocks,
)
from ._mixture import (
    GaussianMixture,
    MixtureSolution,
    component_log_partition,
    component_terms,
    merge_heights,
    mixture_closure_terms,
    mixture_velocity,
    pairwise_bures_wasserstein,
    solve_mixture,
)
from ._mixture_field import kernels as mixture_field_kernels
from ._quadrature import gauss_hermite_gaussian

__all__ = [
    "DEFAULT_N_PER_DIM", "MLP", "MODES", "Affine", "AttentionField", "DepthSolution", "Field",
    "FieldSum", "GaussianMixture", "LayerNorm", "MaskedClosureSolution", "MixtureSolution",
    "Normalization", "PreNorm", "RMSNorm", "Stack", "TraceNorm", "as_field", "block_positions",
    "closure_moment_rhs", "closure_terms", "component_log_partition", "component_terms",
    "gauss_hermite_gaussian", "logistic_normal_moments", "masked_closure_rhs", "masked_field",
    "merge_heights", "mixture_closure_terms", "mixture_field_kernels", "mixture_moments",
    "mixture_velocity",
    "pairwise_bures_wasserstein", "propagate_gaussian", "propagate_particles", "solve_closure",
    "solve_masked_closure", "solve_mixture", "standard_nodes", "validate_blocks",
]
