r"""Blocked kernels for the particle velocity of every attention type.

For tokens :math:`x_1, \dots, x_n` all attention types need sums of the form

.. math::

    N_i = \sum_{j \le u_i} \ell(a_i \cdot b_j)\, r_j ,

with feature vectors :math:`a_i, b_j` (the score :math:`s(x_i, x_j) = a_i\cdot b_j`, shifts
folded in as extra columns), a link :math:`\ell` (``exp`` for softmax-type attention, the
logistic function for sigmoid attention), right-hand sides :math:`r_j` (the tokens and a
column of ones) and an optional causal limit :math:`u_i` (masked attention). They are
computed in tiles of at most ``chunk_size x chunk_size`` entries over both the query and
the key index, so no ``n x n`` array exists when ``n > chunk_size``; a tile costs two
matrix products and one ``exp``, the floor measured in ``benchmarks/bench_particles.py``.

Overflow and underflow of ``exp``: the features carry a per-query shift that bounds the
score from above (Cauchy-Schwarz for softmax, the score itself is :math:`\le 0` for L2,
the current Sinkhorn potential for Sinkhorn). Rows whose sum of weights nevertheless
over- or underflows are recomputed with the exact row maximum (two passes, a
log-sum-exp over column tiles), so the result is always the stable one.

Sinkhorn scaling (:func:`sinkhorn_average`) runs in the log domain on the same kernel,
alternating a pass over row tiles (query potentials ``f``) and one over column tiles
(key potentials ``g``); it is our own code rather than POT's ``ot.sinkhorn_log``, which
builds the full ``n x n`` cost matrix.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
from scipy.special import expit

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "ParticleDiagnostics",
    "ParticleOptions",
    "make_options",
    "SinkhornConvergenceWarning",
    "weighted_sums",
    "normalized_average",
    "sigmoid_average",
    "sinkhorn_average",
    "softmax_features",
    "l2_features",
    "resolve_dtype",
]

#: default tile edge; a float64 tile of 512 x 2048 entries (8 MiB) stays in cache
DEFAULT_CHUNK_SIZE = 512
#: columns per tile are this many times the rows per tile (never more than n)
_COLUMN_FACTOR = 4

#: row sums outside (tiny, huge) trigger the exact-maximum recomputation
_SAFE_RANGE = {np.dtype(np.float64): (1e-280, 1e280), np.dtype(np.float32): (1e-25, 1e30)}


class SinkhornConvergenceWarning(RuntimeWarning):
    """Sinkhorn scaling stopped at its iteration cap above the requested tolerance."""


@dataclasses.dataclass
class ParticleDiagnostics:
    r"""Diagnostics of one particle-velocity evaluation.

    Attributes
    ----------
    ess : ndarray, shape (n,) or None
        Effective sample size :math:`(\sum_j w_{ij})^2/\sum_j w_{ij}^2` of each query's
        attention weights (the smallest over heads for multi-head attention); ``None``
        unless requested.
    marginal_error : float or None
        Sinkhorn only: :math:`\max_j |n\sum_i \pi_{ij} - 1|`, the relative error of the
        column marginal (rows are exact); the largest over Sinkhorn heads.
    iterations : int or None
        Sinkhorn only: iterations used (the largest over Sinkhorn heads).
    converged : bool
        ``False`` when Sinkhorn scaling hit its iteration cap above tolerance.
    """

    ess: np.ndarray | None = None
    marginal_error: float | None = None
    iterations: int | None = None
    converged: bool = True

    @staticmethod
    def combine(parts):
        """Diagnostics of a sum of heads: worst ESS per query, worst Sinkhorn error."""
        ess = [p.ess for p in parts if p.ess is not None]
        errs = [p.marginal_error for p in parts if p.marginal_error is not None]
        its = [p.iterations for p in parts if p.iterations is not None]
        return ParticleDiagnostics(
            ess=np.minimum.reduce(ess) if ess else None,
            marginal_error=max(errs) if errs else None,
            iterations=max(its) if its else None,
            converged=all(p.converged for p in parts))


def resolve_dtype(dtype):
    """``numpy.float64`` or ``numpy.float32``; anything else is a ``ValueError``."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"`dtype` must be numpy.float32 or numpy.float64, got {dtype!r}.") from None
    if dt not in _SAFE_RANGE:
        raise ValueError(f"`dtype` must be numpy.float32 or numpy.float64, got {dtype!r}.")
    return dt


