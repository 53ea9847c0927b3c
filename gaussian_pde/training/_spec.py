r"""Model specifications: one family of Transformer encoders and the PDE simulator.

Every model maps tokens :math:`x_1, \dots, x_n \in \mathbb R^d` (one sequence) through
``depth`` = :math:`L` layers built from two sub-layers :math:`F`, multi-head softmax
attention

.. math::

    \mathrm{Attn}(x_i) = \sum_{h=1}^{H} V_h \sum_j w^h_{ij}\,x_j,\qquad
    w^h_{ij} \propto e^{c\,\langle Q_h x_i, K_h x_j\rangle},\qquad V_h = W_{O,h} W_{V,h},

(the map of :class:`gaussian_pde.Softmax` summed over heads as in
:class:`gaussian_pde.MultiHead`; :math:`c = 1/\sqrt k` by default, :math:`k = d/H`) and a
two-layer feed-forward map :math:`\mathrm{FFN}(x) = W_2\,\phi(W_1 x + b_1) + b_2`
(:math:`\phi` the exact GELU :math:`u\Phi(u)`, its tanh approximation, or ReLU). Each
sub-layer :math:`F` updates the tokens as the variant says, with :math:`\beta` the branch
scale (1, :math:`1/\sqrt L` or :math:`1/L`; ``branch_scale``), :math:`\mathrm{LN}` the
per-token LayerNorm with learned gain and shift, :math:`\mathrm{DyT}(x) = \gamma\odot
\tanh(a x) + b` (Dynamic Tanh: learned scalar :math:`a`, vectors :math:`\gamma, b`) and
:math:`N(x) = \sqrt d\,x/|x|` the projection on the sphere of radius :math:`\sqrt d`
(docs/math.md section 11):

``pre_ln``
    :math:`x \leftarrow x + \beta F(\mathrm{LN}(x))`
``post_ln``
    :math:`x \leftarrow \mathrm{LN}(x + \beta F(x))`
``peri_ln``
    :math:`x \leftarrow x + \beta\,\mathrm{LN}'(F(\mathrm{LN}(x)))` (LayerNorm on the
    branch's input and on its output)
``dyt``
    :math:`x \leftarrow x + \beta F(\mathrm{DyT}(x))` (pre-LN with DyT for LN)
``ngpt``
    :math:`x \leftarrow N\big(x + \alpha\odot(N(F(x)) - x)\big)` with learned step sizes
    :math:`\alpha \in \mathbb R^d` (initially :math:`1/L`); the embedded tokens are
    projected on the sphere too (a normalised Transformer without its weight
    normalisation)
``rezero``
    :math:`x \leftarrow x + g\,F(x)`, a learned scalar gate :math:`g` per sub-layer,
    initially 0
``no_ln``, ``no_ln_sqrt``, ``no_ln_depth``
    :math:`x \leftarrow x + \beta F(x)` with :math:`\beta = 1, 1/\sqrt L, 1/L`
``no_residual``
    :math:`x \leftarrow F(\mathrm{LN}(x))`
``neither``
    :math:`x \leftarrow F(x)`
``pde_euler``
    :math:`\dot x = \mathrm{Attn}_t[\mu](x) + \mathrm{FFN}_t(x)` on :math:`[0, T]`, explicit
    Euler at :math:`h = T/L`, weights piecewise constant per layer, :math:`T = 1`
``pde_rk4``
    the same ODE, one classical RK4 step per layer
``pde_euler_tied``, ``pde_rk4_tied``
    the same with one set of weights for every layer
``pde_*_tL``
    the four simulators with horizon :math:`T = L` (so :math:`h = 1`)
"""

from __future__ import annotations

import dataclasses
import math
import numbers

__all__ = ["ModelSpec", "VARIANTS", "BRANCH_SCALES", "model_spec"]

