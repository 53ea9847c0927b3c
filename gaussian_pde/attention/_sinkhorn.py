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

import numpy as np
from scipy.optimize import brentq
from scipy.special import logsumexp

from .._generated import sinkhorn as _gen
from . import _compiled_fields as cf
from ._base import SingleHeadAttention
from ._kernels import sinkhorn_average

__all__ = ["Sinkhorn"]


class Sinkhorn(SingleHeadAttention):
    r"""Sinkhorn (doubly stochastic) self-attention head with kernel :math:`e^{c\langle Qx, Ky\rangle}`.

    Parameters
    ----------
    %(weights)s
    %(scale)s
    """

    name = "sinkhorn"
    generated = _gen

    def mean_is_linear(self):
        r"""True: :math:`\alpha' = V\alpha`."""
        return True

    def scalar_solution(self, mean0, var0, t):
        r"""``d = 1``: :math:`s' = 2vas^2\varphi(a^2s^2)`, :math:`\alpha(t) = \alpha_0e^{vt}`.

        :math:`F(s) = -1/s - \sqrt{1 + 4a^2s^2}/s + 2|a|\operatorname{asinh}(2|a|s)`
        satisfies :math:`F(s) = F(s_0) + 4vat`, inverted by a bracketing root finder to
        machine precision (``F`` is monotone).
        """
        m0, s0 = mean0, var0
        a, v = self.scale * float(self.Q[:, 0] @ self.K[:, 0]), self.V[0, 0]
        if a == 0 or v == 0:
            return m0 * np.exp(v * t), np.full_like(t, s0)
        b = 2.0 * abs(a)

        def F(s):
            return -1.0 / s - np.sqrt(1.0 + b * b * s * s) / s + b * np.arcsinh(b * s)

        target = F(s0) + 4.0 * v * a * t
        out = np.empty_like(t)
        for i, rhs in np.ndenumerate(target):
            lo, hi = s0, s0
            if rhs >= F(s0):
                while F(hi) < rhs:
                    hi *= 2.0
                    if hi > 1e300:
                        raise ValueError("`t` reaches the blow-up time.")
            else:
                while F(lo) > rhs:
                    lo /= 2.0
            out[i] = brentq(lambda s, r=rhs: F(s) - r, lo, hi, xtol=1e-300, rtol=1e-15, maxiter=500)
        return m0 * np.exp(v * t), out

    def definition_field(self, Y, logw, X):
        """The conditional mean of the weighted entropic self-coupling, times ``V``."""
        g = _sinkhorn_potential(self.score_matrix(Y, Y), logw)
        S = self.score_matrix(X, Y) + g + logw
        P = np.exp(S - logsumexp(S, axis=1, keepdims=True))
        return (P @ Y) @ self.V.T

    @classmethod
    def example_setting(cls):
        """The 2-D example with K replaced by -K and a general ``V``."""
        from ._examples import example_data

        Q, K, V, _, mean0, cov0 = example_data()
        return dict(attention=cls(Q, -K, V), mean0=mean0, cov0=cov0)

    def mean_generator(self):
        r""":math:`V`: the mean obeys :math:`\alpha' = V\alpha` whatever :math:`\Sigma`."""
        return self.V.copy()

    def compiled_field(self):
        """The compiled field (:data:`FIELD`): weights ``A = cK^TQ, V``."""
        Q, K, V, c = self.weights()     # a subclass that changes the weights keeps its field
        data = (c * K.T @ Q, V)
        return cf.head_field(FIELD, self.k, self.d, data)

    def particle_kernel(self, x, opts):
        r"""Particle velocity :math:`V\sum_j n\pi_{ij}x_j` with :math:`\pi` the Sinkhorn plan.

        The plan is the doubly stochastic scaling of :math:`e^{c\langle Qx_i, Kx_j\rangle}`
        (log domain, uniform marginals, :func:`~gaussian_pde.attention._kernels.sinkhorn_average`);
        its potentials are kept in ``opts.state`` and warm-start the next call.
        """
        n = x.shape[0]
        qx, kx = self._projections(x)
        state = opts.state if opts.state is not None else {}
        f, g = state.get("f"), state.get("g")
        if f is None or f.shape != (n,) or not (np.all(np.isfinite(f)) and np.all(np.isfinite(g))):
            f = g = None
        avg, diag, f, g = sinkhorn_average(
            self.scale * qx, kx, x, f=f, g=g, tol=opts.sinkhorn_tol,
            max_iter=opts.sinkhorn_max_iter, chunk_size=opts.chunk_size, dtype=opts.dtype,
            want_ess=opts.want_ess, warn=opts.warn)
        state["f"], state["g"] = f, g
        return avg @ self.V.T, diag


def _sinkhorn_potential(S, logw, tol=1e-13, max_iter=20_000):
    r"""Column potential ``g`` of the weighted entropic self-coupling :math:`e^{S_{ij} + f_i + g_j} w_iw_j`."""
    f = np.zeros(S.shape[0])
    g = np.zeros(S.shape[1])
    for _ in range(max_iter):
        f = -logsumexp(S + g + logw, axis=1)
        g_new = -logsumexp(S.T + f + logw, axis=1)
        if np.max(np.abs(g_new - g)) < tol:
            return g_new
        g = g_new
    return g


#: the compiled field of a Sinkhorn head: the body printed from the derivation
#: (``derivations/sinkhorn.py``) into the generated module (no closed-form Jacobian:
#: differences)
FIELD = cf.HeadKernel(_gen.field_body)