def _tile_shape(n_rows, n_cols, chunk_size):
    rows = max(1, min(chunk_size, n_rows))
    cols = max(1, min(n_cols, chunk_size * _COLUMN_FACTOR if n_cols > chunk_size else n_cols))
    return rows, cols


def _mask_tile(S, c0, upper_rows):
    """Set ``S[r, j] = -inf`` where column ``c0 + j`` is not below ``upper_rows[r]``."""
    cols = np.arange(c0, c0 + S.shape[1])
    S[cols[None, :] >= upper_rows[:, None]] = -np.inf


def _sweep(a, bT, rhs, acc, sq, rows, cols, upper, link, bias, buf, shift=None):
    """Accumulate ``link(a_i . b_j - shift_i) r_j`` over tiles into ``acc`` (and ``sq``)."""
    na, nb = a.shape[0], bT.shape[1]
    for r0 in range(0, na, rows):
        r1 = min(r0 + rows, na)
        ar = a[r0:r1]
        c_end = nb if upper is None else int(upper[r0:r1].max())
        for c0 in range(0, c_end, cols):
            c1 = min(c0 + cols, c_end)
            S = buf[: (r1 - r0) * (c1 - c0)].reshape(r1 - r0, c1 - c0)
            np.matmul(ar, bT[:, c0:c1], out=S)
            if upper is not None and c1 > upper[r0:r1].min():
                _mask_tile(S, c0, upper[r0:r1])
            if link == "exp":
                if shift is not None:
                    S -= shift[r0:r1, None]
                np.exp(S, out=S)
            else:
                if bias:
                    S += bias
                expit(S, out=S)
            acc[r0:r1] += S @ rhs[c0:c1]
            if sq is not None:
                sq[r0:r1] += np.einsum("ij,ij->i", S, S)


def _row_max(a, bT, rows, cols, upper, buf):
    na, nb = a.shape[0], bT.shape[1]
    m = np.full(na, -np.inf)
    for r0 in range(0, na, rows):
        r1 = min(r0 + rows, na)
        c_end = nb if upper is None else int(upper[r0:r1].max())
        for c0 in range(0, c_end, cols):
            c1 = min(c0 + cols, c_end)
            S = buf[: (r1 - r0) * (c1 - c0)].reshape(r1 - r0, c1 - c0)
            np.matmul(a[r0:r1], bT[:, c0:c1], out=S)
            if upper is not None and c1 > upper[r0:r1].min():
                _mask_tile(S, c0, upper[r0:r1])
            np.maximum(m[r0:r1], S.max(axis=1), out=m[r0:r1])
    return m


