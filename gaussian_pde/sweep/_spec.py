r"""The specification of a parameter sweep: a frozen dataclass and its TOML form.

A sweep runs every attention type in ``attention`` in every dimension in ``dims`` on
``draws`` random settings (weights and initial covariance). The TOML file has one table per
part of the specification::

    [sweep]                # what to run
    attention = ["softmax", "l2"]
    dims = [3, 4, 5]
    draws = 200
    seed = 20260101
    batch_size = 25        # settings per Dask task (one stored chunk)

    [weights]              # how Q, K (k x d) and V (d x d) are drawn
    k = "half"             # rank of Q: an integer, "half" (floor(d/2), at least 1) or "full"
    distribution = "normal"
    std = 1.0
    key = "minus_query"    # K = -Q; or "query" (K = Q) or "independent"
    value = "identity"     # V = I; or "gram" (G^T G), "gram_t" (G G^T), "random"
    score_scale = 0.0      # 0 means the default 1/sqrt(k)
    heads = 2              # multihead only: number of heads, each of type head_type
    head_type = "softmax"

    [initial]              # how Sigma_0 is drawn
    cov = "wishart"        # G G^T with G of shape (d, rank); or "identity"
    rank = "full"
    std = 1.0
    mean_std = 0.0         # entries of alpha_0 (types whose field matrix sees the mean)

    [solver]               # passed to gaussian_pde.solve
    horizon = 10.0
    ...

    [record]               # what to store per setting
    ...

Every table and key is optional except ``[sweep]`` ``attention``, ``dims`` and ``draws``;
:meth:`SweepSpec.to_toml` writes the complete form with every default spelled out.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import numbers
import pathlib

from ..attention import DEFAULT_ATTENTION
from ..integrate import METHODS as _SCIPY_METHODS

__all__ = ["SweepSpec", "WeightSpec", "InitialSpec", "SolverSpec", "RecordSpec"]

_DISTRIBUTIONS = ("normal", "uniform")
_KEYS = ("minus_query", "query", "independent")
_VALUES = ("identity", "gram", "gram_t", "random")
_INITIAL = ("wishart", "identity")
#: the method names :func:`gaussian_pde.solve` accepts (a spec is checked against them)
SOLVE_METHODS = ("auto", "rosenbrock") + tuple(sorted(_SCIPY_METHODS))


def _usable_types():
    """Registered names a sweep can run: the Gaussian-preserving types (exact moment ODEs)."""
    from ..attention import ATTENTIONS

    return tuple(name for name, cls in ATTENTIONS.items() if cls.gaussian_preserving)


def _single_heads():
    """Registered Gaussian-preserving single-head types: what a ``multihead`` head can be."""
    from ..attention import ATTENTIONS, SingleHeadAttention

    return tuple(name for name, cls in ATTENTIONS.items()
                 if cls.gaussian_preserving and issubclass(cls, SingleHeadAttention))


def _fail(where, msg, exc=ValueError):
    raise exc(f"`{where}` {msg}")


def _check_int(value, where, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        _fail(where, f"must be an integer, got {value!r}.", TypeError)
    if value < minimum:
        _fail(where, f"must be at least {minimum}, got {value}.")
    return int(value)


def _check_float(value, where, *, positive=True, allow_zero=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(where, f"must be a number, got {value!r}.", TypeError)
    value = float(value)
    if not math.isfinite(value) or (positive and (value < 0 or (value == 0 and not allow_zero))):
        kind = "non-negative" if allow_zero else "positive"
        _fail(where, f"must be a finite {kind} number, got {value!r}.")
    return value


def _check_choice(value, where, choices):
    if not isinstance(value, str) or value not in choices:
        _fail(where, f"must be one of {', '.join(map(repr, choices))}, got {value!r}.")
    return value


def _check_rank(value, where, words):
    if isinstance(value, str):
        return _check_choice(value, where, words)
    return _check_int(value, where, 1)


@dataclasses.dataclass(frozen=True)
class WeightSpec:
    """How the attention weights Q, K (``k x d``) and V (``d x d``) are drawn.

    Parameters
    ----------
    k : int or {"half", "full"}
        Number of rows (rank) of Q: an integer (capped at ``d``), ``"half"`` for
        ``max(1, d // 2)`` (the paper's choice) or ``"full"`` for ``d``.
    distribution : {"normal", "uniform"}
        Law of the entries of Q, K and of the factors ``G`` used for V; uniform entries
        are scaled to have standard deviation ``std``.
    std : float
        Standard deviation of the entries.
    key : {"minus_query", "query", "independent"}
        ``K = -Q``, ``K = Q`` or drawn independently.
    value : {"identity", "gram", "gram_t", "random"}
        ``V = I``, ``G^T G``, ``G G^T`` (``G`` a fresh ``d x d`` draw) or ``G`` itself.
    score_scale : float
        Score scale ``c``; ``0`` selects the default ``1/sqrt(k)``.
    heads : int
        Number of heads of ``multihead`` attention (ignored by single-head types).
    head_type : str
        Type of each head of ``multihead`` attention: a registered Gaussian-preserving
        single-head type (``softmax``, ``l2``, ``sinkhorn``).
    """

    k: int | str = "half"
    distribution: str = "normal"
    std: float = 1.0
    key: str = "minus_query"
    value: str = "identity"
    score_scale: float = 0.0
    heads: int = 2
    head_type: str = DEFAULT_ATTENTION

    def __post_init__(self):
        s = object.__setattr__
        s(self, "k", _check_rank(self.k, "weights.k", ("half", "full")))
        s(self, "distribution", _check_choice(self.distribution, "weights.distribution",
                                              _DISTRIBUTIONS))
        s(self, "std", _check_float(self.std, "weights.std"))
        s(self, "key", _check_choice(self.key, "weights.key", _KEYS))
        s(self, "value", _check_choice(self.value, "weights.value", _VALUES))
        s(self, "score_scale", _check_float(self.score_scale, "weights.score_scale",
                                            allow_zero=True))
        s(self, "heads", _check_int(self.heads, "weights.heads", 1))
        s(self, "head_type", _check_choice(self.head_type, "weights.head_type", _single_heads()))

    def rank(self, d):
        """Number of rows of Q in dimension ``d``."""
        if self.k == "half":
            return max(1, d // 2)
        if self.k == "full":
            return d
        return min(self.k, d)


@dataclasses.dataclass(frozen=True)
class InitialSpec:
    r"""How the initial covariance :math:`\Sigma_0` is drawn.

    Parameters
    ----------
    cov : {"wishart", "identity"}
        :math:`\Sigma_0 = GG^T` with ``G`` of shape ``(d, rank)`` and i.i.d. entries, or
        the identity.
    rank : int or "full"
        Rank of :math:`\Sigma_0` for ``"wishart"`` (capped at ``d``).
    std : float
        Standard deviation of the entries of ``G`` (scale of the identity).
    distribution : {"normal", "uniform"}
        Law of the entries of ``G``.
    mean_std : float
        Standard deviation of the entries of the initial mean :math:`\alpha_0` (normal,
        from a stream of its own: the covariances and weights do not change with it),
        integrated for the types whose field matrix depends on the mean
        (``field_sees_mean``: linear attention); the other types' covariance equations
        do not involve the mean. Default 0: :math:`\alpha_0 = 0`.
    """

    cov: str = "wishart"
    rank: int | str = "full"
    std: float = 1.0
    distribution: str = "normal"
    mean_std: float = 0.0

    def __post_init__(self):
        s = object.__setattr__
        s(self, "cov", _check_choice(self.cov, "initial.cov", _INITIAL))
        s(self, "rank", _check_rank(self.rank, "initial.rank", ("full",)))
        s(self, "std", _check_float(self.std, "initial.std"))
        s(self, "distribution", _check_choice(self.distribution, "initial.distribution",
                                              _DISTRIBUTIONS))
        s(self, "mean_std", _check_float(self.mean_std, "initial.mean_std", allow_zero=True))


@dataclasses.dataclass(frozen=True)
class SolverSpec:
    """Integration settings, passed to :func:`gaussian_pde.solve`.

    Parameters
    ----------
    horizon : float
        Integrate over ``(0, horizon)``.
    method : str
        A method of :func:`gaussian_pde.solve` by name: a
        :func:`scipy.integrate.solve_ivp` method, ``"auto"`` or ``"rosenbrock"``
        (an unknown name is refused when the spec is built, not when a task runs).
    rtol, atol : float
        Solver tolerances (on the entries of the factor ``L``).
    blowup_threshold : float
        Blow-up event when the trace passes this multiple of its initial value.
    steady_tol : float
        Steady-state event tolerance (``0`` turns the event off).
    max_nfev : int
        Give up (status ``"failed"``) after this many right-hand-side evaluations.
    """

    horizon: float = 10.0
    method: str = "DOP853"
    rtol: float = 1e-8
    atol: float = 1e-10
    blowup_threshold: float = 1e8
    steady_tol: float = 1e-9
    max_nfev: int = 20_000

    def __post_init__(self):
        s = object.__setattr__
        s(self, "horizon", _check_float(self.horizon, "solver.horizon"))
        if not isinstance(self.method, str):
            _fail("solver.method", f"must be a string, got {self.method!r}.", TypeError)
        if self.method not in SOLVE_METHODS:
            _fail("solver.method", f"must be one of {list(SOLVE_METHODS)}, got "
                  f"{self.method!r}.")
        s(self, "rtol", _check_float(self.rtol, "solver.rtol"))
        if self.rtol >= 1:
            _fail("solver.rtol", f"must be smaller than 1, got {self.rtol!r}.")
        s(self, "atol", _check_float(self.atol, "solver.atol"))
        s(self, "blowup_threshold", _check_float(self.blowup_threshold,
                                                 "solver.blowup_threshold"))
        if self.blowup_threshold <= 1:
            _fail("solver.blowup_threshold", f"must be greater than 1, got "
                  f"{self.blowup_threshold!r}.")
        s(self, "steady_tol", _check_float(self.steady_tol, "solver.steady_tol",
                                           allow_zero=True))
        s(self, "max_nfev", _check_int(self.max_nfev, "solver.max_nfev", 1))


@dataclasses.dataclass(frozen=True)
class RecordSpec:
    r"""What is stored for each setting.

    ``status``, ``t_final`` and the task's completion flag are always stored.

    Parameters
    ----------
    final_state : bool
        The final covariance (``d x d``).
    outcome : bool
        The outcome class (see :func:`gaussian_pde.sweep.classify_outcome`).
    limit_rank : bool
        Number of eigenvalues of :math:`\Sigma/\operatorname{tr}\Sigma` above
        ``rank_threshold`` at the final time.
    blowup_time : bool
        The estimated blow-up time (NaN when there is none).
    eigenvalues : bool
        Eigenvalues of :math:`\Sigma` (ascending) on ``grid`` equispaced times in
        ``[0, horizon]``; NaN after the integration stopped.
    grid : int
        Number of times of the coarse grid (at least 2).
    rank_threshold : float
        Threshold on the normalised eigenvalues for the limit rank, in ``(0, 1)``.
    """

    final_state: bool = True
    outcome: bool = True
    limit_rank: bool = True
    blowup_time: bool = True
    eigenvalues: bool = True
    grid: int = 11
    rank_threshold: float = 1e-2

    def __post_init__(self):
        for name in ("final_state", "outcome", "limit_rank", "blowup_time", "eigenvalues"):
            if not isinstance(getattr(self, name), bool):
                _fail(f"record.{name}", f"must be true or false, got {getattr(self, name)!r}.",
                      TypeError)
        object.__setattr__(self, "grid", _check_int(self.grid, "record.grid", 2))
        thr = _check_float(self.rank_threshold, "record.rank_threshold")
        if thr >= 1:
            _fail("record.rank_threshold", f"must be smaller than 1, got {thr!r}.")
        object.__setattr__(self, "rank_threshold", thr)


_TABLES = {"weights": WeightSpec, "initial": InitialSpec, "solver": SolverSpec,
           "record": RecordSpec}


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    r"""A parameter sweep: attention types x dimensions x random draws.

    Parameters
    ----------
    attention : sequence of str
        Names from :data:`gaussian_pde.ATTENTIONS` of Gaussian-preserving types
        (``softmax``, ``l2``, ``sinkhorn``, ``multihead``; sweeps integrate the exact
        moment ODEs).
    dims : sequence of int
        Token dimensions ``d``.
    draws : int
        Number of random settings per (attention type, dimension).
    seed : int
        Base seed. Setting ``(d, draw)`` uses the stream
        ``numpy.random.SeedSequence(seed, spawn_key=(d, draw))``, so any setting (and any
        task) recomputes alone to the same numbers, whatever the batch size, and the same
        draw index gives the same weights and :math:`\Sigma_0` for every attention type
        (paired comparisons).
    batch_size : int
        Settings per task: one Dask task, one stored chunk.
    weights, initial, solver, record : WeightSpec, InitialSpec, SolverSpec, RecordSpec
        See those classes (dicts are accepted).

    Examples
    --------
    >>> from gaussian_pde.sweep import SweepSpec
    >>> spec = SweepSpec(attention=["softmax"], dims=[2, 3], draws=10, batch_size=4)
    >>> spec.n_tasks, spec.n_settings
    (6, 20)
    """

    attention: tuple = (DEFAULT_ATTENTION,)
    dims: tuple = (2,)
    draws: int = 10
    seed: int = 0
    batch_size: int = 50
    weights: WeightSpec = dataclasses.field(default_factory=WeightSpec)
    initial: InitialSpec = dataclasses.field(default_factory=InitialSpec)
    solver: SolverSpec = dataclasses.field(default_factory=SolverSpec)
    record: RecordSpec = dataclasses.field(default_factory=RecordSpec)

    def __post_init__(self):
        from ..attention import ATTENTIONS

        s = object.__setattr__
        att = self.attention
        if isinstance(att, str):
            att = (att,)
        if not isinstance(att, (list, tuple)) or not att:
            _fail("sweep.attention", f"must be a non-empty list of names, got {att!r}.",
                  TypeError)
        # the sweep integrates the exact moment ODEs: Gaussian-preserving types only
        usable = _usable_types()
        for a in att:
            if isinstance(a, str) and a in ATTENTIONS and a not in usable:
                _fail("sweep.attention", f"contains {a!r}, which does not preserve "
                      f"Gaussians; sweeps integrate the exact moment ODEs of "
                      f"{', '.join(map(repr, usable))}.")
            _check_choice(a, "sweep.attention", usable)
        if len(set(att)) != len(att):
            _fail("sweep.attention", f"must not repeat a name, got {list(att)!r}.")
        s(self, "attention", tuple(att))
        dims = self.dims
        if isinstance(dims, numbers.Integral) and not isinstance(dims, bool):
            dims = (dims,)
        if not isinstance(dims, (list, tuple)) or not dims:
            _fail("sweep.dims", f"must be a non-empty list of integers, got {dims!r}.",
                  TypeError)
        dims = tuple(_check_int(d, "sweep.dims", 1) for d in dims)
        if len(set(dims)) != len(dims):
            _fail("sweep.dims", f"must not repeat a dimension, got {list(dims)!r}.")
        s(self, "dims", dims)
        s(self, "draws", _check_int(self.draws, "sweep.draws", 1))
        s(self, "seed", _check_int(self.seed, "sweep.seed", 0))
        s(self, "batch_size", _check_int(self.batch_size, "sweep.batch_size", 1))
        for name, cls in _TABLES.items():
            value = getattr(self, name)
            if isinstance(value, dict):
                value = _build(cls, value, name)
            elif not isinstance(value, cls):
                _fail(name, f"must be a {cls.__name__} or a dict, got {type(value).__name__}.",
                      TypeError)
            s(self, name, value)

    # ----------------------------------------------------------------- layout of tasks
    @property
    def blocks(self):
        """The ``(attention, d)`` pairs, in storage and task order."""
        return [(a, d) for a in self.attention for d in self.dims]

    @property
    def tasks_per_block(self):
        """Number of tasks (batches) per ``(attention, d)`` block."""
        return -(-self.draws // self.batch_size)

    @property
    def n_tasks(self):
        """Total number of tasks."""
        return len(self.blocks) * self.tasks_per_block

    @property
    def n_settings(self):
        """Total number of settings."""
        return len(self.blocks) * self.draws

    def task(self, index):
        """``(attention, d, first_draw, stop_draw)`` of task ``index``."""
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            raise TypeError(f"`task_index` must be an integer, got {index!r}.")
        if not 0 <= index < self.n_tasks:
            raise ValueError(f"`task_index` must be in [0, {self.n_tasks}), got {index}.")
        block, j = divmod(int(index), self.tasks_per_block)
        attention, d = self.blocks[block]
        lo = j * self.batch_size
        return attention, d, lo, min(lo + self.batch_size, self.draws)

    # ----------------------------------------------------------------- conversions
    def to_dict(self):
        """The nested dict of the TOML form (every default spelled out)."""
        out = {"sweep": {"attention": list(self.attention), "dims": list(self.dims),
                         "draws": self.draws, "seed": self.seed,
                         "batch_size": self.batch_size}}
        for name in _TABLES:
            out[name] = dataclasses.asdict(getattr(self, name))
        return out

    @classmethod
    def from_dict(cls, data, *, source=None):
        """Build from the nested dict of the TOML form.

        Unknown tables and keys are errors that name the key (and ``source``, the file).
        """
        try:
            if not isinstance(data, dict):
                raise TypeError(f"a sweep specification must be a table, got "
                                f"{type(data).__name__}.")
            _check_keys(data, ("sweep",) + tuple(_TABLES), "")
            sweep = data.get("sweep")
            if not isinstance(sweep, dict):
                raise ValueError("the table [sweep] is required (with attention, dims, draws).")
            top = [f.name for f in dataclasses.fields(cls) if f.name not in _TABLES]
            _check_keys(sweep, top, "sweep.")
            for req in ("attention", "dims", "draws"):
                if req not in sweep:
                    raise ValueError(f"the key `sweep.{req}` is required.")
            kwargs = dict(sweep)
            for name, table_cls in _TABLES.items():
                table = data.get(name, {})
                if not isinstance(table, dict):
                    raise TypeError(f"`{name}` must be a table [{name}], got {table!r}.")
                kwargs[name] = _build(table_cls, table, name)
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            if source is None:
                raise
            raise type(exc)(f"{source}: {exc}") from None

    @classmethod
    def from_toml(cls, path):
        """Read a TOML file; errors name the file and the offending key."""
        path = pathlib.Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueError(f"cannot read the sweep specification {path}: "
                             f"{exc.strerror}.") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"cannot read the sweep specification {path}: not UTF-8 text "
                             f"(TOML is UTF-8; byte {exc.object[exc.start]:#04x} at position "
                             f"{exc.start}).") from None
        return cls.from_toml_string(text, source=path)

    @classmethod
    def from_toml_string(cls, text, *, source="<string>"):
        """Parse TOML text (``source`` names it in error messages)."""
        try:
            import tomllib
        except ImportError:  # pragma: no cover - Python 3.10
            import tomli as tomllib
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{source}: not valid TOML ({exc}).") from None
        return cls.from_dict(data, source=source)

    def to_toml(self):
        """The complete TOML form (round-trips through :meth:`from_toml_string`)."""
        lines = []
        for table, values in self.to_dict().items():
            lines.append(f"[{table}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
            lines.append("")
        return "\n".join(lines)

    @property
    def fingerprint(self):
        """SHA-256 of the canonical JSON form: equal iff the specifications are equal."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def _check_keys(table, allowed, prefix):
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean `{prefix}{close[0]}`?)" if close else ""
            where = f"[{prefix.rstrip('.')}]" if prefix else "the top level"
            raise ValueError(f"unknown key `{prefix}{key}`{hint}; allowed in {where}: "
                             f"{', '.join(allowed)}.")


def _build(cls, table, name):
    _check_keys(table, [f.name for f in dataclasses.fields(cls)], f"{name}.")
    return cls(**table)


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return str(v)
