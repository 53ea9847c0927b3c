r"""Gaussian moments of normalisations and activations without a tensor rule (docs/math.md 6.5).

Per-token normalisation (LayerNorm, RMSNorm)
    :math:`u = \gamma\odot v\,g(r) + \beta`, :math:`v = Px`, :math:`r = |v|^2/d`,
    :math:`g(r) = (r + \epsilon)^{-1/2}` (LayerNorm: :math:`P = I - \mathbf 1\mathbf 1^T/d`;
    RMSNorm: :math:`P = I`, :math:`\beta = 0`). For :math:`x \sim \mathcal N(m, \Sigma)` the
    vector :math:`v \sim \mathcal N(\mu, S)`, :math:`\mu = Pm`, :math:`S = P\Sigma P = U\Lambda
    U^T`, is Gaussian and :math:`r` is a generalised chi-square. With the Laplace
    representation

    .. math:: (r + \epsilon)^{-p} = \frac{1}{\Gamma(p)}\int_0^\infty t^{p-1}e^{-t(r+\epsilon)}\,dt,

    every moment needed is a one-dimensional integral in :math:`t` of a Gaussian integral
    with a quadratic tilt, in closed form in the eigenbasis of :math:`S`
    (:math:`c = 2/d`, :math:`\tilde\mu = U^T\mu`):

    .. math::

        \mathbb E[e^{-tr}f(v)] = Z(t)\,\mathbb E_t[f(v)],\quad
        Z(t) = \prod_i (1 + ct\lambda_i)^{-1/2}
               \exp\Big(-\frac td\sum_i\frac{\tilde\mu_i^2}{1 + ct\lambda_i}\Big),

    :math:`\mathbb E_t` the Gaussian with mean :math:`\tilde\mu_i/(1 + ct\lambda_i)` and
    variances :math:`\lambda_i/(1 + ct\lambda_i)` (in the eigenbasis). The integral in
    :math:`s = \log t` is a trapezoidal sum (the integrand is analytic in the strip
    :math:`|\operatorname{Im}s| < \pi/2`, so the error falls like :math:`e^{-\pi^2/\Delta s}`).
    This gives :math:`\mathbb E u`, :math:`\operatorname{Cov}u` and the mean Jacobian
    :math:`\mathbb E[\partial u/\partial x] = \operatorname{diag}(\gamma)\,(\mathbb E[g]P +
    c\,\mathbb E[g'(r)vv^T])`, so that :math:`\operatorname{Cov}(x, u) = \Sigma\,
    \mathbb E[\partial u/\partial x]^T` (Stein's lemma): the exact first two joint
    moments of :math:`(x, u)`, at :math:`O(d^3)` cost (one eigendecomposition).

Activations of Gaussian pre-activations
    For :math:`a \sim \mathcal N(m, C)`, :math:`s_k = \sqrt{C_{kk}}`,
    :math:`\rho_{kl} = C_{kl}/(s_ks_l)`, the Hermite coefficients
    :math:`e_{n,k} = \mathbb E[\phi(m_k + s_kz)\,\mathrm{He}_n(z)] = s_k^n\,\mathbb E\phi^{(n)}(a_k)`
    give Mehler's expansion

    .. math:: \operatorname{Cov}(\phi(a_k), \phi(a_l)) = \sum_{n \ge 1}
              \frac{\rho_{kl}^n}{n!}\,e_{n,k}\,e_{n,l},

    truncated after order :math:`N` off the diagonal with remainder at most
    :math:`|\rho_{kl}|^{N+1}\sqrt{R_kR_l}`, :math:`R_k = \operatorname{Var}\phi(a_k) -
    \sum_{n \le N} e_{n,k}^2/n!` (Cauchy-Schwarz on the tail); the diagonal is the exact
    variance. Every activation is ReLU plus a part :math:`\psi` that vanishes (to
    rounding) outside :math:`|u| \le 10` and is smooth except at 0: ReLU's coefficients
    are closed forms (:math:`e_0 = m\Phi + s\varphi`, :math:`e_1 = s\Phi`,
    :math:`e_n = s\,\mathrm{He}_{n-2}(-m/s)\,\varphi(m/s)` for :math:`n \ge 2`,
    :math:`\mathbb E\,\mathrm{ReLU}^2 = (m^2 + s^2)\Phi + ms\varphi`, at :math:`m/s`); the
    :math:`\psi` parts are composite Gauss-Legendre sums split at the kink.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import ndtr

__all__ = ["normalization_moments", "activation_hermite", "gaussian_activation_moments"]

_SQRT2PI = math.sqrt(2 * math.pi)
_STEP = 0.3        # trapezoid step in log t: error ~ exp(-pi^2 / 0.3) ~ 5e-15
_LOG_CUT = 40.0    # nodes whose log-integrand is this far below the peak are dropped


def _laplace_nodes(lam, mu2, d, eps, rbar):
    r"""Nodes and weights of the three Laplace integrals (p = 1/2, 1, 3/2).

    Returns ``F = 1/(1 + c t lam)`` (n, d) and the weights (3, n) of
    :math:`\frac{1}{\Gamma(p)}\int t^{p-1}e^{-t\epsilon}Z(t)\,\cdot\,dt` on the trapezoid in
    :math:`s = \log t`.
    """
    c = 2.0 / d
    s_c = -math.log(rbar + eps)
    # eps = 0: the tail decays only as a power of t (that of the rank), so go further
    hi = s_c + 300.0 if eps == 0 else max(s_c + 60.0, math.log(80.0 / eps))
    s = np.arange(s_c - 90.0, hi + _STEP, _STEP)
    t = np.exp(s)
    ct = c * t[:, None] * lam
    F = 1.0 / (1.0 + ct)
    logZ = -0.5 * np.log1p(ct).sum(axis=1) - (t / d) * (F @ mu2)
    p = np.array([0.5, 1.0, 1.5])
    logw = (p[:, None] * s - t * eps + logZ
            - np.array([math.lgamma(q) for q in p])[:, None] + math.log(_STEP))
    top = logw.max(axis=1, keepdims=True)
    if np.any(logw[:, -1] > top[:, 0] - _LOG_CUT):
        raise ValueError("the normalisation's moments are infinite or too heavy-tailed for "
                         "its closure: `eps` = 0 with a covariance of rank below 4 (the "
                         "token's centred part is nearly degenerate); use `eps` > 0.")
    keep = np.any(logw > top - _LOG_CUT, axis=0)
    return F[keep], np.exp(logw[:, keep])


def normalization_moments(mean, cov, gamma, beta, eps, center):
    r"""Exact mean, covariance and mean Jacobian of a per-token normalisation of a Gaussian.

    :math:`u = \gamma\odot Px\,(|Px|^2/d + \epsilon)^{-1/2} + \beta` for
    :math:`x \sim \mathcal N(m, \Sigma)` (module docstring).

    Parameters
    ----------
    mean : ndarray, shape (d,)
        :math:`m`.
    cov : ndarray, shape (d, d)
        :math:`\Sigma`.
    gamma, beta : ndarray, shape (d,)
        Gain and shift.
    eps : float
        ``>= 0``; with 0 the closure asks for a centred covariance of rank 4 or more.
    center : bool
        Subtract the coordinates' mean (LayerNorm) or not (RMSNorm).

    Returns
    -------
    mean_u : ndarray (d,)
    cov_u : ndarray (d, d)
    jac : ndarray (d, d)
        :math:`\mathbb E[\partial u/\partial x]`; :math:`\operatorname{Cov}(x, u) = \Sigma\,J^T`.
    """
    d = mean.shape[0]
    if center:
        mu = mean - mean.mean()
        S = cov - cov.mean(axis=0) - cov.mean(axis=1)[:, None] + cov.mean()
    else:
        mu, S = mean, cov
    lam, U = np.linalg.eigh(0.5 * (S + S.T))
    lam = np.maximum(lam, 0.0)
    mt = U.T @ mu
    mu2 = mt * mt
    rbar = (float(mu2.sum()) + float(lam.sum())) / d
    F, w = _laplace_nodes(lam, mu2, d, eps, rbar)
    w_half, w_one, w_3half = w
    # E[g v] = U (a * mt), a_i = I_{1/2}[1/(1 + c t lam_i)]; E[g] = I_{1/2}[1]
    mean_gv = U @ ((w_half @ F) * mt)
    e_g = float(w_half.sum())

    def second(wp):
        # E[(r + eps)^{-p} v v^T] in the eigenbasis: diag(I_p[lam F]) + (mt mt^T) o I_p[F F^T]
        B = (F * wp[:, None]).T @ F
        B *= np.outer(mt, mt)
        B[np.diag_indices(d)] += (wp @ F) * lam
        return B

    B2 = second(w_one)
    B3 = second(w_3half)
    E_gvv = U @ B2 @ U.T
    cov_v = E_gvv - np.outer(mean_gv, mean_gv)
    cov_u = gamma[:, None] * cov_v * gamma
    # J = diag(gamma) (E[g] P + c E[g' v v^T]), g' = -(1/2)(r + eps)^{-3/2}, c = 2/d
    K = -(U @ B3 @ U.T) / d
    if center:
        K[np.diag_indices(d)] += e_g
        K -= e_g / d
    else:
        K[np.diag_indices(d)] += e_g
    jac = gamma[:, None] * K
    return gamma * mean_gv + beta, 0.5 * (cov_u + cov_u.T), jac


# --------------------------------------------------------------------------------------
# activations


def _phi(x):
    return np.exp(-0.5 * x * x) / _SQRT2PI


def _hermite_table(z, order):
    """Probabilists' Hermite polynomials ``He_0..He_order`` at ``z``, shape (order+1, ...)."""
    H = np.empty((order + 1,) + np.shape(z))
    H[0] = 1.0
    if order >= 1:
        H[1] = z
    for n in range(1, order):
        H[n + 1] = z * H[n] - n * H[n - 1]
    return H


