r"""Multi-head attention: the sum of the heads' velocity fields.

.. math:: \Gamma[\mu](x) = \sum_{h=1}^{H} \Gamma_h[\mu](x)

Each head is any Gaussian-preserving single-head type (softmax, L2, Sinkhorn), so the
field against a Gaussian is affine with :math:`M = \sum_h M_h`, :math:`b = \sum_h b_h`
and the moment equations are the sums of the heads' equations
(``derivations/multihead.py``).
"""

from __future__ import annotations

import numpy as np

from ._base import Attention
from ._kernels import ParticleDiagnostics
from ._l2 import L2
from ._softmax import Softmax

__all__ = ["MultiHead"]


class MultiHead(Attention):
    r"""Sum of attention heads.

    Parameters
    ----------
    heads : sequence of Attention
        Non-empty; all heads must share the token dimension ``d``.

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> Q = np.array([[1.0, 0.0]])
    >>> mh = gp.MultiHead([gp.Softmax(Q, -Q, np.eye(2)), gp.L2(Q, Q, np.eye(2))])
    >>> mh.d, len(mh.heads)
    (2, 2)
    """

    name = "multihead"
    #: every head preserves Gaussians (checked by the constructor), so the sum does
    gaussian_preserving = True

    def __init__(self, heads):
        if isinstance(heads, Attention):
            raise TypeError("`heads` must be a sequence of attention heads, not a single head.")
        try:
            heads = tuple(heads)
        except TypeError:
            raise TypeError(f"`heads` must be a sequence of attention heads, "
                            f"got {type(heads).__name__}.") from None
        if not heads:
            raise ValueError("`heads` must contain at least one head.")
        for i, h in enumerate(heads):
            if not isinstance(h, Attention):
                raise TypeError(f"`heads[{i}]` must be an attention type, got {type(h).__name__}.")
            if not h.gaussian_preserving:
                raise TypeError(f"`heads[{i}]` ({h.name}) does not preserve Gaussians; "
                                "MultiHead sums Gaussian-preserving heads.")
        dims = {h.d for h in heads}
        if len(dims) != 1:
            raise ValueError(f"all `heads` must have the same dimension d, got {sorted(dims)}.")
        self._heads = heads
        self._frozen = True

    @property
    def heads(self):
        """The heads (a tuple), whose fields add up to this one."""
        return self._heads

    @property
    def d(self) -> int:
        return self.heads[0].d

    @classmethod
    def from_heads(cls, heads):
        """``MultiHead(heads)``: the sum of the heads' fields."""
        return cls(heads)

    @classmethod
    def example(cls, d=2, rng=None, heads=None):
        """A random instance (see :meth:`Attention.example`): one softmax and one L2 head.

        ``heads`` (optional) gives the head classes instead, e.g. ``(gp.Softmax, gp.Sinkhorn)``
        (names are resolved by :func:`gaussian_pde.get_attention`, above this module).
        """
        rng = np.random.default_rng(rng)
        heads = (Softmax, L2) if heads is None else heads
        return cls([h.example(d, rng) for h in heads])

    def field_matrix(self, cov):
        return sum(h.field_matrix(cov) for h in self.heads)

    def field_offset(self, mean, cov):
        return sum(h.field_offset(mean, cov) for h in self.heads)

    def moment_rhs(self, mean, cov):
        parts = [h.moment_rhs(mean, cov) for h in self.heads]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    def cov_rhs(self, cov):
        return sum(h.cov_rhs(cov) for h in self.heads)

    def factor_rhs(self, L):
        return sum(h.factor_rhs(L) for h in self.heads)

    def mean_is_linear(self):
        r"""Whether every head's mean equation is linear in the mean (then so is the sum)."""
        return all(h.mean_is_linear() for h in self.heads)

    def riccati_matrix(self):
        r""":math:`\sum_h S_h` when every head has one, else ``None``."""
        return _sum_or_none([h.riccati_matrix() for h in self.heads])

    def scalar_solution(self, mean0, var0, t):
        """The heads' class's ``scalar_solution_of_sum`` when all heads share one, else None."""
        cls = type(self.heads[0])
        solve_sum = getattr(cls, "scalar_solution_of_sum", None)
        if solve_sum is None or any(type(h) is not cls for h in self.heads):
            return None
        return solve_sum(self.heads, mean0, var0, t)

    def definition_field(self, Y, logw, X):
        """The sum of the heads' fields from their definitions."""
        return sum(h.definition_field(Y, logw, X) for h in self.heads)

    @classmethod
    def example_setting(cls):
        """A softmax head with :math:`K = -Q`, :math:`V = I` plus an L2 head with :math:`K = -Q`."""
        from ._examples import example_data

        Q, _, V, q2, mean0, cov0 = example_data()
        return dict(attention=cls([Softmax(Q, -Q, np.eye(2)), L2(q2, -q2, V)]), mean0=mean0,
                    cov0=cov0)

    def compiled_field(self):
        """The sum of the heads' compiled fields, or ``None`` unless every head has one."""
        from ._compiled_fields import add

        return add([h.compiled_field() for h in self.heads])

    def mean_generator(self):
        r""":math:`\sum_h N_h` when every head's mean equation is free of :math:`\Sigma`, else ``None``."""
        return _sum_or_none([h.mean_generator() for h in self.heads])

    def particle_kernel(self, x, opts):
        r"""Sum of the heads' particle velocities; diagnostics of the worst head."""
        v = 0.0
        parts = []
        for i, h in enumerate(self.heads):
            vh, dh = h.particle_kernel(x, opts.for_head(i))
            v = v + vh
            parts.append(dh)
        return v, ParticleDiagnostics.combine(parts)

    def __repr__(self):
        return f"MultiHead([{', '.join(repr(h) for h in self.heads)}])"

    def __eq__(self, other):
        return type(other) is MultiHead and other.heads == self.heads

    def __hash__(self):
        return hash(("MultiHead",) + self.heads)


def _sum_or_none(parts):
    """The sum of the heads' closed-form pieces, or ``None`` if any head has none."""
    if any(p is None for p in parts):
        return None
    return sum(parts)
