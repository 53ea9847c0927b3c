r"""``method="auto"`` of the event loop: explicit steps until the run turns stiff.

The event loop (:func:`gaussian_pde.integrate._solve.integrate_system`) runs
:func:`gaussian_pde.solve`'s ``"auto"`` where the compiled engine does not (user events,
``first_step``, a field without a compiled kernel: a mixture, a closure of a type
without one). A run starts with DOP853 (Hairer's Fortran code where ``gaussian_pde.integrate._scipy_loop``
can use it, SciPy's Python DOP853 otherwise) and applies Hairer's stiffness test after
every accepted step: :math:`h|\lambda| > 6.1` on 15 accepted steps, the count reset by
6 non-stiff steps in a row, with :math:`|\lambda|` estimated from the last two stages
(``dop853.f``; the same test as :func:`gaussian_pde.integrate._batch.solve_batch`'s
``"auto"``). On the Fortran path, where that estimate can hover at the threshold for
hundreds of stability-limited steps, frequent rejected steps (5 among 20 accepted ones)
also count when the exact Jacobian confirms them (:math:`h\rho(J) \ge 2`; a fast growth
such as a blow-up rejects as often with :math:`h\rho(J) \approx 0.1`). When the run is
found stiff, the same trajectory continues from the last accepted step with
:data:`STIFF_SOLVER` (LSODA) given the exact Jacobian of the factor form (and of the
mean) when every head is softmax or L2, and LSODA's own finite differences otherwise
(Sinkhorn). Events are those of the step loop, so blow-up, steady state, rank collapse
and user events behave exactly as with any other method.

On the Fortran path with an exact Jacobian the hand-over has two stages
(:func:`gaussian_pde.integrate._scipy_loop.integrate_fortran`). The first sign of stiffness
turns on Hairer's stabilised step-size control (``BETA = 0.08``), which removes most
rejections of a mildly stability-limited run; the second hands over to LSODA on trial
(:func:`gaussian_pde.integrate._scipy_loop.stiff_trial`): LSODA stays once its cost per unit
time (evaluations, plus about 6 evaluations of overhead a step and 12 a Jacobian) falls
below DOP853's before the switch, scaled by the stiffness :math:`-\min\operatorname{Re}
\lambda(J)`, within 200 steps; otherwise DOP853 resumes, its tests held back for 50
accepted steps (twice as many after every lost trial). The stabilised control can hold a
run just inside its stability bound (:math:`h\rho(J)` of 3 to 5) with hardly a
rejection, below Hairer's threshold, where neither test fires and DOP853 crawls: every
200 accepted steps (twice as many after every lost trial) the stabilised run therefore
looks at :math:`h\rho(J) \ge 2` itself, and goes to LSODA on trial where it holds (three
settings of the seeded invariant loop went from ``failed``, their 50,000 evaluations
spent, to LSODA's own verdict). On seed 5 of
``benchmarks/bench_solve.py`` (a tail where LSODA needed 750 evaluations in 347 steps and
DOP853 with the stabilised control about 550) the run stays explicit: 1,521 evaluations
(1,855 when that tail went to LSODA; the stabilised restart begins with the last
accepted step).

Why LSODA: on the stiff tail of the paper's steady-state workload (``K = -Q``, the
covariance approaching a rank-deficient limit like :math:`1/t` while the surviving
directions relax fast) at the default ``rtol = 1e-10``, explicit steps are
stability-limited to :math:`h \approx 0.003\,t`-:math:`0.012\,t`, and order matters
as much as stability. On seed 9 of ``benchmarks/bench_solve.py`` from t = 3 to 1712,
DOP853 needs 23700 evaluations, SciPy's Radau 1092 steps (7700 evaluations), LSODA's
BDF (orders up to 5, about 1.3 evaluations a step, a Jacobian every 20 steps) 845 steps
(1070 evaluations); ``solve_batch``'s RODAS4 (order 4) takes about 3000 steps for the
whole run. An LSODA step costs about half a DOP853 step here (its own work and the
step loop's, more than the evaluations), so switching earlier than the stiffness test
does not pay.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.integrate import DOP853, LSODA

from ._compiled_batch import _NONSTIFF_RESET, _STIFF_HLAMB, _STIFF_STEPS
from ._tableaux import DOP853 as _dop

__all__ = ["STIFF_SOLVER", "StiffnessDOP853"]

#: the solver a run continues with once it is found stiff
STIFF_SOLVER = LSODA

_NS = _dop.N_STAGES
#: weights of the last stage (``c = 1``): ``y_last = y + h A[NS-1] K``
_A_LAST = np.ascontiguousarray(_dop.A[_NS - 1, :_NS - 1])


class StiffnessDOP853(DOP853):
    r"""SciPy's DOP853 (same steps) with Hairer's stiffness test after every accepted step.

    :attr:`stiff` turns ``True`` once :math:`h|\lambda| > 6.1` held on 15 accepted steps
    without 6 non-stiff steps in a row; :math:`h|\lambda| =
    h\|f(y_{n+1}) - f(y_{\text{last}})\| / \|y_{n+1} - y_{\text{last}}\|` with
    :math:`y_{\text{last}}` the state of the last stage (``c = 1``), as in ``dop853.f``.
    The test costs one small product per step and no evaluation.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stiff = False
        self.hlamb = 0.0
        self._iasti = 0
        self._nonsti = 0

    def _step_impl(self):
        t_old, y_old = self.t, self.y
        ok, msg = super()._step_impl()
        if ok and not self.stiff:
            h = self.t - t_old
            K = self.K
            dy = self.y - y_old - h * _A_LAST.dot(K[:_NS - 1])
            df = K[_NS] - K[_NS - 1]
            den = float(dy.dot(dy))
            self.hlamb = abs(h) * math.sqrt(float(df.dot(df)) / den) if den > 0 else 0.0
            if self.hlamb > _STIFF_HLAMB:
                self._nonsti = 0
                self._iasti += 1
                self.stiff = self._iasti >= _STIFF_STEPS
            else:
                self._nonsti += 1
                if self._nonsti >= _NONSTIFF_RESET:
                    self._iasti = 0
        return ok, msg

