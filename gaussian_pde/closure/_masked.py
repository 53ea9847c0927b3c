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

import numpy as np
from scipy.special import logsumexp

from .._common.linalg import psd_sqrt
from .._common.validation import (
    validate_array,
    validate_covariance,
    validate_int,
    validate_quadrature,
)
from ..attention import Attention
from ..integrate import Status, integrate_system, run_options
from ._engine import DEFAULT_N_PER_DIM, standard_nodes

_EPS = np.finfo(float).eps
_TINY = np.finfo(float).tiny
#: blocks whose means and covariances differ by at most this (relative) are treated as
#: one Gaussian by the logit test: the field's jump across a switch is then at most that
#: fraction (identical blocks drift apart by 4e-5 near a softmax blow-up, through the
#: blocks' different rounding, and the closure must still reach the exact t*; the runs
#: that chatter have blocks that differ by O(1))
_BLOCKS_EQUAL = 1e-3

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
    if covs0.ndim == 2 and covs0.shape == (d, d):
        covs0 = np.broadcast_to(covs0, (B, d, d))
    if covs0.shape != (B, d, d):
        raise ValueError(f"`{cov_name}` must have shape ({B}, {d}, {d}) (one per block of "
                         f"`{mean_name}`) or ({d}, {d}), got {covs0.shape}.")
    covs0 = validate_covariance(covs0, cov_name, batch=True)
    with np.errstate(over="ignore", invalid="ignore"):
        mix = mixture_moments(means0, covs0)
    if not all(np.all(np.isfinite(a)) for a in mix):
        raise ValueError(f"`{mean_name}` and `{cov_name}` are too large: the covariance of "
                         "the whole sequence (the mixture of the blocks) overflows float64 "
                         f"(largest |entry| of `{mean_name}` {np.max(np.abs(means0)):.3g}); "
                         "rescale them.")
    return means0, covs0


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
        On a confirmed blow-up, its time (docs/math.md section 10), extrapolated from
        :math:`u = B/\sum_b \operatorname{tr}\Sigma_b`.
    t_final : float or None
        Where the integration stopped.
    t_events : dict
        Times of every event, by name.
    nfev : int
        Right-hand-side evaluations.
    """

    t: np.ndarray
    means: np.ndarray
    covs: np.ndarray
    mixture_mean: np.ndarray
    mixture_cov: np.ndarray
    status: Status
    message: str
    t_blowup: float | None = None
    t_final: float | None = None
    t_events: dict = dataclasses.field(default_factory=dict)
    nfev: int = 0

    @property
    def success(self) -> bool:
        """``False`` only when the solver failed."""
        return Status(self.status).success


class _MaskedSystem:
    r"""Block means and factors for :func:`gaussian_pde.integrate._event_loop.integrate_system`.

    The events see the average block covariance :math:`\frac1B\sum_b \Sigma_b` (so
    identical blocks reach the verdicts of unmasked softmax with the same thresholds);
    user events see the moments of the whole sequence.
    """

    def __init__(self, attention, B, n_per_dim):
        self.att, self.B, self.d, self.n_per_dim = attention, B, attention.d, n_per_dim
        self.nm = B * attention.d
        self.nfev = 0
        Z, _ = standard_nodes(attention.d, n_per_dim)
        self._z_max = float(np.max(np.linalg.norm(Z, axis=1)))
        self._a_norm = float(np.linalg.norm(attention.A))

    def out_of_range(self, y):
        r"""Why the block field cannot be followed at ``y`` (None where it can).

        The weights :math:`\pi_c(x) \propto e^{\ell_c(x)}` depend on the differences of
        the logits :math:`\ell_c = \alpha_c^TAx + \frac12 x^TA^T\Sigma_cAx` between blocks.
        Once those pass :math:`1/\varepsilon` the weights switch between blocks across a
        layer of relative width below :math:`\varepsilon` (an argmax, discontinuous at
        the resolution of the nodes), and the steps chatter to nothing (block means of
        1e150: ``max_nfev`` after minutes, at t ~ 1e-139). The bound
        :math:`2|u|\max_b|\alpha_b - \bar\alpha| + |u|^2\max_b\|\Sigma_b - \bar\Sigma\|_F`,
        :math:`|u| \le \|A\|_F\max_b(|\alpha_b| + \|L_b\|_F\max|z|)` over the nodes
        :math:`z`, is checked at every step end, for blocks that differ by more than
        1e-3 relative (``_BLOCKS_EQUAL``: across a switch the field jumps by
        :math:`V(\alpha_c - \alpha_{c'} + (\Sigma_c - \Sigma_{c'})Ax)`, so blocks equal up to
        rounding or nearly equal, as for the softmax field, jump by little whatever the
        weights do); so are
        the moments of the whole sequence, which are returned.
        """
        means, L = self._split(y)
        with np.errstate(over="ignore", invalid="ignore"):
            covs = L @ np.swapaxes(L, -1, -2)
            mix = mixture_moments(means[None], covs[None])
            if not all(np.all(np.isfinite(a)) for a in mix):
                return ("the moments of the whole sequence (the mixture of the blocks) "
                        "overflow float64")
            m_abs = np.sqrt(np.einsum("bi,bi->b", means, means))
            l_fro = np.sqrt(np.einsum("bij,bij->b", L, L))
            u = self._a_norm * float(np.max(m_abs + l_fro * self._z_max))
            dm = means - means.mean(axis=0)
            dc = covs - covs.mean(axis=0)
            dm_max = float(np.sqrt(np.max(np.einsum("bi,bi->b", dm, dm))))
            dc_max = float(np.sqrt(np.max(np.einsum("bij,bij->b", dc, dc))))
            bound = 2.0 * u * dm_max + u * u * dc_max
            # the field jumps across a switch by V(alpha_c - alpha_c' + (S_c - S_c')Ax):
            # blocks equal up to rounding jump by rounding, whatever the weights do
            c_max = float(np.max(np.sqrt(np.einsum("bij,bij->b", covs, covs))))
            spread = max(dm_max / max(float(np.max(m_abs)) + np.sqrt(c_max), _TINY),
                         dc_max / max(c_max, _TINY))
        if not (_EPS * bound < 1.0 or spread <= _BLOCKS_EQUAL):
            return (f"the block weights' logits differ by up to {bound:.3g}: beyond "
                    f"1/eps = {1 / _EPS:.3g} they switch between blocks faster than the "
                    "resolution of the state (an argmax) and no solver can follow the "
                    "closure")
        return None

    def _split(self, y):
        B, d = self.B, self.d
        return y[:self.nm].reshape(B, d), y[self.nm:].reshape(B, d, d)

    def fun(self, t, y):
        self.nfev += 1
        dm, dL = masked_closure_rhs(self.att, *self._split(y), self.n_per_dim)
        return np.concatenate([dm.ravel(), dL.ravel()])

    __call__ = fun

    def trace(self, y):
        L = y[self.nm:]
        return float(L @ L) / self.B

    def cov_and_rate(self, y):
        means, L = self._split(y)
        _, dL = masked_closure_rhs(self.att, means, L, self.n_per_dim)
        C = dL @ np.swapaxes(L, -1, -2)
        return (L @ np.swapaxes(L, -1, -2)).mean(0), (C + np.swapaxes(C, -1, -2)).mean(0)

    def mean_and_cov(self, y):
        means, L = self._split(y)
        m, c = mixture_moments(means[None], (L @ np.swapaxes(L, -1, -2))[None])
        return m[0], c[0]


def solve_masked_closure(attention, means0, covs0, t_span, *, t_eval=None,
                         n_per_dim=DEFAULT_N_PER_DIM, method="RK45", rtol=1e-8, atol=1e-10,
                         blowup_threshold=1e8, steady_tol=None, steady_atol=0.0,
                         rank_tol=None, events=(), max_step=np.inf, first_step=None,
                         max_nfev=50_000):
    r"""Integrate the block-causal closure of masked attention.

    Runs :func:`gaussian_pde.solve`'s event loop, so statuses, the confirmed blow-up time
    and the events mean what they mean there (docs/math.md section 10). The events are
    evaluated on the average block covariance :math:`\frac1B\sum_b \Sigma_b`; user events
    ``event(t, mean, cov)`` receive the moments of the whole sequence.

    Parameters
    ----------
    attention : Attention
        One causal attention head (``closure == "block_causal"``: masked attention).
    means0 : array_like, shape (B, d)
        Initial block means (position-dependent data).
    covs0 : array_like, shape (B, d, d) or (d, d)
        Initial block covariances (one for all blocks if 2-D).
    t_span, t_eval, rtol, atol, max_step, first_step, max_nfev
        As in :func:`gaussian_pde.solve_closure`.
    method : str or OdeSolver subclass
        A :func:`scipy.integrate.solve_ivp` method for the event loop; default ``"RK45"``
        (the block field has no compiled form).
    n_per_dim : int
        Gauss-Hermite nodes per dimension (2..40).
    blowup_threshold, steady_tol, steady_atol, rank_tol, events
        As in :func:`gaussian_pde.solve`, on the average block covariance.

    Returns
    -------
    MaskedClosureSolution
    """
    if not (isinstance(attention, Attention) and attention.closure == "block_causal"
            and attention.heads == (attention,)):
        raise TypeError("`attention` must be one attention head whose closure is block-causal "
                        f"(masked attention), got {type(attention).__name__}.")
    d = attention.d
    means0, covs0 = validate_blocks(means0, covs0, d)
    B = means0.shape[0]
    n_per_dim = validate_quadrature(n_per_dim, "n_per_dim", d=d)
    opts, method, events = run_options(
        t_span, method, events, t_eval=t_eval, rtol=rtol, atol=atol, max_step=max_step,
        first_step=first_step, max_nfev=max_nfev, blowup_threshold=blowup_threshold,
        steady_tol=steady_tol, steady_atol=steady_atol, rank_tol=rank_tol)
    system = _MaskedSystem(attention, B, n_per_dim)
    y0 = np.concatenate([means0.ravel(), psd_sqrt(covs0).ravel()])
    run = integrate_system(system, y0, opts, method, user_events=events)
    means = run.y[:, :system.nm].reshape(-1, B, d)
    Ls = run.y[:, system.nm:].reshape(-1, B, d, d)
    covs = Ls @ np.swapaxes(Ls, -1, -2)
    mix_m, mix_c = mixture_moments(means, covs)
    return MaskedClosureSolution(t=run.t, means=means, covs=covs, mixture_mean=mix_m,
                                 mixture_cov=mix_c, status=run.status, message=run.message,
                                 t_blowup=run.t_blowup, t_final=run.t_final,
                                 t_events=run.t_events, nfev=run.nfev)
