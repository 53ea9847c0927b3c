""":func:`solve_batch`: its input, turned into one attention per trajectory, and its runs.

The input is checked (a mapping of stacked weights becomes one attention per trajectory),
each attention asked for its compiled field (:meth:`~gaussian_pde.Attention.compiled_field`),
and the compiled engine (:mod:`gaussian_pde.integrate._compiled_engine`) run once for every
pair of kernels among them.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from .._common.validation import validate_array, validate_covariance
from ..attention import (
    ATTENTIONS,
    Attention,
    compiled_field_of,
    get_attention,
    has_hook,
    require_mean,
)
from . import _compiled_engine
from ._options import solver_options

__all__ = ["solve_batch"]

_METHODS = ("auto", "DOP853", "rosenbrock")
_PATHS = ("auto", "compiled")


def solve_batch(attentions_or_weights, cov0s, t_span, *, t_eval=None, rtol=1e-10, atol=1e-12,
                blowup_threshold=1e8, steady_tol=None, steady_atol=0.0, rank_tol=None,
                max_step=np.inf, max_nfev=100_000, method="auto", mean0s=None, path="auto"):
    r"""Integrate many covariance trajectories at once, each with its own steps and events.

    .. math:: L_b' = M_b(\Sigma_b)L_b,\qquad \Sigma_b = L_bL_b^T,\qquad b = 1..B

    Parameters
    ----------
    attentions_or_weights : Attention, sequence of Attention, or mapping
        One attention for every trajectory; or ``B`` attentions of the same dimension
        (any mix of types: trajectories whose compiled fields share kernels run in one
        call of the integrator); or stacked single-head weights
        ``{"kind": "softmax", "Q": (B, k, d), "K": (B, k, d), "V": (B, d, d),
        "scale": (B,)}`` (any entry may be unstacked, ``scale`` defaults to
        :math:`1/\sqrt{k}`), which become one attention per trajectory. Every attention
        must supply a compiled field (:meth:`~gaussian_pde.Attention.compiled_field`:
        every Gaussian-preserving built-in type does); a ``TypeError`` says which does
        not.
    cov0s : array_like, shape (B, d, d)
        Initial covariances, symmetric PSD (any rank).
    t_span : (float, float)
        Common interval of integration.
    t_eval : array_like, optional
        Common output times; ``cov[b, j]`` is NaN once trajectory ``b`` has stopped.
    rtol, atol, blowup_threshold, steady_tol, steady_atol, rank_tol, max_step, max_nfev
        As in :func:`gaussian_pde.solve` (per trajectory). The steady-state event is on
        when ``steady_tol`` is given or ``steady_atol`` is positive (``steady_tol=None``
        with ``steady_atol > 0`` stops at :math:`\|\Sigma'\|_F \le` ``steady_atol``, the
        paper's criterion). ``max_nfev`` counts every evaluation of the field, the
        Jacobian's included (a DOP853 step costs 12; a RODAS4P2 step 6, plus 1 for a new
        closed-form Jacobian or :math:`2n` for central differences, :math:`n` the size of
        the state, :math:`d^2` or :math:`d(d + 1)` with the mean).
    mean0s : array_like, shape (B, d), optional
        Initial means: the mean's equation :math:`\alpha_b' = b_b + M_b\alpha_b` is
        integrated with the factor, in the state :math:`[L_b \mid \alpha_b]` (in the
        units of :func:`gaussian_pde.solve`: a power of 2 that makes the tolerances
        relative to the mean's size). Required where a field matrix depends on the mean
        (``field_sees_mean``: linear attention, whose mean equation is not homogeneous
        and whose mean is held in its own units).
    path : {"auto", "compiled"}
        Both run the compiled integrator, the only one (``BatchSolution.path`` is
        ``"compiled"``). ``"numpy"``, a vectorised NumPy loop that this function no
        longer has, is refused with a ``ValueError``.
    method : {"auto", "DOP853", "rosenbrock"}
        ``"DOP853"``: explicit Dormand-Prince 8(5,3) steps. ``"rosenbrock"``: the
        L-stable, stiffly accurate linearly implicit RODAS4P2 (Steinebach 2020) with
        its embedded order-3 estimate. ``"auto"`` (default): every trajectory starts with
        DOP853 and switches for good to RODAS4P2 once Hairer's stiffness test
        (:math:`h|\lambda| > 6.1` on 15 accepted steps) finds it stiff, or, where the
        Jacobian has a closed form, once 75 of a block of 100 accepted steps have
        :math:`h|\lambda| \ge 2` (DOP853 crawling at its stability limit), so short and
        non-stiff runs take exactly the DOP853 steps and the stiff tail of a slow
        convergence (K = -Q: the covariance approaches a rank-deficient limit like
        :math:`1/t` while the surviving directions relax fast, and explicit steps are
        stability-limited to about ``0.004 t``) takes steps limited by accuracy only.

    Returns
    -------
    BatchSolution

    Raises
    ------
    TypeError
        Where an attention supplies no compiled field, or ``attentions_or_weights`` is
        none of the forms above.
    ValueError
        For bad shapes, options or weights, and for ``path="numpy"``.

    Notes
    -----
    A DOP853 step of a trajectory uses SciPy's error norm and step-size rule, so with
    ``method="DOP853"`` (and with ``"auto"`` until a trajectory is found stiff) a batch
    trajectory follows the steps of :func:`scipy.integrate.solve_ivp`'s ``DOP853`` on the
    factor, and those of ``solve(..., method="DOP853")``, up to rounding.

    A RODAS4P2 step solves, for :math:`W = I/(\gamma h) - J` (:math:`\gamma = 1/4`),

    .. math::

        W U_i = f\Big(y + \sum_{j<i} a_{ij} U_j\Big) + \sum_{j<i} \frac{c_{ij}}{h} U_j,
        \qquad i = 1, \dots, 6,

    with :math:`y_{n+1} = y + \sum_j a_{6j} U_j + U_6` and error estimate :math:`U_6`
    (the form and the step of Hairer's ``rodas.f``, E. Hairer and G. Wanner, *Solving
    Ordinary Differential Equations II*, 2nd ed., Springer 1996, section IV.7, with
    Steinebach's coefficients and order-3 dense output: G. Steinebach, "Improvement of
    Rosenbrock-Wanner method RODASP", *Progress in Differential-Algebraic Equations II*,
    Springer 2020; :data:`gaussian_pde.integrate.RODAS4P2`). On very stiff runs
    RODAS4's local error falls off with a low power of :math:`h` (order reduction) and
    its steps shrink many times below Radau's; RODAS4P2 satisfies further conditions
    against it. :math:`J` is the Jacobian of
    the field at the step's start: the compiled field's closed form where it has one and
    it holds, column-scaled central differences otherwise; it is recomputed only after an
    accepted step. :math:`W` is factored by LU with partial pivoting. The step-size rule
    is the DOP853 one with exponent :math:`-1/4` and growth at most 6. The factor form is
    kept, so the covariance stays symmetric PSD with its rank.

    The blow-up event is checked at step ends; the blow-up time comes from the same
    extrapolation of :math:`1/\operatorname{tr}\Sigma` as in :func:`gaussian_pde.solve`,
    evaluated at the end of the first step past the threshold (``solve`` evaluates it at
    the located crossing). Steady-state and rank-collapse events are located by
    bisection on the dense output to ``2**-30`` of the step.

    Examples
    --------
    >>> import numpy as np, gaussian_pde as gp
    >>> att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2), scale=0.5)
    >>> sol = gp.solve_batch(att, [np.eye(2), 2 * np.eye(2)], (0, 2))
    >>> np.round(sol.t_blowup, 6)           # exact 1/lambda_max(Sigma0^1/2 (A + A^T) Sigma0^1/2)
    array([1. , 0.5])
    """
    cov0s, mean0s = _checked(cov0s, mean0s, path)
    nb, d = cov0s.shape[0], cov0s.shape[-1]
    atts = _attentions(attentions_or_weights, nb)
    listed = atts if isinstance(atts, list) else [atts]
    for att in listed:
        require_mean(att, mean0s, "mean0s")
    if listed[0].d != d:
        fd = listed[0].d
        raise ValueError(f"`cov0s` must be {fd} x {fd} to match the attention's dimension, "
                         f"got shape {cov0s.shape}.")
    opts = solver_options(t_span, t_eval=t_eval, rtol=rtol, atol=atol, max_step=max_step,
                          max_nfev=max_nfev, blowup_threshold=blowup_threshold,
                          steady_tol=steady_tol, steady_atol=steady_atol, rank_tol=rank_tol)
    if not (isinstance(method, str) and method in _METHODS):
        raise ValueError("`method` must be 'auto', 'DOP853' or 'rosenbrock', "
                         f"got {method!r}.")
    fields = _compiled_engine.compiled_fields(atts, nb)
    if fields is not None:
        return _run_compiled(fields, atts, cov0s, mean0s, opts, method)
    _require_compiled_fields(listed)
    parts = []
    for rows in _kernel_groups(atts):   # fields of several kernels: a run for each
        sub = [atts[i] for i in rows]
        parts.append((rows, _run_compiled(
            _compiled_engine.compiled_fields(sub, len(rows)), sub, cov0s[rows],
            None if mean0s is None else mean0s[rows], opts, method)))
    return _gather(parts, nb)


def _require_compiled_fields(atts):
    """Refuse, with a ``TypeError``, the first attention of ``atts`` without a compiled field."""
    for i, att in enumerate(atts):
        if compiled_field_of(att) is None:
            where = "`attentions_or_weights" + (f"[{i}]`" if len(atts) > 1 else "`")
            able = ", ".join(name for name, cls in ATTENTIONS.items()
                             if has_hook(cls, "compiled_field"))
            raise TypeError(f"{where} is {att!r}, which supplies no compiled field "
                            "(`compiled_field()` returned None): solve_batch integrates "
                            f"the types that do: {able}.")


