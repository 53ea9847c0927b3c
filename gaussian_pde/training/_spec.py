r"""Model specifications: one family of Transformer encoders and the PDE simulator.

Every model maps tokens :math:`x_1, \dots, x_n \in \mathbb R^d` (one sequence) through
``depth`` blocks built from two sub-layers, multi-head softmax attention

.. math::

    \mathrm{Attn}(x_i) = \sum_{h=1}^{H} V_h \sum_j w^h_{ij}\,x_j,\qquad
    w^h_{ij} \propto e^{c\,\langle Q_h x_i, K_h x_j\rangle},\qquad V_h = W_{O,h} W_{V,h},

(the map of :class:`gaussian_pde.Softmax` summed over heads as in
:class:`gaussian_pde.MultiHead`; :math:`c = 1/\sqrt k` by default, :math:`k = d/H`) and a
two-layer feed-forward map :math:`\mathrm{FFN}(x) = W_2\,\phi(W_1 x + b_1) + b_2`
(:math:`\phi` the exact GELU :math:`u\Phi(u)`, its tanh approximation, or ReLU). The
block of each variant
(docs/math.md section 11):

``pre_ln``
    :math:`x \leftarrow x + \mathrm{Attn}(\mathrm{LN}(x))`;
    :math:`x \leftarrow x + \mathrm{FFN}(\mathrm{LN}(x))`
``post_ln``
    :math:`x \leftarrow \mathrm{LN}(x + \mathrm{Attn}(x))`;
    :math:`x \leftarrow \mathrm{LN}(x + \mathrm{FFN}(x))`
``no_ln``
    :math:`x \leftarrow x + \mathrm{Attn}(x)`; :math:`x \leftarrow x + \mathrm{FFN}(x)`
``no_residual``
    :math:`x \leftarrow \mathrm{Attn}(\mathrm{LN}(x))`; :math:`x \leftarrow \mathrm{FFN}(\mathrm{LN}(x))`
``neither``
    :math:`x \leftarrow \mathrm{Attn}(x)`; :math:`x \leftarrow \mathrm{FFN}(x)`
``pde_euler``
    :math:`\dot x = \mathrm{Attn}_t[\mu](x) + \mathrm{FFN}_t(x)` on :math:`[0, T]`, explicit
    Euler at :math:`h = T/L`, weights piecewise constant per layer
``pde_rk4``
    the same ODE, one classical RK4 step per layer
``pde_euler_tied``, ``pde_rk4_tied``
    the same with one set of weights for every layer
"""

from __future__ import annotations

import dataclasses
import math
import numbers

__all__ = ["ModelSpec", "VARIANTS", "model_spec"]

_NORMS = ("pre", "post", "none")
_SIMULATORS = (None, "euler", "rk4")
_ACTIVATIONS = ("gelu", "relu", "gelu_tanh")


