r"""Gaussian closure of the Transformer PDE where Gaussians are not preserved (docs/math.md 6).

For a velocity field :math:`\Gamma` (possibly depending on the current Gaussian), project
the PDE onto Gaussians by matching the first two moments: with
:math:`X \sim \mathcal N(\alpha, \Sigma)`,

.. math::

    \alpha' = \mathbb E[\Gamma(X)],\qquad
    \Sigma' = \mathbb E[(X-\alpha)\Gamma(X)^T] + \mathbb E[\Gamma(X)(X-\alpha)^T] .

**Factor form.** Write :math:`X = \alpha + Lz`, :math:`z \sim \mathcal N(0, I)`,
:math:`\Sigma = LL^T`. Then :math:`\mathbb E[(X-\alpha)\Gamma^T] = L\,\mathbb E[z\Gamma^T]`
and

.. math:: L' = G := \mathbb E[\Gamma(\alpha + Lz)\,z^T]

gives :math:`LL'^T + L'L^T = \Sigma'`. By Stein's lemma :math:`G = \mathbb E[J_\Gamma(X)]\,L`,
so for an affine field :math:`b + Mx` this is the exact :math:`L' = ML` of
:func:`gaussian_pde.solve`; in general the covariance stays symmetric positive
semi-definite and its rank cannot grow, whatever the integration error.

**Quadrature.** The expectations use the tensor Gauss-Hermite rule of
:mod:`gaussian_pde.closure._quadrature` with ``n_per_dim`` nodes per dimension (the accuracy knob,
exact for polynomials of degree ``2 * n_per_dim - 1`` in each coordinate). Components
with closed forms (affine fields, ReLU/GELU MLPs, sigmoid attention via Stein's lemma in
the one-dimensional score variable) override the quadrature.

Fields are small objects (:class:`Field`) that add up (``attn + mlp``) into a block; see
:mod:`gaussian_pde.closure._blocks` for the feed-forward and normalisation components.
"""

from __future__ import annotations

import abc
import functools

import numpy as np

from .._common.gaussian import logistic_normal_moments
from .._common.linalg import psd_sqrt
from .._common.validation import (
    validate_covariance,
    validate_quadrature,
    validate_same_dimension,
    validate_tolerance,
    validate_vector,
)
from ..attention import Attention, has_hook
from ..integrate import MomentSolution, integrate_system, run_options, solve, validate_method
from ._quadrature import gauss_hermite_gaussian

__all__ = [
    "Field",
    "FieldSum",
    "AttentionField",
    "as_field",
    "closure_terms",
    "closure_moment_rhs",
    "solve_closure",
    "logistic_normal_moments",
    "standard_nodes",
    "DEFAULT_N_PER_DIM",
]

#: default Gauss-Hermite nodes per dimension of the closure
DEFAULT_N_PER_DIM = 8


@functools.lru_cache(maxsize=64)
def _standard_nodes_cached(d, m):
    z, w = gauss_hermite_gaussian(np.zeros(d), np.eye(d), m)
    z.setflags(write=False)
    w.setflags(write=False)
    return z, w


def standard_nodes(d, n_per_dim):
    r"""Gauss-Hermite nodes ``(m**d, d)`` and weights of :math:`\mathcal N(0, I_d)` (cached)."""
    m = validate_quadrature(n_per_dim, "n_per_dim", d=d)
    return _standard_nodes_cached(int(d), m)


# --------------------------------------------------------------------------------------
# fields


