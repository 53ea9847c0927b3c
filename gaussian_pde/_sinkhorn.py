r"""Sinkhorn attention.

The attention plan is the entropic coupling :math:`\pi` of :math:`\mu` with itself for the
kernel :math:`e^{s(x,y)}`, :math:`s(x,y) = y^TAx`, and
:math:`\Gamma[\mu](x) = V\,\mathbb E_\pi[y \mid x]`. For a Gaussian the coupling is
Gaussian (``derivations/sinkhorn.py``): with :math:`\Sigma = LL^T`, :math:`B = L^TAL` and
:math:`\varphi(g) = 2/(1 + \sqrt{1 + 4g})`,

.. math::

    \alpha' = V\alpha,\qquad L' = V L B\,\varphi(B^TB),

valid for singular ``A`` and singular :math:`\Sigma` (nothing is inverted).
"""

from __future__ import annotations

from ._attention import SingleHeadAttention
from ._generated import sinkhorn as _gen

__all__ = ["Sinkhorn"]


class Sinkhorn(SingleHeadAttention):
    r"""Sinkhorn (doubly stochastic) self-attention head with kernel :math:`e^{c\langle Qx, Ky\rangle}`.

    Parameters
    ----------
    Q, K : array_like, shape (k, d)
        Query and key matrices.
    V : array_like, shape (d, d)
        Value matrix.
    scale : float, optional
        Score scale :math:`c`, default :math:`1/\sqrt{k}`.
    """

    name = "sinkhorn"
    _generated = _gen