def _check_int(value, name, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {type(value).__name__}.")
    if value < minimum:
        raise ValueError(f"`{name}` must be at least {minimum}, got {value}.")
    return int(value)


def _check_real(value, name, *, positive=True):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a real number, got {type(value).__name__}.")
    value = float(value)
    if not math.isfinite(value) or (positive and value <= 0):
        raise ValueError(f"`{name}` must be a finite positive number, got {value!r}.")
    return value


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    r"""One model of the family (see the module docstring for the blocks).

    Parameters
    ----------
    residual : bool
        Residual connections around both sub-layers (ignored by the simulator, which is
        residual by construction: its Euler step is :math:`x + h\,F(x)`).
    norm : {"pre", "post", "none"}
        LayerNorm placement (``"none"``: no normalisation; the simulator has none).
    simulator : {None, "euler", "rk4"}
        ``None``: a Transformer block stack; otherwise the PDE simulator integrated with
        that scheme at :math:`h = T/L`.
    tied : bool
        One set of block weights shared by every layer.
    width, depth, heads : int
        Token dimension :math:`d`, number of layers :math:`L \ge 1`, heads :math:`H`
        (``width`` divisible by ``heads``; head size :math:`k = d/H`).
    ffn_width : int, optional
        Hidden width of the feed-forward map (default ``2 * width``); 0: no FFN
        (attention-only blocks).
    horizon : float
        The simulator's depth :math:`T` (``h = T/L``).
    scale : float, optional
        Score scale :math:`c` (default :math:`1/\sqrt k`).
    activation : {"gelu", "relu", "gelu_tanh"}
        The FFN's activation (:class:`gaussian_pde.MLP`'s names).
    """

    residual: bool = True
    norm: str = "pre"
    simulator: str | None = None
    tied: bool = False
    width: int = 8
    depth: int = 4
    heads: int = 2
    ffn_width: int | None = None
    horizon: float = 1.0
    scale: float | None = None
    activation: str = "gelu"
    name: str = ""

    def __post_init__(self):
        set_ = object.__setattr__
        for flag in ("residual", "tied"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"`{flag}` must be True or False, got {getattr(self, flag)!r}.")
        if self.norm not in _NORMS:
            raise ValueError(f"`norm` must be one of {_NORMS}, got {self.norm!r}.")
        if self.simulator not in _SIMULATORS:
            raise ValueError(f"`simulator` must be one of {_SIMULATORS}, got {self.simulator!r}.")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {_ACTIVATIONS}, "
                             f"got {self.activation!r}.")
        set_(self, "width", _check_int(self.width, "width", 2))
        set_(self, "depth", _check_int(self.depth, "depth", 1))
        set_(self, "heads", _check_int(self.heads, "heads", 1))
        if self.width % self.heads:
            raise ValueError(f"`width` ({self.width}) must be divisible by `heads` "
                             f"({self.heads}).")
        ffn = 2 * self.width if self.ffn_width is None else self.ffn_width
        set_(self, "ffn_width", _check_int(ffn, "ffn_width", 0))
        set_(self, "horizon", _check_real(self.horizon, "horizon"))
        if self.scale is not None:
            set_(self, "scale", _check_real(self.scale, "scale"))
        if self.simulator is not None:
            if self.norm != "none":
                raise ValueError("the PDE simulator has no normalisation: `norm` must be "
                                 f"'none' when `simulator` is given, got {self.norm!r}.")
            set_(self, "residual", True)
        if not self.name:
            set_(self, "name", self._default_name())

    def _default_name(self):
        if self.simulator is not None:
            return f"pde_{self.simulator}" + ("_tied" if self.tied else "")
        ln = {"pre": "pre_ln", "post": "post_ln", "none": "no_ln"}[self.norm]
        base = ln if self.residual else ("no_residual" if self.norm != "none" else "neither")
        if not self.residual and self.norm == "post":
            base = "no_residual_post_ln"
        return base + ("_tied" if self.tied else "")

    @property
    def head_dim(self) -> int:
        """Head size :math:`k = d / H`."""
        return self.width // self.heads

    @property
    def score_scale(self) -> float:
        r"""The score scale :math:`c` in use (``scale``, default :math:`1/\sqrt k`)."""
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.head_dim)

    @property
    def step(self) -> float:
        """Depth step: :math:`h = T/L` for the simulator, 1 for a block stack."""
        return self.horizon / self.depth if self.simulator is not None else 1.0

    @property
    def n_weight_sets(self) -> int:
        """Number of distinct block weight sets (1 when tied)."""
        return 1 if self.tied else self.depth

    @property
    def has_layernorm(self) -> bool:
        """Whether the blocks normalise (the bridge to the Gaussian solver needs not)."""
        return self.norm != "none"

    def replace(self, **changes):
        """A copy with ``changes`` (the name is recomputed unless given)."""
        changes.setdefault("name", "")
        return dataclasses.replace(self, **changes)


#: the variants of the study, by name (same width, depth, heads and initialisation)
VARIANTS = {
    "pre_ln": ModelSpec(residual=True, norm="pre"),
    "post_ln": ModelSpec(residual=True, norm="post"),
    "no_ln": ModelSpec(residual=True, norm="none"),
    "no_residual": ModelSpec(residual=False, norm="pre"),
    "neither": ModelSpec(residual=False, norm="none"),
    "pde_euler": ModelSpec(norm="none", simulator="euler"),
    "pde_rk4": ModelSpec(norm="none", simulator="rk4"),
    "pde_euler_tied": ModelSpec(norm="none", simulator="euler", tied=True),
    "pde_rk4_tied": ModelSpec(norm="none", simulator="rk4", tied=True),
}


def model_spec(model, **changes):
    """A :class:`ModelSpec` from a variant name of :data:`VARIANTS` or a spec, with ``changes``.

    Raises ``ValueError`` naming ``model`` for an unknown name.
    """
    if isinstance(model, ModelSpec):
        spec = model
    elif isinstance(model, str):
        if model not in VARIANTS:
            raise ValueError(f"`model` must be one of {sorted(VARIANTS)} or a ModelSpec, "
                             f"got {model!r}.")
        spec = VARIANTS[model]
    else:
        raise TypeError(f"`model` must be a variant name or a ModelSpec, "
                        f"got {type(model).__name__}.")
    if not changes:
        return spec
    keep = spec.name if isinstance(model, str) else ""
    changes.setdefault("name", keep)
    return dataclasses.replace(spec, **changes)
