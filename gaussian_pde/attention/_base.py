r"""Base classes for attention types.

An attention type is a small immutable object that defines the velocity field
:math:`\Gamma[\mu](x)` of the Transformer PDE (docs/math.md section 2)

.. math::

    \partial_t \mu + \nabla\cdot(\mu\,\Gamma[\mu]) = 0 .

Every Gaussian-preserving type implements the same two hooks, which give the affine
field :math:`\Gamma[\mathcal N(\alpha,\Sigma)](x) = b + M x`:

``field_matrix(cov)``
    :math:`M(\Sigma)`, shape ``(..., d, d)``;
``field_offset(mean, cov)``
    :math:`b(\alpha, \Sigma)`, shape ``(..., d)``.

The moment equations (docs/math.md section 3) then follow for every type alike:
:math:`\alpha' = b + M\alpha`, :math:`\Sigma' = M\Sigma + \Sigma M^T`.
"""

from __future__ import annotations

import abc

import numpy as np

from .._common.validation import validate_matrix, validate_positive
from ._kernels import make_options

__all__ = ["Attention", "SingleHeadAttention", "CLOSURES"]


#: the values of :attr:`Attention.closure` for types that do not preserve Gaussians
CLOSURES = ("quadrature", "block_causal")


class Attention(abc.ABC):
    r"""Abstract attention type (one velocity field of the Transformer PDE).

    What a type can do is declared on the type, as class attributes that the solvers,
    the closure engine, the particle code, the sweeps and the tests read (no code tests
    an attention by its name or class to decide what to do with it).

    Attributes
    ----------
    name : str
        Registry name, e.g. ``"softmax"`` (:data:`gaussian_pde.ATTENTIONS`).
    gaussian_preserving : bool
        Whether the PDE maps Gaussians to Gaussians: the field against
        :math:`\mathcal N(\alpha,\Sigma)` is affine, :meth:`field_matrix`,
        :meth:`field_offset`, :meth:`moment_rhs`, :meth:`cov_rhs` and :meth:`factor_rhs`
        give the exact moment equations, and :func:`gaussian_pde.moment_rhs` and
        :func:`gaussian_pde.solve` accept the type. Otherwise those hooks raise
        ``TypeError`` and :attr:`closure` says what replaces them. Default ``True``.
    exact_jacobian : bool
        Whether the factor-form field :math:`L' = F(L)` has an exact (closed-form)
        Jacobian that the stiff integrators of :mod:`gaussian_pde.integrate` use instead
        of finite differences. Its right-hand side is then analytic in :math:`L` (sums,
        products and solves, no eigen- or singular-value decomposition; L2 evaluates its
        solve through an SVD for accuracy, but takes the solve for a complex argument),
        so the complex step :math:`\operatorname{Im} F(L + i\delta E)/\delta` is exact too. ``True``
        for softmax and L2, ``False`` for Sinkhorn (its :math:`\varphi` uses an SVD), for
        the non-Gaussian-preserving types, and by default: a new type leaves it
        ``False`` (the closed forms cover the softmax and L2 heads only).
        :class:`~gaussian_pde.MultiHead`: ``True`` iff every head has it (on the class:
        ``False``, what holds for every instance).
    closure : {None, "quadrature", "block_causal"}
        How the type is handled when it does not preserve Gaussians:

        ``None``
            exact moment equations (every Gaussian-preserving type); for a type that
            does not preserve Gaussians, no Gaussian closure (particles only);
        ``"quadrature"``
            the Gaussian closure of :func:`gaussian_pde.solve_closure`: the field against
            the Gaussian by quadrature (Stein's lemma in the score for sigmoid), moments
            by Gauss-Hermite quadrature (:class:`~gaussian_pde.AttentionField`);
        ``"block_causal"``
            tokens carry positions; the block-causal family of Gaussians of
            :func:`gaussian_pde.solve_masked_closure` (masked attention, also the masked
            layers of :class:`~gaussian_pde.Stack`).
    uses_positions : bool
        Whether tokens carry sequence positions in ``[0, 1]`` (masked attention): the
        particle functions take ``positions=``. Default ``False``.

    Notes
    -----
    The hooks a type implements:

    ``d``, ``field_matrix``, ``field_offset``, ``moment_rhs``, ``cov_rhs``, ``factor_rhs``
        the affine field and the moment equations (abstract; non-Gaussian-preserving
        types make them raise ``TypeError``);
    ``factor_kernel``
        optional fast closure ``L -> L'``;
    ``mean_generator``
        optional: the constant :math:`N` of a mean equation :math:`\alpha' = N\alpha`
        that does not involve :math:`\Sigma` (Sinkhorn), which :func:`gaussian_pde.solve`
        then solves in closed form; ``None`` by default;
    ``_particle_velocity(x, opts)``
        the particle kernel: unchecked velocities :math:`\Gamma[\mu_n](x_i)` of the
        tokens ``x`` (shape ``(n, d)``, validated) with validated
        :class:`~gaussian_pde.attention._kernels.ParticleOptions`; returns ``(v, diag)``,
        ``v`` of shape ``(n, d)`` and a :class:`~gaussian_pde.ParticleDiagnostics`.
        :meth:`particle_velocity` (the public entry) and
        :func:`gaussian_pde.simulate_particles` call it; every registered type provides
        it (:func:`gaussian_pde.register_attention` checks);
    ``example(d, rng)``
        a random valid instance of dimension ``d`` (classmethod), which the tests that
        run over the registry use: a new type supplies one (single-head types inherit
        that of :class:`SingleHeadAttention`).
    """

    #: registry name, e.g. ``"softmax"``
    name: str = ""
    #: whether the PDE maps Gaussians to Gaussians for this type
    gaussian_preserving: bool = True
    #: whether the factor-form field has an exact (closed-form) Jacobian
    exact_jacobian: bool = False
    #: None (exact moment ODE), "quadrature" or "block_causal" (see :data:`CLOSURES`)
    closure: str | None = None
    #: whether tokens carry sequence positions (masked attention)
    uses_positions: bool = False

    @property
    @abc.abstractmethod
    def d(self) -> int:
        """Token dimension."""

    @abc.abstractmethod
    def field_matrix(self, cov):
        r"""Linear part :math:`M(\Sigma)` of the affine field, shape ``(..., d, d)``."""

    @abc.abstractmethod
    def field_offset(self, mean, cov):
        r"""Constant part :math:`b(\alpha, \Sigma)` of the affine field, shape ``(..., d)``."""

    @abc.abstractmethod
    def moment_rhs(self, mean, cov):
        r"""Unchecked :math:`(\alpha', \Sigma')`; the public entry is :func:`gaussian_pde.moment_rhs`."""

    @abc.abstractmethod
    def cov_rhs(self, cov):
        r"""Unchecked :math:`\Sigma'` (the covariance equation does not involve the mean)."""

    @abc.abstractmethod
    def factor_rhs(self, L):
        r"""Unchecked :math:`L'` of the factor form :math:`\Sigma = LL^T` (keeps rank and PSD)."""

    def factor_kernel(self):
        r"""A fast closure ``kernel(L) -> L'`` for one unbatched ``(d, d)`` factor.

        Same numbers as :meth:`factor_rhs` up to rounding; used by :func:`solve`, where
        the right-hand side is called thousands of times on one small matrix. The default
        calls :meth:`factor_rhs`; generated types hoist the weight-only products.
        """
        return self.factor_rhs

    def compiled_field(self):
        r"""The factor field compiled (Numba), for the compiled integrators; ``None`` by default.

        A type that supplies one returns a
        :class:`~gaussian_pde.attention._compiled_fields.CompiledField`: kernels of
        fixed signatures for :math:`Z' = [M(\Sigma)L \mid b + M\alpha]` and its
        closed-form Jacobian, and its weights packed into one float64 vector.
        :func:`gaussian_pde.solve_batch` then runs its compiled integrator; where this
        returns ``None`` it runs the vectorised NumPy loop.
        """
        return None

    def mean_generator(self):
        r"""The matrix :math:`N` with :math:`\alpha' = N\alpha` whatever :math:`\Sigma`, or ``None``.

        A type whose mean's equation does not involve the covariance (Sinkhorn:
        :math:`\alpha' = V\alpha`) returns :math:`N`; the mean is then
        :math:`\alpha(t) = e^{(t - t_0)N}\alpha_0` exactly, and :func:`gaussian_pde.solve`
        integrates the covariance alone. ``None`` (the default) where the mean's
        equation involves :math:`\Sigma` (softmax, L2) or is not known.
        """
        return None

    def velocity(self, mean, cov, x):
        r"""The affine field :math:`\Gamma[\mathcal N(\alpha,\Sigma)](x) = b + Mx` at tokens ``x`` (..., d)."""
        return self.field_offset(mean, cov) + x @ self.field_matrix(cov).T

    def particle_velocity(self, x, *, positions=None, chunk_size=None, dtype=np.float64,
                          state=None, want_ess=False, sinkhorn_tol=None,
                          sinkhorn_max_iter=1000, warn=True):
        r"""Velocities :math:`\Gamma[\mu_n](x_i)` of the particle system (docs/math.md section 1).

        The attention is computed in tiles of at most ``chunk_size`` query rows (see
        :mod:`gaussian_pde.attention._kernels`), so no ``n x n`` array is formed when
        ``n > chunk_size``.

        Parameters
        ----------
        x : array_like, shape (n, d)
            Token positions :math:`x_1, \dots, x_n` (the empirical measure :math:`\mu_n`).
        positions : array_like, shape (n,), optional
            Sequence positions in ``[0, 1]`` (masked attention only; default
            :math:`(i + 1/2)/n`, the array order).
        chunk_size : int, optional
            Query rows per tile (default 512); at least 1.
        dtype : numpy.float64 or numpy.float32
            Precision of the tiles (float32 is about twice as fast; its accuracy is
            stated in the README).
        state : dict, optional
            Mutable store for warm starts (Sinkhorn potentials) between calls.
        want_ess : bool
            Also compute the effective sample size of every query's attention weights.
        sinkhorn_tol, sinkhorn_max_iter : float, int
            Sinkhorn only: tolerance on the column marginal error (default ``1e-8``, or
            ``1e-4`` in float32) and iteration cap.
        warn : bool
            Sinkhorn only: warn when the cap is reached above tolerance.

        Returns
        -------
        v : ndarray, shape (n, d)
            Velocities.
        diag : ParticleDiagnostics
            Effective sample sizes, Sinkhorn marginal error and iterations.
        """
        from .._common.validation import validate_particles

        x = validate_particles(x, "x", d=self.d)
        opts = make_options(x.shape[0], positions=positions, chunk_size=chunk_size,
                            dtype=dtype, state=state, want_ess=want_ess,
                            sinkhorn_tol=sinkhorn_tol, sinkhorn_max_iter=sinkhorn_max_iter,
                            warn=warn)
        return self._particle_velocity(x, opts)

    def _particle_velocity(self, x, opts):
        r"""The particle kernel: unchecked velocities :math:`\Gamma[\mu_n](x_i)`.

        Every attention type implements this hook (the registry refuses a type that
        does not); :meth:`particle_velocity` validates the arguments and calls it.

        Parameters
        ----------
        x : ndarray, shape (n, d)
            Validated token positions (float64, finite).
        opts : ParticleOptions
            Validated options (:func:`~gaussian_pde.attention._kernels.make_options`):
            positions, tile size, precision, warm-start state, ESS request, Sinkhorn
            tolerance.

        Returns
        -------
        v : ndarray, shape (n, d)
        diag : ParticleDiagnostics
        """
        raise NotImplementedError(f"{type(self).__name__} has no particle velocity.")

    @classmethod
    def example(cls, d=2, rng=None):
        """A random valid instance of dimension ``d`` (for the tests run over the registry).

        Parameters
        ----------
        d : int
            Token dimension.
        rng : numpy.random.Generator, int or None
            Source of the random weights (``numpy.random.default_rng(rng)``).

        Returns
        -------
        Attention
            Weights of order one, so that the moment equations and the particle
            velocities are tame for covariances of order one.
        """
        raise NotImplementedError(f"{cls.__name__} does not define `example(d, rng)`.")

    def __setattr__(self, key, value):
        if getattr(self, "_frozen", False):
            raise AttributeError(f"{type(self).__name__} objects are immutable.")
        object.__setattr__(self, key, value)


