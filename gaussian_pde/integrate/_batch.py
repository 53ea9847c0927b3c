r"""Many covariance trajectories at once: a vectorised, per-trajectory adaptive integrator.

The factor-form covariance equation (docs/math.md section 3),

.. math:: L_b' = M_b(\Sigma_b)\,L_b,\qquad \Sigma_b = L_bL_b^T,\qquad b = 1, \dots, B,

is integrated for a stack of ``B`` trajectories with one vectorised right-hand side per
Runge-Kutta stage: the generated functions in :mod:`gaussian_pde._generated` broadcast
over leading axes, of the state and of stacked weights ``Q, K, V`` of shape
``(B, k, d)``. Every trajectory has its own time, step size and step control (the
Dormand-Prince 8(5,3) pair of :func:`scipy.integrate.solve_ivp`'s ``DOP853``, with the same
error norm and step-size rule, or, where it is stiff, the L-stable Rosenbrock method
RODAS4 with a finite-difference Jacobian: ``method="auto"`` switches per trajectory),
its own events (blow-up with a time estimate, steady
state, rank collapse, the same definitions as :func:`gaussian_pde.solve`) and its own
status. Finished trajectories leave the active stack, so a trajectory that blows up early
costs nothing afterwards, and one that needs many steps only costs its own rows.

Differences from :func:`gaussian_pde.solve`, all documented on :func:`solve_batch`: the
blow-up time is estimated at the end of the step that passed the threshold instead of at
the located crossing; steady-state and rank-collapse events are located by bisection on
the dense output to ``2**-30`` of the step.

Where every attention supplies a compiled field
(:meth:`~gaussian_pde.Attention.compiled_field`), :func:`solve_batch` runs the same steps,
events and output per trajectory in compiled code instead
(:mod:`gaussian_pde.integrate._compiled_batch`, which also carries the mean); this module's
loop serves the rest (covariance only).
"""

# The event helpers defined inside the integration loop are called within the same
# iteration only, so binding the loop variables late is intended:
# ruff: noqa: B023

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from .._common.linalg import psd_factor
from .._common.validation import validate_array, validate_covariance
from ..attention import Attention, require_mean
from ._events import (
    blowup_extrapolate,
    blowup_probe_step,
    blowup_verdict,
    rank_first,
    rank_gap,
    steady_gap,
)
from ._field import build_field, cov_rate
from ._options import solver_options
from ._record import BatchRecord
from ._refactor import REFACTOR_ABOVE, REFACTOR_EVERY, cancellation_excess, rotation
from ._results import Status, overflow_message
from ._steppers import MIN_FACTOR, SAFETY, DOP853Stepper, MixedStep, RosenbrockStepper, rms

__all__ = ["solve_batch"]

#: bisection steps that locate a steady-state or rank-collapse crossing within a step
_BISECT = 30

_METHODS = ("auto", "DOP853", "rosenbrock")
_PATHS = ("auto", "compiled", "numpy")
#: Hairer's DOP853 stiffness test: h |lambda| above this on _STIFF_STEPS accepted steps
#: (a run of _NONSTIFF_RESET non-stiff steps resets the count) switches a row to RODAS4
_STIFF_HLAMB, _STIFF_STEPS, _NONSTIFF_RESET = 6.1, 15, 6


