r"""The attention of a Transformer layer, as the package's types.

A head of a trained Transformer scores tokens by the scaled dot product of its
projections, with biases where the projections carry them (BERT, GPT-2), and normalises
the scores by a softmax over keys:

.. math::

    \Gamma_h[\mu](x) = V_h\,\frac{\int e^{s_h(x,y)}\,y\,d\mu(y)}{\int e^{s_h(x,y)}\,d\mu(y)},
    \qquad s_h(x, y) = c\,(Q_hx + q_h)^T(K_hy + k_h),

and the layer's attention is the sum of its heads, :math:`\Gamma = \sum_h\Gamma_h`.
:func:`dot_product_head` and :func:`sum_of_heads` build these from weight arrays, so that
code handing trained weights to the solvers (``gaussian_pde.training``) names no type.
"""

from __future__ import annotations

from ._biased_softmax import BiasedSoftmax
from ._multihead import MultiHead
from ._softmax import Softmax

__all__ = ["dot_product_head", "sum_of_heads"]


def dot_product_head(Q, K, V, *, scale=None, q=None, k_b=None):
    r"""One softmax head of score :math:`c\,(Qx + q)^T(Ky + k_b)`.

    Parameters
    ----------
    Q, K : array_like, shape (k, d)
        Query and key projections.
    V : array_like, shape (d, d)
        The head's value map (output projection times value projection).
    scale : float, optional
        Score scale :math:`c` (default :math:`1/\sqrt k`).
    q, k_b : array_like, shape (k,), optional
        Query and key biases. With neither, the head is plain softmax attention;
        with either, softmax with biases (the key bias cancels in the normalisation).

    Returns
    -------
    Attention
    """
    if q is None and k_b is None:
        return Softmax(Q, K, V, scale=scale)
    return BiasedSoftmax(Q, K, V, q=q, k_b=k_b, scale=scale)


def sum_of_heads(heads):
    r"""The attention whose field is the sum of the ``heads``' fields, :math:`\sum_h\Gamma_h`.

    Parameters
    ----------
    heads : sequence of Attention
        Gaussian-preserving heads of one dimension ``d``.
    """
    return MultiHead.from_heads(heads)
