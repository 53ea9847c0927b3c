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
from .attention._base import Attention, SingleHeadAttention
from .attention._l2 import L2
from .attention._masked import Masked
from .attention._moments import moment_rhs
from .attention._multihead import MultiHead
from .attention._registry import ATTENTIONS, get_attention, register_attention
from .attention._sigmoid import Sigmoid
from .attention._sinkhorn import Sinkhorn
from .attention._softmax import Softmax
from .closure._blocks import MLP, Affine, LayerNorm, PreNorm, RMSNorm, TraceNorm
from .closure._depth import DepthSolution, Stack, propagate_gaussian, propagate_particles
from .closure._engine import (
    AttentionField,
    Field,
    FieldSum,
    closure_moment_rhs,
    logistic_normal_moments,
    solve_closure,
)
from .closure._masked import block_positions, solve_masked_closure
from .closure._mixture import GaussianMixture, MixtureSolution, mixture_velocity, solve_mixture
from .integrate._batch import solve_batch
from .integrate._exact import blowup_time, exact_covariance, scalar_solution
from .integrate._results import BatchSolution
from .integrate._solve import MomentSolution, Status, solve
from .particles._simulate import (
    ParticleDegeneracyWarning,
    ParticleDiagnostics,
    ParticleSolution,
    SinkhornConvergenceWarning,
    sample_gaussian,
    simulate_particles,
)
from .studies._certified import CertifiedLimit, certified_limit, certified_limits
from .studies._compare import CompareReport, compare

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
    "L2",
    "LayerNorm",
    "MLP",
    "Masked",
    "MixtureSolution",
    "MomentSolution",
    "MultiHead",
    "Outcome",
    "ParticleDegeneracyWarning",
    "ParticleDiagnostics",
    "ParticleSolution",
    "PreNorm",
    "RMSNorm",
    "Sigmoid",
    "SingleHeadAttention",
    "Sinkhorn",
    "SinkhornConvergenceWarning",
    "Softmax",
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
