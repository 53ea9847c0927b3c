r"""L2 attention.

.. math::

    \Gamma[\mu](x) = V\,\frac{\int e^{s(x,y)}\,y\,d\mu(y)}{\int e^{s(x,y)}\,d\mu(y)},
    \qquad s(x, y) = -c\,|Qx - Ky|^2 .

Against :math:`\mathcal N(\alpha,\Sigma)` the field is affine (``derivations/l2.py``):

.. math::

    M = 2c\,V(I + 2c\,\Sigma K^TK)^{-1}\Sigma K^TQ,\qquad
    b = V(I + 2c\,\Sigma K^TK)^{-1}\alpha,

and :math:`\alpha' = b + M\alpha`, :math:`\Sigma' = M\Sigma + \Sigma M^T`.
"""

from __future__ import annotations

import numpy as np

from .._generated import l2 as _gen
from ._base import SingleHeadAttention
from ._kernels import ParticleDiagnostics, l2_features, normalized_average

__all__ = ["L2"]


class L2(SingleHeadAttention):
    r"""L2 self-attention head, score :math:`-c\,|Qx - Ky|^2`.

    Parameters
    ----------
    Q, K : array_like, shape (k, d)
        Query and key matrices.
    V : array_like, shape (d, d)
        Value matrix.
    scale : float, optional
        Score scale :math:`c`, default :math:`1/\sqrt{k}`.
    """

    name = "l2"
    exact_jacobian = True
    _generated = _gen

    def compiled_field(self):
        """The compiled field (:mod:`~gaussian_pde.attention._compiled_fields`): ``c, s, sV, sK, Q, V, K``."""
        from . import _compiled_fields as cf

        c = float(self.scale)
        s = float(np.sqrt(2.0 * c))
        data = (c, s, s * self.V, s * self.K, self.Q, self.V, self.K)
        return cf.combine(self.d, [cf.pack_head(cf.L2, self.k, self.d, data)])

    def _particle_velocity(self, x, opts):
        r"""Particle velocity :math:`V\sum_j w_{ij}x_j`, :math:`w_{ij}\propto e^{-c|Qx_i - Kx_j|^2}`."""
        qx, kx = self._projections(x)
        a, b = l2_features(qx, kx, self.scale)
        avg, ess = normalized_average(a, b, x, chunk_size=opts.chunk_size, dtype=opts.dtype,
                                      want_ess=opts.want_ess)
        return avg @ self.V.T, ParticleDiagnostics(ess=ess)
