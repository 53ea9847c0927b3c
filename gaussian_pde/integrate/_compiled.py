"""The compiled loops' loader, for the integrators (the loops live with the types).

:func:`kernel` is :func:`gaussian_pde.attention.compiled_kernel`: the loop of that name
compiled by Numba (``cache=True``), or ``None`` without Numba.
"""

from ..attention import compiled_kernel as kernel

__all__ = ["kernel"]
