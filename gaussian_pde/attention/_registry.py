"""The one registry of attention types: name -> class.

The CLI, sweeps and tests iterate over :data:`ATTENTIONS`. A new type registers itself
with :func:`register_attention` (see the README section "Adding an attention type").
"""

from __future__ import annotations

from ._base import Attention
from ._l2 import L2
from ._masked import Masked
from ._multihead import MultiHead
from ._sigmoid import Sigmoid
from ._sinkhorn import Sinkhorn
from ._softmax import Softmax

__all__ = ["ATTENTIONS", "get_attention", "register_attention"]

#: name -> attention class
ATTENTIONS: dict[str, type[Attention]] = {
    "softmax": Softmax,
    "l2": L2,
    "sinkhorn": Sinkhorn,
    "multihead": MultiHead,
    "sigmoid": Sigmoid,
    "masked": Masked,
}


def register_attention(cls):
    """Add an attention class to the registry under ``cls.name`` (usable as a decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Attention)):
        raise TypeError(f"`cls` must be a subclass of gaussian_pde.Attention, got {cls!r}.")
    if not cls.name:
        raise ValueError("`cls.name` must be a non-empty string.")
    ATTENTIONS[cls.name] = cls
    return cls


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
