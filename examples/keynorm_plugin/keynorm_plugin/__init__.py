r"""Key-norm softmax attention for ``gaussian_pde``, registered from another package.

The score penalises the norm of the key token,

.. math:: s(x, y) = c\,(Qx)^T(Ky) - \tfrac{\gamma}{2}|y|^2,\qquad \gamma \ge 0,

which keeps Gaussians Gaussian (a score quadratic in the key token, as L2 attention's).
Against :math:`\mathcal N(\alpha, \Sigma)` the field is :math:`Mx + b` with

.. math:: M = V(I + \gamma\Sigma)^{-1}\Sigma A,\qquad b = V(I + \gamma\Sigma)^{-1}\alpha,
          \qquad A = cK^TQ,

derived in :mod:`keynorm_plugin.derivation`. Installing this distribution registers
:class:`KeyNormSoftmax` as ``"keynorm_softmax"`` through the entry-point group
``gaussian_pde.attentions``; it then runs in every solver of ``gaussian_pde``, the compiled
one included (its kernel: :mod:`keynorm_plugin._kernel`).
"""

from __future__ import annotations

import numpy as np

from gaussian_pde.attention import (
    ATTENTIONS,
    CompiledField,
    ParticleDiagnostics,
    QuadraticScore,
    SingleHeadAttention,
    normalized_average,
    normalized_definition_field,
    register_attention,
)

from ._kernel import compiled_kernels, pack, scratch_size

__all__ = ["KeyNormSoftmax"]
__version__ = "0.1.0"


