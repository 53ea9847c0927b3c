"""Results and statuses: what every solver of the package returns.

:class:`Status` is the one vocabulary of how an integration ended; every result type of
the package carries a ``status``, a ``message`` and ``success``.
"""

from __future__ import annotations

import dataclasses
import enum

import numpy as np

from .._common.linalg import psd_sqrt
from .._common.validation import validate_int

__all__ = ["Status", "MomentSolution", "BatchSolution", "Run"]


class Status(str, enum.Enum):
    """How an integration ended (compares equal to its string value).

    One vocabulary for every solver of the package (moment ODEs, batches, closures, depth
    stacks, particles); docs/math.md section 10 defines each:

    * ``FINISHED``: reached the end of ``t_span`` (or of the layers);
    * ``BLOWUP``: a finite-time blow-up, confirmed; ``t_blowup`` holds its time;
    * ``STEADY``: the steady-state event fired;
    * ``RANK_COLLAPSE``: the rank-collapse event fired;
    * ``EVENT``: a user's terminal event fired;
    * ``FAILED``: the solver gave up (step size, evaluation budget, growth without a
      finite-time signature, non-finite state); ``message`` says why.
    """

    FINISHED = "finished"
    BLOWUP = "blowup"
    STEADY = "steady"
    RANK_COLLAPSE = "rank_collapse"
    EVENT = "event"
    FAILED = "failed"

    def __str__(self):
        return self.value

    @property
    def success(self) -> bool:
        """``False`` only for ``FAILED``."""
        return self is not Status.FAILED


@dataclasses.dataclass(frozen=True)
class MomentSolution:
    """Result of :func:`solve`.

    Attributes
    ----------
    t : ndarray, shape (T,)
        Output times (``t_eval`` up to the stopping time, or the solver's steps).
    mean : ndarray, shape (T, d) or None
        Means; ``None`` in covariance-only mode (``mean0=None``).
    cov : ndarray, shape (T, d, d)
        Covariances, symmetric PSD with the rank of ``cov0``.
    factor : ndarray, shape (T, d, d)
        Factors ``L`` with ``cov = L L^T``.
    status : Status
        How the run ended (:class:`Status`).
    message : str
        Human-readable reason.
    t_blowup : float or None
        Estimated finite-time blow-up time.
    t_final, mean_final, cov_final
        Time and state where the integration stopped (an event time need not be in ``t``).
    t_events : dict
        Times of every event, by name (``"blowup"``, ``"steady"``, ``"rank_collapse"``,
        and the user's events by their ``__name__``).
    nfev : int
        Number of right-hand-side evaluations.
    """

    t: np.ndarray
    mean: np.ndarray | None
    cov: np.ndarray
    factor: np.ndarray
    status: Status
    message: str
    t_blowup: float | None
    t_final: float
    mean_final: np.ndarray | None
    cov_final: np.ndarray
    t_events: dict
    nfev: int

    @property
    def success(self) -> bool:
        """``False`` only when the solver failed."""
        return Status(self.status).success