_NORMS = ("pre", "post", "peri", "dyt", "ngpt", "none")
#: residual branch scales :math:`\beta` by name
BRANCH_SCALES = ("1", "1/sqrt(L)", "1/L")
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
    norm : {"pre", "post", "peri", "dyt", "ngpt", "none"}
        Normalisation: LayerNorm before the branch, after the sum, on both ends of the
        branch; Dynamic Tanh before the branch; the normalised Transformer; none (the
        simulator has none).
    rezero : bool
        A learned scalar gate on each residual branch, initially 0 (``norm="none"``).
    branch_scale : {"1", "1/sqrt(L)", "1/L"}
        The factor :math:`\beta` of each residual branch.
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
    horizon : float or "depth"
        The simulator's depth :math:`T` (``h = T/L``); ``"depth"``: :math:`T = L`.
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
    horizon: float | str = 1.0
    scale: float | None = None
    activation: str = "gelu"
    name: str = ""
    rezero: bool = False
    branch_scale: str = "1"

    def __post_init__(self):
        set_ = object.__setattr__
        for flag in ("residual", "tied", "rezero"):
            if not isinstance(getattr(self, flag), bool):
                raise TypeError(f"`{flag}` must be True or False, got {getattr(self, flag)!r}.")
        if self.norm not in _NORMS:
            raise ValueError(f"`norm` must be one of {_NORMS}, got {self.norm!r}.")
        if self.simulator not in _SIMULATORS:
            raise ValueError(f"`simulator` must be one of {_SIMULATORS}, got {self.simulator!r}.")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"`activation` must be one of {_ACTIVATIONS}, "
                             f"got {self.activation!r}.")
        if self.branch_scale not in BRANCH_SCALES:
            raise ValueError(f"`branch_scale` must be one of {BRANCH_SCALES}, "
                             f"got {self.branch_scale!r}.")
        set_(self, "width", _check_int(self.width, "width", 2))
        set_(self, "depth", _check_int(self.depth, "depth", 1))
        set_(self, "heads", _check_int(self.heads, "heads", 1))
        if self.width % self.heads:
            raise ValueError(f"`width` ({self.width}) must be divisible by `heads` "
                             f"({self.heads}).")
        ffn = 2 * self.width if self.ffn_width is None else self.ffn_width
        set_(self, "ffn_width", _check_int(ffn, "ffn_width", 0))
        if self.horizon != "depth":
            set_(self, "horizon", _check_real(self.horizon, "horizon"))
        if self.scale is not None:
            set_(self, "scale", _check_real(self.scale, "scale"))
        if self.simulator is not None:
            if self.norm != "none":
                raise ValueError("the PDE simulator has no normalisation: `norm` must be "
                                 f"'none' when `simulator` is given, got {self.norm!r}.")
            set_(self, "residual", True)
        if self.rezero and (self.norm != "none" or not self.residual
                            or self.simulator is not None):
            raise ValueError("`rezero` gates residual branches without normalisation: it "
                             "needs `residual=True`, `norm='none'` and no `simulator`.")
        if self.norm == "ngpt" and not self.residual:
            raise ValueError("the normalised Transformer (`norm='ngpt'`) is residual: "
                             "`residual` must be True.")
        if not self.name:
            set_(self, "name", self._default_name())

    def _default_name(self):
        if self.simulator is not None:
            return (f"pde_{self.simulator}" + ("_tied" if self.tied else "")
                    + ("_tL" if self.horizon == "depth" else ""))
        ln = {"pre": "pre_ln", "post": "post_ln", "peri": "peri_ln", "dyt": "dyt",
              "ngpt": "ngpt", "none": "rezero" if self.rezero else "no_ln"}[self.norm]
        base = ln if self.residual else ("no_residual" if self.norm != "none" else "neither")
        if not self.residual and self.norm not in ("pre", "none"):
            base = f"no_residual_{ln}"
        if self.residual:
            base += {"1": "", "1/sqrt(L)": "_sqrt", "1/L": "_depth"}[self.branch_scale]
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
    def horizon_value(self) -> float:
        """The simulator's horizon :math:`T` as a number (:math:`L` for ``"depth"``)."""
        return float(self.depth) if self.horizon == "depth" else float(self.horizon)

    @property
    def step(self) -> float:
        """Depth step: :math:`h = T/L` for the simulator, 1 for a block stack."""
        return self.horizon_value / self.depth if self.simulator is not None else 1.0

    @property
    def branch_factor(self) -> float:
        r"""The residual branch scale :math:`\beta` (1, :math:`1/\sqrt L` or :math:`1/L`)."""
        return {"1": 1.0, "1/sqrt(L)": 1.0 / math.sqrt(self.depth),
                "1/L": 1.0 / self.depth}[self.branch_scale]

    @property
    def n_weight_sets(self) -> int:
        """Number of distinct block weight sets (1 when tied)."""
        return 1 if self.tied else self.depth

    @property
    def has_layernorm(self) -> bool:
        """Whether the blocks normalise (LayerNorm, DyT or the sphere; the bridge needs not)."""
        return self.norm != "none"

    def replace(self, **changes):
        """A copy with ``changes`` (the name is recomputed unless given)."""
        changes.setdefault("name", "")
        return dataclasses.replace(self, **changes)


#: the variants of the study, by name (same width, depth, heads and initialisation)
VARIANTS = {
    "pre_ln": ModelSpec(residual=True, norm="pre"),
    "post_ln": ModelSpec(residual=True, norm="post"),
    "peri_ln": ModelSpec(residual=True, norm="peri"),
    "dyt": ModelSpec(residual=True, norm="dyt"),
    "ngpt": ModelSpec(residual=True, norm="ngpt"),
    "rezero": ModelSpec(residual=True, norm="none", rezero=True),
    "no_ln": ModelSpec(residual=True, norm="none"),
    "no_ln_sqrt": ModelSpec(residual=True, norm="none", branch_scale="1/sqrt(L)"),
    "no_ln_depth": ModelSpec(residual=True, norm="none", branch_scale="1/L"),
    "no_residual": ModelSpec(residual=False, norm="pre"),
    "neither": ModelSpec(residual=False, norm="none"),
}
for _sim in ("euler", "rk4"):
    for _tied in (False, True):
        for _T in (1.0, "depth"):
            _spec = ModelSpec(norm="none", simulator=_sim, tied=_tied, horizon=_T)
            VARIANTS[_spec.name] = _spec
del _sim, _tied, _T, _spec


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