def solve_batch(attentions_or_weights, cov0s, t_span, *, t_eval=None, rtol=1e-10, atol=1e-12,
                blowup_threshold=1e8, steady_tol=None, steady_atol=0.0, rank_tol=None,
                max_step=np.inf, max_nfev=100_000, method="auto", mean0s=None, path="auto"):
    r"""Integrate many covariance trajectories at once, each with its own steps and events.

    .. math:: L_b' = M_b(\Sigma_b)L_b,\qquad \Sigma_b = L_bL_b^T,\qquad b = 1..B

    Parameters
    ----------
    attentions_or_weights : Attention, sequence of Attention, or mapping
        One attention for every trajectory; or ``B`` attentions (any mix of softmax, L2,
        Sinkhorn and MultiHead of the same dimension: trajectories with the same
        structure share one vectorised call); or stacked single-head weights
        ``{"kind": "softmax", "Q": (B, k, d), "K": (B, k, d), "V": (B, d, d),
        "scale": (B,)}`` (any entry may be unstacked, ``scale`` defaults to
        :math:`1/\sqrt{k}`).
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
        Jacobian's included (a Rosenbrock step costs ``d^2 + 6`` for softmax and L2,
        ``2 d^2 + 6`` otherwise; a DOP853 step 12).
    mean0s : array_like, shape (B, d), optional
        Initial means: the mean's equation :math:`\alpha_b' = b_b + M_b\alpha_b` is
        integrated with the factor, in the state :math:`[L_b \mid \alpha_b]` (in the
        units of :func:`gaussian_pde.solve`: a power of 2 that makes the tolerances
        relative to the mean's size). Compiled path only. Required where a field matrix
        depends on the mean (``field_sees_mean``: linear attention, whose mean equation
        is not homogeneous and whose mean is held in its own units).
    path : {"auto", "compiled", "numpy"}
        ``"auto"`` (default): the compiled integrator
        (:mod:`gaussian_pde.integrate._compiled_batch`: the loop over trajectories in
        Numba, parallel over them, the same steps, events, statuses and messages) where
        every attention supplies a compiled field
        (:meth:`~gaussian_pde.Attention.compiled_field`), the vectorised NumPy loop
        otherwise; ``BatchSolution.path`` says which ran. ``"compiled"`` requires the
        compiled path, ``"numpy"`` forces the NumPy loop.
    method : {"auto", "DOP853", "rosenbrock"}
        ``"DOP853"``: explicit Dormand-Prince 8(5,3) steps. ``"rosenbrock"``: the
        L-stable, stiffly accurate linearly implicit RODAS4 (Hairer and Wanner 1996) with
        its embedded order-3 estimate. ``"auto"`` (default): every trajectory starts with
        DOP853 and switches for good to RODAS4 once Hairer's stiffness test
        (:math:`h|\lambda| > 6.1` on 15 accepted steps) finds it stiff, so short and
        non-stiff runs take exactly the DOP853 steps and the stiff tail of a slow
        convergence (K = -Q: the covariance approaches a rank-deficient limit like
        :math:`1/t` while the surviving directions relax fast, and explicit steps are
        stability-limited to about ``0.004 t``) takes steps limited by accuracy only.

    Returns
    -------
    BatchSolution

    Notes
    -----
    A DOP853 step of a trajectory uses SciPy's error norm and step-size rule, so with
    ``method="DOP853"`` (and with ``"auto"`` until a trajectory is found stiff) a batch
    trajectory follows the same steps as ``solve(..., method="DOP853")`` up to rounding.

    A RODAS4 step solves, for :math:`W = I/(\gamma h) - J` (:math:`\gamma = 1/4`),

    .. math::

        W U_i = f\Big(y + \sum_{j<i} a_{ij} U_j\Big) + \sum_{j<i} \frac{c_{ij}}{h} U_j,
        \qquad i = 1, \dots, 6,

    with :math:`y_{n+1} = y + \sum_j a_{6j} U_j + U_6` and error estimate :math:`U_6`
    (coefficients and the order-3 dense output of Hairer's ``rodas.f``; E. Hairer and
    G. Wanner, *Solving Ordinary Differential Equations II*, 2nd ed., Springer 1996,
    section IV.7). :math:`J` is the Jacobian of the factor field at the step's start, by
    complex-step (softmax, L2) or central differences, all perturbed states of all rows in
    one vectorised call of the field; it is recomputed only after an accepted step. The
    :math:`d^2 \times d^2` matrices :math:`W` are LU-inverted once per step for the whole
    stack (:func:`numpy.linalg.inv`) and applied to the six stages as batched mat-vecs. The
    step-size rule is the DOP853 one with exponent :math:`-1/4` and growth at most 6. The
    factor form is kept, so the covariance stays symmetric PSD with its rank.

    The blow-up event is checked at step ends; the blow-up time comes from
    the same extrapolation of :math:`1/\operatorname{tr}\Sigma` as in
    :func:`gaussian_pde.solve`, evaluated at the end of the first step past the threshold.

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
    atts = _attentions(attentions_or_weights, nb) if path != "numpy" else None
    for att in [atts] if isinstance(atts, Attention) else (atts or []):
        require_mean(att, mean0s, "mean0s")
    fd = None if atts is None else (atts if not isinstance(atts, list) else atts[0]).d
    if atts is None:
        field, fd = build_field(attentions_or_weights, nb)
    if fd != d:
        raise ValueError(f"`cov0s` must be {fd} x {fd} to match the attention's dimension, "
                         f"got shape {cov0s.shape}.")
    opts = solver_options(t_span, t_eval=t_eval, rtol=rtol, atol=atol, max_step=max_step,
                          max_nfev=max_nfev, blowup_threshold=blowup_threshold,
                          steady_tol=steady_tol, steady_atol=steady_atol, rank_tol=rank_tol)
    if not (isinstance(method, str) and method in _METHODS):
        raise ValueError("`method` must be 'auto', 'DOP853' or 'rosenbrock', "
                         f"got {method!r}.")
    if atts is not None:
        from . import _compiled_batch

        fields = _compiled_batch.compiled_fields(atts, nb)
        if fields is not None:
            return _run_compiled(fields, atts, cov0s, mean0s, opts, method)
        groups = _kernel_groups(atts)
        if groups is not None:              # fields of several kernels: a run for each
            parts = []
            for rows in groups:
                sub = [atts[i] for i in rows]
                parts.append((rows, _run_compiled(
                    _compiled_batch.compiled_fields(sub, len(rows)), sub, cov0s[rows],
                    None if mean0s is None else mean0s[rows], opts, method)))
            return _gather(parts, nb)
        field, _ = build_field(attentions_or_weights, nb)
    if path == "compiled":
        raise ValueError("`path='compiled'` needs a compiled field for every attention "
                         "(`Attention.compiled_field()` returned None).")
    if mean0s is not None:
        raise ValueError("`mean0s` needs the compiled path: every attention must supply a "
                         "compiled field (`Attention.compiled_field()` returned None).")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return _integrate(field, cov0s, opts, method)


def _kernel_groups(atts):
    """Trajectories whose compiled fields have different kernels, grouped by kernel.

    A list of index arrays where every attention of the list ``atts`` has a compiled
    field (the types of other packages bring kernels of their own); None where one has
    none, or for a single attention.
    """
    if not isinstance(atts, list):
        return None
    keys = {}
    for i, att in enumerate(atts):
        cf = att.compiled_field()
        if cf is None:
            return None
        keys.setdefault((id(cf.rhs), id(cf.jac)), []).append(i)
    return [np.array(rows) for rows in keys.values()]


def _run_compiled(fields, atts, cov0s, mean0s, opts, method):
    """:func:`solve_batch` on the compiled path, for ``fields`` of one pair of kernels."""
    from . import _compiled_batch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # a mean equation that is not homogeneous keeps the mean in its own units
        units = mean0s is None or all(
            a.mean_is_linear() for a in ([atts] if isinstance(atts, Attention) else atts))
        return _compiled_batch.integrate_compiled(fields, cov0s, mean0s, opts, method,
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
    if not (isinstance(path, str) and path in _PATHS):
        raise ValueError(f"`path` must be 'auto', 'compiled' or 'numpy', got {path!r}.")
    if mean0s is not None:
        mean0s = validate_array(mean0s, "mean0s", ndim=2)
        if mean0s.shape != (nb, d):
            raise ValueError(f"`mean0s` must have shape ({nb}, {d}) to match `cov0s`, "
                             f"got {mean0s.shape}.")
    return cov0s, mean0s


def _attentions(obj, n):
    """One attention, or a list of ``n``, for the compiled path; None where it cannot run.

    Stacked weights and sequences are checked by :func:`build_field` (the NumPy path's
    messages); a mapping of stacked weights becomes one attention per trajectory.
    """
    if isinstance(obj, Attention):
        return obj
    if isinstance(obj, Mapping):
        field, _ = build_field(obj, n)        # validates
        (_, heads), = field.groups
        if len(heads) != 1:
            return None
        cls, ws, _ = heads[0]
        ws = [np.asarray(w, dtype=float) for w in ws]
        rows = max(w.shape[0] for w in ws)

        def row(b):
            vals = [w[min(b, w.shape[0] - 1)] for w in ws]
            kw = {name: (float(v.ravel()[0]) if name == "scale" else v)
                  for name, v in zip(cls.weight_names, vals)}
            return cls(**kw)

        try:
            atts = [row(b) for b in range(rows)]
        except (TypeError, ValueError):
            return None                     # a weight form the constructor does not take
        return atts[0] if rows == 1 else atts
    if (isinstance(obj, Sequence) and not isinstance(obj, (str, bytes)) and len(obj) == n
            and all(isinstance(a, Attention) for a in obj)
            and len({a.d for a in obj}) == 1):
        return list(obj)
    return None


# ----------------------------------------------------------------------------------------
# the loop and its pieces
# ----------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Active:
    """The rows still integrating, aligned: trajectory index, time, state, rate, step."""

    idx: np.ndarray
    t: np.ndarray
    base: np.ndarray           # the row's clock: t = base + tau (see _integrate)
    tau: np.ndarray
    y: np.ndarray
    f: np.ndarray
    h_abs: np.ndarray
    limit: np.ndarray          # trace ratio of the next blow-up look
    rejected: np.ndarray       # the last attempt was rejected
    implicit: np.ndarray       # RODAS4 steps
    iasti: np.ndarray          # Hairer's stiffness counters
    nonsti: np.ndarray

    def compact(self, keep):
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name)[keep])


class _Events:
    """Steady-state and rank-collapse gaps of every trajectory (``_events`` definitions)."""

    def __init__(self, ev_opts, cov0s, L0, f0):
        self.opts = ev_opts
        nb, d = cov0s.shape[0], cov0s.shape[-1]
        self.d = d
        self.first = None if ev_opts.rank_tol is None else rank_first(cov0s, ev_opts.rank_tol)
        self.g_steady = self.steady(L0, f0) if ev_opts.steady_on else None
        self.g_rank = self.rank(L0, np.arange(nb)) if self.first is not None else None

    def steady(self, L, dL):
        return steady_gap(*cov_rate(L, dL), self.opts.steady_tol, self.opts.steady_atol)

    def rank(self, L, rows):
        return rank_gap(L @ np.swapaxes(L, -1, -2), self.first[rows], self.opts.rank_tol)

    def locate(self, g, t_old, h, Ln, dLn, interp, field, nfev):
        """Located stop time (``inf``: none) and kind (1 steady, 2 rank) within the step.

        ``g``: global indices of the accepted rows, ``interp(sel, x)``: dense output of
        rows ``sel`` at fractions ``x``; a downward crossing of a gap is bisected to
        ``2**-_BISECT`` of the step.
        """
        d = self.d
        stop_t = np.full(g.size, np.inf)
        kind = np.zeros(g.size, dtype=int)

        def bisect(sel, gfun):
            lo, hi = np.zeros(sel.size), np.ones(sel.size)
            for _ in range(_BISECT):
                mid = 0.5 * (lo + hi)
                val = gfun(interp(sel, mid), sel)
                nfev[g[sel]] += 1
                lo, hi = np.where(val > 0, mid, lo), np.where(val > 0, hi, mid)
            return hi

        if self.g_steady is not None:
            g_new = self.steady(Ln, dLn)
            fired = np.flatnonzero((self.g_steady[g] > 0) & (g_new <= 0))
            if fired.size:
                def gs(ym, sel):
                    Lm = ym.reshape(-1, d, d)
                    return self.steady(Lm, field.at(g[sel], Lm))
                stop_t[fired] = t_old[fired] + bisect(fired, gs) * h[fired]
                kind[fired] = 1
            self.g_steady[g] = g_new
        if self.g_rank is not None:
            g_new = self.rank(Ln, g)
            fired = np.flatnonzero((self.g_rank[g] > 0) & (g_new <= 0) & (self.first[g] < d))
            if fired.size:
                x = bisect(fired, lambda ym, sel: self.rank(ym.reshape(-1, d, d), g[sel]))
                tr_ = t_old[fired] + x * h[fired]
                earlier = tr_ < stop_t[fired]
                stop_t[fired[earlier]] = tr_[earlier]
                kind[fired[earlier]] = 2
            self.g_rank[g] = g_new
        return stop_t, kind


def _initial_step(field, y, f, t0, t1, opts, err_exp, nfev):
    """Hairer, Norsett and Wanner II.4, as SciPy's ``select_initial_step``, per row."""
    nb, n = y.shape
    d = int(round(np.sqrt(n)))
    scale = opts.atol + np.abs(y) * opts.rtol
    d0, d1 = rms(y / scale), rms(f / scale)
    h0 = np.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / np.maximum(d1, 1e-300))
    h0 = np.minimum(h0, t1 - t0)
    f1 = field(y.reshape(nb, d, d) + h0[:, None, None] * f.reshape(nb, d, d)).reshape(nb, n)
    nfev += 1
    d2 = rms((f1 - f) / scale) / h0
    h1 = np.where((d1 <= 1e-15) & (d2 <= 1e-15), np.maximum(1e-6, h0 * 1e-3),
                  (0.01 / np.maximum(np.maximum(d1, d2), 1e-300)) ** -err_exp)
    return np.minimum.reduce([100 * h0, h1, np.full(nb, t1 - t0), np.full(nb, opts.max_step)])