class Field(abc.ABC):
    r"""A velocity field :math:`\Gamma[\mu](x)` evaluated against a Gaussian or particles.

    Subclasses implement

    ``__call__(mean, cov, x)``
        the mean-field velocity :math:`\Gamma[\mathcal N(\alpha,\Sigma)](x)` at points
        ``x`` of shape ``(n, d)``;
    ``particle(x, positions=None)``
        the particle velocity :math:`\Gamma[\mu_n](x_i)` of the empirical measure of ``x``;

    and may override ``affine(mean, cov)`` (``(b, M)`` when the field is exactly
    :math:`b + Mx`, else ``None``) and ``closure_terms(mean, L, n_per_dim)`` (closed forms).
    Fields add: ``f + g`` is the field :math:`\Gamma_f + \Gamma_g`.
    """

    #: token dimension
    d: int

    @abc.abstractmethod
    def __call__(self, mean, cov, x):
        """Mean-field velocity against N(mean, cov) at points ``x`` (n, d)."""

    @abc.abstractmethod
    def particle(self, x, positions=None):
        """Particle velocity of the empirical measure of ``x`` (n, d)."""

    def affine(self, mean, cov):
        r"""``(b, M)`` if the field against :math:`\mathcal N(\alpha,\Sigma)` is :math:`b + Mx`, else ``None``."""
        return None

    #: whether :meth:`affine` returns the affine form against every Gaussian
    always_affine = False

    @property
    def closed_moments(self):
        """Whether :meth:`gaussian_moments` answers against every Gaussian (no tensor rule)."""
        return self.always_affine

    def gaussian_moments(self, mean, cov):
        r"""Mean, mean Jacobian and covariance of :math:`\Gamma(X)` without a tensor rule, or ``None``.

        That is :math:`(\mathbb E\Gamma(X),\ \mathbb E J_\Gamma(X),\ \operatorname{Cov}\Gamma(X))`.

        For :math:`X\sim\mathcal N(\alpha,\Sigma)`; by Stein's lemma
        :math:`\operatorname{Cov}(X, \Gamma(X)) = \Sigma\,\mathbb E[J_\Gamma]^T`, so these are the
        first two joint moments of :math:`(X, \Gamma(X))` that a discrete layer map needs
        (docs/math.md 6.5). The default: the affine form :math:`(b + M\alpha, M, M\Sigma M^T)`
        when there is one, else ``None`` (the caller falls back on the tensor rule).
        """
        aff = self.affine(mean, cov)
        if aff is None:
            return None
        b, M = aff
        return b + M @ mean, M, M @ cov @ M.T

    def closure_terms(self, mean, L, n_per_dim):
        r""":math:`(\mathbb E[\Gamma(X)],\ G = \mathbb E[\Gamma(\alpha + Lz)z^T])`, unchecked.

        The default uses the affine form when there is one, then the closed moments
        (:math:`G = \mathbb E[J_\Gamma]L`, :meth:`gaussian_moments`), else the tensor
        Gauss-Hermite rule in :math:`z`.
        """
        cov = L @ L.T
        aff = self.affine(mean, cov)
        if aff is not None:
            b, M = aff
            return b + M @ mean, M @ L
        if self.closed_moments:
            mom = self.gaussian_moments(mean, cov)
            if mom is not None:
                return mom[0], mom[1] @ L
        Z, W = standard_nodes(L.shape[1], n_per_dim)
        X = mean + Z @ L.T
        Gam = self(mean, cov, X)
        return W @ Gam, (Gam * W[:, None]).T @ Z

    def __add__(self, other):
        if not isinstance(other, (Field, Attention)):
            return NotImplemented
        return FieldSum([self, other])

    def __radd__(self, other):
        if not isinstance(other, (Field, Attention)):
            return NotImplemented
        return FieldSum([other, self])


def as_field(obj, name="field"):
    """An attention object becomes an :class:`AttentionField`; a :class:`Field` is returned as is."""
    if isinstance(obj, Field):
        return obj
    if isinstance(obj, Attention):
        try:
            return AttentionField(obj)
        except TypeError as exc:   # the message names `attention`: say which argument
            raise TypeError(f"`{name}`: {exc}") from None
    raise TypeError(f"`{name}` must be a gaussian_pde field (attention, feed-forward, PreNorm "
                    f"or a sum of them), got {type(obj).__name__}.")