def _relu_hermite(m, s, order):
    """ReLU's coefficients e_0..e_order and E[ReLU^2] at N(m, s^2) (s > 0)."""
    k = m / s
    Phi, ph = ndtr(k), _phi(k)
    e = np.empty((order + 1,) + m.shape)
    e[0] = m * Phi + s * ph
    if order >= 1:
        e[1] = s * Phi
    if order >= 2:
        H = _hermite_table(-k, order - 2)
        e[2:] = s * H * ph
    return e, (m * m + s * s) * Phi + m * s * ph


_GL = np.polynomial.legendre.leggauss(10)
_PANELS = 12       # per side of the kink: 240 nodes per unit


def _split_nodes(lo, hi, n_panels):
    """Composite Gauss-Legendre nodes and weights on [lo, hi] (arrays of intervals)."""
    x, w = _GL
    edges = lo[..., None] + (hi - lo)[..., None] * np.linspace(0.0, 1.0, n_panels + 1)
    half = 0.5 * np.diff(edges, axis=-1)
    mid = edges[..., :-1] + half
    nodes = (mid[..., None] + half[..., None] * x).reshape(lo.shape + (-1,))
    weights = (half[..., None] * w).reshape(lo.shape + (-1,))
    return nodes, weights


def _psi_rule(m, s):
    """Nodes ``u`` (p, q) and weights (p, q) of E[f(a)] for the part localised in |u| <= 10.

    Wide units (s >= 1/2): composite Gauss-Legendre in ``u`` on [-10, 0] and [0, 10]
    (panels of width 5/6) against the normal density (the kink of the activation at 0 is a
    panel edge). Narrow units: the same in ``z = (u - m)/s`` on [-9, 9], split at the kink
    ``z = -m/s`` (the activation varies on the scale ``1/s > 2`` in ``z``).
    """
    p = m.shape[0]
    q = 2 * _PANELS * _GL[0].size
    u = np.empty((p, q))
    w = np.empty((p, q))
    wide = s >= 0.5
    if np.any(wide):
        mw, sw = m[wide], s[wide]
        k = mw.shape[0]
        u1, w1 = _split_nodes(np.full(k, -10.0), np.zeros(k), _PANELS)
        u2, w2 = _split_nodes(np.zeros(k), np.full(k, 10.0), _PANELS)
        uw = np.concatenate([u1, u2], axis=1)
        u[wide] = uw
        w[wide] = (np.concatenate([w1, w2], axis=1)
                   * _phi((uw - mw[:, None]) / sw[:, None]) / sw[:, None])
    narrow = ~wide
    if np.any(narrow):
        mn, sn = m[narrow], s[narrow]
        k = mn.shape[0]
        z0 = np.clip(-mn / sn, -9.0, 9.0)
        z1, v1 = _split_nodes(np.full(k, -9.0), z0, _PANELS)
        z2, v2 = _split_nodes(z0, np.full(k, 9.0), _PANELS)
        zn = np.concatenate([z1, z2], axis=1)
        u[narrow] = mn[:, None] + sn[:, None] * zn
        w[narrow] = np.concatenate([v1, v2], axis=1) * _phi(zn)
    return u, w


