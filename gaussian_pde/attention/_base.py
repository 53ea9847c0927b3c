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
import warnings
import weakref

import numpy as np
from scipy.special import logsumexp

from .._common.validation import validate_matrix, validate_positive
from ._kernels import make_options

__all__ = ["Attention", "SingleHeadAttention", "CLOSURES", "DEPRECATED_HOOKS", "has_hook",
           "normalized_definition_field"]


#: the values of :attr:`Attention.closure` for types that do not preserve Gaussians
CLOSURES = ("quadrature", "block_causal")


def has_hook(cls, hook):
    """Whether ``cls`` implements the contract method ``hook`` (overrides the default)."""
    return getattr(cls, hook).__func__ is not getattr(Attention, hook).__func__ \
        if isinstance(Attention.__dict__.get(hook), classmethod) \
        else getattr(cls, hook) is not getattr(Attention, hook)


class _ExactJacobian:
    """Derived capability: whether the type's compiled field has a closed-form Jacobian.

    On an instance: whether its :meth:`~Attention.compiled_field` exists and its
    Jacobian kernel has a closed form (``CompiledField.exact_jacobian``; for a sum of
    heads, every head's). On the class: what holds for every instance, read off the
    compiled field of its ``example`` (once per class; it compiles the kernels, or loads
    them from the disk cache), and False for a type that sums heads (it depends on the
    heads) or that does not preserve Gaussians.
    """

    def __get__(self, obj, owner=None):
        if obj is not None:
            field = obj.compiled_field()
            return bool(field is not None and field.exact_jacobian)
        return _class_exact_jacobian(owner)


#: class -> its exact_jacobian (the compiled field of its example)
_EXACT_JACOBIAN = weakref.WeakKeyDictionary()


def _class_exact_jacobian(cls):
    """:class:`_ExactJacobian` on the class ``cls``."""
    if (not cls.gaussian_preserving or not has_hook(cls, "compiled_field")
            or has_hook(cls, "from_heads")):
        return False
    if cls not in _EXACT_JACOBIAN:
        try:
            att = cls.example(2, 0)
        except (NotImplementedError, TypeError):     # no example to read it off
            _EXACT_JACOBIAN[cls] = False
        else:
            _EXACT_JACOBIAN[cls] = _ExactJacobian().__get__(att)
    return _EXACT_JACOBIAN[cls]


#: hooks that the event loop no longer calls: the field and its Jacobian come from
#: ``compiled_field`` (else from ``factor_rhs`` and ``moment_rhs``)
DEPRECATED_HOOKS = ("fused_term", "fused_rhs", "factor_kernel", "jacobian_parts",
                    "jacobian_holds")


class _FieldSeesMean:
    r"""Derived capability: whether the type implements ``field_matrix_with_mean``.

    Such a type's field matrix :math:`M(\alpha, \Sigma)` depends on the mean, so its
    covariance equation cannot be integrated without the mean. On an instance: whether
    any of its heads does.
    """

    def __get__(self, obj, owner=None):
        if obj is None:
            return has_hook(owner, "field_matrix_with_mean")
        return any(has_hook(type(h), "field_matrix_with_mean") if h is obj
                   else h.field_sees_mean for h in obj.heads)


