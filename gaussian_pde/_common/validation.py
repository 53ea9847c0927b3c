"""Input validation shared by the whole package.

Every public function checks its arguments here, so that bad input fails early with a
``ValueError`` or ``TypeError`` that names the argument and says what was expected,
instead of failing deep inside NumPy (STYLE.md, point 5).
"""

from __future__ import annotations

import numbers
import os

import numpy as np

__all__ = [
    "usable_cores",
    "validate_allocation",
    "validate_choices",
    "validate_array",
    "validate_matrix",
    "validate_vector",
    "validate_t_eval",
    "validate_covariance",
    "validate_positive",
    "validate_t_span",
    "validate_tolerance",
    "validate_int",
    "validate_particles",
    "validate_positions",
    "validate_flag",
    "validate_seed",
]


def validate_array(value, name, *, ndim=None, dtype=float, finite=True):
    """Convert ``value`` to a float array and check its number of dimensions.

    Parameters
    ----------
    value : array_like
        The user input.
    name : str
        Argument name used in error messages.
    ndim : int or tuple of int, optional
        Allowed numbers of dimensions.
    dtype : data-type
        Target dtype (float by default).
    finite : bool
        Reject NaN and infinite entries.
    """
    if isinstance(value, (str, bytes)) or value is None:
        raise TypeError(f"`{name}` must be an array of numbers, got {type(value).__name__}.")
    try:
        raw = np.asarray(value)
        if raw.dtype.kind in "USO" and _holds_text(raw):
            # NumPy would parse "0.1" as a number without a word
            raise TypeError(f"`{name}` must be an array of numbers, got text entries.")
        if raw.dtype.kind == "c" and not np.issubdtype(np.dtype(dtype), np.complexfloating):
            # casting would drop the imaginary part without a word
            if np.any(raw.imag != 0):
                raise ValueError(f"`{name}` must be real, got complex values with non-zero "
                                 "imaginary parts.")
            raw = raw.real
        arr = np.asarray(raw, dtype=dtype)
    except (TypeError, ValueError) as exc:
        if str(exc).startswith(f"`{name}` must be real"):
            raise
        raise TypeError(f"`{name}` must be an array of real numbers ({exc}).") from None
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if arr.ndim not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"`{name}` must have {want} dimension(s), got shape {arr.shape}.")
    if finite and not np.isfinite(arr).all():
        raise ValueError(f"`{name}` must contain only finite values (found NaN or inf).")
    return arr


def _holds_text(raw):
    """Whether an array of dtype str, bytes or object holds text (strings or bytes)."""
    if raw.dtype.kind in "US":
        return True
    return any(isinstance(v, (str, bytes)) for v in raw.ravel())


