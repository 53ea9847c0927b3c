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
from scipy.special import lambertw

from .._generated import l2 as _gen
from . import _compiled_fields as cf
from ._base import SingleHeadAttention, normalized_definition_field
from ._kernels import ParticleDiagnostics, l2_features, normalized_average
from ._scores import QuadraticScore

__all__ = ["L2"]


class L2(SingleHeadAttention):
    r"""L2 self-attention head, score :math:`-c\,|Qx - Ky|^2`.

    Parameters
    ----------
    %(weights)s
    %(scale)s
    """

    name = "l2"
    generated = _gen
    definition_field = normalized_definition_field

    def mean_is_linear(self):
        r"""True: :math:`b = VP^{-1}\alpha` is linear in the mean."""
        return True

    def scalar_solution(self, mean0, var0, t):
        r"""``d = 1``: :math:`s' = 4vas^2/(1 + 2\kappa s)`, solved by the Lambert W function.

        With :math:`h = 2\kappa`, :math:`m = 4va`:
        :math:`-1/s + h\ln s = -1/s_0 + h\ln s_0 + mt`, :math:`s = 1/(h\,W(e^{-R/h}/h))`,
        and :math:`\ln(\alpha/\alpha_0) = \tfrac{v}{m}\big[-1/s + 2a\ln s\big]_{s_0}^{s}`.
        """
        q, k, v, c = self.Q[:, 0], self.K[:, 0], self.V[0, 0], self.scale
        a, kappa = c * float(q @ k), c * float(k @ k)
        m0, s0 = mean0, var0
        va = v * a
        h, m = 2.0 * kappa, 4.0 * va
        if m == 0:  # v = 0 or a = 0: the variance is constant
            rate = v * (1.0 + 2.0 * a * s0) / (1.0 + h * s0)
            return m0 * np.exp(rate * t), np.full_like(t, s0)
        R = -1.0 / s0 + h * np.log(s0) + m * t
        # s = 1/(h W(exp(-R/h)/h)), in logs: W(e^z) with z = -R/h - ln h
        s = 1.0 / (h * _lambertw_exp(-R / h - np.log(h)))
        mean = m0 * np.exp(v / m * ((-1.0 / s + 2 * a * np.log(s))
                                    - (-1.0 / s0 + 2 * a * np.log(s0))))
        return mean, s

    def quadratic_score(self):
        """:math:`H = 2cK^TK`, :math:`A = 2cK^TQ`."""
        c = self.scale
        return QuadraticScore(A=2 * np.asarray(self.A), H=2 * c * self.K.T @ self.K,
                              V=np.asarray(self.V))

    def score_matrix(self, X, Y):
        """``S[i, j] = -c|Qx_i - Ky_j|^2``."""
        qx, ky = X @ self.Q.T, Y @ self.K.T
        return -self.scale * (np.sum(qx**2, 1)[:, None] - 2 * qx @ ky.T + np.sum(ky**2, 1)[None])

    @classmethod
    def example_setting(cls):
        """:math:`K = -Q`, :math:`V = I`: collapse onto the line orthogonal to ``Q`` (rank 1 limit)."""
        from ._examples import example_data

        Q, _, _, _, mean0, cov0 = example_data()
        return dict(attention=cls(Q, -Q, np.eye(2)), mean0=mean0, cov0=cov0)

    def compiled_field(self):
        """The compiled field (:data:`FIELD`, generated): weights ``c, s, sV, sK, Q, V, K``, ``s = sqrt(2c)``."""
        Q, K, V, c = self.weights()     # a subclass that changes the weights keeps its field
        c = float(c)
        s = float(np.sqrt(2.0 * c))
        data = (c, s, s * V, s * K, Q, V, K)
        return cf.head_field(FIELD, self.k, self.d, data)

    def particle_kernel(self, x, opts):
        r"""Particle velocity :math:`V\sum_j w_{ij}x_j`, :math:`w_{ij}\propto e^{-c|Qx_i - Kx_j|^2}`."""
        qx, kx = self._projections(x)
        a, b = l2_features(qx, kx, self.scale)
        avg, ess = normalized_average(a, b, x, chunk_size=opts.chunk_size, dtype=opts.dtype,
                                      want_ess=opts.want_ess)
        return avg @ self.V.T, ParticleDiagnostics(ess=ess)


def _lambertw_exp(z):
    """Principal Lambert W of ``exp(z)``, stable for large ``z``."""
    z = np.asarray(z, dtype=float)
    out = np.empty_like(z)
    small = z < 500
    out[small] = lambertw(np.exp(z[small])).real
    if np.any(~small):  # W(e^z) = z - ln z + ln z / z + ... ; refine by Newton on w + ln w = z
        w = z[~small] - np.log(z[~small])
        for _ in range(8):
            w -= (w + np.log(w) - z[~small]) / (1.0 + 1.0 / w)
        out[~small] = w
    return out


#: the compiled field of an L2 head: the body and Jacobian parts printed from the
#: derivation (``derivations/l2.py``) into the generated module
FIELD = cf.HeadKernel(_gen.field_body, _gen.field_parts)