def activation_hermite(activation, m, s, order):
    r"""Hermite coefficients :math:`e_0..e_N` and second moment of :math:`\phi(a)`, :math:`a\sim\mathcal N(m,s^2)`.

    Parameters
    ----------
    activation : callable or None
        ``psi(u)``: the activation minus ReLU (vanishing outside ``|u| <= 10``); ``None``
        for ReLU itself.
    m, s : ndarray, shape (p,)
        Means and standard deviations of the pre-activations.
    order : int
        The largest :math:`n`.

    Returns
    -------
    e : ndarray, shape (order + 1, p)
        :math:`e_n = \mathbb E[\phi(m + sz)\mathrm{He}_n(z)]`; :math:`e_0 = \mathbb E\phi`,
        :math:`e_1/s = \mathbb E\phi'`.
    second : ndarray, shape (p,)
        :math:`\mathbb E[\phi(a)^2]`.
    """
    m = np.asarray(m, float)
    s = np.asarray(s, float)
    pos = s > 1e-12
    ss = np.where(pos, s, 1.0)
    e, second = _relu_hermite(m, ss, order)
    if activation is not None:
        u, w = _psi_rule(m, ss)
        psi = activation(u)
        relu = np.maximum(u, 0.0)
        H = _hermite_table((u - m[:, None]) / ss[:, None], order)
        e = e + np.einsum("npq,pq->np", H, psi * w)
        second = second + np.einsum("pq,pq->p", psi * (psi + 2 * relu), w)
    if not np.all(pos):   # a constant pre-activation: phi(m), no fluctuation
        val = np.maximum(m, 0.0) if activation is None else np.maximum(m, 0.0) + activation(m)
        e[:, ~pos] = 0.0
        e[0, ~pos] = val[~pos]
        second = np.where(pos, second, val * val)
    return e, second


