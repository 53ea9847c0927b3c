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
covariance only (no mean); the blow-up time is estimated at the end of the step that
passed the threshold instead of at the located crossing; steady-state and rank-collapse
events are located by bisection on the dense output to ``2**-30`` of the step.
"""

# The event helpers defined inside the integration loop are called within the same
# iteration only, so binding the loop variables late is intended:
# ruff: noqa: B023

from __future__ import annotations

import warnings

import numpy as np

from .._common.linalg import psd_sqrt
from .._common.validation import validate_array, validate_covariance
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
from ._results import BatchSolution, Status
from ._steppers import MIN_FACTOR, SAFETY, DOP853Stepper, MixedStep, RosenbrockStepper, rms

__all__ = ["solve_batch"]

#: bisection steps that locate a steady-state or rank-collapse crossing within a step
_BISECT = 30

_METHODS = ("auto", "DOP853", "rosenbrock")
#: Hairer's DOP853 stiffness test: h |lambda| above this on _STIFF_STEPS accepted steps
#: (a run of _NONSTIFF_RESET non-stiff steps resets the count) switches a row to RODAS4
_STIFF_HLAMB, _STIFF_STEPS, _NONSTIFF_RESET = 6.1, 15, 6


def solve_batch(attentions_or_weights, cov0s, t_span, *, t_eval=None, rtol=1e-10, atol=1e-12,
                blowup_threshold=1e8, steady_tol=None, steady_atol=0.0, rank_tol=None,
                max_step=np.inf, max_nfev=100_000, method="auto"):
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
    cov0s = validate_array(cov0s, "cov0s", ndim=None)
    if cov0s.ndim != 3:
        raise ValueError(f"`cov0s` must have shape (B, d, d), got {cov0s.shape}.")
    if cov0s.shape[0] == 0:
        raise ValueError("`cov0s` must not be empty.")
    cov0s = validate_covariance(cov0s, "cov0s", batch=True)
    nb, d = cov0s.shape[0], cov0s.shape[-1]
    field, fd = build_field(attentions_or_weights, nb)
    if fd != d:
        raise ValueError(f"`cov0s` must be {fd} x {fd} to match the attention's dimension, "
                         f"got shape {cov0s.shape}.")
    opts = solver_options(t_span, t_eval=t_eval, rtol=rtol, atol=atol, max_step=max_step,
                          max_nfev=max_nfev, blowup_threshold=blowup_threshold,
                          steady_tol=steady_tol, steady_atol=steady_atol, rank_tol=rank_tol)
    t0, t1, t_eval, rtol, atol = opts.t0, opts.t1, opts.t_eval, opts.rtol, opts.atol
    max_step, max_nfev = opts.max_step, opts.max_nfev
    ev_opts = opts.events
    blowup_threshold, rank_tol = ev_opts.blowup_threshold, ev_opts.rank_tol
    steady_on = ev_opts.steady_on
    if not (isinstance(method, str) and method in _METHODS):
        raise ValueError("`method` must be 'auto', 'DOP853' or 'rosenbrock', "
                         f"got {method!r}.")

    n = d * d
    # outputs
    status = np.full(nb, Status.FINISHED, dtype=object)
    message = ["reached the end of t_span"] * nb
    t_final = np.full(nb, t1)
    L_final = np.empty((nb, d, d))
    t_blowup = np.full(nb, np.nan)
    nfev = np.zeros(nb, dtype=int)
    nsteps = np.zeros(nb, dtype=int)
    stiff_final = np.full(nb, method == "rosenbrock")
    cov_out = None
    if t_eval is not None:
        cov_out = np.full((nb, t_eval.size, d, d), np.nan)

    # state of the active rows
    idx = np.arange(nb)
    field.set_active(idx)
    L0 = psd_sqrt(cov0s)
    y = L0.reshape(nb, n).copy()
    tr0 = np.maximum(np.trace(cov0s, axis1=1, axis2=2), np.finfo(float).tiny)
    t = np.full(nb, t0)
    limit = np.full(nb, blowup_threshold)
    # a finite-time estimate (t*, t) awaiting confirmation further up, as in solve
    suspected = [None] * nb
    rejected = np.zeros(nb, dtype=bool)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        f = field(y.reshape(nb, d, d)).reshape(nb, n)
        nfev += 1
        dop = DOP853Stepper(field, d, atol, rtol, nfev)
        ros = RosenbrockStepper(field, d, atol, rtol, nfev)
        implicit = np.full(nb, method == "rosenbrock")   # per active row: RODAS4 steps
        switching = method == "auto"
        iasti = np.zeros(nb, dtype=int)
        nonsti = np.zeros(nb, dtype=int)
        if t_eval is not None:
            at0 = t_eval == t0
            if at0.any():
                cov_out[:, at0] = cov0s[:, None]

        def steady_g(L, dL):
            return steady_gap(*cov_rate(L, dL), ev_opts.steady_tol, ev_opts.steady_atol)

        first = None if rank_tol is None else rank_first(cov0s, rank_tol)  # == d: off

        def rank_g(L, rows):
            return rank_gap(L @ np.swapaxes(L, -1, -2), first[rows], rank_tol)

        g_steady = steady_g(y.reshape(nb, d, d), f.reshape(nb, d, d)) if steady_on else None
        g_rank = rank_g(y.reshape(nb, d, d), idx) if rank_tol is not None else None

        # initial step (Hairer, Norsett and Wanner II.4, as SciPy's select_initial_step)
        scale = atol + np.abs(y) * rtol
        d0, d1 = rms(y / scale), rms(f / scale)
        h0 = np.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / np.maximum(d1, 1e-300))
        h0 = np.minimum(h0, t1 - t0)
        f1 = field(y.reshape(nb, d, d) + h0[:, None, None] * f.reshape(nb, d, d)).reshape(nb, n)
        nfev += 1
        d2 = rms((f1 - f) / scale) / h0
        h1 = np.where((d1 <= 1e-15) & (d2 <= 1e-15), np.maximum(1e-6, h0 * 1e-3),
                      (0.01 / np.maximum(np.maximum(d1, d2), 1e-300))
                      ** -np.where(implicit, ros.err_exp, dop.err_exp))
        h_abs = np.minimum.reduce([100 * h0, h1, np.full(nb, t1 - t0), np.full(nb, max_step)])

        while idx.size:
            m = idx.size
            min_step = 10 * np.abs(np.nextafter(t, np.inf) - t)
            h_abs = np.clip(h_abs, min_step, max_step)
            h = np.minimum(h_abs, t1 - t)
            # one attempted step for every active row: DOP853 or RODAS4 by row
            ros.n_active = m
            parts = []
            y_new, err = np.empty_like(y), np.empty(m)
            explicit_rows = np.flatnonzero(~implicit)
            for stepper, rows in ((dop, explicit_rows), (ros, np.flatnonzero(implicit))):
                if rows.size == m:
                    y_new, err, st = stepper.attempt(idx, y, f, h, None if stepper is dop
                                                     else rows)
                elif rows.size:
                    y_new[rows], err[rows], st = stepper.attempt(idx[rows], y[rows], f[rows],
                                                                 h[rows], rows)
                else:
                    continue
                parts.append((rows, st))
            step = parts[0][1] if len(parts) == 1 else MixedStep(parts, m)
            err_exp = np.where(implicit, ros.err_exp, dop.err_exp)
            max_factor = np.where(implicit, ros.max_factor, dop.max_factor)
            err = np.where(np.isfinite(err), err, np.inf)
            acc = err < 1
            fac = np.where(err == 0, max_factor,
                           np.minimum(max_factor, SAFETY * np.where(err > 0, err, 1.0) ** err_exp))
            fac_acc = np.where(rejected, np.minimum(1.0, fac), fac)
            fac_rej = np.maximum(MIN_FACTOR, SAFETY * np.where(np.isfinite(err) & (err > 0),
                                                                  err, 1e300) ** err_exp)
            h_abs = np.where(acc, h_abs * fac_acc, h_abs * fac_rej)
            rejected = ~acc
            done = np.zeros(m, dtype=bool)
            too_small = ~acc & (h_abs < min_step)
            if too_small.any():
                for r in np.flatnonzero(too_small):
                    status[idx[r]] = Status.FAILED
                    message[idx[r]] = "step size too small (required step below rounding)"
                t_final[idx[too_small]] = t[too_small]
                L_final[idx[too_small]] = y[too_small].reshape(-1, d, d)
                done |= too_small

            a = np.flatnonzero(acc)
            if a.size:
                t_old, y_old, f_old = t[a], y[a], f[a]
                t_new = t_old + h[a]
                t_new = np.where(t1 - t_new < 4 * np.abs(np.nextafter(t1, np.inf) - t1),
                                 t1, t_new)
                f_new_a = step.rate(a)
                Ln = y_new[a].reshape(-1, d, d)
                dLn = f_new_a.reshape(-1, d, d)
                nsteps[idx[a]] += 1
                stop_t = np.full(a.size, np.inf)        # located event time within the step
                stop_kind = np.zeros(a.size, dtype=int)  # 1 steady, 2 rank
                interp = step.dense(a, y_old, f_old)

                def locate(sel, gfun):
                    """Bisection for the downward crossing of ``gfun`` within the step."""
                    lo, hi = np.zeros(sel.size), np.ones(sel.size)
                    for _ in range(_BISECT):
                        mid = 0.5 * (lo + hi)
                        ym = interp(sel, mid)
                        g = gfun(ym, sel)
                        nfev[idx[a[sel]]] += 1
                        lo, hi = np.where(g > 0, mid, lo), np.where(g > 0, hi, mid)
                    return hi

                if steady_on:
                    g_new = steady_g(Ln, dLn)
                    fired = np.flatnonzero((g_steady[idx[a]] > 0) & (g_new <= 0))
                    if fired.size:
                        def gs(ym, sel):
                            Lm = ym.reshape(-1, d, d)
                            return steady_g(Lm, field.at(idx[a[sel]], Lm))
                        x = locate(fired, gs)
                        stop_t[fired] = t_old[fired] + x * h[a][fired]
                        stop_kind[fired] = 1
                    g_steady[idx[a]] = g_new
                if rank_tol is not None:
                    g_new = rank_g(Ln, idx[a])
                    fired = np.flatnonzero((g_rank[idx[a]] > 0) & (g_new <= 0) & (first[idx[a]] < d))
                    if fired.size:
                        x = locate(fired, lambda ym, sel: rank_g(ym.reshape(-1, d, d),
                                                                 idx[a[sel]]))
                        tr_ = t_old[fired] + x * h[a][fired]
                        earlier = tr_ < stop_t[fired]
                        stop_t[fired[earlier]] = tr_[earlier]
                        stop_kind[fired[earlier]] = 2
                    g_rank[idx[a]] = g_new
                # output at t_eval up to the stop time
                if t_eval is not None:
                    t_end = np.minimum(t_new, stop_t)
                    lo_i = np.searchsorted(t_eval, t_old, side="right")
                    hi_i = np.searchsorted(t_eval, t_end, side="right")
                    cnt = hi_i - lo_i
                    if cnt.any():
                        sel = np.repeat(np.arange(a.size), cnt)
                        j = np.concatenate([np.arange(p, q) for p, q in zip(lo_i, hi_i) if q > p])
                        x = (t_eval[j] - t_old[sel]) / h[a][sel]
                        ys = interp(sel, x)
                        Ls = ys.reshape(-1, d, d)
                        cov_out[idx[a[sel]], j] = Ls @ np.swapaxes(Ls, -1, -2)
                # located events stop the trajectory
                ev = np.flatnonzero(np.isfinite(stop_t))
                if ev.size:
                    x = (stop_t[ev] - t_old[ev]) / h[a][ev]
                    ye = interp(ev, x)
                    for r, kind, te in zip(ev, stop_kind[ev], stop_t[ev]):
                        g = idx[a[r]]
                        name = "steady" if kind == 1 else "rank_collapse"
                        status[g] = Status.STEADY if kind == 1 else Status.RANK_COLLAPSE
                        message[g] = f"terminal event {name!r} at t = {te:.10g}"
                    t_final[idx[a[ev]]] = stop_t[ev]
                    L_final[idx[a[ev]]] = ye.reshape(-1, d, d)
                    done[a[ev]] = True
                # blow-up: tr(Sigma) past limit * tr0 at the step end
                live = ~done[a]
                trn = np.sum(Ln * Ln, axis=(1, 2))
                over = np.flatnonzero(live & (trn > limit[a] * tr0[idx[a]]))
                if over.size:
                    rows = idx[a[over]]
                    Lb, dLb = Ln[over], dLn[over]
                    cov, dcov = cov_rate(Lb, dLb)
                    tr_, dtr = np.trace(cov, axis1=1, axis2=2), np.trace(dcov, axis1=1, axis2=2)
                    hh = blowup_probe_step(tr_, dtr)
                    L2 = Lb + hh[:, None, None] * dLb
                    cov2, dcov2 = cov_rate(L2, field.at(rows, L2))
                    nfev[rows] += 1
                    tstar, finite = blowup_extrapolate(
                        t_new[over], tr_, dtr, np.trace(cov2, axis1=1, axis2=2),
                        np.trace(dcov2, axis1=1, axis2=2), hh)
                    for q, r in enumerate(over):
                        g = rows[q]
                        verdict, detail = blowup_verdict(tstar[q], finite[q], t_new[r],
                                                          limit[a[r]], suspected[g])
                        if verdict is None:   # follow it further
                            suspected[g], limit[a[r]] = detail
                            continue
                        status[g], message[g] = verdict, detail
                        if verdict == Status.BLOWUP:
                            t_blowup[g] = tstar[q]
                        t_final[g] = t_new[r]
                        L_final[g] = Ln[r]
                        done[a[r]] = True
                # advance the accepted rows that go on
                t[a], y[a], f[a] = t_new, y_new[a], f_new_a
                ros.accepted(a)
                end = ~done[a] & (t_new >= t1)
                if end.any():
                    L_final[idx[a[end]]] = Ln[end]
                    done[a[end]] = True
            if switching and explicit_rows.size:
                # Hairer's stiffness detection on the accepted DOP853 steps
                hl = np.zeros(m)
                hl[explicit_rows] = dop.hlamb
                ok = acc & ~implicit
                stiff_step = ok & (hl > _STIFF_HLAMB)
                iasti = np.where(stiff_step, iasti + 1, iasti)
                nonsti = np.where(stiff_step, 0, np.where(ok, nonsti + 1, nonsti))
                iasti = np.where(nonsti >= _NONSTIFF_RESET, 0, iasti)
                to_implicit = iasti >= _STIFF_STEPS
                if to_implicit.any():
                    implicit = implicit | to_implicit
                    stiff_final[idx[to_implicit]] = True
                    if ros.fresh is not None:
                        ros.fresh[to_implicit] = False
            if max_nfev is not None:
                over_n = ~done & (nfev[idx] > max_nfev)
                for r in np.flatnonzero(over_n):
                    status[idx[r]] = Status.FAILED
                    message[idx[r]] = (f"gave up after {max_nfev} right-hand-side evaluations "
                                       f"near t = {t[r]:.10g} (stiff or nearly singular "
                                       "dynamics)")
                t_final[idx[over_n]] = t[over_n]
                L_final[idx[over_n]] = y[over_n].reshape(-1, d, d)
                done |= over_n
            if done.any():
                keep = ~done
                idx, t, y, f = idx[keep], t[keep], y[keep], f[keep]
                h_abs, rejected, limit = h_abs[keep], rejected[keep], limit[keep]
                implicit, iasti, nonsti = implicit[keep], iasti[keep], nonsti[keep]
                ros.compact(keep)
                field.set_active(idx)

    cov_final = L_final @ np.swapaxes(L_final, -1, -2)
    return BatchSolution(t=t_eval, cov=cov_out, t_final=t_final, cov_final=cov_final,
                         factor_final=L_final, status=status, t_blowup=t_blowup,
                         message=message, nfev=nfev, nsteps=nsteps, ncalls=field.calls,
                         implicit=stiff_final)
