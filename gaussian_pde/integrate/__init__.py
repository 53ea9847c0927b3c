r"""The integration core (docs/math.md section 10): one engine and one event loop.

Below the drivers, one module per concept, with no import back up:

* ``_results``: :class:`Status`, the one vocabulary of how a run ended, and the result
  types;
* ``_events``: the one definition of blow-up (its time and confirmation), steady state
  and rank collapse, used by every solver of the package;
* ``_options``: the one validation of solver options;
* ``_moment_field``: one trajectory's state: its field and exact Jacobian (the type's
  compiled kernels, else its NumPy reference) and the units of its mean;
* ``_steppers``: DOP853 and RODAS4P2 attempts, their dense output, the step-size rule
  and the stiffness tests;
* ``_compiled_engine``: the compiled engine (Numba, parallel over trajectories): a
  trajectory's steps, events and output, for every type whose ``compiled_field()``
  supplies the kernels: all of :func:`solve_batch`, :func:`solve`'s default (one
  trajectory to its end) and the certified limits' plain states (``integrate_states``);
* ``_event_loop``: ``integrate_system``, :func:`scipy.integrate.solve_ivp` with the
  package's events, which :func:`solve`'s other methods and the closure solvers run;
* ``_solve`` and ``_batch``: :func:`solve` and :func:`solve_batch`, their input and
  their paths (and ``integrate_covariance_state``, the engine for a state whose field
  supplies a factor of its covariance: the mixture closure's);
* ``_precompile``: a fresh machine's first run compiles the engine in a second process
  while this one compiles the fields.

Shared with other loops, below this package: the DOP853 and RODAS4P2
coefficients (:mod:`gaussian_pde._common.tableaux`), the differences that replace a
closed-form Jacobian (:mod:`gaussian_pde._common.differences`), the re-factoring
:math:`L \mapsto LW` (:mod:`gaussian_pde._common.factor_rotation`); the closed-form
solutions, the reference problems of the tests, are their own module
(:mod:`gaussian_pde._exact`), re-exported here.
"""

from .._common.tableaux import RODAS4P2
from .._exact import blowup_time, exact_covariance, scalar_solution
from ._batch import solve_batch
from ._compiled_engine import compile_kernels, integrate_states
from ._event_loop import integrate_system
from ._events import (
    blowup_extrapolate,
    blowup_probe_step,
    blowup_signature,
    blowup_verdict,
    event_options,
    rank_first,
    rank_gap,
    steady_gap,
)
from ._options import METHODS, run_options, validate_method
from ._precompile import COMPILE_ASIDE, compile_on_two_cores
from ._results import BatchSolution, MomentSolution, Status
from ._solve import integrate_covariance_state, solve

__all__ = ["METHODS", "BatchSolution", "MomentSolution", "RODAS4P2", "Status", "blowup_time",
           "exact_covariance", "scalar_solution", "solve", "solve_batch",
           # the event loop and its pieces, which the closures and particles share
           "blowup_extrapolate", "blowup_probe_step", "blowup_signature",
           "blowup_verdict", "event_options",
           "integrate_covariance_state", "integrate_states", "integrate_system", "rank_first",
           "rank_gap", "run_options",
           "steady_gap", "validate_method",
           # the compiled kernels, compiled now (before a fork), or on two cores
           "COMPILE_ASIDE", "compile_kernels", "compile_on_two_cores"]
