"""The one registry of attention types: name -> class.

The CLI, sweeps and tests iterate over :data:`ATTENTIONS`. A new type registers itself
with :func:`register_attention` (see the README section "Adding an attention type"),
which checks the capabilities it declares (:class:`~gaussian_pde.Attention`):
``gaussian_preserving``, ``exact_jacobian``, ``closure`` and the particle kernel
``_particle_velocity``. Code that needs types with a given capability filters the
registry by these attributes, e.g. :func:`names_with`.
"""

from __future__ import annotations

from ._base import CLOSURES, Attention
from ._l2 import L2
from ._masked import Masked
from ._multihead import MultiHead
from ._sigmoid import Sigmoid
from ._sinkhorn import Sinkhorn
from ._softmax import Softmax

__all__ = ["ATTENTIONS", "get_attention", "register_attention", "names_with"]

#: name -> attention class
ATTENTIONS: dict[str, type[Attention]] = {
    "softmax": Softmax,
    "l2": L2,
    "sinkhorn": Sinkhorn,
    "multihead": MultiHead,
    "sigmoid": Sigmoid,
    "masked": Masked,
}


def _check_capabilities(cls):
    """The capabilities ``cls`` declares are well formed and consistent (else an error)."""
    where = f"attention type {cls.__name__} ({cls.name!r})"
    for attr in ("gaussian_preserving", "exact_jacobian", "uses_positions"):
        if not isinstance(getattr(cls, attr), bool):
            raise TypeError(f"{where}: `{attr}` must be True or False, got "
                            f"{getattr(cls, attr)!r}.")
    if cls.closure is not None and cls.closure not in CLOSURES:
        raise ValueError(f"{where}: `closure` must be None or one of "
                         f"{', '.join(map(repr, CLOSURES))}, got {cls.closure!r}.")
    if cls.gaussian_preserving and cls.closure is not None:
        raise ValueError(f"{where}: a Gaussian-preserving type has exact moment equations; "
                         f"`closure` must be None, got {cls.closure!r}.")
    if cls.exact_jacobian and not cls.gaussian_preserving:
        raise ValueError(f"{where}: `exact_jacobian` needs exact moment equations "
                         "(`gaussian_preserving = True`).")
    if cls._particle_velocity is Attention._particle_velocity:
        raise TypeError(f"{where} has no particle kernel: define "
                        "`_particle_velocity(self, x, opts)` (see gaussian_pde.Attention).")


def register_attention(cls):
    """Add an attention class to the registry under ``cls.name`` (usable as a decorator).

    The class must declare well-formed capabilities (:class:`~gaussian_pde.Attention`):
    booleans ``gaussian_preserving``, ``exact_jacobian`` and ``uses_positions``,
    ``closure`` None or one of ``"quadrature"``, ``"block_causal"`` (None for a
    Gaussian-preserving type), and a particle kernel ``_particle_velocity``.
    """
    if not (isinstance(cls, type) and issubclass(cls, Attention)):
        raise TypeError(f"`cls` must be a subclass of gaussian_pde.Attention, got {cls!r}.")
    if not cls.name or not isinstance(cls.name, str):
        raise ValueError("`cls.name` must be a non-empty string.")
    _check_capabilities(cls)
    ATTENTIONS[cls.name] = cls
    return cls


def names_with(**capabilities):
    """Registered names whose class has the given capability values, in registry order.

    >>> names_with(gaussian_preserving=False)
    ['sigmoid', 'masked']
    """
    return [name for name, cls in ATTENTIONS.items()
            if all(getattr(cls, k) == v for k, v in capabilities.items())]


def get_attention(name):
    """The attention class registered under ``name``."""
    if isinstance(name, type) and issubclass(name, Attention):
        return name
    if not isinstance(name, str):
        raise TypeError(f"`name` must be a string, got {type(name).__name__}.")
    try:
        return ATTENTIONS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown attention type {name!r}; "
                         f"known types: {', '.join(ATTENTIONS)}.") from None