def gaussian_activation_moments(activation, mean, s, cov, order):
    r"""Mean, mean derivative and the non-linear covariance of :math:`\phi(a)`, :math:`a \sim \mathcal N(m, C)`.

    Parameters
    ----------
    activation : callable or None
        As in :func:`activation_hermite`.
    mean : ndarray, shape (p,)
        :math:`m`.
    s : ndarray, shape (p,)
        :math:`s_k = \sqrt{C_{kk}}`.
    cov : ndarray, shape (p, p), or None
        :math:`C` (needed for ``order >= 2`` only).
    order : int
        Mehler order :math:`N \ge 1` off the diagonal (order 1 needs no ``p x p`` matrix).

    Returns
    -------
    e0 : ndarray (p,)
        :math:`\mathbb E\phi(a)`.
    dphi : ndarray (p,)
        :math:`\mathbb E\phi'(a)`, so that
        :math:`\operatorname{Cov}(a, \phi(a)) = C\,\operatorname{diag}(\mathbb E\phi')` (Stein's lemma)
        and the order-1 term of Mehler's expansion is
        :math:`\operatorname{diag}(\mathbb E\phi')\,C\,\operatorname{diag}(\mathbb E\phi')`.
    extra : ndarray (p,) or (p, p)
        :math:`\operatorname{Cov}\phi(a)` minus that order-1 term: the diagonal
        :math:`\operatorname{Var}\phi(a_k) - e_{1,k}^2` (order 1), or the full matrix with
        the orders ``2..N`` off the diagonal.
    bound : float or None
        ``order >= 2``: the largest truncation bound :math:`|\rho_{kl}|^{N+1}\sqrt{R_kR_l}`
        relative to :math:`\max_k\operatorname{Var}\phi(a_k)`; ``None`` for order 1
        (it would need the ``p x p`` correlations).
    """
    e, second = activation_hermite(activation, mean, s, order)
    var = np.maximum(second - e[0] ** 2, 0.0)
    pos = s > 1e-12
    sinv = np.where(pos, 1.0 / np.where(pos, s, 1.0), 0.0)
    dphi = e[1] * sinv
    diag = np.maximum(var - e[1] ** 2, 0.0)
    if order == 1:
        return e[0], dphi, diag, None
    R = cov * sinv[:, None] * sinv
    extra = np.zeros_like(R)
    Rn = R.copy()
    fact = 1.0
    tail = var - e[1] ** 2
    for n in range(2, order + 1):
        Rn *= R
        fact *= n
        extra += Rn * np.outer(e[n] / fact, e[n])
        tail -= e[n] ** 2 / fact
    np.fill_diagonal(extra, diag)
    np.abs(R, out=R)
    np.fill_diagonal(R, 0.0)
    R **= order + 1
    r_tail = np.sqrt(np.maximum(tail, 0.0))
    bound = float((R * r_tail[:, None] * r_tail).max(initial=0.0)
                  / max(float(var.max(initial=0.0)), 1e-300))
    return e[0], dphi, extra, bound