def weighted_sums(a, b, rhs, *, chunk_size=DEFAULT_CHUNK_SIZE, dtype=np.float64,
                  want_sq=False, upper=None, link="exp", bias=0.0):
    r"""Blocked sums :math:`N_i = \sum_{j<u_i} \ell(a_i\cdot b_j)\, r_j`.

    Parameters
    ----------
    a : ndarray, shape (na, p)
        Query features.
    b : ndarray, shape (nb, p)
        Key features.
    rhs : ndarray, shape (nb, q)
        Right-hand sides; for ``link="exp"`` the last column must be all ones (its sum is
        the normaliser used to detect over- and underflow).
    chunk_size : int
        Rows per tile; a tile has at most ``chunk_size`` rows and
        ``4 * chunk_size`` columns (all ``nb`` columns when ``nb <= chunk_size``).
    dtype : numpy.float32 or numpy.float64
        Precision of the tiles; sums over tiles are accumulated in float64.
    want_sq : bool
        Also return :math:`\sum_j \ell(a_i\cdot b_j)^2` (for the effective sample size).
    upper : ndarray of int, shape (na,), optional
        Causal limits :math:`u_i`, non-decreasing in ``i``; columns ``j >= u_i`` are left
        out.
    link : {"exp", "sigmoid"}
        :math:`\ell = \exp` or the logistic function :math:`\sigma(\cdot + \text{bias})`.
    bias : float
        Added to the score before the logistic function.

    Returns
    -------
    acc : ndarray, shape (na, q)
        :math:`N_i\,e^{-c_i}`.
    sq : ndarray, shape (na,) or None
        Sum of squared weights, in the same scale :math:`e^{-2c_i}`.
    log_scale : ndarray, shape (na,)
        :math:`c_i`: zero, except on rows recomputed with their exact maximum score.
    """
    dt = resolve_dtype(dtype)
    a = np.ascontiguousarray(a, dtype=dt)
    bT = np.ascontiguousarray(np.asarray(b, dtype=dt).T)
    rhs = np.ascontiguousarray(rhs, dtype=dt)
    na, nb, q = a.shape[0], bT.shape[1], rhs.shape[1]
    rows, cols = _tile_shape(na, nb, chunk_size)
    buf = np.empty(rows * cols, dtype=dt)
    acc = np.zeros((na, q))
    sq = np.zeros(na) if want_sq else None
    log_scale = np.zeros(na)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        _sweep(a, bT, rhs, acc, sq, rows, cols, upper, link, bias, buf)
        if link != "exp":
            return acc, sq, log_scale
        tiny, huge = _SAFE_RANGE[dt]
        if want_sq:  # squared weights must not underflow either
            tiny, huge = np.sqrt(tiny), np.sqrt(huge)
        den = acc[:, -1]
        bad = np.flatnonzero(~((den > tiny) & (den < huge)))
        if bad.size:
            ab = a[bad]
            ub = None if upper is None else upper[bad]
            m = _row_max(ab, bT, rows, cols, ub, buf)
            acc_b = np.zeros((bad.size, q))
            sq_b = np.zeros(bad.size) if want_sq else None
            _sweep(ab, bT, rhs, acc_b, sq_b, rows, cols, ub, "exp", 0.0, buf,
                   shift=m.astype(dt))
            acc[bad] = acc_b
            if want_sq:
                sq[bad] = sq_b
            log_scale[bad] = m
    return acc, sq, log_scale


def _with_ones(values):
    return np.column_stack([values, np.ones(values.shape[0])])


def _ess(den, sq):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sq > 0, den * den / np.where(sq > 0, sq, 1.0), 0.0)


def softmax_features(qx, ky):
    r"""Features for the score :math:`qx_i\cdot ky_j`, shifted by a Cauchy-Schwarz bound.

    :math:`a_i = (qx_i, -|qx_i|\max_j|ky_j|)`, :math:`b_j = (ky_j, 1)`, so
    :math:`a_i\cdot b_j \le 0` and ``exp`` cannot overflow.
    """
    # tokens near the end of the floating-point range overflow the bound to inf; the
    # velocity then comes out non-finite and its caller reports it (no warning here)
    with np.errstate(over="ignore", invalid="ignore"):
        bound = np.linalg.norm(qx, axis=1) * np.sqrt(np.max(np.einsum("ij,ij->i", ky, ky)))
    a = np.column_stack([qx, -bound])
    b = np.column_stack([ky, np.ones(ky.shape[0])])
    return a, b


def l2_features(qx, ky, c):
    r"""Features for the score :math:`-c\,|qx_i - ky_j|^2 \le 0`.

    :math:`a_i = (2c\,qx_i, -c|qx_i|^2, 1)`, :math:`b_j = (ky_j, 1, -c|ky_j|^2)`.
    """
    nq = np.einsum("ij,ij->i", qx, qx)
    nk = np.einsum("ij,ij->i", ky, ky)
    a = np.column_stack([2.0 * c * qx, -c * nq, np.ones(qx.shape[0])])
    b = np.column_stack([ky, np.ones(ky.shape[0]), -c * nk])
    return a, b


