r"""gaussian_pde: Gaussian solutions of the Transformer PDE.

The continuous-depth, many-token limit of a deep Transformer is a Vlasov equation,
:math:`\\partial_t\\mu + \\nabla\\cdot(\\mu\\,\\Gamma[\\mu]) = 0`, whose velocity is the
attention. For softmax, L2, multi-head and Sinkhorn attention a Gaussian stays Gaussian
and the PDE reduces to ODEs for the mean and covariance, derived with SymPy in
``derivations/`` and integrated here.

Importing the package imports neither matplotlib nor dask.
"""

from ._attention import Attention, SingleHeadAttention
from ._batch import BatchSolution, solve_batch
from ._blocks import MLP, Affine, LayerNorm, PreNorm, RMSNorm, TraceNorm
from ._closure import (
    AttentionField,
    Field,
    FieldSum,
    closure_moment_rhs,
    logistic_normal_moments,
    solve_closure,
)
from ._compare import CompareReport, compare
from ._depth import DepthSolution, Stack, propagate_gaussian, propagate_particles
from ._exact import blowup_time, exact_covariance, scalar_solution
from ._gaussian import bures_wasserstein
from ._l2 import L2
from ._masked import Masked
from ._masked_closure import block_positions, solve_masked_closure
from ._moments import moment_rhs
from ._multihead import MultiHead
from ._particles import (
    ParticleDegeneracyWarning,
    ParticleDiagnostics,
    ParticleSolution,
    SinkhornConvergenceWarning,
    sample_gaussian,
    simulate_particles,
)
from ._registry import ATTENTIONS, get_attention, register_attention
from ._sigmoid import Sigmoid
from ._sinkhorn import Sinkhorn
from ._softmax import Softmax
from ._solve import MomentSolution, Status, solve
from .analysis import Outcome, TrajectoryOutcome, classify_solution, classify_trajectory

__version__ = "0.1.0"

__all__ = [
    "ATTENTIONS",
    "Affine",
    "Attention",
    "AttentionField",
    "BatchSolution",
    "CompareReport",
    "DepthSolution",
    "Field",
    "FieldSum",
    "L2",
    "LayerNorm",
    "MLP",
    "Masked",
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
    "compare",
    "exact_covariance",
    "get_attention",
    "logistic_normal_moments",
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
]
