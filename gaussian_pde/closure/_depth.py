r"""Discrete depth: a stack of L layers in three modes (docs/math.md section 7.1).

Layer :math:`\ell` has its own field :math:`F_\ell` (a block of
:mod:`gaussian_pde.closure._blocks`, or an attention type). Modes:

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

and the continuous mode integrates :math:`L' = ML` (an attention layer with a compiled field:
:func:`gaussian_pde.solve` and its compiled engine, through
:func:`~gaussian_pde.closure._engine.solve_closure`). Otherwise it is the Gaussian closure:
the continuous mode integrates the closure ODE (:func:`gaussian_pde.closure._engine.solve_closure`);
the discrete modes use the field's closed moments where it has them
(:meth:`~gaussian_pde.closure._engine.Field.gaussian_moments`: MLPs, LayerNorm/RMSNorm/trace
normalisation in pre-norm position, sums with one non-affine term; docs/math.md 6.5),

.. math::

    (\alpha, \Sigma) \mapsto (\alpha + h\mathbb E\Gamma,\
    \Sigma + h(\Sigma\,\mathbb EJ^T + \mathbb EJ\,\Sigma) + h^2\operatorname{Cov}\Gamma),

with no quadrature in :math:`d`; other fields push the Gauss-Hermite nodes of
:math:`\mathcal N(\alpha,\Sigma)` through the layer map and match the mean and covariance
of the images (the weights are positive, so the covariance stays PSD), a tensor rule that
:func:`propagate_gaussian` refuses up front where it is too large. Particles run every mode with the same weights:
RK4 (``steps_per_layer`` steps) for the continuous mode, the layer map itself otherwise.

Masked (causal) attention layers carry token positions (a stack is either all masked or
has no masked layer). Their Gaussian propagation is the block-causal family of
:mod:`gaussian_pde.closure._masked`: ``B`` position blocks, block ``b`` carrying
:math:`\mathcal N(\alpha_b, \Sigma_b)` and attending to the mixture of blocks
:math:`c \le b`. The continuous mode integrates the block closure
(:func:`gaussian_pde.closure._masked.solve_masked_closure`); the discrete modes push each
block's Gauss-Hermite nodes through the layer map :math:`x \mapsto x + h\Gamma_b(x)` or
:math:`x \mapsto \Gamma_b(x)`, with :math:`\Gamma_b` evaluated against the blocks *before*
the layer, and match moments. Particles apply the masked particle velocity with the
tokens' positions.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._common.linalg import psd_sqrt
from .._common.runge_kutta import rk4_step
from .._common.validation import (
    QUADRATURE_MAX_NODES,
    validate_allocation,
    validate_array,
    validate_covariance,
    validate_int,
    validate_particles,
    validate_positions,
    validate_positive,
    validate_quadrature,
    validate_same_dimension,
    validate_step,
    validate_tolerance,
    validate_vector,
)
from ..attention import Attention
from ..integrate import Status, event_options
from ..particles import particle_moments, sliced_wasserstein_to_gaussian
from ._engine import DEFAULT_N_PER_DIM, as_field, solve_closure, standard_nodes
from ._masked import (
    block_positions,
    masked_field,
    mixture_moments,
    solve_masked_closure,
    validate_blocks,
)

__all__ = ["Stack", "DepthSolution", "propagate_gaussian", "propagate_particles", "MODES"]

#: the depth modes
MODES = ("continuous", "residual", "none")
_HUGE = float(np.finfo(float).max)


def _is_block_causal(layer):
    """Whether a layer is an attention type with the block-causal closure (masked)."""
    return isinstance(layer, Attention) and layer.closure == "block_causal"


def _as_layer(obj, name):
    """A layer: a :class:`Field` (attention is wrapped), or a block-causal head as is."""
    if isinstance(obj, Attention) and obj.uses_positions:
        if not _is_block_causal(obj):
            raise TypeError(f"`{name}` ({obj.name}) uses token positions but has no "
                            "block-causal closure (closure = "
                            f"{obj.closure!r}): no depth propagation is defined for it.")
        return obj
    return as_field(obj, name)


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

    Notes
    -----
    A stack of :class:`~gaussian_pde.attention._masked.Masked` heads (all layers masked; mixing
    masked and position-free layers is rejected) propagates a block-causal family of
    Gaussians (``propagate_gaussian(..., n_blocks=B)``) and tokens with positions.

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> gp.Stack(gp.Softmax(np.eye(2), np.eye(2), np.eye(2)), n_layers=4, h=0.1).n_layers
    4
    """

    def __init__(self, layers, n_layers=None, h=1.0, mode="residual"):
        if isinstance(layers, (list, tuple)):
            if len(layers) < 1:
                raise ValueError("`layers` must contain at least one layer (L >= 1).")
            fields = [_as_layer(f, f"layers[{i}]") for i, f in enumerate(layers)]
            if n_layers is not None and validate_int(n_layers, "n_layers") != len(fields):
                raise ValueError(f"`n_layers` = {n_layers} does not match len(layers) = "
                                 f"{len(fields)}.")
        else:
            if n_layers is None:
                raise ValueError("`n_layers` is required when `layers` is a single field.")
            n_layers = validate_allocation(validate_int(n_layers, "n_layers", minimum=1),
                                           "n_layers")
            fields = [_as_layer(layers, "layers")] * n_layers
        self.d = validate_same_dimension(fields, "layers")
        masked = [_is_block_causal(f) for f in fields]
        if any(masked) and not all(masked):
            i = masked.index(not masked[0])
            raise ValueError(f"`layers[{i}]` is {'' if masked[i] else 'not '}masked but "
                             f"`layers[0]` is {'' if masked[0] else 'not '}masked: a stack "
                             "is either all masked (block-causal) or has no masked layer.")
        #: whether the layers are masked (causal) attention heads
        self.masked = masked[0]
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
        extra = ", masked" if self.masked else ""
        return (f"Stack(n_layers={self.n_layers}, h={self.h:g}, mode={self.mode!r}, "
                f"d={self.d}{extra})")


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
        (:func:`gaussian_pde.particles._simulate.sliced_wasserstein_to_gaussian`).
    x_final : ndarray or None
        Particles only: the last tokens.
    block_mean, block_cov : ndarray or None, shapes (K, B, d) and (K, B, d, d)
        Masked stacks: the moments of every position block (Gaussian: the block-causal
        family; particles: the tokens of each block, given ``n_blocks``). ``mean`` and
        ``cov`` are then the moments of the whole sequence (the uniform mixture of the
        blocks), so they compare with an unmasked stack's.
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
    block_mean: np.ndarray | None = None
    block_cov: np.ndarray | None = None

    @property
    def success(self) -> bool:
        """``False`` only when the propagation failed."""
        return Status(self.status).success


