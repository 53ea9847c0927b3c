r"""Softmax attention with query and key biases.

.. math::

    \Gamma[\mu](x) = V\,\frac{\int e^{s(x,y)}\,y\,d\mu(y)}{\int e^{s(x,y)}\,d\mu(y)},
    \qquad s(x, y) = c\,(Qx + q)^T(Ky + k_b),

as in BERT and GPT-2, whose projections carry biases. The score is linear in ``y``:
:math:`s = y^T(Ax + g) + r(x)` with :math:`A = cK^TQ`, :math:`g = cK^Tq`, and
:math:`r(x) = c(Qx + q)^Tk_b` cancels in the normalisation (the key bias drops out).
Against :math:`\mathcal N(\alpha,\Sigma)` the field is affine with :math:`M = V\Sigma A`
and :math:`b = V(\alpha + \Sigma g)` (``derivations/biased_softmax.py``), so

.. math::

    \alpha' = V(\alpha + \Sigma A\alpha + \Sigma g),\qquad
    \Sigma' = V\Sigma A\Sigma + \Sigma A^T\Sigma V^T :

the covariance obeys plain softmax's equation; the mean gains the drift :math:`V\Sigma g`.
At :math:`q = 0` the type is plain softmax.
"""

from __future__ import annotations

import numpy as np

from .._common.validation import validate_array
from .._generated import biased_softmax as _gen
from . import _compiled_fields as cf
from ._base import SingleHeadAttention, normalized_definition_field
from ._examples import example_data
from ._kernels import ParticleDiagnostics, normalized_average, softmax_features
from ._registry import register_attention
from ._scores import QuadraticScore

__all__ = ["BiasedSoftmax"]


@register_attention
class BiasedSoftmax(SingleHeadAttention):
    r"""Softmax self-attention head with biases, score :math:`c\,(Qx + q)^T(Ky + k_b)`.

    Parameters
    ----------
    %(weights)s
    %(scale)s
    q, k_b : array_like, shape (k,), optional
        Query and key biases (default zero).

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> cls = gp.get_attention("biased_softmax")
    >>> att = cls(np.eye(2), np.eye(2), np.eye(2), q=[1.0, 0.0], scale=1.0)
    >>> gp.moment_rhs(att, np.zeros(2), np.eye(2))[0]
    array([1., 0.])
    """

    name = "biased_softmax"
    generated = _gen
    weight_names = ("Q", "K", "V", "scale", "q", "k_b")
    definition_field = normalized_definition_field

    def __init__(self, Q, K, V, q=None, k_b=None, scale=None):
        super().__init__(Q, K, V, scale=scale)
        object.__setattr__(self, "_frozen", False)
        k = self.k
        biases = []
        for name, b in (("q", q), ("k_b", k_b)):
            b = np.zeros(k) if b is None else validate_array(b, name, ndim=1)
            if b.shape != (k,):
                raise ValueError(f"`{name}` must have shape ({k},) (one entry per row of Q), "
                                 f"got {b.shape}.")
            b.setflags(write=False)
            biases.append(b)
        self.q, self.k_b = biases
        self._frozen = True

    @classmethod
    def example(cls, d=2, rng=None):
        """A random instance with ``k = d`` and biases of size 1/2."""
        rng = np.random.default_rng(rng)
        Q, K, V = cls._example_weights(d, rng)
        return cls(Q, K, V, q=0.5 * rng.standard_normal(d), k_b=0.5 * rng.standard_normal(d))

    def weights(self):
        return self.Q, self.K, self.V, self.scale, self.q[:, None], self.k_b[:, None]

    def quadratic_score(self):
        """:math:`H = 0`, :math:`A = cK^TQ` and the linear term :math:`g = cK^Tq`."""
        return QuadraticScore(A=np.asarray(self.A), H=None, V=np.asarray(self.V),
                              g=self.scale * (self.K.T @ self.q))

    def compiled_field(self):
        """The compiled field (:data:`FIELD`, generated): weights ``c, [cV; K; Q], q``."""
        Q, K, V, c, q, _ = self.weights()   # a subclass that changes the weights keeps its field
        c = float(c)
        data = (c, c * V, K, Q, q)
        return cf.head_field(FIELD, self.k, self.d, data)

    def riccati_matrix(self):
        r""":math:`A + A^T` when :math:`V = I`: the covariance is plain softmax's."""
        if not np.array_equal(self.V, np.eye(self.d)):
            return None
        return self.A + self.A.T

    def score_matrix(self, X, Y):
        """``S[i, j] = c (Q x_i + q)^T (K y_j + k_b)``."""
        return self.scale * (X @ self.Q.T + self.q) @ (Y @ self.K.T + self.k_b).T

    def particle_kernel(self, x, opts):
        r"""Particle velocity :math:`V\sum_j w_{ij}x_j`, :math:`w_{ij}\propto e^{c(Qx_i + q)^T(Kx_j + k_b)}`."""
        qx, kx = self._projections(x)
        a, b = softmax_features(self.scale * (qx + self.q), kx + self.k_b)
        avg, ess = normalized_average(a, b, x, chunk_size=opts.chunk_size, dtype=opts.dtype,
                                      want_ess=opts.want_ess)
        return avg @ self.V.T, ParticleDiagnostics(ess=ess)

    @classmethod
    def example_setting(cls):
        """The softmax example (blow-up at t* = 0.586, V = I) with biases: the same t*."""
        Q, K, _, _, mean0, cov0 = example_data()
        return dict(attention=cls(Q, K, np.eye(2), q=[0.5], k_b=[-0.3]), mean0=mean0,
                    cov0=cov0, horizon=3.0, t_end=0.4)

    def __repr__(self):
        return (f"BiasedSoftmax(d={self.d}, k={self.k}, scale={self.scale:.6g}, "
                f"|q|={np.linalg.norm(self.q):.3g})")

    def __eq__(self, other):
        return (super().__eq__(other) and np.array_equal(other.q, self.q)
                and np.array_equal(other.k_b, self.k_b))

    def __hash__(self):
        return hash((super().__hash__(), self.q.tobytes(), self.k_b.tobytes()))


#: the compiled field of a softmax head with a query bias: the body and Jacobian parts
#: printed from the derivation (``derivations/biased_softmax.py``, softmax's programs with
#: the bias) into the generated module
FIELD = cf.HeadKernel(_gen.field_body, _gen.field_parts)