def normalized_average(a, b, values, *, chunk_size=DEFAULT_CHUNK_SIZE, dtype=np.float64,
                       want_ess=False, upper=None):
    r"""Softmax-weighted averages :math:`\sum_j w_{ij} y_j / \sum_j w_{ij}`, :math:`w_{ij} = e^{a_i\cdot b_j}`.

    Returns the averages, shape ``(na, d)``, and the effective sample sizes
    :math:`(\sum_j w_{ij})^2/\sum_j w_{ij}^2` (or ``None``).
    """
    acc, sq, _ = weighted_sums(a, b, _with_ones(values), chunk_size=chunk_size, dtype=dtype,
                               want_sq=want_ess, upper=upper)
    den = acc[:, -1]
    avg = acc[:, :-1] / den[:, None]
    return avg, (_ess(den, sq) if want_ess else None)


def sigmoid_average(a, b, values, bias, *, chunk_size=DEFAULT_CHUNK_SIZE, dtype=np.float64,
                    want_ess=False):
    r"""Unnormalised averages :math:`\frac1n\sum_j \sigma(a_i\cdot b_j + \text{bias})\, y_j`.

    Returns the averages, shape ``(na, d)``, and the effective sample sizes (or ``None``).
    """
    acc, sq, _ = weighted_sums(a, b, _with_ones(values), chunk_size=chunk_size, dtype=dtype,
                               want_sq=want_ess, link="sigmoid", bias=float(bias))
    avg = acc[:, :-1] / b.shape[0]
    return avg, (_ess(acc[:, -1], sq) if want_ess else None)


def sinkhorn_average(a, b, values, *, f=None, g=None, tol=1e-8, max_iter=1000,
                     chunk_size=DEFAULT_CHUNK_SIZE, dtype=np.float64, want_ess=False,
                     warn=True):
    r"""Log-domain Sinkhorn scaling with uniform marginals and the plan's row averages.

    The plan is :math:`\pi_{ij} = \frac{1}{n^2} e^{S_{ij} + f_i + g_j}`,
    :math:`S_{ij} = a_i\cdot b_j`, with both marginals uniform. One iteration is

    .. math::

        f_i \leftarrow \log n - \log\sum_j e^{S_{ij} + g_j},\qquad
        g_j \leftarrow \log n - \log\sum_i e^{S_{ij} + f_i},

    the first as a log-sum-exp over row tiles, the second over column tiles. After the
    ``f`` update the rows are exact; the iteration stops when the column marginal error
    :math:`\max_j |n\sum_i\pi_{ij} - 1|` is at most ``tol``.

    Parameters
    ----------
    a, b : ndarray, shape (n, p)
        Query and key features.
    values : ndarray, shape (n, d)
        The tokens :math:`y_j` averaged with the row-normalised plan.
    f, g : ndarray, shape (n,), optional
        Warm-start potentials (zero when ``None``).
    tol : float
        Tolerance on the column marginal error.
    max_iter : int
        Iteration cap.
    chunk_size, dtype
        Tiling and precision, as in :func:`weighted_sums`.
    want_ess : bool
        Also return the effective sample sizes of the row-normalised plan.
    warn : bool
        Warn with :class:`SinkhornConvergenceWarning` when the cap is reached above ``tol``.

    Returns
    -------
    avg : ndarray, shape (n, d)
        :math:`\sum_j n\pi_{ij} y_j`.
    diag : ParticleDiagnostics
        Effective sample sizes (if asked), marginal error, iterations, convergence.
    f, g : ndarray, shape (n,)
        Final potentials (to warm-start the next call).
    """
    n = a.shape[0]
    f = np.zeros(n) if f is None else np.array(f, dtype=float)
    g = np.zeros(n) if g is None else np.array(g, dtype=float)
    log_n = np.log(n)
    rhs = _with_ones(values)
    ones = np.ones((n, 1))
    one = np.ones((n, 1))
    kw = dict(chunk_size=chunk_size, dtype=dtype)
    err = np.inf
    iterations = 0
    for iterations in range(1, max_iter + 1):  # noqa: B007 (used after the loop)
        # rows: sum_j exp(S_ij + g_j) = den_i exp(c_i - f_i) with the shift f_i folded in
        acc, sq, c = weighted_sums(np.column_stack([a, f, one]), np.column_stack([b, one, g]),
                                   rhs, want_sq=want_ess, **kw)
        den = acc[:, -1]
        f = f + log_n - np.log(den) - c
        # columns: (1/n) sum_i exp(S_ij + f_i + g_j) = n * column sum of pi
        cacc, _, cc = weighted_sums(np.column_stack([b, g, one]), np.column_stack([a, one, f]),
                                    ones, **kw)
        log_col = np.log(cacc[:, 0]) + cc - log_n
        err = float(np.max(np.abs(np.expm1(log_col))))
        if err <= tol:
            break
        g = g - log_col
    converged = err <= tol
    if not converged and warn:
        warnings.warn(
            f"Sinkhorn scaling did not converge within `sinkhorn_max_iter` = {max_iter} "
            f"iterations: column marginal error {err:.3g} > `sinkhorn_tol` = {tol:.3g}.",
            SinkhornConvergenceWarning, stacklevel=3)
    avg = acc[:, :-1] / den[:, None]
    diag = ParticleDiagnostics(ess=_ess(den, sq) if want_ess else None,
                               marginal_error=err, iterations=iterations, converged=converged)
    return avg, diag, f, g


