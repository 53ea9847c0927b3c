r"""gaussian_pde: Gaussian solutions of the Transformer PDE.

The continuous-depth, many-token limit of a deep Transformer is a Vlasov equation,
:math:`\\partial_t\\mu + \\nabla\\cdot(\\mu\\,\\Gamma[\\mu]) = 0`, whose velocity is the
attention. For softmax, L2, multi-head and Sinkhorn attention a Gaussian stays Gaussian
and the PDE reduces to ODEs for the mean and covariance, derived with SymPy in
``derivations/`` and integrated here.

Importing the package imports neither matplotlib nor dask.
"""

from ._common.gaussian import bures_wasserstein
from ._version import __version__  # noqa: F401  (the package version)
from .analysis import Outcome, TrajectoryOutcome, classify_solution, classify_trajectory
from .attention import (
    ATTENTIONS,
    Attention,
    SingleHeadAttention,
    get_attention,
    moment_rhs,
    register_attention,
)
from .attention import types as _types
from .attention.types import *  # noqa: F403  (the attention types, by class)
from .closure import (
    MLP,
    Affine,
    AttentionField,
    DepthSolution,
    Field,
    FieldSum,
    GaussianMixture,
    LayerNorm,
    MixtureSolution,
    PreNorm,
    RMSNorm,
    Stack,
    TraceNorm,
    block_positions,
    closure_moment_rhs,
    logistic_normal_moments,
    mixture_velocity,
    propagate_gaussian,
    propagate_particles,
    solve_closure,
    solve_masked_closure,
    solve_mixture,
)
from .integrate import (
    BatchSolution,
    MomentSolution,
    Status,
    blowup_time,
    exact_covariance,
    scalar_solution,
    solve,
    solve_batch,
)
from .particles import (
    ParticleDegeneracyWarning,
    ParticleDiagnostics,
    ParticleSolution,
    SinkhornConvergenceWarning,
    sample_gaussian,
    simulate_particles,
)
from .studies import CertifiedLimit, CompareReport, certified_limit, certified_limits, compare

__all__ = [
    "ATTENTIONS",
    "Affine",
    "Attention",
    "AttentionField",
    "BatchSolution",
    "CertifiedLimit",
    "CompareReport",
    "DepthSolution",
    "Field",
    "FieldSum",
    "GaussianMixture",
    "LayerNorm",
    "MLP",
    "MixtureSolution",
    "MomentSolution",
    "Outcome",
    "ParticleDegeneracyWarning",
    "ParticleDiagnostics",
    "ParticleSolution",
    "PreNorm",
    "RMSNorm",
    "SingleHeadAttention",
    "SinkhornConvergenceWarning",
    "Stack",
    "Status",
    "TraceNorm",
    "TrajectoryOutcome",
    "block_positions",
    "blowup_time",
    "bures_wasserstein",
    "classify_solution",
    "classify_trajectory",
    "closure_moment_rhs",
    "certified_limit",
    "certified_limits",
    "compare",
    "exact_covariance",
    "get_attention",
    "logistic_normal_moments",
    "mixture_velocity",
    "moment_rhs",
    "propagate_gaussian",
    "propagate_particles",
    "register_attention",
    "sample_gaussian",
    "scalar_solution",
    "simulate_particles",
    "solve",
    "solve_batch",
    "solve_closure",
    "solve_masked_closure",
    "solve_mixture",
]
__all__ += _types.__all__
del _types

# the attention types of installed packages (entry-point group ``gaussian_pde.attentions``),
# registered once the package's public face is complete, which they import
from .attention import load_entry_points as _load_entry_points  # noqa: E402

_load_entry_points()
del _load_entry_points