def _attempt(act, h, dop, ros):
    """One attempted step for every active row, DOP853 or RODAS4 by row."""
    m = act.idx.size
    ros.n_active = m
    parts = []
    y_new, err = np.empty_like(act.y), np.empty(m)
    for stepper, rows in ((dop, np.flatnonzero(~act.implicit)),
                          (ros, np.flatnonzero(act.implicit))):
        if rows.size == m:
            y_new, err, st = stepper.attempt(act.idx, act.y, act.f, h,
                                             None if stepper is dop else rows)
        elif rows.size:
            y_new[rows], err[rows], st = stepper.attempt(act.idx[rows], act.y[rows],
                                                         act.f[rows], h[rows], rows)
        else:
            continue
        parts.append((rows, st))
    step = parts[0][1] if len(parts) == 1 else MixedStep(parts, m)
    return y_new, np.where(np.isfinite(err), err, np.inf), step


def _control(act, err, dop, ros):
    """Accept where ``err < 1``; the next step sizes (SciPy's DOP853 rule, per method)."""
    err_exp = np.where(act.implicit, ros.err_exp, dop.err_exp)
    max_factor = np.where(act.implicit, ros.max_factor, dop.max_factor)
    acc = err < 1
    fac = np.where(err == 0, max_factor,
                   np.minimum(max_factor, SAFETY * np.where(err > 0, err, 1.0) ** err_exp))
    fac_acc = np.where(act.rejected, np.minimum(1.0, fac), fac)
    fac_rej = np.maximum(MIN_FACTOR, SAFETY * np.where(np.isfinite(err) & (err > 0),
                                                          err, 1e300) ** err_exp)
    act.h_abs = np.where(acc, act.h_abs * fac_acc, act.h_abs * fac_rej)
    act.rejected = ~acc
    return acc