def _push_nodes(F, mean, cov, h, mode, n_per_dim):
    """Closure of a discrete layer: moments of the images of the Gauss-Hermite nodes.

    ``F(mean, cov, X)`` is the velocity at the nodes ``X``: a :class:`Field`, or any
    callable with that signature (the block fields of a masked layer).
    """
    Z, W = standard_nodes(mean.shape[0], n_per_dim)
    X = mean + Z @ psd_sqrt(cov).T
    V = F(mean, cov, X)
    Y = X + h * V if mode == "residual" else V
    m = W @ Y
    Yc = Y - m
    C = (Yc * W[:, None]).T @ Yc
    return m, 0.5 * (C + C.T)


def _gaussian_layer(F, mean, cov, h, mode, n_per_dim):
    r"""One discrete layer: exact (affine), closed moments, or the tensor rule.

    Closed moments :math:`(\mathbb E\Gamma, \mathbb EJ, \operatorname{Cov}\Gamma)`
    (:meth:`~gaussian_pde.closure._engine.Field.gaussian_moments`) give the residual map's
    :math:`\alpha + h\mathbb E\Gamma` and
    :math:`\Sigma + h(\Sigma\,\mathbb EJ^T + \mathbb EJ\,\Sigma) + h^2\operatorname{Cov}\Gamma`
    (mode none: :math:`(\mathbb E\Gamma, \operatorname{Cov}\Gamma)`).
    """
    aff = F.affine(mean, cov)
    if aff is not None:
        b, M = aff
        if mode == "residual":
            P = np.eye(F.d) + h * M
            return mean + h * (b + M @ mean), P @ cov @ P.T, True
        return b + M @ mean, M @ cov @ M.T, True
    mom = F.gaussian_moments(mean, cov) if F.closed_moments else None
    if mom is not None:
        E, J, C = mom
        if mode == "residual":
            X = cov @ J.T
            c = cov + h * (X + X.T) + (h * h) * C
            return mean + h * E, 0.5 * (c + c.T), False
        return E, C, False
    m, c = _push_nodes(F, mean, cov, h, mode, n_per_dim)
    return m, c, False


