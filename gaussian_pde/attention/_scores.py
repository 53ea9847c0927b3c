r"""The quadratic score form shared by the closures and studies that need it.

A head whose score is quadratic in the key token,

.. math:: s(x, y) = -\tfrac12\,y^THy + y^TAx + r(x),

(:math:`r` cancels in the softmax normalisation) has a velocity against a Gaussian,
and against a mixture of Gaussians, in closed form: softmax has :math:`H = 0`,
:math:`A = cK^TQ`; L2 (:math:`-c|Qx - Ky|^2`) has :math:`H = 2cK^TK`, :math:`A = 2cK^TQ`.
A type exposes its form through ``Attention.quadratic_score()``; :func:`quadratic_heads`
collects the forms of a sum of heads.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["QuadraticScore", "quadratic_heads", "single_heads"]


@dataclasses.dataclass(frozen=True)
class QuadraticScore:
    """One head's quadratic score: bilinear coupling ``A`` (``y^T A x``), Hessian ``H``, ``V``.

    ``H`` is ``None`` where it is zero (a score linear in ``y``).
    """

    A: np.ndarray
    H: np.ndarray | None
    V: np.ndarray


def single_heads(attention):
    """The single heads of ``attention``, nested sums flattened (``[attention]`` for one).

    The order is that of :func:`quadratic_heads`.
    """
    return [g for h in attention.heads
            for g in ((h,) if h is attention else single_heads(h))]


def quadratic_heads(attention, name="attention", what="the mixture closure"):
    """The :class:`QuadraticScore` of every head of ``attention``; else ``TypeError``.

    ``name`` and ``what`` word the error: which argument, and what needs the form.
    """
    from ._base import Attention

    if not isinstance(attention, Attention):
        raise TypeError(f"`{name}` must be an attention object, got {type(attention).__name__}.")
    out = []
    for i, h in enumerate(attention.heads):
        if h is not attention:                      # a head that is a sum of heads itself
            out.extend(quadratic_heads(h, f"{name}.heads[{i}]", what))
            continue
        score = h.quadratic_score()
        if score is None:
            raise TypeError(f"`{name}` ({h.name}): {what} needs heads whose score is quadratic "
                            "in the key token (softmax and L2 heads, or a MultiHead of them), "
                            "whose velocity against a Gaussian or a mixture is in closed form.")
        out.append(score)
    return out