class SingleHeadAttention(Attention):
    r"""An attention head with query, key and value matrices.

    Parameters
    ----------
    Q, K : array_like, shape (k, d)
        Query and key matrices.
    V : array_like, shape (d, d)
        Value matrix (already multiplied by the output map).
    scale : float, optional
        Score scale; defaults to :math:`1/\sqrt{k}`.

    Notes
    -----
    The interaction matrix is :math:`A = \text{scale}\, K^T Q`, so that
    :math:`\text{scale}\,\langle Qx, Ky\rangle = y^T A x`.
    """

    def __init__(self, Q, K, V, scale=None):
        Q = validate_matrix(Q, "Q")
        k, d = Q.shape
        K = validate_matrix(K, "K", shape=(k, d))
        V = validate_matrix(V, "V", shape=(d, d))
        if scale is None:
            scale = 1.0 / np.sqrt(k)
        scale = validate_positive(scale, "scale")
        for arr in (Q, K, V):
            arr.setflags(write=False)
        self.Q, self.K, self.V, self.scale = Q, K, V, scale
        self._frozen = True

    #: module generated by ``derivations/generate.py`` with the right-hand sides
    _generated = None

    @classmethod
    def example(cls, d=2, rng=None):
        """A random instance: ``cls(Q, K, V)`` with ``k = d`` and weights of order one.

        See :meth:`Attention.example`; a subclass with more constructor arguments
        overrides it.
        """
        return cls(*cls._example_weights(d, rng))

    @staticmethod
    def _example_weights(d, rng):
        """Random ``Q``, ``K`` (``d x d``, entries of size 1/2) and ``V`` (spectral size ~1)."""
        rng = np.random.default_rng(rng)
        Q = 0.5 * rng.standard_normal((d, d))
        K = 0.5 * rng.standard_normal((d, d))
        V = rng.standard_normal((d, d)) / np.sqrt(d)
        return Q, K, V

    @property
    def d(self) -> int:
        return self.Q.shape[1]

    def _weights(self):
        return self.Q, self.K, self.V, self.scale

    def field_matrix(self, cov):
        return self._generated.field_matrix(*self._weights(), cov)

    def field_offset(self, mean, cov):
        return self._generated.field_offset(*self._weights(), mean, cov)

    def moment_rhs(self, mean, cov):
        return self._generated.moment_rhs(*self._weights(), mean, cov)

    def cov_rhs(self, cov):
        return self._generated.cov_rhs(*self._weights(), cov)

    def factor_rhs(self, L):
        return self._generated.factor_rhs(*self._weights(), L)

    def factor_kernel(self):
        make = getattr(self._generated, "factor_kernel", None)
        return self.factor_rhs if make is None else make(*self._weights())

    def _projections(self, x):
        """Queries :math:`Qx_i` and keys :math:`Kx_i` of the tokens, shape (n, k) each."""
        return x @ self.Q.T, x @ self.K.T

    @property
    def k(self) -> int:
        """Number of rows of the query and key matrices."""
        return self.Q.shape[0]

    @property
    def A(self):
        r"""Interaction matrix :math:`A = \text{scale}\,K^T Q` (``d x d``)."""
        return self.scale * self.K.T @ self.Q

    def __repr__(self):
        return f"{type(self).__name__}(d={self.d}, k={self.k}, scale={self.scale:.6g})"

    def __eq__(self, other):
        return (
            type(other) is type(self)
            and other.scale == self.scale
            and all(np.array_equal(a, b) for a, b in
                    zip((self.Q, self.K, self.V), (other.Q, other.K, other.V)))
        )

    def __hash__(self):
        return hash((type(self).__name__, self.scale, self.Q.tobytes(), self.K.tobytes(),
                     self.V.tobytes()))