@dataclasses.dataclass(frozen=True)
class BatchSolution:
    """Result of :func:`solve_batch`; ``B`` trajectories.

    Attributes
    ----------
    t : ndarray, shape (T,), or None
        ``t_eval``.
    cov : ndarray, shape (B, T, d, d), or None
        Covariances at ``t``; NaN after a trajectory stopped.
    t_final : ndarray, shape (B,)
        Where each trajectory stopped.
    cov_final, factor_final : ndarray, shape (B, d, d)
        Final covariance and factor (``cov = L L^T``).
    status : ndarray of Status, shape (B,)
        As :attr:`gaussian_pde.MomentSolution.status`.
    t_blowup : ndarray, shape (B,)
        Estimated blow-up time; NaN where there is none.
    message : list of str
        Per trajectory.
    nfev : ndarray of int, shape (B,)
        Right-hand-side evaluations per trajectory.
    nsteps : ndarray of int, shape (B,)
        Accepted steps per trajectory.
    ncalls : int
        Calls of the compiled integrator for the whole batch: 1, or one for every pair
        of kernels among the attentions' compiled fields.
    implicit : ndarray of bool, shape (B,)
        Where the trajectory ended on Rosenbrock (RODAS4P2) steps: every trajectory with
        ``method="rosenbrock"``, those found stiff with ``method="auto"``.
    mean : ndarray, shape (B, T, d), or None
        Means at ``t`` (NaN after a trajectory stopped); ``None`` without ``mean0s``.
    mean_final : ndarray, shape (B, d), or None
        Final means; ``None`` without ``mean0s``.
    path : str
        Which integrator ran: ``"compiled"``, the compiled batch integrator
        (:mod:`gaussian_pde.integrate._compiled_engine`), the only one.
    """

    t: np.ndarray | None
    cov: np.ndarray | None
    t_final: np.ndarray
    cov_final: np.ndarray
    factor_final: np.ndarray
    status: np.ndarray
    t_blowup: np.ndarray
    message: list
    nfev: np.ndarray
    nsteps: np.ndarray
    ncalls: int
    implicit: np.ndarray | None = None
    mean: np.ndarray | None = None
    mean_final: np.ndarray | None = None
    path: str = "compiled"

    def __len__(self):
        return self.t_final.size

    @property
    def success(self) -> np.ndarray:
        """Per trajectory: ``False`` only where the solver failed."""
        return np.array([Status(s).success for s in self.status], dtype=bool)

    def trajectory(self, i):
        """Trajectory ``i`` as a :class:`gaussian_pde.MomentSolution` (covariance only)."""
        i = validate_int(i, "i")
        if not -len(self) <= i < len(self):
            raise IndexError(f"trajectory index {i} out of range for {len(self)} trajectories.")
        with_mean = self.mean_final is not None
        if self.t is None:
            t = np.array([self.t_final[i]])
            cov = self.cov_final[i][None]
            mean = self.mean_final[i][None] if with_mean else None
        else:
            keep = np.isfinite(self.cov[i, :, 0, 0])
            t, cov = self.t[keep], self.cov[i, keep]
            mean = self.mean[i, keep] if with_mean else None
        tb = None if np.isnan(self.t_blowup[i]) else float(self.t_blowup[i])
        return MomentSolution(
            t=t, mean=mean, cov=cov, factor=psd_sqrt(cov), status=self.status[i],
            message=self.message[i], t_blowup=tb, t_final=float(self.t_final[i]),
            mean_final=self.mean_final[i] if with_mean else None,
            cov_final=self.cov_final[i], t_events={}, nfev=int(self.nfev[i]))


@dataclasses.dataclass
class Run:
    """One trajectory in the solver's state and its verdict.

    What the event loop (:func:`~gaussian_pde.integrate._event_loop.integrate_system`) and the
    engine's single trajectory (:func:`~gaussian_pde.integrate._compiled_engine.integrate_one`)
    return; ``stiff_from``: where the engine's RODAS4P2 took over (None: never);
    ``stiff_stop``: the engine stopped there instead (a plain state whose field has no
    closed-form Jacobian, :func:`~gaussian_pde.integrate.integrate_covariance_state`).
    """

    t: np.ndarray
    y: np.ndarray               # (T, n)
    status: Status
    message: str
    t_blowup: float | None
    t_final: float
    y_final: np.ndarray
    t_events: dict
    nfev: int
    stiff_from: float | None = None
    stiff_stop: bool = False


def overflow_message(t_last, t_next):
    """The message of a run whose state left the floating-point range."""
    return (f"the state left the floating-point range (overflow to inf or NaN) after "
            f"t = {t_last:.10g}, before t = {t_next:.10g}: the covariance or the mean "
            "outgrows float64 there")
