"""One validation of solver options, shared by every solver of the package.

Every check raises ``TypeError`` or ``ValueError`` naming the argument and what was
expected, before any work is done: a NaN or negative step would otherwise surface as
an error deep inside a solve.
"""

from __future__ import annotations

import dataclasses
import numbers
import types

import numpy as np
from scipy.integrate import BDF, DOP853, LSODA, RK23, RK45, OdeSolver, Radau

from .._common.validation import (
    validate_int,
    validate_positive,
    validate_t_eval,
    validate_t_span,
    validate_tolerance,
)
from ._events import EventOptions, event_options

__all__ = ["SolverOptions", "solver_options", "run_options", "validate_method",
           "validate_user_events", "METHODS"]

#: the solver classes of :func:`scipy.integrate.solve_ivp` by the names it accepts for
#: ``method`` (its documented list; read only)
METHODS = types.MappingProxyType({"RK23": RK23, "RK45": RK45, "DOP853": DOP853,
                                  "Radau": Radau, "BDF": BDF, "LSODA": LSODA})


@dataclasses.dataclass(frozen=True)
class SolverOptions:
    """Validated options of one integration.

    Attributes
    ----------
    t0, t1 : float
        The interval.
    t_eval : ndarray or None
        Output times within it, increasing.
    rtol, atol : float
        Tolerances in solver units.
    max_step : float
        Positive; ``inf`` for no limit.
    first_step : float or None
        Positive and at most ``t1 - t0``.
    max_nfev : int or None
        The right-hand-side evaluation budget.
    events : EventOptions
        Blow-up, steady-state and rank-collapse settings.
    """

    t0: float
    t1: float
    t_eval: np.ndarray | None
    rtol: float
    atol: float
    max_step: float
    first_step: float | None
    max_nfev: int | None
    events: EventOptions


def _validate_max_step(max_step):
    if isinstance(max_step, bool) or not isinstance(max_step, numbers.Real):
        raise TypeError(f"`max_step` must be a real number, got {type(max_step).__name__}.")
    max_step = float(max_step)
    if not max_step > 0:     # also rejects NaN
        raise ValueError(f"`max_step` must be positive (np.inf for no limit), got {max_step!r}.")
    return max_step


def solver_options(t_span, *, t_eval=None, rtol=1e-10, atol=1e-12, max_step=np.inf,
                   first_step=None, max_nfev=100_000, blowup_threshold=1e8, steady_tol=None,
                   steady_atol=0.0, rank_tol=None):
    """Checked :class:`SolverOptions`; the arguments are those of :func:`gaussian_pde.solve`."""
    t0, t1 = validate_t_span(t_span)
    t_eval = validate_t_eval(t_eval, t0, t1)
    rtol = validate_tolerance(rtol, "rtol")
    atol = validate_positive(atol, "atol")
    max_step = _validate_max_step(max_step)
    if first_step is not None:
        first_step = validate_positive(first_step, "first_step")
        if first_step > t1 - t0:
            raise ValueError(f"`first_step` must not exceed the length of `t_span`, "
                             f"{t1 - t0!r}; got {first_step!r}.")
    if max_nfev is not None:
        max_nfev = validate_int(max_nfev, "max_nfev", minimum=1)
        # every step costs at least one evaluation: a run that cannot reach t1 within the
        # budget would only burn it (for minutes) before failing
        if (t1 - t0) / max_step > max_nfev:
            raise ValueError(f"`max_step` = {max_step!r} needs at least "
                             f"{(t1 - t0) / max_step:.3g} steps over `t_span`, more than "
                             f"`max_nfev` = {max_nfev} right-hand-side evaluations allow.")
    events = event_options(blowup_threshold, steady_tol, steady_atol, rank_tol)
    return SolverOptions(float(t0), float(t1), t_eval, rtol, atol, max_step, first_step,
                         max_nfev, events)


def validate_method(method, extra=()):
    """A :func:`scipy.integrate.solve_ivp` method name or class, or one of ``extra``."""
    if isinstance(method, str):
        if method not in METHODS and method not in extra:
            names = sorted(METHODS) + list(extra)
            raise ValueError(f"`method` must be one of {names} or an OdeSolver subclass, "
                             f"got {method!r}.")
        return method
    if isinstance(method, type) and issubclass(method, OdeSolver):
        return method
    raise TypeError(f"`method` must be a string or an OdeSolver subclass, got {method!r}.")


def validate_user_events(events):
    """``events`` as a tuple of callables (one callable is accepted alone)."""
    if callable(events):
        events = (events,)
    try:
        events = tuple(events)
    except TypeError:
        raise TypeError("`events` must be a callable or a sequence of callables.") from None
    for i, ev in enumerate(events):
        if not callable(ev):
            raise TypeError(f"`events[{i}]` must be callable as event(t, mean, cov).")
    return events


def run_options(t_span, method, events, **options):
    """``(SolverOptions, method, events)``, checked: what every closure solver validates.

    ``options`` are the keyword arguments of :func:`solver_options`.
    """
    return (solver_options(t_span, **options), validate_method(method),
            validate_user_events(events))