def _kernel_groups(atts):
    """The trajectories of the list ``atts`` grouped by the kernels of their compiled fields.

    A list of index arrays, one for every pair ``(rhs, jac)`` of kernels (the types of
    other packages bring kernels of their own); every attention has a compiled field.
    """
    keys = {}
    for i, att in enumerate(atts):
        cf = att.compiled_field()
        keys.setdefault((id(cf.rhs), id(cf.jac)), []).append(i)
    return [np.array(rows) for rows in keys.values()]


def _run_compiled(fields, atts, cov0s, mean0s, opts, method):
    """:func:`solve_batch` for ``fields`` of one pair of kernels."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # a mean equation that is not homogeneous keeps the mean in its own units
        units = mean0s is None or all(
            a.mean_is_linear() for a in ([atts] if isinstance(atts, Attention) else atts))
        return _compiled_engine.integrate_batch(fields, cov0s, mean0s, opts, method,
                                                  mean_units=units)


def _gather(parts, nb):
    """One :class:`BatchSolution` of ``B = nb`` trajectories from ``(rows, part)`` pairs."""
    first = parts[0][1]
    out = {}
    for f in dataclasses.fields(first):
        value = getattr(first, f.name)
        if f.name in ("t", "path"):
            out[f.name] = value
        elif f.name == "ncalls":
            out[f.name] = sum(p.ncalls for _, p in parts)
        elif f.name == "message":
            msgs = [None] * nb
            for rows, p in parts:
                for i, m in zip(rows, p.message):
                    msgs[i] = m
            out[f.name] = msgs
        elif value is None:
            out[f.name] = None
        else:
            full = np.empty((nb, *np.shape(value)[1:]), dtype=np.asarray(value).dtype)
            for rows, p in parts:
                full[rows] = getattr(p, f.name)
            out[f.name] = full
    return type(first)(**out)


def _checked(cov0s, mean0s, path):
    """The validated initial covariances ``(B, d, d)`` and means ``(B, d)``; ``path`` checked."""
    cov0s = validate_array(cov0s, "cov0s", ndim=None)
    if cov0s.ndim != 3:
        raise ValueError(f"`cov0s` must have shape (B, d, d), got {cov0s.shape}.")
    if cov0s.shape[0] == 0:
        raise ValueError("`cov0s` must not be empty.")
    cov0s = validate_covariance(cov0s, "cov0s", batch=True)
    nb, d = cov0s.shape[0], cov0s.shape[-1]
    if isinstance(path, str) and path == "numpy":
        raise ValueError("`path='numpy'` was removed: solve_batch runs the compiled "
                         "integrator only; pass `path='auto'` (the default) or 'compiled'.")
    if not (isinstance(path, str) and path in _PATHS):
        raise ValueError(f"`path` must be 'auto' or 'compiled', got {path!r}.")
    if mean0s is not None:
        mean0s = validate_array(mean0s, "mean0s", ndim=2)
        if mean0s.shape != (nb, d):
            raise ValueError(f"`mean0s` must have shape ({nb}, {d}) to match `cov0s`, "
                             f"got {mean0s.shape}.")
    return cov0s, mean0s


def _attentions(obj, n):
    """One attention (for every trajectory) or a list of ``n``, from any accepted form.

    A mapping of stacked weights becomes one attention per trajectory
    (:func:`_from_weights`); a sequence is checked for its length, its entries and their
    common dimension.
    """
    if isinstance(obj, Attention):
        return obj
    if isinstance(obj, Mapping):
        return _from_weights(obj, n)
    if isinstance(obj, (str, bytes)) or not isinstance(obj, Sequence):
        raise TypeError("`attentions_or_weights` must be an attention, a sequence of "
                        "attentions or a mapping of stacked weights, got "
                        f"{type(obj).__name__}.")
    atts = list(obj)
    if len(atts) != n:
        raise ValueError(f"`attentions_or_weights` has {len(atts)} attentions but `cov0s` "
                         f"has {n} covariances; they must match.")
    for i, a in enumerate(atts):
        if not isinstance(a, Attention):
            raise TypeError(f"`attentions_or_weights[{i}]` must be an attention, "
                            f"got {type(a).__name__}.")
    dims = {a.d for a in atts}
    if len(dims) != 1:
        raise ValueError(f"all `attentions_or_weights` must have the same dimension d, got "
                         f"{sorted(dims)}.")
    return atts


#: the weights of a head that stacked weights (a mapping) can describe
_QKV = ("Q", "K", "V", "scale")


def _stacked(w, name):
    """Stacked weight ``name`` of the mapping ``w``: ``(B, rows, d)``, a leading axis added."""
    arr = validate_array(w[name], name, ndim=(2, 3))
    return arr[None] if arr.ndim == 2 else arr


def _from_weights(w, n):
    """One attention per trajectory (or one for all) from a mapping of stacked weights."""
    unknown = set(w) - {"kind", *_QKV}
    if unknown or not {"kind", "Q", "K", "V"} <= set(w):
        raise ValueError("`attentions_or_weights` (stacked weights) must be a mapping with "
                         "keys 'kind', 'Q', 'K', 'V' and optionally 'scale', got keys "
                         f"{sorted(w)}.")
    try:
        cls = get_attention(w["kind"])
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"`attentions_or_weights['kind']`: {exc}") from None
    if not cls.gaussian_preserving or getattr(cls, "weight_names", None) != _QKV:
        raise ValueError("`attentions_or_weights['kind']` must be a single-head kind with "
                         f"exact moment equations, got {w['kind']!r}.")
    Q = _stacked(w, "Q")
    k, d = Q.shape[-2:]
    if k == 0 or d == 0:
        # as the attention classes: a head needs at least one query row (the default
        # scale 1/sqrt(k) is infinite at k = 0) and one dimension
        raise ValueError(f"stacked weights `Q` must have shape (B, k, d) with k >= 1 and "
                         f"d >= 1, got {Q.shape}.")
    K, V = _stacked(w, "K"), _stacked(w, "V")
    if K.shape[-2:] != (k, d) or V.shape[-2:] != (d, d):
        raise ValueError(f"stacked weights must have Q, K of shape (B, {k}, {d}) and V of "
                         f"shape (B, {d}, {d}), got K {K.shape}, V {V.shape}.")
    scale = w.get("scale")
    scale = np.full(1, 1.0 / np.sqrt(k)) if scale is None else validate_array(
        scale, "scale", ndim=(0, 1)).reshape(-1)
    if not np.all((scale > 0) & np.isfinite(scale)):
        raise ValueError(f"`scale` must be positive and finite, got {scale}.")
    ws = (Q, K, V, scale)
    for name, arr in zip(_QKV, ws):
        if arr.shape[0] not in (1, n):
            raise ValueError(f"stacked `{name}` must have 1 or {n} (= len(cov0s)) entries "
                             f"along its first axis, got {arr.shape[0]}.")
    rows = max(arr.shape[0] for arr in ws)
    atts = []
    for b in range(rows):
        Qb, Kb, Vb, sb = (arr[min(b, arr.shape[0] - 1)] for arr in ws)
        try:
            atts.append(cls(Q=Qb, K=Kb, V=Vb, scale=float(sb)))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"`attentions_or_weights` (stacked weights, trajectory {b}): "
                            f"{exc}") from None
    return atts[0] if rows == 1 else atts