class FieldSum(Field):
    r"""The sum :math:`\sum_k \Gamma_k` of fields (a user-assembled block).

    Parameters
    ----------
    terms : sequence of Field or Attention
        Non-empty, all with the same token dimension (checked: the error names the term).
    """

    def __init__(self, terms):
        flat = []
        for i, t in enumerate(terms):
            t = as_field(t, f"terms[{i}]")
            flat.extend(t.terms if isinstance(t, FieldSum) else [t])
        self.d = validate_same_dimension(flat, "terms")
        self.terms = tuple(flat)

    def __call__(self, mean, cov, x):
        return sum(t(mean, cov, x) for t in self.terms)

    def particle(self, x, positions=None):
        return sum(t.particle(x, positions) for t in self.terms)

    def affine(self, mean, cov):
        parts = [t.affine(mean, cov) for t in self.terms]
        if any(p is None for p in parts):
            return None
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    def closure_terms(self, mean, L, n_per_dim):
        parts = [t.closure_terms(mean, L, n_per_dim) for t in self.terms]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    @property
    def always_affine(self):
        return all(t.always_affine for t in self.terms)

    @property
    def closed_moments(self):
        """Every term closed, and at most one of them not affine (their cross-covariances)."""
        return (all(t.closed_moments for t in self.terms)
                and sum(not t.always_affine for t in self.terms) <= 1)

    def gaussian_moments(self, mean, cov):
        r"""Sum of the terms' moments; the cross-covariances where all terms but one are affine.

        With :math:`\Gamma = \sum_k\Gamma_k`, the cross term of an affine :math:`\Gamma_a = b + M_aX`
        and any :math:`\Gamma_k` is :math:`M_a\Sigma\,\mathbb E[J_k]^T` (Stein's lemma), exact for
        Gaussian :math:`X`; two non-affine terms have no closed cross-covariance (``None``).
        """
        if self.always_affine:
            return super().gaussian_moments(mean, cov)
        parts = [t.gaussian_moments(mean, cov) for t in self.terms]
        if any(p is None for p in parts):
            return None
        affine = [t.affine(mean, cov) is not None for t in self.terms]
        if sum(not a for a in affine) > 1:
            return None
        E = sum(p[0] for p in parts)
        J = sum(p[1] for p in parts)
        C = sum(p[2] for p in parts)
        for i, pi in enumerate(parts):
            for k in range(i + 1, len(parts)):
                a, o = (pi, parts[k]) if affine[i] else (parts[k], pi)
                X = a[1] @ cov @ o[1].T
                C = C + X + X.T
        return E, J, 0.5 * (C + C.T)

    def __repr__(self):
        return " + ".join(repr(t) for t in self.terms)


# --------------------------------------------------------------------------------------
# the logistic function of a Gaussian, with an error bound


# --------------------------------------------------------------------------------------
# attention fields


class AttentionField(Field):
    r"""The velocity field of an attention type as a :class:`Field`.

    * Gaussian-preserving types (softmax, L2, Sinkhorn, multi-head): the exact affine field
      :math:`b + Mx` of the attention's hooks, unless ``n_inner`` is given;
    * ``n_inner`` (Gaussian-preserving types): the field computed from its definition
      (docs/math.md section 2.2) with the measure replaced by its ``n_inner``-per-dimension
      Gauss-Hermite rule (Sinkhorn: weighted log-domain Sinkhorn on the nodes, then the
      conditional law of ``y`` given any ``x``). A check of the closure engine, not a way to
      compute: it converges to the affine field as ``n_inner`` grows;
    * a type that does not preserve Gaussians but implements
      :meth:`~gaussian_pde.Attention.gaussian_closure_field` (sigmoid: Stein's lemma in
      the score, one-dimensional expectations with error bound ``logistic_tol``): that
      field;
    * masked attention needs positions: use :mod:`gaussian_pde.closure._masked`.
    """

    def __init__(self, attention, *, n_inner=None, logistic_tol=1e-12):
        if not isinstance(attention, Attention):
            raise TypeError(f"`attention` must be an attention object, got "
                            f"{type(attention).__name__}.")
        # what the type can do is declared on it: `gaussian_preserving` and `closure`
        if attention.uses_positions:
            raise TypeError(f"`attention` ({attention.name}) uses token positions; use "
                            "gaussian_pde.closure._masked for its block-causal closure.")
        if not attention.gaussian_preserving and not has_hook(type(attention),
                                                              "gaussian_closure_field"):
            raise TypeError(f"`attention` ({attention.name}) does not preserve Gaussians and "
                            f"declares no Gaussian closure (closure = {attention.closure!r}); "
                            "simulate particles instead.")
        if n_inner is not None:
            n_inner = validate_quadrature(n_inner, "n_inner", d=attention.d)
            if not attention.gaussian_preserving:
                raise ValueError("`n_inner` applies to Gaussian-preserving attention only.")
        self.attention = attention
        self.d = attention.d
        self.n_inner = n_inner
        self.logistic_tol = validate_tolerance(logistic_tol, "logistic_tol", upper=1e-3 + 1e-18)

    def __repr__(self):
        return f"AttentionField({self.attention!r})"

    @property
    def always_affine(self):
        return self.attention.gaussian_preserving and self.n_inner is None

    def affine(self, mean, cov):
        att = self.attention
        if att.gaussian_preserving and self.n_inner is None:
            return att.field_offset(mean, cov), att.field_matrix_with_mean(cov, mean)
        return None

    def __call__(self, mean, cov, x):
        att = self.attention
        aff = self.affine(mean, cov)
        if aff is not None:
            return aff[0] + x @ aff[1].T
        if not att.gaussian_preserving:
            return att.gaussian_closure_field(mean, cov, x, self.logistic_tol)
        Y, w = gauss_hermite_gaussian(mean, cov, self.n_inner)
        return att.definition_field(Y, np.log(w), x)

    def particle(self, x, positions=None):
        return self.attention.particle_velocity(x)[0]