def validate_flag(value, name):
    """A boolean option: ``True`` or ``False`` (NumPy booleans too), nothing else.

    ``if value:`` would take ``"no"`` or ``2`` for ``True`` without a word.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be True or False, got {value!r}.")
    return bool(value)


def _memory_bytes():
    """Physical memory of this machine (bytes), or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def usable_cores():
    """The cores this process may run on (at least 1): its CPU affinity where the OS has one."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def validate_allocation(count, name, *, itemsize=8, share=0.5):
    """Refuse, before allocating, ``count`` numbers that would not fit in memory.

    ``share`` of the physical memory is the limit: a request past it would otherwise
    fail deep inside NumPy with ``MemoryError``, or swap.
    """
    total = _memory_bytes()
    # a float ``count`` past the float range (an estimate of sizes that overflowed) is inf
    need = float(count) * itemsize if isinstance(count, float) else int(count) * itemsize
    if not need < float("inf") or (total is not None and need > share * total):
        have = "" if total is None else f"{total / 2**30:.3g} GiB of "
        raise ValueError(f"`{name}` asks for {need / 2**30:.3g} GiB of arrays, more than "
                         f"{share:.0%} of this machine's {have}memory.")
    return int(count)


def validate_matrix(value, name, *, shape=None):
    """A finite 2-D float array, optionally of a given shape (``None`` entries are free)."""
    arr = validate_array(value, name, ndim=2)
    if shape is not None:
        for got, want in zip(arr.shape, shape):
            if want is not None and got != want:
                raise ValueError(
                    f"`{name}` must have shape {tuple('*' if s is None else s for s in shape)}, "
                    f"got {arr.shape}."
                )
    if arr.size == 0:
        raise ValueError(f"`{name}` must not be empty, got shape {arr.shape}.")
    return arr


def validate_vector(value, name, *, size=None):
    """A finite 1-D float array of a given length."""
    arr = validate_array(value, name, ndim=1)
    if size is not None and arr.shape[0] != size:
        raise ValueError(f"`{name}` must have length {size}, got shape {arr.shape}.")
    return arr


def validate_covariance(value, name="cov", *, d=None, batch=False, psd_tol=1e-10):
    """A symmetric positive semi-definite matrix (or a stack of them when ``batch``).

    Symmetry is checked to a relative ``1e-10`` of the largest entry and then enforced
    exactly; positive semi-definiteness to ``-psd_tol`` times the largest eigenvalue.
    """
    arr = validate_array(value, name, ndim=None)
    if batch:
        if arr.ndim < 2:
            raise ValueError(f"`{name}` must have shape (..., d, d), got {arr.shape}.")
    elif arr.ndim != 2:
        raise ValueError(f"`{name}` must be a (d, d) matrix, got shape {arr.shape}.")
    if arr.shape[-1] != arr.shape[-2] or arr.shape[-1] == 0:
        raise ValueError(f"`{name}` must be square, got shape {arr.shape}.")
    if d is not None and arr.shape[-1] != d:
        raise ValueError(
            f"`{name}` must be {d} x {d} to match the attention's dimension d = {d}, "
            f"got shape {arr.shape}."
        )
    if (arr == np.swapaxes(arr, -1, -2)).all():
        # exactly symmetric (most inputs): what the symmetrisation below would return,
        # bit for bit (0.5 (a + a) = a), as a copy
        arr = arr.copy()
    else:
        scale = np.max(np.abs(arr), axis=(-2, -1), keepdims=True)
        asym = np.abs(arr - np.swapaxes(arr, -1, -2))
        if np.any(asym > 1e-10 * np.maximum(scale, 1e-300)):
            raise ValueError(f"`{name}` must be symmetric.")
        arr = 0.5 * (arr + np.swapaxes(arr, -1, -2))
    if not batch:
        # a Cholesky factorisation that succeeds is backward stable: the smallest
        # eigenvalue is then above -d eps |arr|, far inside the tolerance below
        try:
            np.linalg.cholesky(arr)
            return arr
        except np.linalg.LinAlgError:
            pass
    eig = np.linalg.eigvalsh(arr)
    top = np.maximum(eig[..., -1:], 0.0)
    if np.any(eig[..., 0:1] < -psd_tol * np.maximum(top, 1.0)):
        raise ValueError(
            f"`{name}` must be positive semi-definite (smallest eigenvalue {eig.min():.3g})."
        )
    return arr


def validate_positive(value, name, *, allow_zero=False):
    """A finite real scalar that is positive (or non-negative)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a real number, got {type(value).__name__}.")
    value = float(value)
    if not np.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"`{name}` must be a finite {kind} number, got {value!r}.")
    return value


def validate_tolerance(value, name, *, upper=1.0):
    """A tolerance in (0, upper)."""
    value = validate_positive(value, name)
    if value >= upper:
        raise ValueError(f"`{name}` must be smaller than {upper}, got {value!r}.")
    return value


