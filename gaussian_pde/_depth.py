r"""Discrete depth: a stack of L layers in three modes (MATH.md section 7).

Layer :math:`\ell` has its own field :math:`F_\ell` (a block of
:mod:`gaussian_pde._blocks`, or an attention type). Modes:

``"continuous"``
    the ODE :math:`\dot x = F_\ell[\mu](x)` for a time ``h`` per layer (the Transformer PDE
    with piecewise-constant weights);
``"residual"``
    :math:`x \mapsto x + hF_\ell[\mu](x)` (the Euler step of the PDE);
``"none"``
    :math:`x \mapsto F_\ell[\mu](x)` (no residual connection).

Gaussian propagation is exact where the field is affine, :math:`F = b + Mx`:

.. math::

    \text{residual: } (\alpha, \Sigma) \mapsto (\alpha + h(b + M\alpha),\ (I + hM)\Sigma(I + hM)^T),
    \qquad \text{none: } (b + M\alpha,\ M\Sigma M^T),

and the continuous mode integrates :math:`L' = ML`. Otherwise it is the Gaussian closure:
the continuous mode integrates the closure ODE (:func:`gaussian_pde._closure.solve_closure`)
and the discrete modes push the Gauss-Hermite nodes of :math:`\mathcal N(\alpha,\Sigma)`
through the layer map and match the mean and covariance of the images (the weights are
positive, so the covariance stays PSD). Particles run every mode with the same weights:
RK4 (``steps_per_layer`` steps) for the continuous mode, the layer map itself otherwise.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ._closure import DEFAULT_N_PER_DIM, as_field, solve_closure, standard_nodes
from ._linalg import psd_sqrt
from ._particles import particle_moments, sliced_wasserstein_to_gaussian
from ._solve import Status
from ._validation import (
    validate_covariance,
    validate_int,
    validate_particles,
    validate_positive,
    validate_quadrature,
    validate_same_dimension,
    validate_step,
    validate_vector,
)

__all__ = ["Stack", "DepthSolution", "propagate_gaussian", "propagate_particles", "MODES"]

#: the depth modes
MODES = ("continuous", "residual", "none")


class Stack:
    r"""A stack of ``n_layers`` layers :math:`F_1, \dots, F_L` with step ``h`` and a mode.

    Parameters
    ----------
    layers : Field, Attention, or sequence of them
        One field per layer; a single field is repeated ``n_layers`` times.
    n_layers : int, optional
        Number of layers (required with a single field; checked against the sequence).
    h : float
        Layer step, ``h > 0`` (residual: :math:`x + hF(x)`; continuous: time per layer;
        unused by ``"none"`` except as the depth unit ``t = \ell h``).
    mode : {"continuous", "residual", "none"}

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> from gaussian_pde._depth import Stack
    >>> Stack(gp.Softmax(np.eye(2), np.eye(2), np.eye(2)), n_layers=4, h=0.1).n_layers
    4
    """

    def __init__(self, layers, n_layers=None, h=1.0, mode="residual"):
        if isinstance(layers, (list, tuple)):
            if len(layers) < 1:
                raise ValueError("`layers` must contain at least one layer (L >= 1).")
            fields = [as_field(f, f"layers[{i}]") for i, f in enumerate(layers)]
            if n_layers is not None and validate_int(n_layers, "n_layers") != len(fields):
                raise ValueError(f"`n_layers` = {n_layers} does not match len(layers) = "
                                 f"{len(fields)}.")
        else:
            if n_layers is None:
                raise ValueError("`n_layers` is required when `layers` is a single field.")
            n_layers = validate_int(n_layers, "n_layers", minimum=1)
            fields = [as_field(layers, "layers")] * n_layers
        self.d = validate_same_dimension(fields, "layers")
        self.layers = tuple(fields)
        self.h = validate_step(h, "h")
        if mode not in MODES:
            raise ValueError(f"`mode` must be one of {MODES}, got {mode!r}.")
        self.mode = mode

    @property
    def n_layers(self):
        """Number of layers L."""
        return len(self.layers)

    def __repr__(self):
        return f"Stack(n_layers={self.n_layers}, h={self.h:g}, mode={self.mode!r}, d={self.d})"


@dataclasses.dataclass(frozen=True)
class DepthSolution:
    r"""Moments after every layer (index 0 is the input).

    Attributes
    ----------
    depth : ndarray, shape (K,)
        :math:`t = \\ell h` for the layers reached.
    mean, cov : ndarray, shapes (K, d) and (K, d, d)
    exact : ndarray of bool, shape (K - 1,)
        Whether each layer map was exact (affine field) or a closure.
    status : Status
        ``"finished"``, ``"blowup"`` (tr Sigma above ``blowup_threshold`` times the input,
        or a blow-up inside a continuous layer) or ``"failed"`` (non-finite moments).
    message : str
    t_blowup : float or None
        Continuous mode: extrapolated blow-up time; discrete modes: the depth ``l h`` at
        which the threshold was passed.
    non_gaussianity : ndarray, shape (K,) or None
        Particles only: sliced W2 of the whitened tokens to N(0, I)
        (:func:`gaussian_pde._particles.sliced_wasserstein_to_gaussian`).
    x_final : ndarray or None
        Particles only: the last tokens.
    """

    depth: np.ndarray
    mean: np.ndarray
    cov: np.ndarray
    exact: np.ndarray
    status: Status
    message: str
    t_blowup: float | None = None
    non_gaussianity: np.ndarray | None = None
    x_final: np.ndarray | None = None


def _push_nodes(F, mean, cov, h, mode, n_per_dim):
    """Closure of a discrete layer: moments of the images of the Gauss-Hermite nodes."""
    Z, W = standard_nodes(F.d, n_per_dim)
    X = mean + Z @ psd_sqrt(cov).T
    V = F(mean, cov, X)
    Y = X + h * V if mode == "residual" else V
    m = W @ Y
    Yc = Y - m
    C = (Yc * W[:, None]).T @ Yc
    return m, 0.5 * (C + C.T)


def _gaussian_layer(F, mean, cov, h, mode, n_per_dim):
    aff = F.affine(mean, cov)
    if aff is not None:
        b, M = aff
        if mode == "residual":
            P = np.eye(F.d) + h * M
            return mean + h * (b + M @ mean), P @ cov @ P.T, True
        return b + M @ mean, M @ cov @ M.T, True
    m, c = _push_nodes(F, mean, cov, h, mode, n_per_dim)
    return m, c, False


def propagate_gaussian(stack, mean0, cov0, *, n_per_dim=DEFAULT_N_PER_DIM,
                       blowup_threshold=1e8, rtol=1e-8, atol=1e-10):
    r"""Propagate :math:`\mathcal N(\alpha_0, \Sigma_0)` through the stack (exact or closure).

    Parameters
    ----------
    stack : Stack
        The layers and mode.
    mean0 : array_like, shape (d,)
        Input mean.
    cov0 : array_like, shape (d, d)
        Input covariance.
    n_per_dim : int
        Gauss-Hermite nodes per dimension of the closure (2..40).
    blowup_threshold : float
        Stop with ``"blowup"`` when tr Sigma exceeds this multiple of tr Sigma_0.
    rtol, atol : float
        Tolerances of the continuous mode's ODE solver.

    Returns
    -------
    DepthSolution
    """
    if not isinstance(stack, Stack):
        raise TypeError(f"`stack` must be a Stack, got {type(stack).__name__}.")
    mean = validate_vector(mean0, "mean0", size=stack.d)
    cov = validate_covariance(cov0, "cov0", d=stack.d)
    n_per_dim = validate_quadrature(n_per_dim, "n_per_dim", d=stack.d)
    blowup_threshold = validate_positive(blowup_threshold, "blowup_threshold")
    tr0 = max(float(np.trace(cov)), 1e-300)
    means, covs, exact = [mean], [cov], []
    status, message, t_blowup = Status.FINISHED, "all layers applied", None
    for i, F in enumerate(stack.layers):
        if stack.mode == "continuous":
            sol = solve_closure(F, mean, cov, (0.0, stack.h), t_eval=[0.0, stack.h],
                                n_per_dim=n_per_dim, rtol=rtol, atol=atol,
                                blowup_threshold=blowup_threshold * tr0 / max(
                                    float(np.trace(cov)), 1e-300) + 1.0)
            exact.append(F.affine(mean, cov) is not None)
            if sol.status != Status.FINISHED:
                status, message = sol.status, f"layer {i + 1}: {sol.message}"
                if sol.t_blowup is not None:
                    t_blowup = i * stack.h + sol.t_blowup
                break
            mean, cov = sol.mean_final, sol.cov_final
        else:
            mean, cov, ex = _gaussian_layer(F, mean, cov, stack.h, stack.mode, n_per_dim)
            exact.append(ex)
            if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(cov))):
                status, message = Status.FAILED, f"non-finite moments after layer {i + 1}"
                break
        means.append(mean)
        covs.append(cov)
        if np.trace(cov) > blowup_threshold * tr0:
            status, t_blowup = Status.BLOWUP, (i + 1) * stack.h
            message = (f"tr(cov) passed {blowup_threshold:.3g} x its input value after "
                       f"layer {i + 1}")
            break
    K = len(means)
    return DepthSolution(depth=stack.h * np.arange(K), mean=np.array(means),
                         cov=np.array(covs), exact=np.array(exact[:K - 1], dtype=bool),
                         status=status, message=message, t_blowup=t_blowup)


def propagate_particles(stack, x0, *, steps_per_layer=10, positions=None,
                        blowup_threshold=1e8, n_directions=32):
    r"""Run the same stack on tokens :math:`x_1..x_n` (particle Monte Carlo).

    Continuous mode: ``steps_per_layer`` classical RK4 steps of the particle system per
    layer; residual: :math:`x_i \mapsto x_i + hF[\mu_n](x_i)`; none: :math:`x_i \mapsto
    F[\mu_n](x_i)`, with the fields' particle velocities (attention: the attention's own
    ``particle_velocity``).

    Returns
    -------
    DepthSolution
        Particle means and covariances (:math:`\frac1n` convention) after each layer, and
        the tokens' distance from Gaussianity (``non_gaussianity``).
    """
    if not isinstance(stack, Stack):
        raise TypeError(f"`stack` must be a Stack, got {type(stack).__name__}.")
    x = validate_particles(x0, "x0", d=stack.d).copy()
    steps_per_layer = validate_int(steps_per_layer, "steps_per_layer", minimum=1)
    m, c = particle_moments(x)
    tr0 = max(float(np.trace(c)), 1e-300)
    means, covs, ng = [m], [c], [sliced_wasserstein_to_gaussian(x, n_directions)]
    status, message, t_blowup = Status.FINISHED, "all layers applied", None
    for i, F in enumerate(stack.layers):
        def v(y, F=F):
            return F.particle(y, positions)

        if stack.mode == "continuous":
            dt = stack.h / steps_per_layer
            for _ in range(steps_per_layer):
                k1 = v(x)
                k2 = v(x + dt / 2 * k1)
                k3 = v(x + dt / 2 * k2)
                k4 = v(x + dt * k3)
                x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        elif stack.mode == "residual":
            x = x + stack.h * v(x)
        else:
            x = v(x)
        if not np.all(np.isfinite(x)):
            status, message = Status.FAILED, f"non-finite tokens after layer {i + 1}"
            break
        m, c = particle_moments(x)
        means.append(m)
        covs.append(c)
        ng.append(sliced_wasserstein_to_gaussian(x, n_directions))
        if np.trace(c) > blowup_threshold * tr0:
            status, t_blowup = Status.BLOWUP, (i + 1) * stack.h
            message = (f"tr(cov) passed {blowup_threshold:.3g} x its input value after "
                       f"layer {i + 1}")
            break
    K = len(means)
    return DepthSolution(depth=stack.h * np.arange(K), mean=np.array(means),
                         cov=np.array(covs), exact=np.zeros(K - 1, dtype=bool),
                         status=status, message=message, t_blowup=t_blowup,
                         non_gaussianity=np.array(ng), x_final=x)