# --------------------------------------------------------------------------------------
# closure right-hand side and solver


def _validate_rule(field, n_per_dim, d):
    """``n_per_dim`` in range; its tensor rule (``n_per_dim ** d`` nodes) checked where used."""
    if field.always_affine or field.closed_moments:
        return validate_quadrature(n_per_dim, "n_per_dim")
    return validate_quadrature(n_per_dim, "n_per_dim", d=d)


def closure_terms(field, mean, L, n_per_dim=DEFAULT_N_PER_DIM):
    r"""Factor-form closure: :math:`(\alpha', L') = (\mathbb E\Gamma(X), \mathbb E[\Gamma(\alpha+Lz)z^T])`.

    Parameters
    ----------
    field : Field or Attention
        The velocity field.
    mean : array_like, shape (d,)
        Mean of the Gaussian.
    L : array_like, shape (d, r)
        Factor of the covariance, :math:`\Sigma = LL^T`.
    n_per_dim : int
        Gauss-Hermite nodes per dimension, 2..40.
    """
    field = as_field(field)
    mean = validate_vector(mean, "mean", size=field.d)
    L = np.asarray(L, dtype=float)
    if L.ndim != 2 or L.shape[0] != field.d:
        raise ValueError(f"`L` must have shape ({field.d}, r), got {L.shape}.")
    n_per_dim = _validate_rule(field, n_per_dim, L.shape[1])
    return field.closure_terms(mean, L, n_per_dim)


def closure_moment_rhs(field, mean, cov, n_per_dim=DEFAULT_N_PER_DIM):
    r"""Gaussian-closure right-hand side :math:`(\alpha', \Sigma')`.

    .. math::

        \alpha' = \mathbb E[\Gamma(X)],\qquad
        \Sigma' = \mathbb E[(X-\alpha)\Gamma(X)^T] + \mathbb E[\Gamma(X)(X-\alpha)^T],
        \qquad X\sim\mathcal N(\alpha,\Sigma),

    computed as :math:`\Sigma' = LG^T + GL^T` with :math:`L = \Sigma^{1/2}` (any factor
    gives the same :math:`\Sigma'`). For an affine field it equals
    ``attention.moment_rhs(mean, cov)``.

    Parameters
    ----------
    field : Field or Attention
        The velocity field.
    mean : array_like, shape (d,)
        Mean of the Gaussian.
    cov : array_like, shape (d, d)
        Symmetric PSD.
    n_per_dim : int
        Gauss-Hermite nodes per dimension (2..40; exact to degree ``2 n_per_dim - 1``).

    Returns
    -------
    dmean : ndarray, shape (d,)
    dcov : ndarray, shape (d, d), symmetric
    """
    field = as_field(field)
    mean = validate_vector(mean, "mean", size=field.d)
    cov = validate_covariance(cov, "cov", d=field.d)
    n_per_dim = _validate_rule(field, n_per_dim, field.d)
    L = psd_sqrt(cov)
    dm, G = _finite_terms(field, mean, L, n_per_dim, "mean", "cov")
    C = L @ G.T
    return dm, C + C.T