def _needs_tensor_rule(stack):
    """Indices of the layers whose Gaussian map needs the tensor Gauss-Hermite rule."""
    if stack.masked:
        return list(range(stack.n_layers))
    return [i for i, F in enumerate(stack.layers)
            if not (F.always_affine or F.closed_moments)]


def _check_tensor_rule(stack, n_per_dim):
    """Refuse up front a tensor rule too large to compute, with what it would need."""
    need = _needs_tensor_rule(stack)
    if not need:
        return
    nodes = n_per_dim ** stack.d
    if nodes > QUADRATURE_MAX_NODES:
        gib = nodes * stack.d * 8 * 3 / 2**30
        raise ValueError(
            f"layer {need[0] + 1} ({stack.layers[need[0]]!r}) has no closed Gaussian moments, "
            f"so its Gaussian map needs the tensor Gauss-Hermite rule: `n_per_dim` = "
            f"{n_per_dim} in d = {stack.d} is {float(nodes):.3g} nodes (about {gib:.3g} GiB), "
            f"more than {QUADRATURE_MAX_NODES}; lower `n_per_dim`, or use layers with "
            "closed moments (affine, MLP, LayerNorm/RMSNorm/TraceNorm PreNorm of those, "
            "sums with one non-affine term).")


def _masked_layer(att, means, covs, h, mode, n_per_dim):
    """Discrete masked layer: every block's nodes pushed through its own layer map.

    Block ``b``'s field attends to the blocks ``c <= b`` as they are *before* the layer.
    Exact (up to rounding) when all blocks carry the same Gaussian (the field is then the
    affine softmax field) or when there is a single block.
    """
    out_m, out_c = np.empty_like(means), np.empty_like(covs)
    for b in range(means.shape[0]):
        def F(mean, cov, X, b=b):
            return masked_field(att, means, covs, b, X)

        out_m[b], out_c[b] = _push_nodes(F, means[b], covs[b], h, mode, n_per_dim)
    return out_m, out_c, _blocks_equal(means, covs)


def _blocks_equal(means, covs):
    """Whether the masked field is affine: one block, or the same Gaussian in every block."""
    scale = 1.0 + np.abs(means).max() + np.abs(covs).max()
    return means.shape[0] == 1 or bool(np.abs(means - means[0]).max() <= 1e-13 * scale
                                       and np.abs(covs - covs[0]).max() <= 1e-13 * scale)


def _masked_initial(stack, mean0, cov0, n_blocks):
    """Block means (B, d) and covariances (B, d, d) from the inputs of a masked stack."""
    d = stack.d
    if n_blocks is not None:
        n_blocks = validate_int(n_blocks, "n_blocks", minimum=1)
    if callable(mean0):
        if n_blocks is None:
            raise ValueError("`n_blocks` is required when `mean0` is a function of the "
                             "position.")
        centres = (np.arange(n_blocks) + 0.5) / n_blocks
        mean0 = validate_array(mean0(centres), "mean0(positions)", ndim=2)
    else:
        mean0 = validate_array(mean0, "mean0", ndim=(1, 2))
        if mean0.ndim == 1:
            if n_blocks is None:
                raise ValueError("`n_blocks` is required with a single mean `mean0` for a "
                                 "masked stack (or give `mean0` of shape (B, d)).")
            mean0 = np.broadcast_to(mean0, (n_blocks, mean0.shape[0]))
    if n_blocks is not None and mean0.shape[0] != n_blocks:
        raise ValueError(f"`mean0` has {mean0.shape[0]} blocks but `n_blocks` = {n_blocks}.")
    return validate_blocks(mean0, cov0, d, "mean0", "cov0")