def _store_output(rec, t_eval, g, t_old, t_end, h, interp):
    """Covariances at the output times in ``(t_old, t_end]`` of each accepted row."""
    lo_i = np.searchsorted(t_eval, t_old, side="right")
    hi_i = np.searchsorted(t_eval, t_end, side="right")
    cnt = hi_i - lo_i
    if cnt.any():
        sel = np.repeat(np.arange(g.size), cnt)
        j = np.concatenate([np.arange(p, q) for p, q in zip(lo_i, hi_i) if q > p])
        # (clipped: a step below the rounding of t has t_end - t_old != h)
        x = np.clip((t_eval[j] - t_old[sel]) / h[sel], 0.0, 1.0)
        Ls = interp(sel, x).reshape(-1, *rec.L_final.shape[1:])
        rec.cov[g[sel], j] = Ls @ np.swapaxes(Ls, -1, -2)


def _blowup_looks(rec, act, a, over, t_new, Ln, dLn, field, suspected):
    """The shared blow-up rule at the end of the steps of accepted rows ``a[over]``.

    Returns the positions (in ``a``) of the rows that stop.
    """
    g = act.idx[a[over]]
    cov, dcov = cov_rate(Ln[over], dLn[over])
    tr_, dtr = np.trace(cov, axis1=1, axis2=2), np.trace(dcov, axis1=1, axis2=2)
    hh = blowup_probe_step(tr_, dtr)
    L_end = Ln[over] + hh[:, None, None] * dLn[over]
    cov2, dcov2 = cov_rate(L_end, field.at(g, L_end))
    rec.nfev[g] += 1
    tstar, finite = blowup_extrapolate(t_new[over], tr_, dtr, np.trace(cov2, axis1=1, axis2=2),
                                       np.trace(dcov2, axis1=1, axis2=2), hh)
    stopped = []
    for q, r in enumerate(over):
        verdict, detail = blowup_verdict(tstar[q], finite[q], t_new[r], act.limit[a[r]],
                                         suspected[g[q]])
        if verdict is None:   # follow it further
            suspected[g[q]], act.limit[a[r]] = detail
            continue
        rec.stop(g[q], verdict, detail, t_new[r], Ln[r])
        if verdict == Status.BLOWUP:
            rec.t_blowup[g[q]] = tstar[q]
        stopped.append(r)
    return np.array(stopped, dtype=int)