class KeyNormSoftmax(SingleHeadAttention):
    r"""Softmax attention with a key-norm penalty, score :math:`c(Qx)^T(Ky) - \gamma|y|^2/2`.

    Parameters
    ----------
    %(weights)s
    gamma : float
        Key-norm penalty :math:`\gamma \ge 0`; ``0`` is :class:`gaussian_pde.Softmax`.
    %(scale)s
    """

    name = "keynorm_softmax"
    weight_names = ("Q", "K", "V", "scale", "gamma")
    definition_field = normalized_definition_field

    def __init__(self, Q, K, V, gamma, scale=None):
        if isinstance(gamma, (bool, np.bool_)) or not isinstance(gamma, (int, float, np.integer, np.floating)):
            raise TypeError(f"`gamma` must be a real number >= 0, got {type(gamma).__name__}.")
        if not (np.isfinite(gamma) and gamma >= 0):
            raise ValueError(f"`gamma` must be a finite number >= 0, got {gamma!r}.")
        object.__setattr__(self, "gamma", float(gamma))
        super().__init__(Q, K, V, scale)

    @classmethod
    def example(cls, d=2, rng=None):
        """A random instance with ``k = d`` and ``gamma = 1/2``."""
        return cls(*cls._example_weights(d, rng), gamma=0.5)

    @classmethod
    def example_setting(cls):
        """The built-in 2-D example with ``K = -Q``, ``V = I``, ``gamma = 1/2``."""
        from gaussian_pde.attention import example_data

        Q, _, _, _, mean0, cov0 = example_data()
        return dict(attention=cls(Q, -Q, np.eye(2), gamma=0.5), mean0=mean0, cov0=cov0)

    def weights(self):
        return self.Q, self.K, self.V, self.scale, self.gamma

    # -- the moment equations (closed form of keynorm_plugin.derivation) ----------------

    def _tilt(self, cov, rhs):
        r""":math:`(I + \gamma\Sigma)^{-1}` applied to ``rhs`` (stacks allowed)."""
        cov = np.asarray(cov, dtype=float)
        eye = np.eye(self.d)
        return np.linalg.solve(eye + self.gamma * cov, rhs)

    def field_matrix(self, cov):
        r""":math:`M = V(I + \gamma\Sigma)^{-1}\Sigma A`."""
        return self.V @ self._tilt(cov, np.asarray(cov, dtype=float)) @ self.A

    def field_offset(self, mean, cov):
        r""":math:`b = V(I + \gamma\Sigma)^{-1}\alpha`."""
        mean = np.asarray(mean, dtype=float)
        return (self.V @ self._tilt(cov, mean[..., None]))[..., 0]

    def moment_rhs(self, mean, cov):
        mean = np.asarray(mean, dtype=float)
        M = self.field_matrix(cov)
        dmean = (M @ mean[..., None])[..., 0] + self.field_offset(mean, cov)
        MS = M @ cov
        return dmean, MS + np.swapaxes(MS, -1, -2)

    def cov_rhs(self, cov):
        MS = self.field_matrix(cov) @ cov
        return MS + np.swapaxes(MS, -1, -2)

    def factor_rhs(self, L):
        L = np.asarray(L, dtype=float)
        return self.field_matrix(L @ np.swapaxes(L, -1, -2)) @ L

    def mean_is_linear(self):
        r"""True: :math:`\alpha' = (M + V(I + \gamma\Sigma)^{-1})\alpha`."""
        return True

    def quadratic_score(self):
        r""":math:`H = \gamma I`, :math:`A = cK^TQ` (``H`` None at :math:`\gamma = 0`)."""
        H = self.gamma * np.eye(self.d) if self.gamma > 0 else None
        return QuadraticScore(A=np.asarray(self.A), H=H, V=np.asarray(self.V))

    # -- the compiled path --------------------------------------------------------------

    def compiled_field(self):
        """The field compiled from :func:`keynorm_plugin._kernel.keynorm_field` (no closed-form Jacobian)."""
        rhs, jac = compiled_kernels()
        return CompiledField(rhs=rhs, jac=jac, params=pack(self.gamma, self.A, self.V),
                             d=self.d, ws_size=scratch_size(self.d), exact_jacobian=False)

    # -- tokens -------------------------------------------------------------------------

    def score_matrix(self, X, Y):
        r"""``S[i, j] = c(Qx_i)^T(Ky_j) - \gamma|y_j|^2/2``."""
        return X @ self.A.T @ Y.T - 0.5 * self.gamma * np.sum(Y * Y, axis=1)[None]

    def particle_kernel(self, x, opts):
        r"""Velocities :math:`V\sum_j w_{ij}x_j`, :math:`w_{ij} \propto e^{s(x_i, x_j)}`.

        The score as one inner product of features,
        :math:`s(x_i, x_j) = [cQx_i, 1]\cdot[Kx_j, -\gamma|x_j|^2/2]`.
        """
        qx, kx = self._projections(x)
        a = np.hstack([self.scale * qx, np.ones((x.shape[0], 1))])
        b = np.hstack([kx, -0.5 * self.gamma * np.sum(x * x, axis=1)[:, None]])
        avg, ess = normalized_average(a, b, x, chunk_size=opts.chunk_size, dtype=opts.dtype,
                                      want_ess=opts.want_ess)
        return avg @ self.V.T, ParticleDiagnostics(ess=ess)

    def __repr__(self):
        return (f"KeyNormSoftmax(d={self.d}, k={self.k}, gamma={self.gamma:.6g}, "
                f"scale={self.scale:.6g})")

    def __eq__(self, other):
        return super().__eq__(other) and other.gamma == self.gamma

    def __hash__(self):
        return hash((super().__hash__(), self.gamma))


def _installed():
    """Whether this distribution is installed (its entry point is then advertised)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution("gaussian-pde-keynorm")
    except PackageNotFoundError:
        return False
    return True


# Installed, the class is registered through the entry point when ``gaussian_pde`` is imported
# first; where this module is imported first, ``gaussian_pde`` (imported above, while this
# module was loading) skipped the entry point, and the class registers here. Imported from
# its folder without being installed, it is not registered (a plain class).
if _installed() and ATTENTIONS.get(KeyNormSoftmax.name) is not KeyNormSoftmax:
    register_attention(KeyNormSoftmax)
