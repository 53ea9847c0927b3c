r"""Linear attention: the score average without softmax normalisation.

.. math::

    \Gamma[\mu](x) = V\int s(x, y)\,y\,d\mu(y),\qquad s(x, y) = c\,\langle Qx, Ky\rangle = y^TAx .

Against :math:`\mathcal N(\alpha,\Sigma)` the field is
:math:`V\,\mathbb E[yy^T]Ax = V(\Sigma + \alpha\alpha^T)Ax`: linear in ``x``, with a
matrix that depends on the mean (``derivations/linear.py``),

.. math::

    M = V(\Sigma + \alpha\alpha^T)A,\qquad b = 0,\qquad
    \alpha' = M\alpha,\qquad \Sigma' = M\Sigma + \Sigma M^T .

The type implements :meth:`~gaussian_pde.Attention.field_matrix_with_mean`, so it has
the derived capability ``field_sees_mean``: the solvers require the mean, and the
mean-free hooks refuse. The second moment :math:`P = \Sigma + \alpha\alpha^T` obeys
plain softmax's covariance equation :math:`P' = VPAP + PA^TPV^T`; with :math:`V = I`
it blows up at :math:`t^* = 1/\lambda_{\max}(P_0^{1/2}(A + A^T)P_0^{1/2})`. The state
:math:`Z = [L \mid \alpha]` has :math:`ZZ^T = P` and :math:`Z' = (cVZ)(KZ)^T(QZ)`.
"""

from __future__ import annotations

import numpy as np

from .._generated import linear as _gen
from . import _compiled_fields as cf
from ._base import SingleHeadAttention
from ._examples import example_data
from ._kernels import ParticleDiagnostics
from ._registry import register_attention

__all__ = ["Linear"]


@register_attention
class Linear(SingleHeadAttention):
    r"""Linear (unnormalised) self-attention head, score :math:`c\,\langle Qx, Ky\rangle`.

    Parameters
    ----------
    %(weights)s
    %(scale)s

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> att = gp.get_attention("linear")(np.eye(2), np.eye(2), np.eye(2), scale=1.0)
    >>> att.field_matrix_with_mean(np.eye(2), np.array([1.0, 0.0]))
    array([[2., 0.],
           [0., 1.]])
    """

    name = "linear"

    def _refuse(self, *args):
        raise TypeError("the field matrix of linear attention, V (Sigma + alpha alpha^T) A, "
                        "depends on the mean: use `field_matrix_with_mean(cov, mean)` or "
                        "`moment_rhs(mean, cov)`, and pass a mean to the solvers.")

    field_matrix = cov_rhs = factor_rhs = _refuse

    def field_matrix_with_mean(self, cov, mean):
        return _gen.field_matrix(*self.weights(), np.asarray(mean, dtype=float), cov)

    def field_offset(self, mean, cov):
        return np.zeros(np.broadcast_shapes(np.shape(mean), np.shape(cov)[:-1]))

    def moment_rhs(self, mean, cov):
        return _gen.moment_rhs(*self.weights(), mean, cov)

    def scalar_solution(self, mean0, var0, t):
        r"""``d = 1``: :math:`p = s + m^2` obeys :math:`p' = 2vap^2`, so with :math:`D = 1 - 2vap_0t`

        :math:`s = s_0/D` and :math:`m = m_0/\sqrt D` (:math:`a = cK^TQ`, :math:`v = V`).
        """
        va = self.scale * float(self.K[:, 0] @ self.Q[:, 0]) * float(self.V[0, 0])
        denom = 1.0 - 2.0 * va * (var0 + mean0 ** 2) * np.asarray(t, dtype=float)
        if np.any(denom <= 0):
            raise ValueError("`t` reaches the blow-up time.")
        return mean0 / np.sqrt(denom), var0 / denom

    def definition_field(self, Y, logw, X):
        r""":math:`\Gamma(x_i) = V\sum_j w_j s(x_i, y_j)\,y_j` (weights normalised to one)."""
        w = np.exp(logw - np.max(logw))
        w = w / w.sum()
        S = self.score_matrix(X, Y) * w
        return (S @ Y) @ self.V.T

    def particle_kernel(self, x, opts):
        r""":math:`v_i = V\big(\tfrac1n\sum_j x_jx_j^T\big)Ax_i`: :math:`O(nd^2)`, no ``n x n`` array.

        The effective sample size of the signed weights :math:`w_{ij} = s(x_i, x_j)`,
        :math:`(\sum_j w_{ij})^2/\sum_j w_{ij}^2`, from the first two moments of the tokens.
        """
        xs = np.asarray(x, dtype=opts.dtype)
        n = xs.shape[0]
        second = xs.T @ xs / n
        ax = xs @ np.asarray(self.A, dtype=opts.dtype).T              # A x_i
        v = (ax @ second.T) @ np.asarray(self.V, dtype=opts.dtype).T
        ess = None
        if opts.want_ess:
            row = ax @ xs.mean(axis=0) * n                            # sum_j s_ij
            sq = np.einsum("ij,jk,ik->i", ax, second, ax) * n         # sum_j s_ij^2
            with np.errstate(divide="ignore", invalid="ignore"):
                ess = np.where(sq > 0, row ** 2 / np.where(sq > 0, sq, 1.0), 0.0)
        return np.asarray(v, dtype=np.float64), ParticleDiagnostics(ess=ess)

    def mixture_field(self, logw, means, covs, x):
        r"""The field against a mixture: that of the Gaussian with the mixture's two moments.

        :math:`\Gamma[\mu](x) = V\,\mathbb E_\mu[yy^T]A\,x` depends on :math:`\mu` only
        through its second moment :math:`\sum_kw_k(\Sigma_k + \alpha_k\alpha_k^T)`, so
        every component moves by the same linear map and the mixture closure is exact.
        """
        w = np.exp(logw - np.max(logw))
        w /= w.sum()
        mean = w @ means
        second = np.einsum("k,kij->ij", w, covs + means[:, :, None] * means[:, None, :])
        return self.velocity(mean, second - np.outer(mean, mean), x)

    def second_moment_map(self):
        r"""``(V, A)``: the field is :math:`V\,\mathbb E_\mu[yy^T]A\,x` for every :math:`\mu`."""
        return self.V, self.A

    def compiled_field(self):
        """The compiled field (:data:`FIELD`, generated): weights ``c, [cV; K; Q]``."""
        c = float(self.scale)
        return cf.head_field(FIELD, self.k, self.d, (c, c * self.V, self.K, self.Q))

    @classmethod
    def example_setting(cls):
        r"""The softmax example's weights with :math:`V = I`: blow-up at t* = 0.484.

        :math:`P = \Sigma + \alpha\alpha^T` follows softmax's Riccati equation, so
        :math:`t^* = 1/\lambda_{\max}(P_0^{1/2}(A + A^T)P_0^{1/2})` (softmax's own
        example, at :math:`\Sigma_0`, blows up at 0.586).
        """
        Q, K, _, _, mean0, cov0 = example_data()
        return dict(attention=cls(Q, K, np.eye(2)), mean0=mean0, cov0=cov0, horizon=3.0,
                    t_end=0.3)


#: the compiled field of a linear head: the body and Jacobian parts printed from the
#: derivation (``derivations/linear.py``) into the generated module; its field is
#: :math:`Z' = M(P)Z` over the whole state, :math:`P = ZZ^T`
FIELD = cf.HeadKernel(_gen.field_body, _gen.field_parts, second_moment=True)