def validate_int(value, name, *, minimum=None):
    """An integer (not bool) no smaller than ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {type(value).__name__}.")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"`{name}` must be at least {minimum}, got {value}.")
    return value


def validate_t_eval(t_eval, t0, t1):
    """None, or a non-empty strictly increasing 1-D array of finite times in ``[t0, t1]``."""
    if t_eval is None:
        return None
    t_eval = validate_array(t_eval, "t_eval", ndim=1)
    if t_eval.size == 0:
        raise ValueError("`t_eval` must not be empty.")
    if t_eval.size > 1 and np.any(np.diff(t_eval) <= 0):
        raise ValueError("`t_eval` must be strictly increasing.")
    if t_eval[0] < t0 or t_eval[-1] > t1:
        raise ValueError(f"`t_eval` must lie within `t_span` = ({t0}, {t1}).")
    return t_eval


def validate_t_span(t_span):
    """A pair ``(t0, t1)`` of finite numbers with ``t1 > t0``."""
    try:
        t0, t1 = t_span
    except (TypeError, ValueError):
        raise ValueError(f"`t_span` must be a pair (t0, t1), got {t_span!r}.") from None
    for name, t in (("t_span[0]", t0), ("t_span[1]", t1)):
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not np.isfinite(t):
            raise ValueError(f"`{name}` must be a finite real number, got {t!r}.")
    if not t1 > t0:
        raise ValueError(f"`t_span` must be increasing (t0 < t1), got {t_span!r}.")
    return float(t0), float(t1)


def validate_particles(value, name="x0", *, d=None, min_count=2):
    """Token positions: a finite ``(n, d)`` float array with ``n >= min_count``."""
    arr = validate_array(value, name, ndim=2)
    if d is not None and arr.shape[1] != d:
        raise ValueError(f"`{name}` must have shape (n, {d}) to match the attention's "
                         f"dimension d = {d}, got shape {arr.shape}.")
    if arr.shape[0] < min_count:
        raise ValueError(f"`{name}` must hold at least {min_count} tokens (rows), "
                         f"got shape {arr.shape}.")
    return arr


def validate_positions(value, n, name="positions"):
    """Sequence positions: a finite 1-D array of length ``n`` with entries in ``[0, 1]``."""
    arr = validate_array(value, name, ndim=1)
    if arr.shape[0] != n:
        raise ValueError(f"`{name}` must have one entry per token (length {n}), "
                         f"got length {arr.shape[0]}.")
    if np.any((arr < 0) | (arr > 1)):
        raise ValueError(f"`{name}` must lie in [0, 1], got values in "
                         f"[{arr.min():.6g}, {arr.max():.6g}].")
    return arr


def validate_threshold(value, name, *, upper=None, allow_zero=True):
    """A finite real threshold in ``[0, upper)`` (or ``(0, upper)`` without ``allow_zero``).

    ``upper=None`` means no upper bound.
    """
    value = validate_positive(value, name, allow_zero=allow_zero)
    if upper is not None and value >= upper:
        low = "0 <=" if allow_zero else "0 <"
        raise ValueError(f"`{name}` must satisfy {low} {name} < {upper}, got {value!r}.")
    return value


def validate_nonempty(value, name):
    """A sized collection (array, list, ...) that is not empty; returned unchanged."""
    try:
        n = len(value)
    except TypeError:
        raise TypeError(f"`{name}` must be a sequence or array, got {type(value).__name__}.") from None
    if n == 0:
        raise ValueError(f"`{name}` must not be empty.")
    return value


def validate_choices(value, name, allowed):
    """A non-empty sequence (not a string) of distinct members of ``allowed``; a tuple.

    A string would be iterated letter by letter, so it is refused with the fix.
    """
    allowed = tuple(allowed)
    if isinstance(value, (str, bytes)):
        raise TypeError(f"`{name}` must be a sequence of {allowed}, got the string {value!r} "
                        f"(write ({value!r},)).")
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"`{name}` must be a sequence of {allowed}, got "
                        f"{type(value).__name__}.") from None
    if not items:
        raise ValueError(f"`{name}` must not be empty; choose among {allowed}.")
    for item in items:
        try:
            ok = item in allowed
        except (TypeError, ValueError):
            ok = False
        if not ok or isinstance(item, bool):
            raise ValueError(f"`{name}` must hold members of {allowed}, got {item!r}.")
    if len(set(items)) != len(items):
        raise ValueError(f"`{name}` must not repeat a member, got {items}.")
    return items


def validate_square_2x2(value, name, *, batch=True, finite=False):
    """Covariances of a 2-D Gaussian: an array of shape (..., 2, 2) (or (2, 2)).

    NaN entries are allowed unless ``finite`` (they mark samples after a trajectory stopped).
    """
    arr = validate_array(value, name, ndim=None, finite=finite)
    if arr.ndim < 2 or arr.shape[-2:] != (2, 2) or (not batch and arr.ndim != 2):
        want = "(..., 2, 2)" if batch else "(2, 2)"
        raise ValueError(f"`{name}` must hold 2 x 2 covariances, shape {want}, got {arr.shape}.")
    if arr.size == 0:
        raise ValueError(f"`{name}` must not be empty, got shape {arr.shape}.")
    return arr


# --- helpers of the Gaussian closure, blocks and depth modules ---

#: range of Gauss-Hermite nodes per dimension accepted by the closure
QUADRATURE_RANGE = (2, 40)
#: largest tensor-rule size the closure builds (nodes = n_per_dim ** d)
QUADRATURE_MAX_NODES = 250_000


def validate_quadrature(value, name="n_per_dim", *, d=None):
    """Gauss-Hermite nodes per dimension: an int in :data:`QUADRATURE_RANGE`.

    With ``d`` given, the tensor rule (``value ** d`` nodes) must stay below
    :data:`QUADRATURE_MAX_NODES`. The rule is exact for polynomials of degree
    ``2 * value - 1`` in each coordinate; the closure covariance needs degree 2, hence the
    minimum of 2.
    """
    value = validate_int(value, name)
    lo, hi = QUADRATURE_RANGE
    if not lo <= value <= hi:
        raise ValueError(f"`{name}` must be between {lo} and {hi} Gauss-Hermite nodes per "
                         f"dimension (exact to degree {2 * lo - 1}..{2 * hi - 1}), got {value}.")
    if d is not None and value ** d > QUADRATURE_MAX_NODES:
        raise ValueError(f"`{name}` = {value} in d = {d} needs {value ** d} nodes, more than "
                         f"{QUADRATURE_MAX_NODES}; lower `{name}`.")
    return value


def validate_step(value, name="h"):
    """A layer step ``h > 0`` (finite)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a real number, got {type(value).__name__}.")
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a finite positive step, got {value!r}.")
    return float(value)


