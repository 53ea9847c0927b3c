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

from .._generated import sinkhorn as _gen
from ._base import SingleHeadAttention
from ._kernels import sinkhorn_average

__all__ = ["Sinkhorn"]


class Sinkhorn(SingleHeadAttention):
    r"""Sinkhorn (doubly stochastic) self-attention head with kernel :math:`e^{c\langle Qx, Ky\rangle}`.

    Parameters
    ----------
    Q, K : array_like, shape (k, d)
        Query and key matrices.
    V : array_like, shape (d, d)
        Value matrix.
    scale : float, optional
        Score scale :math:`c`, default :math:`1/\sqrt{k}`.
    """

    name = "sinkhorn"
    #: the field involves phi(B^T B) through an SVD: no closed-form Jacobian
    exact_jacobian = False
    _generated = _gen

    def mean_generator(self):
        r""":math:`V`: the mean obeys :math:`\alpha' = V\alpha` whatever :math:`\Sigma`."""
        return self.V.copy()

    def compiled_field(self):
        """The compiled field (:mod:`~gaussian_pde.attention._compiled_fields`): ``A = cK^TQ, V``."""
        from . import _compiled_fields as cf

        data = (self.A, self.V)
        return cf.combine(self.d, [cf.pack_head(cf.SINKHORN, self.k, self.d, data)])

    def _particle_velocity(self, x, opts):
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