def propagate_gaussian(stack, mean0, cov0, *, n_blocks=None, n_per_dim=DEFAULT_N_PER_DIM,
                       blowup_threshold=1e8, rtol=1e-8, atol=1e-10):
    r"""Propagate :math:`\mathcal N(\alpha_0, \Sigma_0)` through the stack (exact or closure).

    Parameters
    ----------
    stack : Stack
        The layers and mode.
    mean0 : array_like, shape (d,); masked stacks also (B, d) or callable
        Input mean. Masked stack: one mean per position block, shape ``(B, d)``; a single
        ``(d,)`` mean for all ``n_blocks`` blocks (position-independent data); or a function
        ``mean0(tau) -> (B, d)`` evaluated at the block centres :math:`(b + 1/2)/B`.
    cov0 : array_like, shape (d, d); masked stacks also (B, d, d)
        Input covariance (masked: one per block, or one shared).
    n_blocks : int, optional
        Masked stacks only: the number ``B >= 1`` of position blocks (checked against
        ``mean0``; required when ``mean0`` is a ``(d,)`` vector or a function).
    n_per_dim : int
        Gauss-Hermite nodes per dimension of the closure (2..40), for the layers without
        closed moments (their tensor rule of ``n_per_dim ** d`` nodes is refused up front
        above 250,000 nodes, with the memory it would take).
    blowup_threshold : float
        Stop with ``"blowup"`` when tr Sigma exceeds this multiple of tr Sigma_0 (masked:
        the covariance of the whole sequence, the mixture of the blocks).
    rtol, atol : float
        Tolerances of the continuous mode's ODE solver (per layer,
        :func:`~gaussian_pde.closure._engine.solve_closure` with its default method: an
        attention layer with a compiled field runs :func:`gaussian_pde.solve`, other
        layers the closure's RK45 event loop).

    Returns
    -------
    DepthSolution
        Masked stacks also fill ``block_mean`` and ``block_cov``; ``mean`` and ``cov`` are
        the mixture's moments.
    """
    if not isinstance(stack, Stack):
        raise TypeError(f"`stack` must be a Stack, got {type(stack).__name__}.")
    if stack.masked:
        means, covs = _masked_initial(stack, mean0, cov0, n_blocks)
        state = (means, covs)
    else:
        if n_blocks is not None:
            raise ValueError("`n_blocks` applies to a stack of masked attention only.")
        state = (validate_vector(mean0, "mean0", size=stack.d),
                 validate_covariance(cov0, "cov0", d=stack.d))
    n_per_dim = validate_quadrature(n_per_dim, "n_per_dim")
    _check_tensor_rule(stack, n_per_dim)
    # the states after every layer and the closed moments' working d x d arrays
    validate_allocation((stack.n_layers + 12) * stack.d ** 2, "stack")
    blowup_threshold = event_options(blowup_threshold).blowup_threshold
    rtol = validate_tolerance(rtol, "rtol")
    atol = validate_positive(atol, "atol")

    def moments(st):
        return mixture_moments(*st) if stack.masked else st

    def total_trace(st):
        return max(float(np.trace(st[1], axis1=-2, axis2=-1).sum()), 1e-300)

    tr0 = max(float(np.trace(moments(state)[1])), 1e-300)
    states, exact = [state], []
    status, message, t_blowup = Status.FINISHED, "all layers applied", None
    for i, F in enumerate(stack.layers):
        mean, cov = state
        if stack.mode == "continuous":
            # the solvers' thresholds are relative to their own start (a sum of block
            # traces for the masked closure): the same absolute level as tr0 * threshold
            # (capped: past float64 the level is never reached, and must stay finite)
            rel = min(blowup_threshold * (tr0 / total_trace(state)) + 1.0, _HUGE)
            if stack.masked:
                sol = solve_masked_closure(F, mean, cov, (0.0, stack.h), t_eval=[0.0, stack.h],
                                           n_per_dim=n_per_dim, rtol=rtol, atol=atol,
                                           blowup_threshold=rel)
                exact.append(_blocks_equal(mean, cov))
                new = (sol.means[-1], sol.covs[-1])
            else:
                sol = solve_closure(F, mean, cov, (0.0, stack.h), t_eval=[0.0, stack.h],
                                    n_per_dim=n_per_dim, rtol=rtol, atol=atol,
                                    blowup_threshold=rel)
                exact.append(F.affine(mean, cov) is not None)
                new = (sol.mean_final, sol.cov_final)
            if sol.status != Status.FINISHED:
                status, message = sol.status, f"layer {i + 1}: {sol.message}"
                if sol.t_blowup is not None:
                    t_blowup = i * stack.h + sol.t_blowup
                break
            state = new
        else:
            if stack.masked:
                *new, ex = _masked_layer(F, mean, cov, stack.h, stack.mode, n_per_dim)
            else:
                *new, ex = _gaussian_layer(F, mean, cov, stack.h, stack.mode, n_per_dim)
            exact.append(ex)
            state = tuple(new)
            with np.errstate(over="ignore", invalid="ignore"):
                finite = all(np.all(np.isfinite(a)) for a in (*state, *moments(state)))
            if not finite:
                status, message = Status.FAILED, f"non-finite moments after layer {i + 1}"
                break
        states.append(state)
        if np.trace(moments(state)[1]) > blowup_threshold * tr0:
            status, t_blowup = Status.BLOWUP, (i + 1) * stack.h
            message = (f"tr(cov) passed {blowup_threshold:.3g} x its input value after "
                       f"layer {i + 1}")
            break
    K = len(states)
    mom = [moments(st) for st in states]
    extra = {}
    if stack.masked:
        extra = {"block_mean": np.array([st[0] for st in states]),
                 "block_cov": np.array([st[1] for st in states])}
    return DepthSolution(depth=stack.h * np.arange(K), mean=np.array([m for m, _ in mom]),
                         cov=np.array([c for _, c in mom]),
                         exact=np.array(exact[:K - 1], dtype=bool),
                         status=status, message=message, t_blowup=t_blowup, **extra)