def validate_same_dimension(items, name):
    """Objects with a ``d`` attribute that all share it; returns ``d``.

    ``items`` is a non-empty sequence; the message names the first mismatching entry.
    """
    validate_nonempty(items, name)
    d0 = items[0].d
    for i, item in enumerate(items):
        if item.d != d0:
            raise ValueError(f"`{name}[{i}]` has token dimension d = {item.d}, but "
                             f"`{name}[0]` has d = {d0}: the components of a block must act "
                             "on the same token dimension.")
    return d0


def validate_seed(seed, name="seed"):
    """A NumPy ``Generator`` from ``seed``; else ``ValueError`` or ``TypeError`` naming ``name``.

    ``seed`` is a Generator (returned as is), None (fresh entropy), a non-negative int, or a
    sequence of them (the entropy of a ``SeedSequence``).
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None:
        return np.random.default_rng()
    ints = [seed] if isinstance(seed, numbers.Integral) else seed
    if (isinstance(seed, (numbers.Integral, tuple, list))
            and all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in ints)):
        if any(s < 0 for s in ints):
            raise ValueError(f"`{name}` must be a non-negative integer (or a sequence of "
                             f"them), got {seed!r}.")
        return np.random.default_rng(list(ints) if isinstance(seed, (tuple, list)) else int(seed))
    raise TypeError(f"`{name}` must be an int, a sequence of ints, a numpy Generator or None, "
                    f"got {type(seed).__name__}.")