def _refactor_rows(act, a, d, ros, atol, rtol):
    r"""Re-factor rows ``a`` whose factor's columns cancel: :math:`L \mapsto LW`, :math:`L' \mapsto L'W`.

    The rule of :func:`gaussian_pde.solve` (:mod:`gaussian_pde.integrate._refactor`):
    where the rounding of a cancelling direction passes ``REFACTOR_ABOVE`` of the
    tolerance (:func:`~gaussian_pde.integrate._refactor.cancellation_excess`), the
    columns are rotated onto orthogonal ones. Looked at every ``REFACTOR_EVERY``-th
    accepted step of a row, as in :func:`gaussian_pde.solve`: one batched SVD of those
    rows. The flow is
    equivariant under :math:`L \mapsto LW`, so the rate rotates with the state (no new
    evaluation); a Jacobian kept for the row is no longer the one at its state.
    """
    if a.size == 0:
        return
    L = act.y[a].reshape(-1, d, d)
    for q in np.flatnonzero(cancellation_excess(L, atol, rtol) > REFACTOR_ABOVE):
        W = rotation(L[q])
        row = a[q]
        act.y[row] = (L[q] @ W).ravel()
        act.f[row] = (act.f[row].reshape(d, d) @ W).ravel()
        if ros.fresh is not None:
            ros.fresh[row] = False


