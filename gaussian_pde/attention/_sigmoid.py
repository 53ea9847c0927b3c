r"""Sigmoid attention (not normalised).

.. math::

    \Gamma[\mu](x) = V \int \sigma\big(s(x,y) + b\big)\, y \, d\mu(y),\qquad
    s(x, y) = c\,\langle Qx, Ky\rangle,\qquad \sigma(z) = \frac{1}{1 + e^{-z}} .

The weights are not normalised, so the field against a Gaussian is not affine and
Gaussians are not preserved (docs/math.md section 3.4): there are no exact moment equations, and
:func:`gaussian_pde.moment_rhs` and :func:`gaussian_pde.solve` reject this type. The
particle system :math:`\dot x_i = V\frac1n\sum_j \sigma(s(x_i,x_j) + b)\,x_j` is simulated
by :func:`gaussian_pde.particles._simulate.simulate_particles`.
"""

from __future__ import annotations

import numbers

import numpy as np
from scipy.special import expit

from .._common.gaussian import logistic_normal_moments
from ._base import SingleHeadAttention
from ._kernels import ParticleDiagnostics, sigmoid_average

__all__ = ["Sigmoid"]


def _no_closure(self, *args, **kwargs):
    raise TypeError(f"`attention` ({self.name}) does not preserve Gaussians: it has no exact "
                    "moment equations; use the Gaussian closure (gaussian_pde.solve_closure) "
                    "or simulate particles.")


class Sigmoid(SingleHeadAttention):
    r"""Sigmoid self-attention head, weights :math:`\sigma(c\,\langle Qx, Ky\rangle + b)`.

    Parameters
    ----------
    %(weights)s
    bias : float
        The bias :math:`b` inside the logistic function (default 0).
    %(scale)s

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> att = gp.Sigmoid(np.eye(2), np.eye(2), np.eye(2), bias=-1.0)
    >>> att.gaussian_preserving, att.bias
    (False, -1.0)
    """

    name = "sigmoid"
    gaussian_preserving = False

    def __init__(self, Q, K, V, bias=0.0, scale=None):
        if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not np.isfinite(bias):
            raise TypeError(f"`bias` must be a finite real number, got {bias!r}.")
        self.bias = float(bias)
        super().__init__(Q, K, V, scale=scale)

    field_matrix = field_offset = moment_rhs = cov_rhs = factor_rhs = _no_closure

    @classmethod
    def example(cls, d=2, rng=None):
        """A random instance (see :meth:`Attention.example`), bias in ``[-1, 1]``."""
        rng = np.random.default_rng(rng)
        Q, K, V = cls._example_weights(d, rng)
        return cls(Q, K, V, bias=float(rng.uniform(-1.0, 1.0)))

    def gaussian_closure_field(self, mean, cov, x, tol):
        r"""Stein's lemma in the score :math:`z = y^TAx + b \sim \mathcal N(\alpha^TAx + b,\ x^TA^T\Sigma Ax)`.

        .. math:: \Gamma(x) = V\big(\alpha\,\mathbb E[\sigma(z)] + \Sigma A x\,\mathbb E[\sigma'(z)]\big),

        the one-dimensional expectations by
        :func:`~gaussian_pde.logistic_normal_moments` (error bound ``tol``).
        """
        A = self.A
        u = x @ A.T                             # u_i = A x_i
        m = u @ mean + self.bias
        s = np.sqrt(np.clip(np.einsum("ij,jk,ik->i", u, cov, u), 0.0, None))
        e_sig, e_dsig, _ = logistic_normal_moments(m, s, tol)
        return (e_sig[:, None] * mean + e_dsig[:, None] * (u @ cov)) @ self.V.T

    def definition_field(self, Y, logw, X):
        r""":math:`\Gamma(x_i) = V\sum_j w_j\,\sigma(s(x_i, y_j) + b)\,y_j` (weights normalised to one)."""
        w = np.exp(logw - np.max(logw))
        w = w / w.sum()
        return (expit(self.score_matrix(X, Y) + self.bias) * w) @ Y @ self.V.T

    @classmethod
    def example_setting(cls):
        """The 2-D example with K replaced by -K, a general ``V`` and bias ``-1/2``."""
        from ._examples import example_data

        Q, K, V, _, mean0, cov0 = example_data()
        return dict(attention=cls(Q, -K, V, bias=-0.5), mean0=mean0, cov0=cov0)

    def particle_kernel(self, x, opts):
        r"""Particle velocity :math:`V\frac1n\sum_j \sigma(c\langle Qx_i, Kx_j\rangle + b)\,x_j`."""
        qx, kx = self._projections(x)
        avg, ess = sigmoid_average(self.scale * qx, kx, x, self.bias,
                                   chunk_size=opts.chunk_size, dtype=opts.dtype,
                                   want_ess=opts.want_ess)
        return avg @ self.V.T, ParticleDiagnostics(ess=ess)

    def __repr__(self):
        return f"Sigmoid(d={self.d}, k={self.k}, scale={self.scale:.6g}, bias={self.bias:.6g})"

    def __eq__(self, other):
        return super().__eq__(other) and other.bias == self.bias

    def __hash__(self):
        return hash((super().__hash__(), self.bias))
