"""The attention types the package defines, by class.

``gaussian_pde`` re-exports these at the top level (``gaussian_pde.Softmax``, ...); types
registered by other modules or packages are reached through the registry
(:func:`gaussian_pde.get_attention`).
"""

from ._l2 import L2
from ._masked import Masked
from ._multihead import MultiHead
from ._sigmoid import Sigmoid
from ._sinkhorn import Sinkhorn
from ._softmax import Softmax

__all__ = ["L2", "Masked", "MultiHead", "Sigmoid", "Sinkhorn", "Softmax"]