def _stiffness(act, acc, hlamb, rec, ros):
    """Hairer's DOP853 stiffness test on the accepted explicit steps; switch to RODAS4."""
    m = act.idx.size
    explicit = np.flatnonzero(~act.implicit)
    hl = np.zeros(m)
    hl[explicit] = hlamb
    ok = acc & ~act.implicit
    stiff_step = ok & (hl > _STIFF_HLAMB)
    act.iasti = np.where(stiff_step, act.iasti + 1, act.iasti)
    act.nonsti = np.where(stiff_step, 0, np.where(ok, act.nonsti + 1, act.nonsti))
    act.iasti = np.where(act.nonsti >= _NONSTIFF_RESET, 0, act.iasti)
    to_implicit = act.iasti >= _STIFF_STEPS
    if to_implicit.any():
        act.implicit = act.implicit | to_implicit
        rec.implicit[act.idx[to_implicit]] = True
        if ros.fresh is not None:
            ros.fresh[to_implicit] = False


def _start(field, cov0s, opts, method):
    """The record, the active rows, the steppers and the events at ``t0``.

    Rows whose field overflows at the initial covariance stop at once (no step can be
    taken).
    """
    nb, d = cov0s.shape[0], cov0s.shape[-1]
    n = d * d
    t0, t1, t_eval = opts.t0, opts.t1, opts.t_eval
    rec = BatchRecord(nb, d, t1, t_eval, method)
    nfev = rec.nfev
    idx = np.arange(nb)
    field.set_active(idx)
    y = psd_factor(cov0s).reshape(nb, n).copy()
    f = field(y.reshape(nb, d, d)).reshape(nb, n)
    nfev += 1
    dop = DOP853Stepper(field, d, opts.atol, opts.rtol, nfev)
    ros = RosenbrockStepper(field, d, opts.atol, opts.rtol, nfev)
    implicit = np.full(nb, method == "rosenbrock")
    if t_eval is not None:
        at0 = t_eval == t0
        if at0.any():
            rec.cov[:, at0] = cov0s[:, None]
    events = _Events(opts.events, cov0s, y.reshape(nb, d, d), f.reshape(nb, d, d))
    err_exp = np.where(implicit, ros.err_exp, dop.err_exp)
    act = _Active(idx=idx, t=np.full(nb, t0), base=np.zeros(nb), tau=np.full(nb, t0), y=y, f=f,
                  h_abs=_initial_step(field, y, f, t0, t1, opts, err_exp, nfev),
                  limit=np.full(nb, opts.events.blowup_threshold),
                  rejected=np.zeros(nb, dtype=bool), implicit=implicit,
                  iasti=np.zeros(nb, dtype=int), nonsti=np.zeros(nb, dtype=int))
    bad = ~np.isfinite(f).all(axis=1)
    if bad.any():
        rec.stop(idx[bad], Status.FAILED,
                 f"the field is not finite at t = {t0:.10g}: the rate of the initial "
                 "covariance overflows float64", t0, y[bad].reshape(-1, d, d))
        act.compact(~bad)
        ros.compact(~bad)
        field.set_active(act.idx)
    return rec, act, dop, ros, events


