r"""Softmax attention.

.. math::

    \Gamma[\mu](x) = V\,\frac{\int e^{s(x,y)}\,y\,d\mu(y)}{\int e^{s(x,y)}\,d\mu(y)},
    \qquad s(x, y) = c\,\langle Qx, Ky\rangle = y^T A x .

Against :math:`\mathcal N(\alpha,\Sigma)` the field is affine with
:math:`M = V\Sigma A` and :math:`b = V\alpha` (``derivations/softmax.py``), so

.. math::

    \alpha' = V(\alpha + \Sigma A\alpha),\qquad
    \Sigma' = V\Sigma A\Sigma + \Sigma A^T\Sigma V^T .
"""

from __future__ import annotations

from .._generated import softmax as _gen
from ._base import SingleHeadAttention
from ._kernels import ParticleDiagnostics, normalized_average, softmax_features

__all__ = ["Softmax"]


class Softmax(SingleHeadAttention):
    r"""Softmax self-attention head, score :math:`c\,\langle Qx, Ky\rangle`.

    Parameters
    ----------
    Q, K : array_like, shape (k, d)
        Query and key matrices.
    V : array_like, shape (d, d)
        Value matrix.
    scale : float, optional
        Score scale :math:`c`, default :math:`1/\sqrt{k}`.

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=1.0)
    >>> gp.moment_rhs(att, np.zeros(2), np.eye(2))[1]
    array([[2., 0.],
           [0., 2.]])
    """

    name = "softmax"
    exact_jacobian = True
    _generated = _gen

    def compiled_field(self):
        """The compiled field (:mod:`~gaussian_pde.attention._compiled_fields`): ``c, [cV; K; Q]``."""
        from . import _compiled_fields as cf

        c = float(self.scale)
        data = (c, c * self.V, self.K, self.Q)
        return cf.combine(self.d, [cf.pack_head(cf.SOFTMAX, self.k, self.d, data)])

    def _particle_velocity(self, x, opts):
        r"""Particle velocity :math:`V\sum_j w_{ij}x_j`, :math:`w_{ij}\propto e^{c\langle Qx_i, Kx_j\rangle}`."""
        qx, kx = self._projections(x)
        a, b = softmax_features(self.scale * qx, kx)
        avg, ess = normalized_average(a, b, x, chunk_size=opts.chunk_size, dtype=opts.dtype,
                                      want_ess=opts.want_ess)
        return avg @ self.V.T, ParticleDiagnostics(ess=ess)