def _finite_terms(field, mean, L, n_per_dim, mean_name, cov_name):
    """The closure terms at ``(mean, L)``; a clear error when they overflow float64.

    The field at the quadrature nodes of a huge Gaussian overflows (scores past 1e308);
    at the start of a solve, a non-finite right-hand side would stall the step control.
    """
    with np.errstate(all="ignore"):
        try:
            dm, G = field.closure_terms(mean, L, n_per_dim)
        except ValueError:   # the one-dimensional expectations refuse non-finite scores
            dm = G = np.array(np.nan)
    if not (np.all(np.isfinite(dm)) and np.all(np.isfinite(G))):
        raise ValueError(f"`{cov_name}` and `{mean_name}` are too large for the closure: the "
                         "field at the quadrature nodes overflows float64 (largest "
                         f"|entry| of `{cov_name}` {float(np.max(np.abs(L @ L.T))):.3g}); "
                         "rescale the data or the weights.")
    return dm, G


class _ClosureSystem:
    """The closure ODE's state ``(alpha, L)`` for :func:`gaussian_pde.integrate._event_loop.integrate_system`."""

    def __init__(self, field, n_per_dim):
        self.field, self.d, self.n_per_dim = field, field.d, n_per_dim
        self.nfev = 0

    def _terms(self, y):
        d = self.d
        m, L = y[:d], y[d:].reshape(d, d)
        dm, G = self.field.closure_terms(m, L, self.n_per_dim)
        return m, L, dm, G

    def fun(self, t, y):
        self.nfev += 1
        _, _, dm, G = self._terms(y)
        return np.concatenate([dm, G.ravel()])

    __call__ = fun

    def trace(self, y):
        L = y[self.d:]
        return float(L @ L)

    def cov_and_rate(self, y):
        _, L, _, G = self._terms(y)
        C = G @ L.T
        return L @ L.T, C + C.T

    def mean_and_cov(self, y):
        L = y[self.d:].reshape(self.d, self.d)
        return y[:self.d], L @ L.T


def _engine_attention(field, auto, events, first_step):
    """The attention whose :func:`gaussian_pde.solve` is the closure's run, or None.

    ``method="auto"`` without user events or ``first_step``, and a field that is exactly
    an attention's affine field (:class:`AttentionField` of a Gaussian-preserving type,
    no ``n_inner``) whose type supplies a compiled field: the closure is then the
    moment ODE that :func:`gaussian_pde.solve` integrates with the compiled engine.
    """
    if not auto or events or first_step is not None:
        return None
    if not (isinstance(field, AttentionField) and field.always_affine):
        return None
    att = field.attention
    return att if att.compiled_field() is not None else None