def _accepted_rows(run, act, a, h, y_new, step, done):
    """The accepted rows ``a``: their rates, events, output, blow-up looks and advance.

    ``run`` holds what the loop shares (field, record, steppers, events, options,
    initial traces, suspected blow-ups); ``done`` marks the rows that stop.
    """
    field, rec, ros, events, opts = run.field, run.rec, run.ros, run.events, run.opts
    d, t1 = run.d, opts.t1
    g = act.idx[a]
    t_old, y_old, f_old = act.t[a], act.y[a], act.f[a]
    tau_new = act.tau[a] + h[a]
    t_new = act.base[a] + tau_new
    at_end = t1 - t_new < 4 * np.abs(np.nextafter(t1, np.inf) - t1)
    t_new = np.where(at_end, t1, np.minimum(t_new, t1))
    tau_new = np.where(at_end, t1 - act.base[a], tau_new)
    f_new = step.rate(a)
    # an accepted state whose rate overflows: stop at the last finite state
    lost = ~(np.isfinite(f_new).all(axis=1) & np.isfinite(y_new[a]).all(axis=1))
    if lost.any():
        for r in np.flatnonzero(lost):
            rec.stop(g[r], Status.FAILED, overflow_message(t_old[r], t_new[r]),
                     t_old[r], y_old[r].reshape(d, d))
        done[a[lost]] = True
        a, g, t_old, y_old, f_old, t_new, tau_new, f_new = (
            x[~lost] for x in (a, g, t_old, y_old, f_old, t_new, tau_new, f_new))
    if not a.size:
        return
    Ln, dLn = y_new[a].reshape(-1, d, d), f_new.reshape(-1, d, d)
    rec.nsteps[g] += 1
    interp = step.dense(a, y_old, f_old)
    stop_t, kind = events.locate(g, t_old, h[a], Ln, dLn, interp, field, rec.nfev)
    if opts.t_eval is not None:
        _store_output(rec, opts.t_eval, g, t_old, np.minimum(t_new, stop_t), h[a], interp)
    ev = np.flatnonzero(np.isfinite(stop_t))
    if ev.size:   # located events stop the trajectory
        ye = interp(ev, (stop_t[ev] - t_old[ev]) / h[a][ev])
        for q, (r, k, te) in enumerate(zip(ev, kind[ev], stop_t[ev])):
            name = "steady" if k == 1 else "rank_collapse"
            rec.stop(g[r], Status.STEADY if k == 1 else Status.RANK_COLLAPSE,
                     f"terminal event {name!r} at t = {te:.10g}", te, ye[q].reshape(d, d))
        done[a[ev]] = True
    # blow-up: tr(Sigma) past limit * tr0 at the step end
    trn = np.sum(Ln * Ln, axis=(1, 2))
    over = np.flatnonzero(~done[a] & (trn > act.limit[a] * run.tr0[g]))
    if over.size:
        done[a[_blowup_looks(rec, act, a, over, t_new, Ln, dLn, field, run.suspected)]] = True
    # advance the accepted rows that go on
    act.t[a], act.tau[a], act.y[a], act.f[a] = t_new, tau_new, y_new[a], f_new
    if over.size:   # a blow-up look restarts the clock of the rows that go on
        act.base[a[over]], act.tau[a[over]] = t_new[over], 0.0
    ros.accepted(a)
    look = ~done[a] & (rec.nsteps[g] % REFACTOR_EVERY == 0)
    _refactor_rows(act, a[look], d, ros, opts.atol, opts.rtol)
    end = ~done[a] & (t_new >= t1)
    if end.any():
        rec.L_final[g[end]] = Ln[end]
        done[a[end]] = True


