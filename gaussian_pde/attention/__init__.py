"""Attention types: the contract (:class:`Attention`), the types, and their registry.

What the other subpackages need of an attention they import from here: the contract and
its helpers, the registry, the particle kernels' options and diagnostics, and the
moments' entry points. No code outside this subpackage names a concrete type: it calls
the contract (see :class:`Attention`).
"""

from ._base import CLOSURES, Attention, SingleHeadAttention, has_hook, normalized_definition_field
from ._compiled_fields import CompiledField, compiled_field_of
from ._compiled_fields import kernels as compiled_field_kernels
from ._compiled_fields import signatures as compiled_signatures
from ._examples import example_data
from ._kernels import (
    DEFAULT_CHUNK_SIZE,
    ParticleDiagnostics,
    ParticleOptions,
    SinkhornConvergenceWarning,
    make_options,
    normalized_average,
    resolve_dtype,
)
from ._l2 import L2
from ._masked import Masked, default_positions
from ._moments import moment_rhs, require_mean, validate_attention
from ._multihead import MultiHead
from ._registry import (
    ATTENTIONS,
    DEFAULT_ATTENTION,
    ENTRY_POINT_GROUP,
    capabilities,
    get_attention,
    load_entry_points,
    names_with,
    register_attention,
)
from ._scores import QuadraticScore, quadratic_heads, single_heads
from ._sigmoid import Sigmoid
from ._sinkhorn import Sinkhorn
from ._softmax import Softmax
from ._studies import (
    CLUSTER_QUICK_TYPES,
    CLUSTER_REFERENCE_TYPE,
    CLUSTER_TYPES,
    PUBLISHED_PANELS,
    PUBLISHED_TIMED_TYPE,
    PUBLISHED_TYPES,
    PUBLISHED_V_SEEDS,
    REGIME_FLOW_TYPE,
    REGIME_HORIZONS,
    REGIME_PANELS,
    REGIME_TYPES,
    closure_study_attention,
    closure_study_types,
    cluster_attention_of,
    published_attention,
    regime_attention,
)
from ._transformer import dot_product_head, sum_of_heads

__all__ = [
    "L2", "Masked", "MultiHead", "Sigmoid", "Sinkhorn", "Softmax",
    "ATTENTIONS", "Attention", "CLOSURES", "CompiledField", "ENTRY_POINT_GROUP", "DEFAULT_CHUNK_SIZE",
    "ParticleDiagnostics",
    "ParticleOptions", "QuadraticScore", "SingleHeadAttention", "SinkhornConvergenceWarning",
    "capabilities", "compiled_field_kernels", "compiled_field_of", "compiled_signatures",
    "default_positions", "example_data", "get_attention",
    "has_hook", "load_entry_points", "make_options", "moment_rhs", "names_with",
    "normalized_average", "normalized_definition_field", "quadratic_heads",
    "register_attention", "require_mean", "resolve_dtype", "single_heads", "validate_attention",
    "DEFAULT_ATTENTION", "dot_product_head", "sum_of_heads",
    "CLUSTER_TYPES", "PUBLISHED_TYPES", "REGIME_HORIZONS", "REGIME_PANELS", "REGIME_TYPES",
    "closure_study_attention", "closure_study_types", "cluster_attention_of", "published_attention",
    "regime_attention",
    "CLUSTER_QUICK_TYPES", "CLUSTER_REFERENCE_TYPE", "PUBLISHED_PANELS", "PUBLISHED_TIMED_TYPE",
    "PUBLISHED_V_SEEDS", "REGIME_FLOW_TYPE",
]
