r"""Components of a Transformer block as fields of the Gaussian closure (docs/math.md 7.2).

A block's velocity is a user-assembled sum of fields (:class:`gaussian_pde.closure._engine.Field`),
with an optional normalisation in pre-norm position::

    block = PreNorm(LayerNorm(d), Softmax(Q, K, V)) + PreNorm(LayerNorm(d), MLP(W1, b1, W2, b2))

Feed-forward fields
    :class:`Affine` :math:`\Gamma(x) = Wx + c` (Gaussian-exact);
    :class:`MLP` :math:`\Gamma(x) = W_2\,\phi(W_1x + b_1) + b_2` with
    :math:`\phi` = ReLU or GELU (:math:`u\,\Phi(u)`, the exact GELU). The closure terms
    have closed forms: with :math:`u = W_1X + b_1`, :math:`u_k \sim \mathcal N(m_k, s_k^2)`,
    Stein's lemma gives :math:`\mathbb E[\Gamma] = W_2\mathbb E[\phi(u)] + b_2` and
    :math:`G = W_2\operatorname{diag}(\mathbb E[\phi'(u)])W_1L`, with

    .. math::

        \text{ReLU:}\quad \mathbb E\phi = m\Phi(m/s) + s\varphi(m/s),\quad
        \mathbb E\phi' = \Phi(m/s);

        \text{GELU } (r = \sqrt{1+s^2},\ k = m/r):\quad
        \mathbb E\phi = m\Phi(k) + s^2\varphi(k)/r,\quad
        \mathbb E\phi' = \Phi(k) + m\varphi(k)/r^3 .

    The tanh approximation of GELU (GPT-2's, ``activation="gelu_tanh"``),
    :math:`\phi(u) = \tfrac12 u\,(1 + \tanh(\sqrt{2/\pi}\,(u + 0.044715\,u^3)))`, has no
    closed form; it differs from the exact GELU by :math:`\delta(u)`, less than
    :math:`5\cdot10^{-4}`, so its expectations are GELU's closed forms plus those of
    :math:`\delta` and :math:`\delta'` by 1-D quadrature (Gauss-Hermite for :math:`s \le 1`,
    Gauss-Legendre in :math:`u` for wider :math:`u`; equal to adaptive quadrature to
    :math:`10^{-14}`).

Normalisations (per token, or of the distribution)
    :class:`LayerNorm` :math:`\gamma\odot(x - \bar x\mathbf 1)/\sqrt{\operatorname{var}(x) + \epsilon} + \beta`
    (coordinates' mean and variance; undefined for ``d = 1``, where :math:`x - \bar x = 0`);
    :class:`RMSNorm` :math:`\gamma\odot x/\sqrt{\overline{x^2} + \epsilon}`;
    :class:`TraceNorm` :math:`x \mapsto \alpha + c\,(x - \alpha)`, :math:`c = \sqrt{\tau/\operatorname{tr}\Sigma}`:
    the distribution rescaled to trace :math:`\tau` (an affine map: Gaussian-exact).

:class:`PreNorm` ``(norm, inner)`` is the field :math:`\Gamma(x) = \Gamma_{\rm inner}[N_\#\mu](N(x))`.
Against a Gaussian, :math:`N_\#\mu` is replaced by its moment-matched Gaussian (exact for
:class:`TraceNorm`; Gauss-Hermite quadrature for the per-token norms).
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtr

from .._common.linalg import psd_sqrt
from .._common.validation import (
    validate_allocation,
    validate_int,
    validate_matrix,
    validate_positive,
    validate_quadrature,
    validate_vector,
)
from ._engine import DEFAULT_N_PER_DIM, Field, as_field, standard_nodes
from ._moments import gaussian_activation_moments, normalization_moments

__all__ = ["ACTIVATIONS", "Affine", "MLP", "gelu_tanh", "LayerNorm", "RMSNorm", "TraceNorm",
           "PreNorm", "Normalization"]

_SQRT2PI = np.sqrt(2 * np.pi)


def _phi(x):
    return np.exp(-0.5 * x * x) / _SQRT2PI


class Affine(Field):
    r"""Affine feed-forward field :math:`\Gamma(x) = Wx + c` (Gaussian-exact).

    Parameters
    ----------
    W : array_like, shape (d, d)
    c : array_like, shape (d,), optional
        Default zero.
    """

    def __init__(self, W, c=None):
        W = validate_matrix(W, "W")
        if W.shape[0] != W.shape[1]:
            raise ValueError(f"`W` must be square (d, d), got shape {W.shape}.")
        self.d = W.shape[0]
        self.W = W
        self.c = np.zeros(self.d) if c is None else validate_vector(c, "c", size=self.d)

    always_affine = True

    def __repr__(self):
        return f"Affine(d={self.d})"

    def affine(self, mean, cov):
        return self.c, self.W

    def __call__(self, mean, cov, x):
        return x @ self.W.T + self.c

    def particle(self, x, positions=None):
        return x @ self.W.T + self.c


#: the activations of :class:`MLP`
ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
#: default order of Mehler's expansion in :meth:`MLP.gaussian_moments` (narrow layers)
MEHLER_ORDER = 12
#: widest hidden layer given :data:`MEHLER_ORDER` by default (its ``p x p`` correlations)
MEHLER_FULL_MAX = 1024
_GELU_C = float(np.sqrt(2.0 / np.pi))


def gelu_tanh(u):
    r"""The tanh-GELU and its derivative (GPT-2's activation).

    :math:`\phi(u) = \tfrac12u(1 + \tanh t)`, :math:`t = \sqrt{2/\pi}(u + 0.044715u^3)`.
    Returns ``(phi(u), phi'(u))`` with
    :math:`\phi' = \tfrac12(1 + \tanh t) + \tfrac12u(1 - \tanh^2 t)\sqrt{2/\pi}(1 + 0.134145u^2)`.
    """
    u = np.asarray(u, float)
    t = np.tanh(_GELU_C * (u + 0.044715 * u**3))
    return (0.5 * u * (1.0 + t),
            0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * _GELU_C * (1.0 + 3 * 0.044715 * u * u))


def _tanh_gap(u):
    """``delta = tanh-GELU - GELU`` and its derivative (both below 5e-4 and 2e-3 in size)."""
    f, df = gelu_tanh(u)
    return f - u * ndtr(u), df - ndtr(u) - u * _phi(u)


def _rules():
    z, w = np.polynomial.hermite_e.hermegauss(60)
    x, v = np.polynomial.legendre.leggauss(8)
    edges = np.linspace(-10.0, 10.0, 41)        # delta vanishes to rounding beyond |u| = 10
    half = 0.5 * np.diff(edges)
    nodes = ((edges[:-1] + half)[:, None] + half[:, None] * x).ravel()
    return (z, w / w.sum()), (nodes, (half[:, None] * v).ravel())


_HERMITE, _LEGENDRE = _rules()


def _gap_moments(m, s):
    r""":math:`\mathbb E\delta(u)`, :math:`\mathbb E\delta'(u)` for :math:`u \sim \mathcal N(m, s^2)`.

    :math:`s \le 1`: 60-node Gauss-Hermite in :math:`z = (u - m)/s` (the integrand is smooth
    on the scale :math:`1/s \ge 1`); :math:`s > 1`: composite 8-node Gauss-Legendre in
    :math:`u` on :math:`[-10, 10]` against the normal density (wider than :math:`\delta`).
    """
    z, w = _HERMITE
    d, dd = _tanh_gap(m[..., None] + s[..., None] * z)
    e_h, de_h = d @ w, dd @ w
    x, v = _LEGENDRE
    ss = np.maximum(s, 1.0)[..., None]
    pdf = np.exp(-0.5 * ((x - m[..., None]) / ss) ** 2) / (ss * _SQRT2PI)
    d, dd = _tanh_gap(x)
    e_l, de_l = pdf @ (v * d), pdf @ (v * dd)
    small = s <= 1.0
    return np.where(small, e_h, e_l), np.where(small, de_h, de_l)


class MLP(Field):
    r"""Two-layer feed-forward field :math:`\Gamma(x) = W_2\,\phi(W_1x + b_1) + b_2`.

    Parameters
    ----------
    W1 : array_like, shape (p, d)
    b1 : array_like, shape (p,)
    W2 : array_like, shape (d, p)
    b2 : array_like, shape (d,)
    activation : {"relu", "gelu", "gelu_tanh"}
        ReLU, the exact GELU :math:`u\,\Phi(u)`, or its tanh approximation (GPT-2's).
    mehler_order : int, optional
        Order :math:`N \ge 1` of Mehler's expansion of the hidden units' covariance in a
        discrete layer map (:meth:`gaussian_moments`, docs/math.md 6.5): the off-diagonal
        error is at most :math:`|\rho_{kl}|^{N+1}` times the units' non-linear standard
        deviations. Order 1 costs :math:`O(pd^2)`; higher orders form the ``p x p``
        correlations (:math:`O(p^2d)`). Default: :data:`MEHLER_ORDER` while
        ``p <= MEHLER_FULL_MAX`` hidden units, else 1 (wide layers, where the units'
        correlations are small, :math:`O(d^{-1/2})` for generic weights).

    Notes
    -----
    The closure terms use the closed forms of the module docstring (no quadrature; for
    ``gelu_tanh`` a 1-D Gauss-Hermite sum per hidden unit).
    """

    always_affine = False
    closed_moments = True

    def __init__(self, W1, b1, W2, b2, activation="relu", mehler_order=None):
        W1 = validate_matrix(W1, "W1")
        p, d = W1.shape
        self.W1 = W1
        self.b1 = validate_vector(b1, "b1", size=p)
        self.W2 = validate_matrix(W2, "W2", shape=(d, p))
        self.b2 = validate_vector(b2, "b2", size=d)
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}, got {activation!r}.")
        self.activation = activation
        if mehler_order is None:
            mehler_order = MEHLER_ORDER if p <= MEHLER_FULL_MAX else 1
        self.mehler_order = validate_int(mehler_order, "mehler_order", minimum=1)
        if self.mehler_order > 40:
            raise ValueError(f"`mehler_order` must be at most 40, got {mehler_order}.")
        if self.mehler_order >= 2:      # the p x p correlations and their powers
            validate_allocation(4 * p * p, "mehler_order")
        self.d = d
        #: bound on Mehler's remainder at the last :meth:`gaussian_moments` (orders >= 2)
        self.last_mehler_bound = None

    def __repr__(self):
        return f"MLP(d={self.d}, p={self.W1.shape[0]}, activation={self.activation!r})"

    def _act(self, u):
        if self.activation == "relu":
            return np.maximum(u, 0.0)
        if self.activation == "gelu_tanh":
            return gelu_tanh(u)[0]
        return u * ndtr(u)

    def __call__(self, mean, cov, x):
        return self._act(x @ self.W1.T + self.b1) @ self.W2.T + self.b2

    def particle(self, x, positions=None):
        return self(None, None, x)

    def activation_moments(self, m, s):
        r"""Closed-form :math:`\mathbb E\phi(u)`, :math:`\mathbb E\phi'(u)`, :math:`u\sim\mathcal N(m, s^2)`."""
        m, s = np.asarray(m, float), np.asarray(s, float)
        if self.activation == "relu":
            pos = s > 0
            ss = np.where(pos, s, 1.0)
            k = m / ss
            e = np.where(pos, m * ndtr(k) + ss * _phi(k), np.maximum(m, 0.0))
            de = np.where(pos, ndtr(k), (m > 0).astype(float))
            return e, de
        r = np.sqrt(1 + s * s)
        k = m / r
        e, de = m * ndtr(k) + s * s * _phi(k) / r, ndtr(k) + m * _phi(k) / r**3
        if self.activation == "gelu_tanh":
            ge, gde = _gap_moments(m, s)
            return e + ge, de + gde
        return e, de

    def _psi(self):
        """The activation minus ReLU (vanishes outside ``|u| <= 10``), ``None`` for ReLU."""
        if self.activation == "relu":
            return None
        if self.activation == "gelu_tanh":
            return lambda u: gelu_tanh(u)[0] - np.maximum(u, 0.0)
        return lambda u: u * ndtr(u) - np.maximum(u, 0.0)

    def gaussian_moments(self, mean, cov):
        r"""Mean, mean Jacobian and covariance of :math:`\Gamma(X)`, :math:`X\sim\mathcal N(\alpha,\Sigma)`.

        With :math:`a = W_1X + b_1 \sim \mathcal N(m, C)`, :math:`C = W_1\Sigma W_1^T`:
        :math:`\mathbb E\Gamma = W_2\mathbb E\phi(a) + b_2`,
        :math:`\mathbb E J = W_2\operatorname{diag}(\mathbb E\phi')W_1` and
        :math:`\operatorname{Cov}\Gamma = \mathbb E J\,\Sigma\,\mathbb E J^T + W_2 RW_2^T`,
        :math:`R` the orders ``2..mehler_order`` of Mehler's expansion off the diagonal and
        the exact non-linear variance on it (:mod:`gaussian_pde.closure._moments`).
        """
        WS = self.W1 @ cov
        s = np.sqrt(np.maximum(np.einsum("pd,pd->p", WS, self.W1), 0.0))
        C = WS @ self.W1.T if self.mehler_order >= 2 else None
        e0, dphi, extra, bound = gaussian_activation_moments(
            self._psi(), self.W1 @ mean + self.b1, s, C, self.mehler_order)
        self.last_mehler_bound = bound
        J = (self.W2 * dphi) @ self.W1
        if extra.ndim == 1:
            R = (self.W2 * extra) @ self.W2.T
        else:
            R = self.W2 @ extra @ self.W2.T
        cov_out = J @ cov @ J.T + R
        return self.W2 @ e0 + self.b2, J, 0.5 * (cov_out + cov_out.T)

    def closure_terms(self, mean, L, n_per_dim):
        m = self.W1 @ mean + self.b1
        WL = self.W1 @ L
        s = np.sqrt(np.sum(WL * WL, axis=1))
        e, de = self.activation_moments(m, s)
        return self.W2 @ e + self.b2, (self.W2 * de) @ WL


class Normalization:
    """Base class of the normalisations used in :class:`PreNorm`."""

    d: int
    #: whether the map is affine in x given the distribution (Gaussian-exact)
    exact = False

    def apply(self, x, mean, cov):
        """Normalised tokens ``x`` (n, d) of a distribution with moments ``(mean, cov)``."""
        raise NotImplementedError

    def apply_particles(self, x):
        """Normalised tokens of the empirical measure of ``x``."""
        return self.apply(x, None, None)

    def moments(self, mean, cov):
        r"""``(E u, Cov u, E[du/dx])`` for :math:`u = N(X)`, :math:`X\sim\mathcal N(\alpha,\Sigma)`, or ``None``.

        ``None`` (the default) when there is no formula; the per-token norms and the trace
        normalisation have exact ones (docs/math.md 6.5).
        """
        return None

    def push(self, mean, cov, n_per_dim):
        r"""Mean and covariance of :math:`N_\#\mathcal N(\alpha,\Sigma)` (exact moments, else quadrature)."""
        mom = self.moments(mean, cov)
        if mom is not None:
            return mom[0], mom[1]
        Z, W = standard_nodes(self.d, n_per_dim)
        Y = self.apply(mean + Z @ psd_sqrt(cov).T, mean, cov)
        m = W @ Y
        Yc = Y - m
        C = (Yc * W[:, None]).T @ Yc
        return m, 0.5 * (C + C.T)


class LayerNorm(Normalization):
    r"""Per-token LayerNorm :math:`\gamma\odot(x - \bar x)/\sqrt{\operatorname{var}(x) + \epsilon} + \beta`.

    Parameters
    ----------
    d : int
        Token dimension, at least 2 (in ``d = 1`` the centred token is 0: undefined).
    gamma, beta : array_like, shape (d,), optional
        Gain (default ones) and shift (default zeros).
    eps : float
        Added to the variance, default ``1e-5``.
    """

    def __init__(self, d, gamma=None, beta=None, eps=1e-5):
        d = validate_int(d, "d", minimum=1)
        if d < 2:
            raise ValueError("`d` must be at least 2 for LayerNorm: in d = 1 a token minus its "
                             "coordinate mean is 0, so LayerNorm is undefined (use RMSNorm).")
        self.d = d
        self.gamma = np.ones(d) if gamma is None else validate_vector(gamma, "gamma", size=d)
        self.beta = np.zeros(d) if beta is None else validate_vector(beta, "beta", size=d)
        self.eps = validate_positive(eps, "eps", allow_zero=True)

    def __repr__(self):
        return f"LayerNorm(d={self.d})"

    def moments(self, mean, cov):
        """Exact moments by the one-dimensional Laplace integral (docs/math.md 6.5)."""
        return normalization_moments(mean, cov, self.gamma, self.beta, self.eps, center=True)

    def apply(self, x, mean=None, cov=None):
        xc = x - x.mean(axis=-1, keepdims=True)
        var = np.mean(xc * xc, axis=-1, keepdims=True)
        return self.gamma * xc / np.sqrt(var + self.eps) + self.beta


class RMSNorm(Normalization):
    r"""Per-token RMSNorm :math:`\gamma\odot x/\sqrt{\overline{x^2} + \epsilon}`."""

    def __init__(self, d, gamma=None, eps=1e-5):
        self.d = validate_int(d, "d", minimum=1)
        self.gamma = np.ones(self.d) if gamma is None else validate_vector(gamma, "gamma",
                                                                            size=self.d)
        self.eps = validate_positive(eps, "eps", allow_zero=True)

    def __repr__(self):
        return f"RMSNorm(d={self.d})"

    def moments(self, mean, cov):
        """Exact moments by the one-dimensional Laplace integral (docs/math.md 6.5)."""
        return normalization_moments(mean, cov, self.gamma, np.zeros(self.d), self.eps,
                                     center=False)

    def apply(self, x, mean=None, cov=None):
        return self.gamma * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)


class TraceNorm(Normalization):
    r"""Rescale the distribution to a fixed trace: :math:`x \mapsto \alpha + c(x - \alpha)`.

    :math:`c = \sqrt{\tau/\operatorname{tr}\Sigma}`, so the normalised covariance is
    :math:`\tau\Sigma/\operatorname{tr}\Sigma`; affine given the distribution, hence exact
    for Gaussians.

    Parameters
    ----------
    d : int
    target : float
        The trace :math:`\tau` (default 1).
    """

    exact = True

    def __init__(self, d, target=1.0):
        self.d = validate_int(d, "d", minimum=1)
        self.target = validate_positive(target, "target")

    def __repr__(self):
        return f"TraceNorm(d={self.d}, target={self.target:g})"

    def factor(self, cov):
        """The scale :math:`c`."""
        return np.sqrt(self.target / max(float(np.trace(cov)), 1e-300))

    def apply(self, x, mean, cov):
        return mean + self.factor(cov) * (x - mean)

    def apply_particles(self, x):
        m = x.mean(axis=0)
        xc = x - m
        return m + np.sqrt(self.target / max(float(np.sum(xc * xc)) / x.shape[0], 1e-300)) * xc

    def push(self, mean, cov, n_per_dim=None):
        return mean, self.factor(cov) ** 2 * cov

    def moments(self, mean, cov):
        c = self.factor(cov)
        return mean, c * c * cov, c * np.eye(self.d)


class PreNorm(Field):
    r"""A field in pre-norm position: :math:`\Gamma(x) = \Gamma_{\rm inner}[N_\#\mu](N(x))`.

    Parameters
    ----------
    norm : Normalization or None
        :class:`LayerNorm`, :class:`RMSNorm`, :class:`TraceNorm`; ``None`` is the identity.
    inner : Field or Attention
        The field applied to the normalised tokens and their distribution.
    n_per_dim : int
        Gauss-Hermite nodes per dimension for the moments of :math:`N_\#\mu` (per-token
        norms only).
    """

    def __init__(self, norm, inner, n_per_dim=DEFAULT_N_PER_DIM):
        self.inner = as_field(inner, "inner")
        if norm is not None and not isinstance(norm, Normalization):
            raise TypeError(f"`norm` must be LayerNorm, RMSNorm, TraceNorm or None, got "
                            f"{type(norm).__name__}.")
        if norm is not None and norm.d != self.inner.d:
            raise ValueError(f"`norm` has dimension d = {norm.d} but `inner` has d = "
                             f"{self.inner.d}.")
        self.norm = norm
        self.d = self.inner.d
        # the tensor rule (n_per_dim ** d nodes) is checked where it is used
        self.n_per_dim = validate_quadrature(n_per_dim, "n_per_dim")

    def __repr__(self):
        return f"PreNorm({self.norm!r}, {self.inner!r})"

    def _pushed(self, mean, cov):
        if self.norm is None:
            return mean, cov
        return self.norm.push(mean, cov, self.n_per_dim)

    def affine(self, mean, cov):
        if self.norm is None:
            return self.inner.affine(mean, cov)
        if not self.norm.exact:
            return None
        mn, cn = self._pushed(mean, cov)
        aff = self.inner.affine(mn, cn)
        if aff is None:
            return None
        b, M = aff
        c = self.norm.factor(cov)
        return b + (1 - c) * (M @ mean), c * M

    def closure_terms(self, mean, L, n_per_dim):
        if self.norm is None:
            return self.inner.closure_terms(mean, L, n_per_dim)
        return super().closure_terms(mean, L, n_per_dim)

    @property
    def always_affine(self):
        return (self.norm is None or self.norm.exact) and self.inner.always_affine

    @property
    def closed_moments(self):
        """The norm has exact moments and the inner field closed ones."""
        has_norm = self.norm is None or type(self.norm).moments is not Normalization.moments
        return has_norm and self.inner.closed_moments

    def gaussian_moments(self, mean, cov):
        r"""The inner field's moments at the normalised Gaussian, chained through the norm.

        With :math:`u = N(X)` of exact moments :math:`(\mu_u, C_u)` and mean Jacobian
        :math:`J_N` (:meth:`Normalization.moments`), the inner field is taken against and
        at :math:`\mathcal N(\mu_u, C_u)`: :math:`(\mathbb E\Gamma, \mathbb E J_{\rm inner}J_N,
        \operatorname{Cov}\Gamma)`, so that :math:`\operatorname{Cov}(X, \Gamma) =
        \Sigma J_N^T\mathbb E J_{\rm inner}^T`. Exact when the inner field is affine
        against its measure (attention); otherwise the law of :math:`u` is replaced by its
        moment-matched Gaussian (docs/math.md 6.5 gives the error order).
        """
        if self.norm is None:
            return self.inner.gaussian_moments(mean, cov)
        mom = self.norm.moments(mean, cov)
        if mom is None:
            return None
        mu, C, Jn = mom
        inner = self.inner.gaussian_moments(mu, C)
        if inner is None:
            return None
        E, J, Cg = inner
        return E, J @ Jn, Cg

    def __call__(self, mean, cov, x):
        if self.norm is None:
            return self.inner(mean, cov, x)
        mn, cn = self._pushed(mean, cov)
        return self.inner(mn, cn, self.norm.apply(x, mean, cov))

    def particle(self, x, positions=None):
        y = x if self.norm is None else self.norm.apply_particles(x)
        return self.inner.particle(y, positions)