def _integrate(field, cov0s, opts, method):
    """The loop of :func:`solve_batch`: attempt, control, events, output, compact."""
    nb, d = cov0s.shape[0], cov0s.shape[-1]
    t1, max_step, max_nfev = opts.t1, opts.max_step, opts.max_nfev
    rec, act, dop, ros, events = _start(field, cov0s, opts, method)
    nfev = rec.nfev
    # what the accepted rows share; suspected: a finite-time estimate (t*, t) awaiting
    # confirmation further up, as in solve
    run = types.SimpleNamespace(
        field=field, rec=rec, ros=ros, events=events, opts=opts, d=d,
        tr0=np.maximum(np.trace(cov0s, axis1=1, axis2=2), np.finfo(float).tiny),
        suspected=[None] * nb)
    while act.idx.size:
        m = act.idx.size
        # each row runs on its own clock tau = t - base, restarted at every blow-up look
        # (as solve restarts there): near a blow-up at t* the steps that resolve the time
        # t* - t left fall far below the rounding of t, not of tau
        min_step = 10 * np.abs(np.nextafter(act.tau, np.inf) - act.tau)
        act.h_abs = np.clip(act.h_abs, min_step, max_step)
        h = np.minimum(act.h_abs, (t1 - act.base) - act.tau)
        any_explicit = not act.implicit.all()
        y_new, err, step = _attempt(act, h, dop, ros)
        acc = _control(act, err, dop, ros)
        done = np.zeros(m, dtype=bool)
        # (a NaN step size, from a rate that overflowed, counts as too small too)
        too_small = ~acc & ~(act.h_abs >= min_step)
        if too_small.any():
            overflow = ~np.isfinite(y_new).all(axis=1)
            for r in np.flatnonzero(too_small):
                msg = ("step size too small (required step below rounding)"
                       + ("; the trial states leave the floating-point range (overflow)"
                          if overflow[r] else ""))
                rec.stop(act.idx[r], Status.FAILED, msg, act.t[r], act.y[r].reshape(d, d))
            done |= too_small
        a = np.flatnonzero(acc)
        if a.size:
            _accepted_rows(run, act, a, h, y_new, step, done)
        if method == "auto" and any_explicit:
            _stiffness(act, acc, dop.hlamb, rec, ros)
        if max_nfev is not None:
            over_n = ~done & (nfev[act.idx] > max_nfev)
            for r in np.flatnonzero(over_n):
                rec.stop(act.idx[r], Status.FAILED,
                         f"gave up after {max_nfev} right-hand-side evaluations near "
                         f"t = {act.t[r]:.10g} (stiff or nearly singular dynamics)",
                         act.t[r], act.y[r].reshape(d, d))
            done |= over_n
        if done.any():
            keep = ~done
            act.compact(keep)
            ros.compact(keep)
            field.set_active(act.idx)
    rec.note_rank(cov0s)
    return rec.result(opts.t_eval, field.calls)