def _block_index(positions, n_blocks):
    """Block of each token: ``floor(tau B)``, the last block closed at ``tau = 1``."""
    idx = np.minimum((positions * n_blocks).astype(int), n_blocks - 1)
    counts = np.bincount(idx, minlength=n_blocks)
    if np.any(counts == 0):
        raise ValueError(f"`positions` leave block {int(np.argmin(counts))} of `n_blocks` = "
                         f"{n_blocks} without tokens.")
    return idx


def propagate_particles(stack, x0, *, steps_per_layer=10, positions=None, n_blocks=None,
                        blowup_threshold=1e8, n_directions=32):
    r"""Run the same stack on tokens :math:`x_1..x_n` (particle Monte Carlo).

    Continuous mode: ``steps_per_layer`` classical RK4 steps of the particle system per
    layer; residual: :math:`x_i \mapsto x_i + hF[\mu_n](x_i)`; none: :math:`x_i \mapsto
    F[\mu_n](x_i)`, with the fields' particle velocities (attention: the attention's own
    ``particle_velocity``; masked attention with the tokens' ``positions``).

    Parameters
    ----------
    stack : Stack
        The layers and mode.
    x0 : array_like, shape (n, d)
        Input tokens.
    steps_per_layer : int
        RK4 steps per layer of the continuous mode (at least 1).
    positions : array_like, shape (n,), optional
        Sequence positions in ``[0, 1]`` (masked stacks). Default: the block centres of
        :func:`gaussian_pde.closure._masked.block_positions` when ``n_blocks`` is given
        (``n`` a multiple of it), else :math:`(i + 1/2)/n`.
    n_blocks : int, optional
        Masked stacks only: also record the moments of the tokens of each position block
        :math:`[b/B, (b+1)/B)` (``block_mean``, ``block_cov``), to compare with
        :func:`propagate_gaussian` with the same ``n_blocks``.
    blowup_threshold : float
        Stop with ``"blowup"`` when the tokens' tr Sigma exceeds this multiple of its input.
    n_directions : int
        Directions of the sliced W2 distance from Gaussianity.

    Returns
    -------
    DepthSolution
        Particle means and covariances (:math:`\frac1n` convention) after each layer, and
        the tokens' distance from Gaussianity (``non_gaussianity``).
    """
    if not isinstance(stack, Stack):
        raise TypeError(f"`stack` must be a Stack, got {type(stack).__name__}.")
    x = validate_particles(x0, "x0", d=stack.d).copy()
    n = x.shape[0]
    steps_per_layer = validate_int(steps_per_layer, "steps_per_layer", minimum=1)
    n_directions = validate_int(n_directions, "n_directions", minimum=1)
    validate_allocation(n * n_directions, "n_directions")
    blowup_threshold = event_options(blowup_threshold).blowup_threshold
    block = None
    if n_blocks is not None:
        if not stack.masked:
            raise ValueError("`n_blocks` applies to a stack of masked attention only.")
        n_blocks = validate_int(n_blocks, "n_blocks", minimum=1)
        if positions is None:
            positions = block_positions(n, n_blocks)
    if positions is not None:
        positions = validate_positions(positions, n)
    if n_blocks is not None:
        block = _block_index(positions, n_blocks)

    def record(x):
        m, c = particle_moments(x)
        if block is None:
            return m, c, None, None
        bm, bc = zip(*(particle_moments(x[block == b]) for b in range(n_blocks)))
        return m, c, np.array(bm), np.array(bc)

    rec = [record(x)]
    if not np.all(np.isfinite(rec[0][1])):
        raise ValueError("`x0` is too large: the covariance of the tokens overflows float64 "
                         f"(largest |entry| {np.max(np.abs(x)):.3g}); rescale the tokens.")
    tr0 = max(float(np.trace(rec[0][1])), 1e-300)
    ng = [sliced_wasserstein_to_gaussian(x, n_directions)]
    status, message, t_blowup = Status.FINISHED, "all layers applied", None
    for i, F in enumerate(stack.layers):
        x_prev = x
        if stack.masked:
            def v(y, F=F):
                return F.particle_velocity(y, positions=positions)[0]
        else:
            def v(y, F=F):
                return F.particle(y, positions)

        if stack.mode == "continuous":
            dt = stack.h / steps_per_layer
            for _ in range(steps_per_layer):
                x = rk4_step(lambda t, y, v=v: v(y), 0.0, x, dt, finite=True)
                if x is None:     # a stage left the floating-point range
                    break
            if x is None:
                status, message = Status.FAILED, (
                    f"non-finite tokens within layer {i + 1}: a Runge-Kutta stage left the "
                    "floating-point range")
                x = x_prev
                break
        elif stack.mode == "residual":
            x = x + stack.h * v(x)
        else:
            x = v(x)
        if not np.all(np.isfinite(x)):
            # x_final keeps the last finite tokens (those after the previous layer)
            status, message = Status.FAILED, f"non-finite tokens after layer {i + 1}"
            x = x_prev
            break
        with np.errstate(over="ignore", invalid="ignore"):
            r = record(x)
        if not all(a is None or np.all(np.isfinite(a)) for a in r):
            # finite tokens whose moments overflow: x_final keeps the last tokens whose
            # moments are finite (those after the previous layer)
            status, message = Status.FAILED, (f"the covariance of the tokens overflows "
                                              f"float64 after layer {i + 1}")
            x = x_prev
            break
        rec.append(r)
        ng.append(sliced_wasserstein_to_gaussian(x, n_directions))
        if np.trace(rec[-1][1]) > blowup_threshold * tr0:
            status, t_blowup = Status.BLOWUP, (i + 1) * stack.h
            message = (f"tr(cov) passed {blowup_threshold:.3g} x its input value after "
                       f"layer {i + 1}")
            break
    K = len(rec)
    extra = {}
    if block is not None:
        extra = {"block_mean": np.array([r[2] for r in rec]),
                 "block_cov": np.array([r[3] for r in rec])}
    return DepthSolution(depth=stack.h * np.arange(K), mean=np.array([r[0] for r in rec]),
                         cov=np.array([r[1] for r in rec]), exact=np.zeros(K - 1, dtype=bool),
                         status=status, message=message, t_blowup=t_blowup,
                         non_gaussianity=np.array(ng), x_final=x, **extra)
