r"""The start-up time estimate of a sweep: a few tasks timed, the growth in ``d`` fitted.

The time of a setting grows steeply with the dimension (``d x d`` linear algebra in every
step, more steps, and for :math:`K = -Q` the certified limit), while at small ``d`` fixed
costs hide that growth. So the estimate

1. warms up each attention type on one setting at its smallest dimension (Numba compiles
   or loads its kernels there; not timed);
2. times one task per dimension, from the smallest, then at dimensions at least
   ``_PILOT_STEP`` times the last timed one (and the largest), while the predicted time of
   the next one fits the budget (a share of the estimated time, within bounds); a task
   too long for the budget is timed on fewer of its settings (at the smallest dimension,
   one setting is timed first to tell);
3. interpolates log-log between timed dimensions and extrapolates beyond the largest as
   a fixed cost plus a growing part, :math:`t(d) = c + g(d_p)\,(d/d_p)^{p}`, with
   :math:`p` the least-squares log-log slope of the growing part on the last timed
   dimensions (:func:`_growth`). That slope still changes with ``d`` (the step count and
   the certified limit's work grow too; measured between 4.5 and 6 for softmax with
   :math:`K = -Q` from d = 8 to 30), so the range spans :math:`p - 1` to :math:`p + 1`;
4. covers the dimensions up to ``_REACH`` times the largest timed one (the largest timed
   one alone where the growth was not measured). Beyond, it says that it cannot
   estimate, and what the extrapolation would give;
5. schedules the tasks on the workers in submission order (each task to the first free
   worker), so that a last, long task is not divided among idle workers.

A timed task that is a whole task of the sweep is kept (``keep``): the run stores it and
does not compute it again, so the pilot costs only its warm-ups and partial tasks.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time

import numpy as np

from ._compute import compute_batch

__all__ = ["SweepEstimate", "estimate_sweep", "estimate_words"]

#: the pilot may take this share of the estimated compute time (one worker), within bounds
_PILOT_SHARE = 0.1
_PILOT_MIN, _PILOT_MAX = 1.0, 60.0
#: the next dimension timed is at least this factor above the last
_PILOT_STEP = 1.5
#: the estimate covers dimensions up to this factor above the largest timed one
_REACH = 2.0
#: extrapolation slopes added to the fitted one: bottom of the range, top of the range
_SLOPE_LOW, _SLOPE_HIGH = -1.0, 1.0
#: the slope used to plan pilots before two dimensions are timed (an upper guess)
_SLOPE_GUESS = 4.5
#: smallest fitted slope (a slope measured among fixed costs may be ~0 or negative)
_SLOPE_MIN = 1.0
#: a pilot's timing shorter than this is repeated (the median of three)
_REPEAT_BELOW = 0.05
#: past this many tasks, the schedule is summarised (total / workers, or the longest task)
_SCHEDULE_TASKS = 200_000


@dataclasses.dataclass(frozen=True)
class SweepEstimate:
    """The time estimate of a sweep (wall seconds on ``workers`` workers).

    Attributes
    ----------
    seconds, low, high : float
        Central estimate and range of the wall time of the tasks with ``d <= d_reach``,
        the pilot included.
    all_seconds : float
        Central extrapolation to every task (equal to ``seconds`` when ``d_reach`` is
        None): no estimate where ``d_reach`` is set, only what the fitted growth gives.
    workers : int
    n_pilot : int
        Tasks (or parts of tasks) timed.
    d_pilot : int
        Largest dimension timed (0 when nothing was left to compute).
    d_reach : int or None
        Largest dimension the estimate covers, where the sweep has larger ones.
    exponent : float
        Fitted log-log slope of the growing part of the time per setting at ``d_pilot``
        (NaN where the growth was not measured).
    pilot_seconds : float
        Wall time of the pilot (warm-ups included).
    kept : tuple of int
        Tasks the pilot computed whole and handed to ``keep`` (not in the estimate's
        remaining work).
    task_seconds : dict
        Task index -> seconds: measured for those kept, the central estimate (or
        extrapolation) for the others (the progress bar's time left weighs tasks by it).
    """

    seconds: float
    low: float
    high: float
    all_seconds: float
    workers: int
    n_pilot: int
    d_pilot: int
    d_reach: int | None
    exponent: float
    pilot_seconds: float
    kept: tuple = ()
    task_seconds: dict = dataclasses.field(default_factory=dict, repr=False)


def _growth(measured):
    r"""``(c, p, d_ref, g_ref)``: beyond the timed dimensions, :math:`t(d) = c + g(d)`.

    :math:`c`, the fixed cost, is the least time per setting timed; the part that grows,
    :math:`g(d) = g_{ref}\,(d/d_{ref})^p`, has its log-log slope ``p`` fitted (least
    squares) on the last three timed dimensions above that of :math:`c` where it is at
    least :math:`c` (below, the fixed cost and the noise of the timing hide it). ``p``
    is None where fewer than two such dimensions were timed: the growth is not measured.
    """
    low = min(range(len(measured)), key=lambda i: measured[i][1])
    c = measured[low][1]
    d_last, s_last = measured[-1]
    pts = [(d, s - c) for d, s in measured[low + 1:] if s - c >= c][-3:]
    if len(pts) < 2:
        return c, None, d_last, max(s_last - c, c)
    x, y = np.log([q[0] for q in pts]), np.log([q[1] for q in pts])
    p = max(_SLOPE_MIN, float(np.polyfit(x, y, 1)[0]))
    return c, p, pts[-1][0], pts[-1][1]


def _per_setting(measured, d, extra):
    """Seconds per setting at ``d`` from the timed ``(d, seconds per setting)`` pairs.

    Log-log interpolation between them, :func:`_growth` with slope ``p + extra`` beyond.
    """
    ds = [m[0] for m in measured]
    if d <= ds[-1]:
        if d <= ds[0]:
            return measured[0][1]
        logs = np.log([max(m[1], 1e-9) for m in measured])
        return float(np.exp(np.interp(math.log(d), np.log(ds), logs)))
    c, p, d_ref, g_ref = _growth(measured)
    return c + g_ref * (d / d_ref) ** ((_SLOPE_GUESS if p is None else p) + extra)


def _wall(seconds, workers):
    """Wall time of tasks of ``seconds``, in this order, each to the first free worker."""
    if workers <= 1 or not seconds:
        return float(sum(seconds))
    if len(seconds) > _SCHEDULE_TASKS:
        return max(sum(seconds) / workers, max(seconds))
    free = [0.0] * workers
    for s in seconds:
        heapq.heapreplace(free, free[0] + s)
    return max(free)


def _run_pilot(spec, index, rows, keep):
    """Seconds of ``rows`` settings of task ``index``, and the settings timed.

    A whole task is handed to ``keep(index, arrays, seconds)``. A timing shorter than
    ``_REPEAT_BELOW`` is repeated twice (nothing kept) and the median taken: such short
    times are mostly noise on a busy machine.
    """
    attention, d, lo, hi = spec.task(index)
    if rows >= hi - lo:
        task, rows = spec, hi - lo
    else:
        task, index = dataclasses.replace(spec, attention=(attention,), dims=(d,),
                                          draws=rows, batch_size=rows), 0
    times = []
    for repeat in range(3):
        start = time.perf_counter()
        arrays = compute_batch(task, index)
        times.append(time.perf_counter() - start)
        if repeat == 0 and keep is not None and task is spec:
            keep(index, arrays, times[0])
        if times[0] >= _REPEAT_BELOW:
            break
    return float(np.median(times)), rows


def _warm_up(spec, attention, d):
    """One setting of ``(attention, d)``, untimed: compiles or loads its kernels."""
    compute_batch(dataclasses.replace(spec, attention=(attention,), dims=(d,), draws=1,
                                      batch_size=1), 0)


def _pilot_memory(index, call, *args):
    """``call(*args)``; its :class:`MemoryError` carries the task (``exc.sweep_task``).

    The run names that task and its size.
    """
    try:
        return call(*args)
    except MemoryError as exc:
        exc.sweep_task = index
        raise


def estimate_sweep(spec, tasks=None, *, workers=1, budget=None, keep=None, pilot=None,
                   warm_up=None):
    r"""Estimate the wall time of a sweep's tasks from a short pilot (see the module notes).

    Parameters
    ----------
    spec : SweepSpec
        The sweep.
    tasks : sequence of int, optional
        The tasks to estimate (default: all), e.g. those a resume still has to compute.
    workers : int
        Workers the tasks are scheduled on.
    budget : float, optional
        Seconds the pilot may take; default: ``_PILOT_SHARE`` of the estimated time of one
        worker, within ``[_PILOT_MIN, _PILOT_MAX]``, shared among the attention types.
    keep : callable, optional
        ``keep(index, arrays, seconds)`` receives each task the pilot computed whole.
    pilot, warm_up : callable, optional
        ``pilot(spec, index, rows) -> (seconds, settings)`` and
        ``warm_up(spec, attention, d)`` replace the computation (tests).

    Returns
    -------
    SweepEstimate
    """
    start = time.perf_counter()
    tasks = list(range(spec.n_tasks) if tasks is None else tasks)
    kept, measured_tasks = set(), {}
    if pilot is None:
        def kept_too(index, arrays, seconds):
            keep(index, arrays, seconds)
            kept.add(index)
            measured_tasks[index] = seconds

        def pilot(spec, index, rows):
            return _run_pilot(spec, index, rows, None if keep is None else kept_too)
    warm_up = warm_up or _warm_up
    by_block = {}
    for index in tasks:
        attention, d, lo, hi = spec.task(index)
        by_block.setdefault((attention, d), []).append((index, hi - lo))
    models, n_pilot, d_pilot = {}, 0, 0
    n_att = len({a for a, _ in by_block})
    for attention in spec.attention:
        dims = sorted(d for a, d in by_block if a == attention)
        if not dims:
            continue
        _pilot_memory(by_block[(attention, dims[0])][0][0], warm_up, spec, attention, dims[0])
        spent, measured = 0.0, []

        def allowed(measured=measured, attention=attention, dims=dims):
            if budget is not None:
                return budget / n_att
            if not measured:
                return _PILOT_MIN / n_att
            one = sum(rows * _per_setting(measured, d, 0.0)
                      for d in dims for _, rows in by_block[(attention, d)])
            return min(max(_PILOT_SHARE * one, _PILOT_MIN), _PILOT_MAX) / n_att

        for d in dims:
            if measured and d < _PILOT_STEP * measured[-1][0] and d != dims[-1]:
                continue
            index, rows = by_block[(attention, d)][0]
            if not measured and rows > 1:    # one setting first: is the whole task short?
                seconds, _ = _pilot_memory(index, pilot, spec, index, 1)
                spent += seconds
                left = allowed() - spent
                rows = min(rows, max(1, int(left / seconds))) if seconds > 0 else rows
            elif measured:
                per = _per_setting(measured, d, _SLOPE_HIGH)
                left = allowed() - spent
                rows = min(rows, int(left / per)) if per > 0 else rows
                if rows < 1:
                    break
            seconds, timed = _pilot_memory(index, pilot, spec, index, rows)
            spent += seconds
            n_pilot += 1
            measured.append((d, seconds / timed))
        models[attention] = measured
        d_pilot = max(d_pilot, measured[-1][0])

    # the dimensions covered: up to the least reach of the types (one bound for the line)
    reach = min((m[-1][0] if _growth(m)[1] is None else int(_REACH * m[-1][0])
                 for m in models.values()), default=0)
    spent = time.perf_counter() - start
    rest = [(i, a, d, rows) for (a, d), items in by_block.items() for i, rows in items
            if i not in kept]
    rest.sort()

    def wall(extra, covered_only):
        return spent + _wall([rows * _per_setting(models[a], d, extra)
                              for _, a, d, rows in rest
                              if not covered_only or d <= reach], workers)
    beyond = any(d > reach for _, _, d, _ in rest)
    exponents = [p for p in (_growth(m)[1] for m in models.values()) if p is not None]
    task_seconds = {i: rows * _per_setting(models[a], d, 0.0) for i, a, d, rows in rest}
    task_seconds.update(measured_tasks)
    return SweepEstimate(
        seconds=wall(0.0, True), low=wall(_SLOPE_LOW, True), high=wall(_SLOPE_HIGH, True),
        all_seconds=wall(0.0, False), workers=workers, n_pilot=n_pilot,
        d_pilot=d_pilot, d_reach=reach if beyond else None,
        exponent=max(exponents) if exponents else float("nan"), pilot_seconds=spent,
        kept=tuple(sorted(kept)), task_seconds=task_seconds)


def duration(seconds):
    """``seconds`` in words: s, min, h, days or years, two or three digits."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("h", 3600),
                       ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.2g} s"


def estimate_words(est, where):
    """The estimate of the start-up line: ``"; estimated time ..."`` (one line)."""
    if est.n_pilot == 0:
        return "; nothing left to compute"
    span = f"~{duration(est.seconds)}"
    if est.high > 1.5 * est.low:
        span += f" ({duration(est.low)} to {duration(est.high)})"
    timed = f"{est.n_pilot} task(s) timed, d up to {est.d_pilot}"
    if np.isfinite(est.exponent):
        timed += f", time per setting growing ~ d^{est.exponent:.2g} there"
    if est.d_reach is None:
        return f"; estimated time {span} on {where} ({timed})"
    return (f"; estimated time {span} on {where} for d <= {est.d_reach} ({timed}); cannot "
            f"estimate beyond d = {est.d_reach}: extrapolating that growth would give "
            f"~{duration(est.all_seconds)} in all, an extrapolation, not an estimate")
