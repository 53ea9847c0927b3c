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

import numpy as np

from .._generated import softmax as _gen
from . import _compiled_fields as cf
from ._base import SingleHeadAttention, normalized_definition_field
from ._kernels import ParticleDiagnostics, normalized_average, softmax_features
from ._scores import QuadraticScore

__all__ = ["Softmax"]


class Softmax(SingleHeadAttention):
    r"""Softmax self-attention head, score :math:`c\,\langle Qx, Ky\rangle`.

    Parameters
    ----------
    %(weights)s
    %(scale)s

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=1.0)
    >>> gp.moment_rhs(att, np.zeros(2), np.eye(2))[1]
    array([[2., 0.],
           [0., 2.]])
    """

    name = "softmax"
    generated = _gen
    definition_field = normalized_definition_field

    def mean_is_linear(self):
        r"""True: :math:`\alpha' = (V + M)\alpha`."""
        return True

    def riccati_matrix(self):
        r""":math:`S = A + A^T` when :math:`V = I` (:math:`\Sigma' = \Sigma(A + A^T)\Sigma`), else None."""
        if not np.array_equal(self.V, np.eye(self.d)):
            return None
        return self.A + self.A.T

    def scalar_solution(self, mean0, var0, t):
        r""":math:`s = s_0/(1 - 2vas_0t)`, :math:`m = m_0e^{vt}/\sqrt{1 - 2vas_0t}` (``d = 1``)."""
        return _scalar_softmax(self.scale * float(self.K[:, 0] @ self.Q[:, 0]) * float(self.V[0, 0]),
                               float(self.V[0, 0]), mean0, var0, t)

    @classmethod
    def scalar_solution_of_sum(cls, heads, mean0, var0, t):
        """The scalar solution of a sum of softmax heads: their ``v a`` and ``v`` add."""
        va = sum(h.scale * float(h.K[:, 0] @ h.Q[:, 0]) * float(h.V[0, 0]) for h in heads)
        v = sum(float(h.V[0, 0]) for h in heads)
        return _scalar_softmax(va, v, mean0, var0, t)

    def quadratic_score(self):
        """:math:`H = 0`, :math:`A = cK^TQ`."""
        return QuadraticScore(A=np.asarray(self.A), H=None, V=np.asarray(self.V))

    @classmethod
    def example_setting(cls):
        """:math:`A + A^T` indefinite, :math:`V = I`: Riccati blow-up in finite time (exact t* = 0.586)."""
        from ._examples import example_data

        Q, K, _, _, mean0, cov0 = example_data()
        return dict(attention=cls(Q, K, np.eye(2)), mean0=mean0, cov0=cov0, horizon=3.0,
                    t_end=0.4)

    def compiled_field(self):
        """The compiled field (:data:`FIELD`, generated): weights ``c, [cV; K; Q]``."""
        Q, K, V, c = self.weights()     # a subclass that changes the weights keeps its field
        c = float(c)
        data = (c, c * V, K, Q)
        return cf.head_field(FIELD, self.k, self.d, data)

    def particle_kernel(self, x, opts):
        r"""Particle velocity :math:`V\sum_j w_{ij}x_j`, :math:`w_{ij}\propto e^{c\langle Qx_i, Kx_j\rangle}`."""
        qx, kx = self._projections(x)
        a, b = softmax_features(self.scale * qx, kx)
        avg, ess = normalized_average(a, b, x, chunk_size=opts.chunk_size, dtype=opts.dtype,
                                      want_ess=opts.want_ess)
        return avg @ self.V.T, ParticleDiagnostics(ess=ess)


def _scalar_softmax(va, v, m0, s0, t):
    denom = 1.0 - 2.0 * va * s0 * t
    if np.any(denom <= 0):
        raise ValueError("`t` reaches the blow-up time.")
    return m0 * np.exp(v * t) / np.sqrt(denom), s0 / denom


#: the compiled field of a softmax head: the body and Jacobian parts printed from the
#: derivation (``derivations/softmax.py``) into the generated module
FIELD = cf.HeadKernel(_gen.field_body, _gen.field_parts)