@dataclasses.dataclass
class ParticleOptions:
    """Validated options of one particle-velocity evaluation (see ``particle_velocity``)."""

    positions: np.ndarray | None = None
    chunk_size: int = DEFAULT_CHUNK_SIZE
    dtype: np.dtype = np.dtype(np.float64)
    state: dict | None = None
    want_ess: bool = False
    sinkhorn_tol: float = 1e-8
    sinkhorn_max_iter: int = 1000
    warn: bool = True

    def sub_state(self, key):
        """A per-head sub-dictionary of ``state`` (``None`` when there is no state)."""
        if self.state is None:
            return None
        return self.state.setdefault(key, {})

    def for_head(self, key):
        """The same options with the state of head ``key``."""
        return dataclasses.replace(self, state=self.sub_state(key))


def make_options(n, *, positions=None, chunk_size=None, dtype=np.float64, state=None,
                 want_ess=False, sinkhorn_tol=None, sinkhorn_max_iter=1000, warn=True):
    """Validate the keyword arguments of ``particle_velocity`` (names them in errors)."""
    from .._common.validation import validate_int, validate_positions, validate_tolerance

    dt = resolve_dtype(dtype)
    if chunk_size is None:
        chunk_size = DEFAULT_CHUNK_SIZE
    chunk_size = validate_int(chunk_size, "chunk_size", minimum=1)
    if positions is not None:
        positions = validate_positions(positions, n)
    if state is not None and not isinstance(state, dict):
        raise TypeError(f"`state` must be a dict or None, got {type(state).__name__}.")
    if sinkhorn_tol is None:
        sinkhorn_tol = 1e-8 if dt == np.float64 else 1e-4
    sinkhorn_tol = validate_tolerance(sinkhorn_tol, "sinkhorn_tol")
    sinkhorn_max_iter = validate_int(sinkhorn_max_iter, "sinkhorn_max_iter", minimum=1)
    return ParticleOptions(positions=positions, chunk_size=chunk_size, dtype=dt, state=state,
                           want_ess=bool(want_ess), sinkhorn_tol=sinkhorn_tol,
                           sinkhorn_max_iter=sinkhorn_max_iter, warn=bool(warn))
