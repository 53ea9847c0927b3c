r"""The classical fourth-order Runge-Kutta step, written once for every fixed-step loop.

For :math:`y' = f(t, y)` and a step :math:`h`,

.. math::

    k_1 = f(t, y),\quad k_2 = f(t + h/2,\ y + (h/2)k_1),\quad
    k_3 = f(t + h/2,\ y + (h/2)k_2),\quad k_4 = f(t + h,\ y + hk_3),

    y_{new} = y + \frac{h}{6}(k_1 + 2k_2 + 2k_3 + k_4).

The particle simulator's ``method="rk4"``, the continuous mode of the depth stacks, and
the cluster and trust studies' particle clouds all take their steps here, so they round
alike: the stage offsets are formed as ``(c h) k`` with the nodes ``c = 1/2, 1/2, 1``
(``h/2`` and ``0.5 h`` are the same floating-point number).
"""

from __future__ import annotations

import contextlib

import numpy as np

__all__ = ["rk4_step", "rk4_march", "equal_steps"]

#: the nodes of the stages after the first (the Butcher tableau's c_2, c_3, c_4)
_NODES = (0.5, 0.5, 1.0)


def _finite(*arrays):
    return all(np.all(np.isfinite(a)) for a in arrays)


def rk4_step(fun, t, y, h, *, finite=False):
    r"""One classical RK4 step of :math:`y' = f(t, y)` (module docstring).

    Parameters
    ----------
    fun : callable
        ``fun(t, y)``, the right-hand side, an array of the shape of ``y``.
    t : float
        Time at the start of the step.
    y : ndarray
        State at ``t``.
    h : float
        Step.
    finite : bool
        Guard the right-hand side: return None, without calling ``fun`` again, once a
        slope or a stage state is not finite, and None when the new state is not finite
        (overflow in the last combination is not warned about then).

    Returns
    -------
    ndarray or None
        The state at ``t + h``.
    """
    k = fun(t, y)
    ks = [k]
    for c in _NODES:
        ys = y + (c * h) * k
        if finite and not _finite(k, ys):
            return None
        k = fun(t + c * h, ys)
        ks.append(k)
    quiet = np.errstate(over="ignore", invalid="ignore") if finite else contextlib.nullcontext()
    with quiet:
        y_new = y + h / 6 * (ks[0] + 2 * ks[1] + 2 * ks[2] + ks[3])
    if finite and not _finite(y_new):
        return None
    return y_new


def equal_steps(span, h_max, slack=1e-12):
    """``(m, h)``: the fewest equal steps ``h = span / m`` no longer than ``h_max`` (``m >= 1``).

    ``slack`` forgives a ratio ``span / h_max`` that rounding lifted just above a whole
    number.
    """
    m = max(1, int(np.ceil(span / h_max - slack)))
    return m, span / m


def rk4_march(fun, y, t_eval, h_max):
    """RK4 with equal steps of at most ``h_max`` between consecutive times of ``t_eval``.

    Parameters
    ----------
    fun : callable
        ``fun(t, y)``.
    y : ndarray
        State at ``t_eval[0]``.
    t_eval : sequence of float
        Increasing output times.
    h_max : float
        Largest step.

    Returns
    -------
    list of ndarray
        The states at the times of ``t_eval`` (the first is ``y``).
    """
    out = [y]
    for a, b in zip(t_eval[:-1], t_eval[1:]):
        m, h = equal_steps(b - a, h_max)
        t = a
        for _ in range(m):
            y = rk4_step(fun, t, y, h)
            t = t + h
        out.append(y)
    return out
