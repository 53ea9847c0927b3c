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
from ._exact import blowup_time, exact_covariance, scalar_solution
from ._gaussian import bures_wasserstein
from ._l2 import L2
from ._moments import moment_rhs
from ._multihead import MultiHead
from ._registry import ATTENTIONS, get_attention, register_attention
from ._sinkhorn import Sinkhorn
from ._softmax import Softmax
from ._solve import MomentSolution, Status, solve
from .analysis import Outcome, TrajectoryOutcome, classify_solution, classify_trajectory

__version__ = "0.1.0"

__all__ = [
    "ATTENTIONS",
    "Attention",
    "BatchSolution",
    "L2",
    "MomentSolution",
    "MultiHead",
    "Outcome",
    "SingleHeadAttention",
    "Sinkhorn",
    "Softmax",
    "Status",
    "TrajectoryOutcome",
    "blowup_time",
    "bures_wasserstein",
    "classify_solution",
    "classify_trajectory",
    "exact_covariance",
    "get_attention",
    "moment_rhs",
    "register_attention",
    "scalar_solution",
    "solve",
    "solve_batch",
]