def solve_closure(field, mean0, cov0, t_span, *, t_eval=None, n_per_dim=DEFAULT_N_PER_DIM,
                  method="auto", rtol=1e-8, atol=1e-10, blowup_threshold=1e8,
                  steady_tol=None, steady_atol=0.0, rank_tol=None, events=(),
                  max_step=np.inf, first_step=None, max_nfev=50_000):
    r"""Integrate the Gaussian-closure ODEs in factor form.

    .. math:: \alpha' = \mathbb E[\Gamma(X)],\qquad L' = \mathbb E[\Gamma(\alpha + Lz)\,z^T],
              \qquad \Sigma = LL^T .

    Speaks :func:`gaussian_pde.solve`'s language and runs its event loop
    (:func:`gaussian_pde.integrate._event_loop.integrate_system`), so the statuses, the
    blow-up time with its confirmation, the steady-state and rank-collapse events and the
    user events mean what they mean there (docs/math.md section 10). Where the field is
    an attention that preserves Gaussians, :math:`\Gamma = b + Mx`, the closure is exact
    (:math:`L' = ML`, Stein's lemma) and is the moment ODE of :func:`gaussian_pde.solve`:
    with ``method="auto"`` (the default) and a type that supplies a compiled field, it is
    :func:`gaussian_pde.solve` itself that runs (its compiled engine, the same steps,
    statuses and events; ``n_per_dim`` plays no part), otherwise the event loop.

    Parameters
    ----------
    field : Field or Attention
        Velocity field (a block, an attention, ...).
    mean0 : array_like, shape (d,)
        Initial mean.
    cov0 : array_like, shape (d, d)
        Initial covariance (symmetric PSD, any rank).
    t_span : (float, float)
        Interval of integration.
    t_eval : array_like, optional
        Output times within ``t_span``.
    n_per_dim : int
        Gauss-Hermite nodes per dimension (2..40).
    method : str or OdeSolver subclass
        ``"auto"`` (default): :func:`gaussian_pde.solve` (``method="auto"``, the compiled
        engine) where ``field`` is an attention (or its :class:`AttentionField`, without
        ``n_inner``) of a Gaussian-preserving type with a compiled field
        (:meth:`~gaussian_pde.Attention.compiled_field`) and no user ``events`` or
        ``first_step`` are given; otherwise ``"RK45"`` in the event loop. Any other
        :func:`scipy.integrate.solve_ivp` method (``"RK45"``, ``"DOP853"``,
        ``"Radau"``, ``"BDF"``, ``"LSODA"``, a class) integrates the closure in the
        event loop with that method, whatever the field.
    rtol, atol : float
        Tolerances on the entries of the mean and of ``L``.
    blowup_threshold, steady_tol, steady_atol, rank_tol, events, max_step, first_step
        As in :func:`gaussian_pde.solve`.
    max_nfev : int
        Give up (status ``"failed"``) after this many right-hand-side evaluations.

    Returns
    -------
    MomentSolution
        As :func:`gaussian_pde.solve` returns it: ``t``, ``mean``, ``cov``, ``factor``,
        ``status``, ``message``, ``t_blowup``, ``t_events`` (``"blowup"``, ``"steady"``
        when on, ``"rank_collapse"`` when on, the user events').

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=0.5)
    >>> sol = gp.solve_closure(att, np.zeros(2), np.eye(2), (0, 2))
    >>> sol.status, round(sol.t_blowup, 6)      # exact: 1/lambda_max(A + A^T) = 1
    (<Status.BLOWUP: 'blowup'>, 1.0)
    """
    field = as_field(field)
    d = field.d
    mean0 = validate_vector(mean0, "mean0", size=d)
    cov0 = validate_covariance(cov0, "cov0", d=d)
    n_per_dim = _validate_rule(field, n_per_dim, d)
    auto = validate_method(method, extra=("auto",)) == "auto"
    opts, method, events = run_options(
        t_span, "RK45" if auto else method, events, t_eval=t_eval, rtol=rtol, atol=atol,
        max_step=max_step, first_step=first_step, max_nfev=max_nfev,
        blowup_threshold=blowup_threshold, steady_tol=steady_tol, steady_atol=steady_atol,
        rank_tol=rank_tol)
    att = _engine_attention(field, auto, events, first_step)
    if att is not None:
        return solve(att, mean0, cov0, t_span, t_eval=t_eval, rtol=rtol, atol=atol,
                     blowup_threshold=blowup_threshold, steady_tol=steady_tol,
                     steady_atol=steady_atol, rank_tol=rank_tol, max_step=max_step,
                     max_nfev=max_nfev)
    system = _ClosureSystem(field, n_per_dim)
    L0 = psd_sqrt(cov0)
    _finite_terms(field, mean0, L0, n_per_dim, "mean0", "cov0")
    y0 = np.concatenate([mean0, L0.ravel()])
    run = integrate_system(system, y0, opts, method, user_events=events)
    Ls = run.y[:, d:].reshape(-1, d, d)
    mean_f, cov_f = system.mean_and_cov(run.y_final)
    return MomentSolution(t=run.t, mean=run.y[:, :d], cov=Ls @ np.swapaxes(Ls, -1, -2),
                          factor=Ls, status=run.status, message=run.message,
                          t_blowup=run.t_blowup, t_final=run.t_final,
                          mean_final=mean_f.copy(), cov_final=cov_f, t_events=run.t_events,
                          nfev=run.nfev)
