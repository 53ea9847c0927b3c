r"""Masked (causal) softmax attention.

Every token carries a sequence position :math:`\tau \in [0, 1]` (uniform over the
sequence). A token at :math:`\tau` attends only to tokens at :math:`\tau' \le \tau`:

.. math::

    \Gamma[\mu](x, \tau) = V\,\frac{\int_{\tau'\le\tau} e^{s(x,y)}\,y\,d\mu(y, \tau')}
    {\int_{\tau'\le\tau} e^{s(x,y)}\,d\mu(y, \tau')},\qquad s(x,y) = c\,\langle Qx, Ky\rangle .

With position-independent data every prefix sees the same measure and the mean-field
field equals unmasked softmax attention (docs/math.md section 3); with position-dependent data
Gaussians are not preserved, so this type has no exact moment equations and
:func:`gaussian_pde.solve` rejects it.

Particles: tokens are sorted by position once per call; in sorted order token ``i``
attends to the prefix ``j < u_i`` with :math:`u_i = \#\{j : \tau_j \le \tau_i\}`, so a row
tile needs only the columns up to its largest :math:`u_i` (about half the work of
unmasked attention) and the diagonal tiles are masked entry by entry.
"""

from __future__ import annotations

import numpy as np

from ._base import SingleHeadAttention
from ._kernels import ParticleDiagnostics, normalized_average, softmax_features

__all__ = ["Masked", "default_positions"]


def default_positions(n):
    r"""Default sequence positions :math:`\tau_i = (i + 1/2)/n`: the array order."""
    return (np.arange(n) + 0.5) / n


def _no_closure(self, *args, **kwargs):
    raise TypeError(f"`attention` ({self.name}) does not preserve Gaussians for "
                    "position-dependent data: it has no exact moment equations; "
                    "use gaussian_pde.solve_masked_closure or simulate particles.")


class Masked(SingleHeadAttention):
    r"""Causal softmax self-attention head, score :math:`c\,\langle Qx, Ky\rangle`.

    Parameters
    ----------
    %(weights)s
    %(scale)s

    Notes
    -----
    Token positions are given to the particle functions (``positions=``); by default
    token ``i`` of ``n`` sits at :math:`(i + 1/2)/n`.
    """

    name = "masked"
    gaussian_preserving = False
    uses_positions = True

    field_matrix = field_offset = moment_rhs = cov_rhs = factor_rhs = _no_closure

    @classmethod
    def example_setting(cls):
        """:math:`K = -Q`, :math:`V = I`, a mean that moves with the position."""
        from ._examples import example_data

        Q, _, _, _, mean0, cov0 = example_data()

        def masked_mean(tau):
            return mean0 + np.outer(tau - 0.5, [2.0, -1.0])

        return dict(attention=cls(Q, -Q, np.eye(2)), mean0=masked_mean, cov0=cov0)

    def particle_kernel(self, x, opts):
        r"""Causal particle velocity :math:`V\sum_{\tau_j\le\tau_i} w_{ij}x_j / \sum_{\tau_j\le\tau_i} w_{ij}`."""
        n = x.shape[0]
        tau = default_positions(n) if opts.positions is None else opts.positions
        order = np.argsort(tau, kind="stable")
        tau_s = tau[order]
        upper = np.searchsorted(tau_s, tau_s, side="right")
        xs = x[order]
        qx, kx = self._projections(xs)
        a, b = softmax_features(self.scale * qx, kx)
        avg, ess = normalized_average(a, b, xs, chunk_size=opts.chunk_size, dtype=opts.dtype,
                                      want_ess=opts.want_ess, upper=upper)
        v = np.empty_like(avg)
        v[order] = avg @ self.V.T
        if ess is not None:
            ess_out = np.empty_like(ess)
            ess_out[order] = ess
            ess = ess_out
        return v, ParticleDiagnostics(ess=ess)
