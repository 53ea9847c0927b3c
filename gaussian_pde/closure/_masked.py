r"""Block-causal Gaussian closure of masked (causal) softmax attention.

Positions :math:`\tau\in[0,1]` are cut into ``B`` equal blocks with centres
:math:`\tau_b = (b + 1/2)/B`; block ``b`` carries :math:`\mathcal N(\alpha_b, \Sigma_b)`.
A token of block ``b`` attends to the mixture :math:`\frac{1}{b+1}\sum_{c\le b}
\mathcal N(\alpha_c, \Sigma_c)` of the earlier blocks, itself included. The field is
exact for that mixture (each component's tilted law is Gaussian, docs/math.md section 3.2):

.. math::

    \Gamma_b(x) = V\sum_{c\le b}\pi_c(x)\,(\alpha_c + \Sigma_cAx),\qquad
    \pi_c(x) \propto \exp\big(\alpha_c^TAx + \tfrac12 x^TA^T\Sigma_cAx\big),

and it is nonlinear in ``x`` (the weights :math:`\pi_c`), so each block is closed by
moment matching (:mod:`gaussian_pde.closure._engine`, factor form). With the same Gaussian in every
block, :math:`\Gamma_b` is the unmasked softmax field and the closure is exact.

The particle system with the same block structure puts token ``i`` at its block's centre
(ties attend to each other: :math:`\tau'\le\tau` is inclusive), so closure and particles
solve the same mean-field problem and differ only by the closure error and Monte Carlo.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
from scipy.integrate import solve_ivp
from scipy.special import logsumexp

from .._common.linalg import psd_sqrt
from .._common.validation import (
    validate_array,
    validate_covariance,
    validate_int,
    validate_quadrature,
    validate_t_span,
    validate_tolerance,
)
from ..attention._masked import Masked
from ..integrate._solve import Status
from ._engine import DEFAULT_N_PER_DIM, standard_nodes

__all__ = ["MaskedClosureSolution", "masked_field", "masked_closure_rhs",
           "solve_masked_closure", "block_positions", "validate_blocks", "mixture_moments"]


def block_positions(n, n_blocks):
    """Positions of ``n`` tokens, ``n / n_blocks`` per block, each at its block's centre."""
    n = validate_int(n, "n", minimum=2)
    n_blocks = validate_int(n_blocks, "n_blocks", minimum=1)
    if n % n_blocks:
        raise ValueError(f"`n` = {n} must be a multiple of `n_blocks` = {n_blocks}.")
    return np.repeat((np.arange(n_blocks) + 0.5) / n_blocks, n // n_blocks)


def validate_blocks(means0, covs0, d, mean_name="means0", cov_name="covs0"):
    """Block means ``(B, d)`` and covariances ``(B, d, d)`` (a ``(d, d)`` one is shared)."""
    means0 = validate_array(means0, mean_name, ndim=2)
    if means0.shape[1] != d or means0.shape[0] < 1:
        raise ValueError(f"`{mean_name}` must have shape (B, {d}) with B >= 1, got "
                         f"{means0.shape}.")
    B = means0.shape[0]
    covs0 = validate_array(covs0, cov_name, ndim=(2, 3))
    if covs0.ndim == 2:
        covs0 = np.broadcast_to(covs0, (B, d, d))
    if covs0.shape != (B, d, d):
        raise ValueError(f"`{cov_name}` must have shape ({B}, {d}, {d}) (one per block of "
                         f"`{mean_name}`) or ({d}, {d}), got {covs0.shape}.")
    return means0, validate_covariance(covs0, cov_name, batch=True)


def mixture_moments(means, covs):
    """Mean and covariance of the uniform mixture of the blocks (last axes ``(B, d)``)."""
    m = means.mean(axis=-2)
    dev = means - m[..., None, :]
    c = covs.mean(axis=-3) + np.einsum("...bi,...bj->...ij", dev, dev) / means.shape[-2]
    return m, c


def masked_field(attention, means, covs, b, x):
    r"""Velocity :math:`\Gamma_b(x)` of block ``b`` (unchecked), ``x`` of shape (n, d)."""
    A, V = attention.A, attention.V
    u = x @ A.T                                          # (n, d): A x
    logits = (u @ means[: b + 1].T
              + 0.5 * np.einsum("nd,cde,ne->nc", u, covs[: b + 1], u))
    P = np.exp(logits - logsumexp(logits, axis=1, keepdims=True))
    tilted = means[None, : b + 1] + np.einsum("cde,ne->ncd", covs[: b + 1], u)
    return np.einsum("nc,nce->ne", P, tilted) @ V.T


def masked_closure_rhs(attention, means, factors, n_per_dim=DEFAULT_N_PER_DIM):
    r"""Closure right-hand side of every block: :math:`(\alpha_b', L_b')`, unchecked."""
    B, d = means.shape
    Z, W = standard_nodes(d, n_per_dim)
    covs = factors @ np.swapaxes(factors, -1, -2)
    dm = np.empty_like(means)
    dL = np.empty_like(factors)
    for b in range(B):
        X = means[b] + Z @ factors[b].T
        G = masked_field(attention, means, covs, b, X)
        dm[b] = W @ G
        dL[b] = (G * W[:, None]).T @ Z
    return dm, dL


@dataclasses.dataclass(frozen=True)
class MaskedClosureSolution:
    r"""Result of :func:`solve_masked_closure`.

    Attributes
    ----------
    t : ndarray (T,)
    means : ndarray (T, B, d)
    covs : ndarray (T, B, d, d)
    mixture_mean, mixture_cov : ndarray (T, d), (T, d, d)
        Moments of the whole sequence (the uniform mixture of the blocks).
    status : Status
    message : str
    t_blowup : float or None
        On a blow-up, the time extrapolated from :math:`u = 1/\sum_b \operatorname{tr}
        \Sigma_b`, which vanishes linearly at a Riccati singularity:
        :math:`t^* \approx t - u/u'`.
    """

    t: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    mixture_mean: np.ndarray
    mixture_cov: np.ndarray
    status: Status
    message: str
    t_blowup: float | None = None


def solve_masked_closure(attention, means0, covs0, t_span, *, t_eval=None,
                         n_per_dim=DEFAULT_N_PER_DIM, rtol=1e-8, atol=1e-10,
                         blowup_threshold=1e8):
    r"""Integrate the block-causal closure of masked attention.

    Parameters
    ----------
    attention : Masked
        The causal attention head.
    means0 : array_like, shape (B, d)
        Initial block means (position-dependent data).
    covs0 : array_like, shape (B, d, d) or (d, d)
        Initial block covariances (one for all blocks if 2-D).
    t_span, t_eval, rtol, atol
        As in :func:`gaussian_pde.solve`.
    n_per_dim : int
        Gauss-Hermite nodes per dimension (2..40).
    blowup_threshold : float
        Stop when the summed traces exceed this multiple of their initial value.

    Returns
    -------
    MaskedClosureSolution
    """
    if not isinstance(attention, Masked):
        raise TypeError(f"`attention` must be a Masked attention, got {type(attention).__name__}.")
    d = attention.d
    means0, covs0 = validate_blocks(means0, covs0, d)
    B = means0.shape[0]
    t0, t1 = validate_t_span(t_span)
    n_per_dim = validate_quadrature(n_per_dim, "n_per_dim", d=d)
    rtol = validate_tolerance(rtol, "rtol")
    y0 = np.concatenate([means0.ravel(), psd_sqrt(covs0).ravel()])
    nm = B * d
    tr0 = float(np.trace(covs0, axis1=1, axis2=2).sum())

    def rhs(t, y):
        dm, dL = masked_closure_rhs(attention, y[:nm].reshape(B, d),
                                    y[nm:].reshape(B, d, d), n_per_dim)
        return np.concatenate([dm.ravel(), dL.ravel()])

    def blowup(t, y):
        L = y[nm:]
        return float(L @ L) - blowup_threshold * tr0

    blowup.terminal, blowup.direction = True, 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        res = solve_ivp(rhs, (t0, t1), y0, t_eval=t_eval, rtol=rtol, atol=atol,
                        events=[blowup])
    status, message, t_blowup = Status.FINISHED, "reached the end of t_span", None
    if res.status == -1:
        status, message = Status.FAILED, res.message
    elif res.status == 1:
        te, ye = float(res.t_events[0][0]), res.y_events[0][0]
        L, dL = ye[nm:], rhs(te, ye)[nm:]
        tr, dtr = float(L @ L), 2.0 * float(L @ dL)
        t_blowup = te + tr / dtr if dtr > 0 else None
        message = f"blow-up: the traces passed the threshold at t = {te:.10g}" + (
            "" if t_blowup is None else f"; estimated blow-up time t* = {t_blowup:.10g}")
        status = Status.BLOWUP
    Y = res.y.T
    means = Y[:, :nm].reshape(-1, B, d)
    Ls = Y[:, nm:].reshape(-1, B, d, d)
    covs = Ls @ np.swapaxes(Ls, -1, -2)
    mix_m, mix_c = mixture_moments(means, covs)
    return MaskedClosureSolution(t=res.t, means=means, covs=covs, mixture_mean=mix_m,
                                 mixture_cov=mix_c, status=status, message=message,
                                 t_blowup=t_blowup)
