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

import types

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
    generated = _gen
    definition_field = normalized_definition_field

    def mean_is_linear(self):
        r"""True: :math:`\alpha' = (V + M)\alpha`."""
        return True

    def field_matrix(self, cov):
        r""":math:`M = cV\Sigma K^TQ` (the generated expression) as :math:`c\,(V(\Sigma K^T))Q`.

        Three products of :math:`O(d^2k)` instead of one of :math:`O(d^3)`: the heads of a
        wide model (:math:`k = d/H`) stay cheap.
        """
        return self.scale * ((self.V @ (cov @ self.K.T)) @ self.Q)

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
        """The compiled field (:data:`FIELD`): weights ``c, [cV; K; Q]``."""
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


# ----------------------------------------------------------------------------------------
# the compiled field (plain Python, compiled by gaussian_pde.attention._compiled_fields)
# ----------------------------------------------------------------------------------------

def softmax_products(data, k, d, m, y, out, ws):
    r""":math:`Z' = \big((cVL)(KL)^T\big)(QZ)` with :math:`V\alpha` added to the mean's column.

    ``data = [c, cV, K, Q]`` (row-major), or ``[c, cV, K, Q, q]``: where ``data`` holds
    ``k`` entries more, a query bias :math:`q` added to the mean's column of :math:`QZ`
    (a score :math:`c(Qx + q)^TKy`).

    Each type's body is a copy of this function (:func:`body_copy`), not a call of it:
    the kernels inline their body in Numba's IR, and an inlined call inside an inlined
    body would copy this function's IR twice more (half the compilation of a shape's
    kernel, :meth:`~._compiled_fields.CompiledField.specialised`).

    The products in the order of the generated ``factor_apply`` (the derivation's):
    :math:`A = (cVL)(KL)^T` first, then :math:`A(QZ)`; near a
    blow-up, where the factor's entries pass 1e20, the order decides which cancellations
    round. Flat indices: :math:`W = [cV; K; Q]` row-major from ``data[1]``; :math:`P = WZ`
    with its factor block in ``ws[:r d]`` (rows of ``d``), its mean column in
    ``ws[r d:r d + r]``, ``A`` after it. Every entry is one sum over ``p`` in increasing
    order, whichever loop runs innermost.
    """
    c = data[0]
    r = d + 2 * k
    bias = 1 + r * d if data.size > 1 + r * d else -1
    pm = r * d
    pa = pm + r
    for i in range(r):                         # P = W Z
        wi = 1 + i * d
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += data[wi + p] * y[p * m + j]
            ws[i * d + j] = acc
    if m > d:
        # the mean's column, summed over p in the outer loop: one accumulator per row,
        # independent of each other, where a dot product per row waits on each add
        for i in range(r):
            ws[pm + i] = 0.0
        for p in range(d):
            yp = y[p * m + d]
            for i in range(r):
                ws[pm + i] += data[1 + i * d + p] * yp
    q0 = (d + k) * d
    qm = pm + d + k
    if bias >= 0 and m > d:                    # Q alpha + q
        for p in range(k):
            ws[qm + p] += data[bias + p]
    for i in range(d):                         # A = (cVL)(KL)^T
        for j in range(k):
            acc = 0.0
            for p in range(d):
                acc += ws[i * d + p] * ws[(d + j) * d + p]
            ws[pa + i * k + j] = acc
    for i in range(d):                         # Z' = A (QZ), + V alpha in the mean's column
        for j in range(d):
            acc = 0.0
            for p in range(k):
                acc += ws[pa + i * k + p] * ws[q0 + p * d + j]
            out[i * m + j] = acc
    if m > d:
        for i in range(d):
            out[i * m + d] = 0.0
        for p in range(k):
            qp = ws[qm + p]
            for i in range(d):
                out[i * m + d] += ws[pa + i * k + p] * qp
        for i in range(d):
            out[i * m + d] += ws[pm + i] / c


@cf.compiled_later(inline=True, counted=True)
def softmax_parts(data, k, d, m, Z, A, C, M, N, r):
    r"""The Jacobian's parts (:mod:`._compiled_fields`) of :func:`softmax_products`.

    :math:`A = cV`, :math:`C = K^TQ`, :math:`M = A\Sigma C`, :math:`N = A/c + M = V + M`,
    :math:`r = C\alpha`; ``data = [c, cV, K, Q, ...]``.
    """
    L = np.ascontiguousarray(Z[:, :d])
    S = np.empty((d, d))
    cf.mm(L, np.ascontiguousarray(L.T), S)
    c = data[0]
    W = data[1:1 + (d + 2 * k) * d].reshape((d + 2 * k, d))
    Kt = np.ascontiguousarray(W[d:d + k].T)
    Q = W[d + k:d + 2 * k]
    cf.copy2(A, W[:d])
    cf.mm(Kt, Q, C)
    T1 = np.empty((d, d))
    cf.mm(A, S, T1)
    cf.mm(T1, C, M)
    if m > d:
        for i in range(d):
            for j in range(d):
                N[i, j] = A[i, j] / c + M[i, j]
        for i in range(d):
            acc = 0.0
            for p in range(d):
                acc += C[i, p] * Z[p, d]
            r[i] = acc
    return True


def body_copy(module, doc):
    """A copy of :func:`softmax_products` named ``_field`` in ``module``, with ``doc``.

    A type's own body (its name the type's module's, for :class:`._compiled_fields.HeadKernel`):
    the same code, marked by :func:`._compiled_fields.compiled_later`.
    """
    fn = types.FunctionType(softmax_products.__code__, softmax_products.__globals__, "_field")
    fn.__qualname__ = "_field"
    fn.__module__ = module
    fn.__doc__ = doc
    return cf.compiled_later()(fn)


#: the head's :math:`Z'` (:func:`softmax_products`, no bias); ``data = [c, cV, K, Q]``
_field = body_copy(__name__, "Softmax's head field (a copy of softmax_products).")


#: the compiled field of a softmax head
FIELD = cf.HeadKernel(_field, softmax_parts)
