r"""Public entry to the Gaussian moment equations.

For a Gaussian-preserving attention type with affine field :math:`b + Mx` against
:math:`\mathcal N(\alpha, \Sigma)` (docs/math.md section 3):

.. math::

    \alpha' = b + M\alpha,\qquad \Sigma' = M\Sigma + \Sigma M^T .
"""

from __future__ import annotations

import numpy as np

from .._common.validation import validate_covariance, validate_vector
from ._base import Attention

__all__ = ["moment_rhs", "require_mean", "validate_attention"]


def validate_attention(attention, *, gaussian=True):
    """Check that ``attention`` is an attention object (Gaussian-preserving if asked)."""
    if not isinstance(attention, Attention):
        raise TypeError("`attention` must be an attention object such as gaussian_pde.Softmax, "
                        f"got {type(attention).__name__}.")
    if gaussian and not attention.gaussian_preserving:
        raise TypeError(f"`attention` ({attention.name}) does not preserve Gaussians; "
                        "use the Gaussian closure (gaussian_pde.solve_closure) instead.")
    return attention


def require_mean(attention, mean, name):
    """Refuse a missing mean where the field matrix depends on it (``field_sees_mean``).

    Such a type's covariance equation involves the mean, so a covariance-only
    integration has no answer; ``name`` is the caller's argument (``"mean0"``).
    """
    if mean is None and attention.field_sees_mean:
        raise ValueError(f"`{name}` is required for {attention!r}: its field matrix depends "
                         "on the mean (the covariance equation involves the mean), so the "
                         "covariance cannot be integrated alone.")


def moment_rhs(attention, mean, cov):
    r"""Right-hand side of the Gaussian moment ODEs.

    Parameters
    ----------
    attention : Attention
        A Gaussian-preserving attention type (``Softmax``, ``L2``, ``Sinkhorn``,
        ``MultiHead``).
    mean : array_like, shape (d,)
        Mean :math:`\alpha`.
    cov : array_like, shape (d, d)
        Symmetric positive semi-definite covariance :math:`\Sigma`.

    Returns
    -------
    dmean : ndarray, shape (d,)
        :math:`\alpha' = b + M\alpha`.
    dcov : ndarray, shape (d, d)
        :math:`\Sigma' = M\Sigma + \Sigma M^T` (symmetric).

    Raises
    ------
    ValueError
        If the rates overflow float64 (a covariance near the top of the floating-point
        range, e.g. ``1e300`` for softmax): never an array with ``inf`` or NaN.
    """
    validate_attention(attention)
    mean = validate_vector(mean, "mean", size=attention.d)
    cov = validate_covariance(cov, "cov", d=attention.d)
    with np.errstate(over="ignore", invalid="ignore"):
        dmean, dcov = attention.moment_rhs(mean, cov)
        dcov = 0.5 * (dcov + dcov.T)
    if not (np.isfinite(dmean).all() and np.isfinite(dcov).all()):
        # the rates are not representable (e.g. softmax's Sigma' = M Sigma + Sigma M^T
        # with M ~ Sigma grows like Sigma^2): an error, never inf or NaN as an answer
        raise ValueError("the moment rates overflow float64 at this `mean` and `cov` "
                         f"(largest |cov| entry {np.abs(cov).max():.3g}, |mean| "
                         f"{np.abs(mean).max() if mean.size else 0.0:.3g}); rescale the "
                         "problem (the field is scale-covariant in the weights).")
    return dmean, dcov
