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
    validate_int,
    validate_matrix,
    validate_positive,
    validate_quadrature,
    validate_vector,
)
from ._engine import DEFAULT_N_PER_DIM, Field, as_field, standard_nodes

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

    Notes
    -----
    The closure terms use the closed forms of the module docstring (no quadrature; for
    ``gelu_tanh`` a 1-D Gauss-Hermite sum per hidden unit).
    """

    def __init__(self, W1, b1, W2, b2, activation="relu"):
        W1 = validate_matrix(W1, "W1")
        p, d = W1.shape
        self.W1 = W1
        self.b1 = validate_vector(b1, "b1", size=p)
        self.W2 = validate_matrix(W2, "W2", shape=(d, p))
        self.b2 = validate_vector(b2, "b2", size=d)
        if activation not in ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {ACTIVATIONS}, got {activation!r}.")
        self.activation = activation
        self.d = d

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

    def push(self, mean, cov, n_per_dim):
        r"""Mean and covariance of :math:`N_\#\mathcal N(\alpha,\Sigma)` (quadrature by default)."""
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
        self.n_per_dim = validate_quadrature(n_per_dim, "n_per_dim", d=self.d)

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

    def __call__(self, mean, cov, x):
        if self.norm is None:
            return self.inner(mean, cov, x)
        mn, cn = self._pushed(mean, cov)
        return self.inner(mn, cn, self.norm.apply(x, mean, cov))

    def particle(self, x, positions=None):
        y = x if self.norm is None else self.norm.apply_particles(x)
        return self.inner.particle(y, positions)