class _Closure:
    """Derived capability: how a type without exact moments is closed.

    ``"block_causal"`` for a type with token positions, ``"quadrature"`` for one that
    implements ``gaussian_closure_field``, else ``None``.
    """

    def __get__(self, obj, owner=None):
        cls = owner if obj is None else type(obj)
        if cls.uses_positions:
            return "block_causal"
        if has_hook(cls, "gaussian_closure_field"):
            return "quadrature"
        return None


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
        Derived, not declared: whether the Jacobian kernel of the type's
        :meth:`compiled_field` has a closed form, which the stiff integrators of
        :mod:`gaussian_pde.integrate` use instead of differences. Read on an instance
        it holds iff its compiled field has one (a sum of heads: every head's);
        on the class, what holds for every instance (:class:`~gaussian_pde.MultiHead`:
        ``False``).
    closure : {None, "quadrature", "block_causal"}
        Derived, not declared: how the type is handled when it does not preserve
        Gaussians (``"block_causal"`` where it uses positions, ``"quadrature"`` where it
        implements :meth:`gaussian_closure_field`):

        ``None``
            exact moment equations (every Gaussian-preserving type); for a type that
            does not preserve Gaussians, no Gaussian closure (particles only);
        ``"quadrature"``
            the Gaussian closure of :func:`gaussian_pde.solve_closure`: the field against
            the Gaussian of :meth:`gaussian_closure_field`, moments
            by Gauss-Hermite quadrature (:class:`~gaussian_pde.AttentionField`);
        ``"block_causal"``
            tokens carry positions; the block-causal family of Gaussians of
            :func:`gaussian_pde.solve_masked_closure` (masked attention, also the masked
            layers of :class:`~gaussian_pde.Stack`).
    uses_positions : bool
        Whether tokens carry sequence positions in ``[0, 1]`` (masked attention): the
        particle functions take ``positions=``. Default ``False``.
    field_sees_mean : bool
        Derived, not declared: whether the type implements
        :meth:`field_matrix_with_mean`, i.e. its field matrix :math:`M(\alpha,\Sigma)`
        depends on the mean (linear attention, :math:`M = V(\Sigma + \alpha\alpha^T)A`).
        Then the covariance equation involves the mean: the solvers require a mean
        (``mean0``, ``mean0s``), and the mean-free hooks (:meth:`field_matrix`,
        :meth:`cov_rhs`, :meth:`factor_rhs`) raise ``TypeError``.
        On an instance it holds iff one of its :attr:`heads` has it.

    Notes
    -----
    **The contract.** Everything the solvers, closures, particles, studies, sweeps and
    the CLI know about a type, they learn by calling these methods; what a type can do
    is what it implements (:func:`gaussian_pde.attention.capabilities` reads it off the
    class), never its name or class. A hook that a type does not implement keeps the
    default below, which either computes the answer from the other hooks or returns
    ``None`` ("not available": the caller then takes the general path or refuses).

    Exact moments (Gaussian-preserving types):

    ``d``, ``field_matrix(cov)``, ``field_offset(mean, cov)``, ``moment_rhs``, ``cov_rhs``, ``factor_rhs``
        the affine field and the moment equations (abstract; non-Gaussian-preserving
        types make them raise ``TypeError``);
    ``field_matrix_with_mean(cov, mean)``
        :math:`M(\alpha, \Sigma)`, what every caller that holds the mean asks for; the
        default is ``field_matrix(cov)`` (summed over :attr:`heads`). A type whose
        field matrix depends on the mean implements it (then ``field_sees_mean``);
    ``heads``
        the heads whose fields add up to this one (``(self,)``; :class:`MultiHead` its
        heads): every per-head hook below is summed over ``heads`` by its caller;
    ``weights()`` and ``generated``
        the arrays the generated module's functions take, and that module
        (``derivations/<name>.py`` writes it; ``None`` for a type without one): with
        both, ``solve_batch`` stacks the type;
    ``mean_is_linear()``
        whether :math:`\alpha' = N(\Sigma)\alpha` (a zero mean stays zero); default False;
    ``compiled_field()``
        optional, the Numba kernels of the factor field and of its Jacobian: the one
        source of the field that every integrator evaluates (the compiled batch
        integrator, and the event loop of :func:`gaussian_pde.solve`); without one the
        event loop evaluates ``factor_rhs`` and ``moment_rhs`` and its stiff steps take
        differences (default ``None``);
    ``mean_generator()``
        optional constant :math:`N` of :math:`\alpha' = N\alpha` (Sinkhorn), or ``None``;
    ``riccati_matrix()``
        optional :math:`S` with :math:`\Sigma' = \Sigma S\Sigma` (closed-form covariance
        and blow-up time), or ``None``;
    ``scalar_solution(mean0, var0, t)``
        optional closed-form ``(mean(t), var(t))`` for ``d = 1``, or ``None``.

    Closures:

    ``quadratic_score()``
        a :class:`~gaussian_pde.attention.QuadraticScore` (the score is
        :math:`-\tfrac12 y^THy + y^TAx + r(x)`: the mixture closure, the certified
        limits, the batched particles of the studies), or ``None``;
    ``mixture_field(logw, means, covs, x)``
        for a head without a quadratic score: its field at the tokens ``x`` against the
        mixture :math:`\sum_k w_k\mathcal N(\alpha_k, \Sigma_k)` in closed form (the
        mixture closure), or ``None`` (default);
    ``second_moment_map()``
        ``(V, A)`` for a head whose field against every distribution is
        :math:`\Gamma[\mu](x) = V\,\mathbb E_\mu[yy^T]A\,x` (the mixture closure's
        compiled kernel then takes it), or ``None`` (default);
    ``gaussian_closure_field(mean, cov, x, tol)``
        for a type that does not preserve Gaussians: its field against the Gaussian
        at the tokens ``x`` (the Gaussian closure of :func:`gaussian_pde.solve_closure`),
        or ``None``;
    ``definition_field(Y, logw, X)``
        the field from its definition against the weighted measure
        :math:`\sum_j w_j\delta_{y_j}` (quadrature checks of the closure engine); raises
        ``TypeError`` by default;
    ``closure``, ``uses_positions``
        ``"block_causal"`` and ``True`` for masked attention (token positions).

    Particles and examples:

    ``particle_kernel(x, opts)``
        the particle kernel: unchecked velocities :math:`\Gamma[\mu_n](x_i)` of the
        tokens ``x`` (shape ``(n, d)``, validated) with validated
        :class:`~gaussian_pde.attention.ParticleOptions`; returns ``(v, diag)``,
        ``v`` of shape ``(n, d)`` and a :class:`~gaussian_pde.ParticleDiagnostics`.
        Every registered type provides it (:func:`gaussian_pde.register_attention`
        checks);
    ``example(d, rng)`` (classmethod)
        a random valid instance of dimension ``d``, for the tests run over the registry;
    ``example_setting()`` (classmethod)
        optional built-in 2-D example ``dict(attention, mean0, cov0, horizon, t_end)``
        of the main job and ``compare`` (``mean0`` callable for positions), or ``None``;
    ``from_heads(heads)`` (classmethod)
        for a type that sums heads (:class:`MultiHead`): the instance whose field is
        :math:`\sum_h\Gamma_h`; ``None`` (the default) for a single head. Samplers that
        build a sum of heads (sweeps) ask the registry for a type implementing it.

    Deprecated: ``fused_term``, ``fused_rhs``, ``factor_kernel``, ``jacobian_parts`` and
    ``jacobian_holds`` (:data:`DEPRECATED_HOOKS`), the NumPy right-hand sides and
    Jacobian pieces of an earlier contract. No integrator calls them: the field and its
    Jacobian come from ``compiled_field`` (else from ``factor_rhs`` and ``moment_rhs``,
    which those hooks had to agree with). A class that still defines one is accepted,
    with a ``DeprecationWarning`` at its definition.
    """

    #: registry name, e.g. ``"softmax"``
    name: str = ""
    #: whether the PDE maps Gaussians to Gaussians for this type
    gaussian_preserving: bool = True
    #: derived: "block_causal" (positions), "quadrature" (gaussian_closure_field) or None
    closure = _Closure()
    #: whether tokens carry sequence positions (masked attention)
    uses_positions: bool = False
    #: derived: whether the field matrix depends on the mean (implements field_matrix_with_mean)
    field_sees_mean = _FieldSeesMean()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        stale = [hook for hook in DEPRECATED_HOOKS if hook in vars(cls)]
        if stale:
            warnings.warn(
                f"{cls.__name__} defines {', '.join(f'`{h}`' for h in stale)}, which no "
                "integrator calls any more: the field and its Jacobian come from "
                "`compiled_field()` (else from `factor_rhs` and `moment_rhs`); remove "
                "them (see docs/adding_an_attention_type.md).",
                DeprecationWarning, stacklevel=2)

    @property
    @abc.abstractmethod
    def d(self) -> int:
        """Token dimension."""

    @abc.abstractmethod
    def field_matrix(self, cov):
        r"""Linear part :math:`M(\Sigma)` of the affine field, shape ``(..., d, d)``."""

    def field_matrix_with_mean(self, cov, mean):
        r""":math:`M(\alpha, \Sigma)`, the linear part of the field against :math:`\mathcal N(\alpha,\Sigma)`.

        Every caller that holds the mean asks for this. The default, for a field matrix
        that does not involve the mean, is :meth:`field_matrix` (each head's own, summed
        over :attr:`heads`, so that a head whose matrix involves the mean is asked with it).
        """
        heads = self.heads
        if len(heads) == 1 and heads[0] is self:
            return self.field_matrix(cov)
        return sum(h.field_matrix_with_mean(cov, mean) for h in heads)

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

    @property
    def heads(self):
        """The heads whose fields add up to this one: ``(self,)`` for a single head."""
        return (self,)

    exact_jacobian = _ExactJacobian()

    def mean_is_linear(self):
        r"""Whether :math:`\alpha' = N(\Sigma)\alpha` (linear, homogeneous in the mean).

        Then a zero mean stays zero and a scaled mean obeys the same equation. Default
        ``False`` (not known).
        """
        return False

    def riccati_matrix(self):
        r"""Optional :math:`S` with :math:`\Sigma' = \Sigma S\Sigma` exactly, or ``None``.

        :func:`gaussian_pde.exact_covariance` and :func:`gaussian_pde.blowup_time` solve
        that Riccati equation in closed form.
        """
        return None

    def scalar_solution(self, mean0, var0, t):
        """Optional closed-form ``(mean(t), var(t))`` of a ``d = 1`` type, or ``None``."""
        return None

    def quadratic_score(self):
        r"""The :class:`QuadraticScore` of a head whose score is quadratic in ``y``, or ``None``.

        Sums of heads (:attr:`heads`) are handled by the callers.
        """
        return None

    def mixture_field(self, logw, means, covs, x):
        r"""The field against a mixture of Gaussians at tokens ``x``, or ``None`` (default).

        For a head without a :meth:`quadratic_score` whose field against a mixture
        :math:`\sum_k w_k\mathcal N(\alpha_k,\Sigma_k)` is in closed form (``logw``
        (K,), ``means`` (K, d), ``covs`` (K, d, d), ``x`` (n, d)); the mixture closure
        (:func:`gaussian_pde.solve_mixture`) then takes it.
        """
        return None

    def second_moment_map(self):
        r"""``(V, A)`` where the field is :math:`V\,\mathbb E_\mu[yy^T]A\,x`, or ``None`` (default).

        Such a field sees a distribution only through its second moment, so against a
        mixture it is in closed form and the mixture closure's compiled kernel
        (:mod:`gaussian_pde.closure._mixture_field`) runs it.
        """
        return None

    def gaussian_closure_field(self, mean, cov, x, tol):
        r"""The field against :math:`\mathcal N(\alpha,\Sigma)` at tokens ``x``, or ``None``.

        For a type that does not preserve Gaussians: what the Gaussian closure of
        :func:`gaussian_pde.solve_closure` uses (``tol``: error bound of its
        one-dimensional quadratures). ``None`` (default): no Gaussian closure.
        """
        return None

    def definition_field(self, Y, logw, X):
        r"""The field at ``X`` from its definition against :math:`\sum_j w_j\delta_{y_j}`.

        ``Y`` (m, d) atoms, ``logw`` (m,) their log weights; used by the quadrature
        checks of the closure engine. Raises ``TypeError`` by default.
        """
        raise TypeError(f"no quadrature definition for attention type {self.name!r}.")

    @classmethod
    def from_heads(cls, heads):
        r"""The attention of this type whose field is the sum of the ``heads``' fields, or ``None``.

        Only a type that sums heads implements it; the default (a single head) returns
        ``None``.
        """
        return None

    @classmethod
    def example_setting(cls):
        """Optional built-in 2-D example of the main job and ``compare``, or ``None``.

        ``dict(attention=..., mean0=..., cov0=..., horizon=..., t_end=...)``: the
        horizon of the main job (default 20) and the final time of ``compare``
        (default 1); ``mean0`` may be callable (position-dependent means).
        """
        return None

    def compiled_field(self):
        r"""The factor field compiled (Numba), for the compiled integrators; ``None`` by default.

        A type that supplies one returns a
        :class:`~gaussian_pde.attention._compiled_fields.CompiledField`: kernels of
        fixed signatures for :math:`Z' = [M(\Sigma)L \mid b + M\alpha]` and its
        closed-form Jacobian, and its weights packed into one float64 vector.
        :func:`gaussian_pde.solve` and :func:`gaussian_pde.solve_batch` then run the
        compiled engine; where this returns ``None``, ``solve`` runs the SciPy event loop
        on the NumPy reference field and ``solve_batch`` refuses the type (``TypeError``).
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
        return self.field_offset(mean, cov) + x @ self.field_matrix_with_mean(cov, mean).T

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
        return self.particle_kernel(x, opts)

    def particle_kernel(self, x, opts):
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


#: the Parameters entries of a head's weights: a subclass's docstring says ``%(weights)s``
#: where they go (:meth:`SingleHeadAttention.__init_subclass__` puts them in), so every
#: head states them in the same words
WEIGHTS_DOC = r"""Q, K : array_like, shape (k, d)
        Query and key matrices.
    V : array_like, shape (d, d)
        Value matrix (already multiplied by the output map)."""

#: the Parameters entry of the score scale (``%(scale)s``)
SCALE_DOC = r"""scale : float, optional
        Score scale :math:`c`, default :math:`1/\sqrt{k}`."""


class SingleHeadAttention(Attention):
    r"""An attention head with query, key and value matrices.

    Parameters
    ----------
    %(weights)s
    %(scale)s

    Notes
    -----
    The interaction matrix is :math:`A = \text{scale}\, K^T Q`, so that
    :math:`\text{scale}\,\langle Qx, Ky\rangle = y^T A x`.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.__doc__ = _with_weights_doc(cls.__doc__)

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
    generated = None

    #: the names of :meth:`weights`, in order (the keys of ``solve_batch``'s stacked weights)
    weight_names = ("Q", "K", "V", "scale")

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

    def weights(self):
        return self.Q, self.K, self.V, self.scale

    def field_matrix(self, cov):
        return self.generated.field_matrix(*self.weights(), cov)

    def field_offset(self, mean, cov):
        return self.generated.field_offset(*self.weights(), mean, cov)

    def moment_rhs(self, mean, cov):
        return self.generated.moment_rhs(*self.weights(), mean, cov)

    def cov_rhs(self, cov):
        return self.generated.cov_rhs(*self.weights(), cov)

    def factor_rhs(self, L):
        return self.generated.factor_rhs(*self.weights(), L)

    def score_matrix(self, X, Y):
        r"""Scores ``S[i, j] = s(x_i, y_j)``; the default is the bilinear :math:`y_j^TAx_i`."""
        return X @ self.A.T @ Y.T

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


def normalized_definition_field(self, Y, logw, X):
    r"""``definition_field`` of a softmax-normalised head with scores ``score_matrix``.

    :math:`\Gamma(x_i) = V\sum_j p_{ij}y_j`, :math:`p_{ij} \propto w_je^{s(x_i, y_j)}`.
    """
    S = self.score_matrix(X, Y) + logw
    P = np.exp(S - logsumexp(S, axis=1, keepdims=True))
    return (P @ Y) @ self.V.T


def _with_weights_doc(doc):
    """``doc`` with ``%(weights)s`` and ``%(scale)s`` replaced by :data:`WEIGHTS_DOC`, :data:`SCALE_DOC`."""
    if not doc:
        return doc
    return doc.replace("%(weights)s", WEIGHTS_DOC).replace("%(scale)s", SCALE_DOC)


SingleHeadAttention.__doc__ = _with_weights_doc(SingleHeadAttention.__doc__)
