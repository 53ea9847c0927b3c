r"""The quadratic score form shared by the closures and studies that need it.

A head whose score is quadratic in the key token,

.. math:: s(x, y) = -\tfrac12\,y^THy + y^T(Ax + g) + r(x),

(:math:`r` cancels in the softmax normalisation) has a velocity against a Gaussian,
and against a mixture of Gaussians, in closed form: softmax has :math:`H = 0`,
:math:`A = cK^TQ`; L2 (:math:`-c|Qx - Ky|^2`) has :math:`H = 2cK^TK`, :math:`A = 2cK^TQ`;
a query bias :math:`q` (score :math:`c(Qx + q)^TKy`) adds :math:`g = cK^Tq`. The linear
term tilts each Gaussian: :math:`e^{g^Ty}\mathcal N(y;\alpha,\Sigma) =
e^{g^T\alpha + g^T\Sigma g/2}\,\mathcal N(y;\alpha + \Sigma g,\Sigma)`, so a consumer
that handles :math:`g = 0` handles any :math:`g` by moving the means and weights
(:meth:`QuadraticScore.tilt`).
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

    ``H`` is ``None`` where it is zero (a score linear in ``y``); ``g`` (the term
    ``g^T y``) is ``None`` where it is zero.
    """

    A: np.ndarray
    H: np.ndarray | None
    V: np.ndarray
    g: np.ndarray | None = None

    def tilt(self, logw, means, covs):
        r"""Log weights and means of the Gaussians tilted by :math:`e^{g^Ty}`.

        .. math:: \log w_k + g^T\alpha_k + \tfrac12 g^T\Sigma_kg,\qquad
                  \alpha_k + \Sigma_kg

        (the covariances stay): the score's other terms against the tilted Gaussians give
        the field of the whole score against the given ones. Unchanged where ``g`` is None.
        """
        if self.g is None:
            return logw, means
        Sg = covs @ self.g
        return logw + means @ self.g + 0.5 * (Sg @ self.g), means + Sg


def single_heads(attention):
    """The single heads of ``attention``, nested sums flattened (``[attention]`` for one).

    The order is that of :func:`quadratic_heads`.
    """
    return [g for h in attention.heads
            for g in ((h,) if h is attention else single_heads(h))]


def quadratic_heads(attention, name="attention", what="the mixture closure", fields=False):
    """The :class:`QuadraticScore` of every head of ``attention``; else ``TypeError``.

    ``name`` and ``what`` word the error: which argument, and what needs the form.
    ``fields``: a head without a quadratic score that implements
    ``Attention.mixture_field`` (its field against a mixture in closed form) is returned
    itself instead of refused (the mixture closure takes either).
    """
    from ._base import Attention, has_hook

    if not isinstance(attention, Attention):
        raise TypeError(f"`{name}` must be an attention object, got {type(attention).__name__}.")
    out = []
    for i, h in enumerate(attention.heads):
        if h is not attention:                      # a head that is a sum of heads itself
            out.extend(quadratic_heads(h, f"{name}.heads[{i}]", what, fields))
            continue
        score = h.quadratic_score()
        if score is None and fields and has_hook(type(h), "mixture_field"):
            score = h
        if score is None:
            also = " or a field against a mixture in closed form" if fields else ""
            raise TypeError(f"`{name}` ({h.name}): {what} needs heads whose score is quadratic "
                            f"in the key token{also} (softmax and L2 heads, or a MultiHead of "
                            "them), whose velocity against a Gaussian or a mixture is in "
                            "closed form.")
        out.append(score)
    return out
