"""Running a sweep: in-process, on a local Dask cluster, or on an existing one.

The driver (this process) owns the results folder: it submits the missing tasks, writes
each result as it arrives, and never holds more than one task's arrays at a time. Workers
only compute (:func:`gaussian_pde.sweep.compute_batch`), so they need gaussian_pde
installed but no access to the results folder. Dask is imported here, lazily.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
import uuid
import warnings

import numpy as np

from .._common.validation import (
    _memory_bytes,
    usable_cores,
    validate_allocation,
    validate_positive,
)
from ._compute import compute_batch, result_layout
from ._estimate import SweepEstimate, estimate_sweep, estimate_words
from ._spec import SweepSpec
from ._store import SweepIntegrityWarning, SweepStore, _describe

__all__ = ["run_sweep", "SweepReport", "SchedulerUnreachableError"]

#: test hook: seconds each task sleeps before computing (to interrupt sweeps mid-way)
_DELAY_ENV = "GAUSSIAN_PDE_SWEEP_TASK_DELAY"


class SchedulerUnreachableError(ConnectionError):
    """No Dask scheduler answered at the given address within the timeout."""


@dataclasses.dataclass(frozen=True)
class SweepReport:
    """What :func:`run_sweep` did.

    Attributes
    ----------
    path : str
        The results folder.
    n_tasks : int
        Tasks in the sweep.
    n_skipped : int
        Tasks already stored, and verified, when the run started (resumed).
    n_computed : int
        Tasks computed and stored by this run (the damaged ones and those the time
        estimate's pilot computed whole included).
    n_settings_computed : int
        Settings in those tasks.
    seconds : float
        Wall time of the computation: the pilot of the time estimate (in this process,
        before any cluster starts) and the tasks once the cluster was up.
    scheduler : str
        ``"inprocess"``, ``"local"`` (a LocalCluster started here) or the address used.
    n_workers : int
        Workers used (1 in-process).
    n_damaged : int
        Stored tasks found damaged (a chunk truncated, deleted or overwritten) when the run
        started: their flags were cleared and they were recomputed (counted in
        ``n_computed``, not in ``n_skipped``).
    estimate : SweepEstimate or None
        The start-up time estimate (with ``progress``), to compare with ``seconds``.
    """

    path: str
    n_tasks: int
    n_skipped: int
    n_computed: int
    n_settings_computed: int
    seconds: float
    scheduler: str
    n_workers: int
    n_damaged: int = 0
    estimate: SweepEstimate | None = None

    @property
    def settings_per_second(self):
        """Throughput of this run."""
        return self.n_settings_computed / self.seconds if self.seconds > 0 else float("nan")


def _run_task(spec_dict, index, version):
    """Worker-side entry: recompute the spec and run one task (plain data in, arrays out)."""
    from .._version import __version__

    if version != __version__:
        raise RuntimeError(f"worker runs gaussian_pde {__version__}, the driver "
                           f"{version}; install the same version on every worker.")
    delay = float(os.environ.get(_DELAY_ENV, "0") or 0)
    if delay:
        time.sleep(delay)
    start = time.perf_counter()
    arrays = compute_batch(SweepSpec.from_dict(spec_dict), index)
    return arrays, {"seconds": time.perf_counter() - start, "pid": os.getpid()}


#: driver-side bookkeeping per task: its index in the list of missing tasks (a Python int
#: in a list) in-process; with Dask also its future and graph entry (a few kB, measured
#: order of magnitude for dask.distributed 2024-2025)
_TASK_BYTES = {"inprocess": 64, "dask": 4096}
#: share of this machine's memory a sweep may plan to use
_MEMORY_SHARE = 0.5
#: n x n float64 matrices the solver holds per trajectory it integrates (the implicit
#: stepper's Jacobian and its LU factors; the compiled batch integrator allocates them for
#: every trajectory, whatever the method), n = d m the entries of the state [L | alpha]
_SOLVER_MATRICES = 2
#: methods that hold no n x n matrix (SciPy's explicit Runge-Kutta pairs, called per setting)
_NO_MATRICES = ("RK23", "RK45")


def _threads():
    """Trajectories the compiled batch integrator runs at once (Numba's threads)."""
    value = os.environ.get("NUMBA_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else usable_cores()


def solver_bytes(spec, d):
    r"""Bytes of the solver's scratch for one task of dimension ``d``.

    :math:`16 n^2` bytes (``_SOLVER_MATRICES`` matrices of :math:`n^2` float64) per
    trajectory integrated at once, :math:`n = d m` (:math:`m = d`, or :math:`d + 1` for a
    type whose field sees the mean): all of a task's settings up to Numba's thread count
    with DOP853 (the batch), one with another implicit method (one setting at a time),
    none with RK23 / RK45.
    """
    method = spec.solver.method
    if method in _NO_MATRICES:
        return 0.0
    at_once = min(spec.batch_size, spec.draws, _threads()) if method == "DOP853" else 1
    return float(at_once) * _SOLVER_MATRICES * 8.0 * float(_state_size(spec, d)) ** 2


def _state_size(spec, d):
    """Entries ``n = d m`` of the integrated state ``[L | alpha]`` in dimension ``d``."""
    from ..attention import get_attention

    sees_mean = any(getattr(get_attention(a), "field_sees_mean", False) for a in spec.attention)
    return d * (d + 1 if sees_mean else d)


def sweep_resources(spec, scheduler=None):
    r"""What a sweep needs, estimated before any work: bytes and counts.

    With ``r = min(batch_size, draws)`` rows per task, ``G`` grid points and
    :math:`b_d` the bytes of one setting's recorded arrays (:func:`result_layout`):

    * a task holds :math:`r\,(b_d + 16Gd^2 + 64d^2)` bytes (its results, the solver's
      covariances on the grid and a copy, the weights and initial state) and the
      solver's scratch (:func:`solver_bytes`: :math:`16 (dm)^2` bytes per trajectory
      integrated at once);
    * the results, loaded by :func:`load_results` / ``sweep summarize``, are
      :math:`\sum_{\text{blocks}} \text{draws}\,b_d` bytes;
    * the driver's bookkeeping is ``draws`` bytes of ``done`` flags per block and
      ``_TASK_BYTES`` per task.

    Returns
    -------
    dict
        ``task_bytes``, ``solver_bytes`` (its part of ``task_bytes``, at the largest
        ``d``), ``results_bytes``, ``driver_bytes``, ``n_tasks``, ``n_settings``.
    """
    rows = min(spec.batch_size, spec.draws)
    grid = spec.record.grid if spec.record.eigenvalues else 1

    def row_bytes(d):
        return sum(int(np.prod(shape, dtype=np.float64)) * np.dtype(dtype).itemsize
                   for shape, dtype, _ in result_layout(spec, d).values())
    dims = sorted(set(spec.dims))
    task = max(rows * (row_bytes(d) + 16.0 * grid * d * d + 64.0 * d * d)
               + solver_bytes(spec, d) for d in dims)
    results = sum(float(spec.draws) * row_bytes(d) for _, d in spec.blocks)
    per_task = _TASK_BYTES["inprocess" if scheduler == "inprocess" else "dask"]
    driver = float(spec.draws) * len(spec.blocks) + float(spec.n_tasks) * per_task
    return {"task_bytes": task, "solver_bytes": solver_bytes(spec, dims[-1]),
            "results_bytes": results, "driver_bytes": driver, "n_tasks": spec.n_tasks,
            "n_settings": spec.n_settings}


def _gib(n):
    return f"{n / 2**30:.3g} GiB"


def _address_space_left():
    """Bytes left under this process's address-space limit (``ulimit -v``), and the limit.

    ``(None, None)`` without a limit.
    """
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):   # pragma: no cover - not Unix
        return None, None
    if soft in (resource.RLIM_INFINITY, -1) or soft <= 0:
        return None, None
    try:
        with open("/proc/self/statm") as fh:
            used = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        used = 0
    return max(soft - used, 0), soft


def memory_limit():
    """``(bytes, words)``: what a sweep may plan to use, and how that was decided.

    ``_MEMORY_SHARE`` of the physical memory, or, under an address-space limit
    (``ulimit -v``), what that limit leaves this process, if less. ``(None, None)`` where
    neither is known.
    """
    total = _memory_bytes()
    limit, words = None, None
    if total is not None:
        limit = _MEMORY_SHARE * total
        words = f"{_MEMORY_SHARE:.0%} of this machine's {_gib(total)} of memory"
    left, soft = _address_space_left()
    if left is not None and (limit is None or left < limit):
        limit = float(left)
        words = (f"the {_gib(left)} that this process's address-space limit "
                 f"(ulimit -v {soft // 1024}) leaves it")
    return limit, words


def check_resources(spec, scheduler=None):
    """Refuse, before any work, a sweep whose memory would not fit this machine.

    One line, with the size needed and the key to change (see :func:`sweep_resources`
    and :func:`memory_limit`).
    """
    need = sweep_resources(spec, scheduler)
    limit, have = memory_limit()
    if limit is None:
        return need
    if need["task_bytes"] > limit:
        d = max(spec.dims)
        solver = (f", of which {_gib(need['solver_bytes'])} the solver's n x n matrices, "
                  f"n = {_state_size(spec, d)} state entries at d = {d}" if need["solver_bytes"] else "")
        raise ValueError(f"sweep: one task would hold {_gib(need['task_bytes'])} "
                         f"({min(spec.batch_size, spec.draws)} settings, d up to "
                         f"{d}, record.grid = {spec.record.grid}{solver}), more than "
                         f"{have}; lower sweep.dims, sweep.batch_size or record.grid.")
    if need["driver_bytes"] > limit:
        raise ValueError(f"sweep: {need['n_tasks']} tasks of {spec.draws} draws would need "
                         f"{_gib(need['driver_bytes'])} of bookkeeping, more than {have}; "
                         "raise sweep.batch_size or lower sweep.draws.")
    if need["results_bytes"] > limit:
        raise ValueError(f"sweep: the results ({need['n_settings']} settings) would take "
                         f"{_gib(need['results_bytes'])} to load, more than {have}; lower "
                         "sweep.draws, record.grid or sweep.dims, or record fewer arrays.")
    return need


def _out_of_memory(spec, index, exc):
    """The :class:`MemoryError` of task ``index``, naming the task and what it asks for."""
    attention, d, lo, hi = spec.task(index)
    need = sweep_resources(dataclasses.replace(spec, attention=(attention,), dims=(d,)))
    why = " ".join(str(exc).split()) or "an allocation failed"
    draws = f"draw {lo}" if hi - lo == 1 else f"draws {lo}..{hi - 1}"
    return MemoryError(f"sweep task {index} ({attention}, d = {d}, {draws}) ran "
                       f"out of memory ({why}); it asks for about {_gib(need['task_bytes'])}, "
                       f"{_gib(need['solver_bytes'])} of them the solver's n x n matrices "
                       f"(n = {_state_size(spec, d)}): lower sweep.dims or sweep.batch_size.")


@contextlib.contextmanager
def _task_memory(spec, index):
    """Re-raise a task's :class:`MemoryError` with its size (:func:`_out_of_memory`)."""
    try:
        yield
    except MemoryError as exc:
        raise _out_of_memory(spec, index, exc) from None


def _estimate_line(spec, tasks, scheduler, workers, keep):
    """The time estimate of the start-up line (after a pilot, :mod:`._estimate`)."""
    n, where = 1, "one worker"
    if scheduler in (None, "local"):
        n = workers or usable_cores()
        where = f"{n} worker(s)"
    elif scheduler != "inprocess":
        where = "one worker; divide by the cluster's workers"
    try:
        est = estimate_sweep(spec, tasks, workers=n, keep=keep)
    except MemoryError as exc:     # the pilot ran a task of the sweep: say which
        raise _out_of_memory(spec, getattr(exc, "sweep_task", tasks[0]), exc) from None
    return est, estimate_words(est, where)


class _Progress:
    """A one-line progress bar on stderr: tasks done, tasks/s, settings/s and the time left.

    The time left weighs each task by its predicted seconds (``weights``: task index ->
    seconds, from the time estimate), scaled by the time the finished ones took: tasks
    whose cost grows with ``d`` are not counted alike. Without weights, tasks count alike.
    """

    def __init__(self, total, per_task, enabled, stream=None):
        self.total, self.per_task, self.enabled = total, per_task, enabled and total > 0
        self.stream = stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.done, self.settings, self.start, self.last = 0, 0, time.perf_counter(), 0.0
        self.weights, self.left, self.finished, self.overhead = None, None, 0.0, 0.0

    def weigh(self, weights, tasks, overhead=0.0):
        """Weigh ``tasks`` (those still to finish) by ``weights`` for the time left.

        ``overhead``: seconds spent so far on no task (the pilot's warm-ups).
        """
        self.weights, self.overhead = weights, overhead
        self.left = sum(weights.get(i, 0.0) for i in tasks)

    def update(self, settings, force=False, index=None, quiet=False):
        self.done += 1
        self.settings += settings
        if self.weights is not None and index is not None:
            w = self.weights.get(index, 0.0)
            self.finished += w
            self.left = max(self.left - w, 0.0)
        if not self.enabled or quiet:
            return
        now = time.perf_counter()
        if not (force or self.done == self.total or now - self.last >= (0.2 if self.tty
                                                                          else 5.0)):
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        width = 30
        fill = int(width * self.done / self.total)
        rate = self.done / elapsed
        if self.weights is not None and self.finished > 0:
            eta = max(elapsed - self.overhead, 0.0) * self.left / self.finished
        else:
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        line = (f"sweep [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} tasks "
                f"{rate:.2f} tasks/s {self.settings / elapsed:.1f} settings/s "
                f"eta {eta:.0f}s")
        end = "\n" if (not self.tty or self.done == self.total) else ""
        self.stream.write(("\r" if self.tty else "") + line + end)
        self.stream.flush()


#: resident memory of one local worker process before its first task (Python, NumPy,
#: SciPy, dask.distributed and gaussian_pde imported): 171 MiB measured on Linux x86-64
#: with dask.distributed 2024-2025; rounded up
_WORKER_BYTES = 200 * 2**20


def check_local_workers(workers, name="workers"):
    """Refuse, before any work, more local worker processes than the memory holds.

    Each process of the local cluster takes ``_WORKER_BYTES`` (about 200 MiB) before its
    first task; more than half of this machine's memory in all (the limit of
    :func:`~gaussian_pde._common.validation.validate_allocation`) is refused with the
    size, naming ``name``. ``workers`` must be a positive integer. Returns it.
    """
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {workers!r}.")
    need = int(workers) * _WORKER_BYTES
    try:
        validate_allocation(need, name, itemsize=1)
    except ValueError:
        raise ValueError(f"`{name}` = {workers} worker processes would need {_gib(need)} "
                         f"(about {_gib(_WORKER_BYTES)} each before any task), more than half "
                         f"of this machine's memory; lower `{name}`.") from None
    return int(workers)


def local_cluster(n_workers):
    """A LocalCluster of ``n_workers`` single-threaded processes, listening on 127.0.0.1 only.

    No dashboard; the scheduler's small HTTP endpoint takes a free port on 127.0.0.1
    (not the shared default 8787).
    """
    from distributed import LocalCluster

    return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                        host="127.0.0.1", dashboard_address=None,
                        scheduler_kwargs={"dashboard": False,
                                          "dashboard_address": "127.0.0.1:0"})


def _connect(scheduler, workers, connect_timeout):
    """``(client, cluster or None, label, owned)`` for the ``scheduler`` argument."""
    try:
        from distributed import Client
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError("sweeps on Dask need dask.distributed: "
                          "pip install 'gaussian_pde[sweep]' (or use scheduler='inprocess')"
                          ) from None
    if isinstance(scheduler, Client):
        return scheduler, None, str(scheduler.scheduler.address), False
    if scheduler in (None, "local"):
        n = workers or usable_cores()
        cluster = local_cluster(n)
        try:
            client = Client(cluster, timeout=connect_timeout)
        except BaseException:
            cluster.close()
            raise
        return client, cluster, "local", True
    if not isinstance(scheduler, str):
        raise TypeError(f"`scheduler` must be None, 'local', 'inprocess', an address "
                        f"'tcp://HOST:PORT' or a distributed.Client, got {scheduler!r}.")
    if "://" not in scheduler:
        raise ValueError(f"`scheduler` must be 'local', 'inprocess' or an address such as "
                         f"tcp://HOST:PORT, got {scheduler!r}.")
    try:
        client = Client(scheduler, timeout=connect_timeout)
    except (OSError, TimeoutError) as exc:
        raise SchedulerUnreachableError(
            f"no Dask scheduler answered at {scheduler} within {connect_timeout:g} s ({exc}). "
            "Check that the scheduler is running and the address and port are right, or "
            "run locally (omit --scheduler) or in-process (--inprocess).") from None
    return client, None, scheduler, True


def run_sweep(spec, out, *, scheduler=None, workers=None, progress=True,
              connect_timeout=10.0):
    """Run (or resume) a sweep and store every task's results in ``out``.

    Parameters
    ----------
    spec : SweepSpec, dict or path-like
        The specification (a path is read as TOML).
    out : path-like
        Results folder. Created if missing; if it holds the same specification, only the
        missing tasks are computed (resume); a different specification is refused.
    scheduler : None, "local", "inprocess", str or distributed.Client
        ``None``/``"local"``: a LocalCluster on 127.0.0.1 with ``workers`` single-threaded
        worker processes (default: one per available core). ``"inprocess"``: no Dask, tasks
        run one after another in this process. ``"tcp://HOST:PORT"``: an existing
        scheduler (e.g. one started by dask-jobqueue or dask-kubernetes). A ``Client`` is
        used as is (and not closed).
    workers : int, optional
        Worker processes of the local cluster (only with ``None``/``"local"``); more
        than half of the memory holds are refused (:func:`check_local_workers`).
    progress : bool
        Show a line with the size of the sweep (tasks, settings, memory per task and of
        the results) at once, completed by an estimated time from a short pilot
        (:func:`gaussian_pde.sweep._estimate.estimate_sweep`: a few tasks timed in this
        process, stored, not computed again), then a progress bar (tasks done, tasks/s,
        settings/s), on stderr.
    connect_timeout : float
        Seconds to wait for a scheduler before :class:`SchedulerUnreachableError`
        (finite and positive).

    Returns
    -------
    SweepReport

    Raises
    ------
    ValueError
        Before any work, when a task, the driver's bookkeeping or the results would need
        more than half of this machine's memory (:func:`sweep_resources`), with the size.
    """
    if isinstance(spec, dict):
        spec = SweepSpec.from_dict(spec)
    elif not isinstance(spec, SweepSpec):
        spec = SweepSpec.from_toml(spec)
    if workers is not None:
        workers = check_local_workers(workers)
        if scheduler not in (None, "local"):
            raise ValueError("`workers` applies only to the local cluster (scheduler=None).")
    # finite: Dask reads the timeout as a time span, and has none for inf
    validate_positive(connect_timeout, "connect_timeout")
    need = check_resources(spec, scheduler)
    store, damaged = _open_store(spec, out)
    missing = store.missing_tasks()
    skipped = spec.n_tasks - len(missing)
    run_id = uuid.uuid4().hex[:12]
    start = time.perf_counter()
    n_settings, est = 0, None
    bar = _Progress(len(missing), spec.batch_size, progress)   # the pilot's tasks included
    if progress:
        est, missing, n_settings = _pilot(spec, store, missing, need, bar, run_id, scheduler,
                                          workers)
    n_piloted = spec.n_tasks - skipped - len(missing)

    if scheduler == "inprocess":
        n_settings += _run_inprocess(spec, store, missing, bar, run_id)
        return SweepReport(str(out), spec.n_tasks, skipped, n_piloted + len(missing),
                           n_settings, time.perf_counter() - start, "inprocess", 1,
                           len(damaged), est)

    if not missing:  # nothing (more) to do: do not start a cluster
        return SweepReport(str(out), spec.n_tasks, skipped, n_piloted, n_settings,
                           time.perf_counter() - start,
                           "local" if scheduler is None else str(scheduler), 0, len(damaged),
                           est)
    pilot_seconds = time.perf_counter() - start     # the cluster's start-up is not counted
    settings, seconds, label, n_workers = _run_on_cluster(
        spec, store, missing, bar, run_id, scheduler, workers, connect_timeout)
    return SweepReport(str(out), spec.n_tasks, skipped, n_piloted + len(missing),
                       n_settings + settings, pilot_seconds + seconds, label, n_workers,
                       len(damaged), est)


def _open_store(spec, out):
    """The results folder ``out`` of ``spec``, repaired: ``(store, damaged task indices)``.

    Warns (for the caller of :func:`run_sweep`) of damaged tasks, which will be
    recomputed, and of a folder written without integrity records.
    """
    store = SweepStore(out, spec)
    damaged = store.repair()
    if damaged:
        warnings.warn(f"{out}: {len(damaged)} stored task(s) were damaged and will be "
                      f"recomputed: {_describe(spec, damaged)}.", SweepIntegrityWarning,
                      stacklevel=3)
    if not store.verified:
        warnings.warn(f"{out} was written without integrity records (by a gaussian_pde "
                      "before they existed): resuming it checks only decoding and the status "
                      "rows, and stores new tasks without records. Run the sweep into a new "
                      "folder to have it verified.", SweepIntegrityWarning, stacklevel=3)
    return store, damaged


def _pilot(spec, store, missing, need, bar, run_id, scheduler, workers):
    """The start line on stderr, completed by the pilot's time estimate.

    The tasks the pilot computed whole are stored and counted on ``bar``. Returns
    ``(estimate, the tasks still missing, settings computed)``.
    """
    n_settings = 0
    sys.stderr.write(f"sweep: {need['n_tasks']} task(s), {need['n_settings']} settings "
                     f"in {len(spec.blocks)} block(s), d up to {max(spec.dims)}; up to "
                     f"{need['task_bytes'] / 2**20:.3g} MiB per task, results "
                     f"{need['results_bytes'] / 2**20:.3g} MiB")
    sys.stderr.flush()

    def keep(index, arrays, seconds):   # a task the pilot computed whole: stored
        store.write_task(index, arrays, {"run": run_id, "pid": os.getpid(),
                                         "seconds": seconds, "pilot": True})
    try:
        est, words = _estimate_line(spec, missing, scheduler, workers, keep)
    except BaseException:   # end the start line: the error (or interruption) follows
        sys.stderr.write("\n")
        raise
    sys.stderr.write(words + "\n")
    sys.stderr.flush()
    bar.weigh(est.task_seconds, missing, overhead=est.pilot_seconds - sum(
        est.task_seconds[i] for i in est.kept))
    for j, index in enumerate(est.kept):   # one line for them all, at the last
        n_settings += _settings_in(spec, index)
        bar.update(_settings_in(spec, index), index=index, force=True,
                   quiet=j < len(est.kept) - 1)
    missing = [index for index in missing if index not in set(est.kept)]
    return est, missing, n_settings


def _run_inprocess(spec, store, missing, bar, run_id):
    """Compute and store the ``missing`` tasks one after another here; the settings done."""
    n_settings = 0
    for index in missing:
        t0 = time.perf_counter()
        with _task_memory(spec, index):
            arrays = compute_batch(spec, index)
        store.write_task(index, arrays, {"run": run_id, "pid": os.getpid(),
                                         "seconds": time.perf_counter() - t0})
        n_settings += _settings_in(spec, index)
        bar.update(_settings_in(spec, index), index=index)
    return n_settings


def _run_on_cluster(spec, store, missing, bar, run_id, scheduler, workers, connect_timeout):
    """Compute the ``missing`` tasks on Dask workers, storing each as it arrives.

    Connects to (or starts) the cluster of ``scheduler`` (:func:`_connect`) and closes
    what it started; tasks not done when an error or interruption stops the run are
    cancelled. Returns ``(settings done, seconds since the tasks were submitted,
    scheduler label, workers)``.
    """
    client, cluster, label, owned = _connect(scheduler, workers, connect_timeout)
    futures, pending = [], {}
    n_settings = 0
    try:
        from distributed import as_completed

        from .._version import __version__

        n_workers = len(client.nthreads())
        if not n_workers:
            warnings.warn(f"the Dask scheduler at {label} has no workers yet; the sweep "
                          "waits for workers to join (e.g. queued dask-jobqueue jobs).",
                          stacklevel=3)
        spec_dict = spec.to_dict()
        tag = spec.fingerprint[:12]
        start = time.perf_counter()
        futures = [client.submit(_run_task, spec_dict, index, __version__,
                                 key=f"gaussian-pde-sweep-{tag}-{index}-{run_id}", pure=False)
                   for index in missing]
        pending = {f.key: index for f, index in zip(futures, missing)}
        for future in as_completed(futures):
            index = pending.pop(future.key)
            with _task_memory(spec, index):
                arrays, info = future.result()
            future.release()
            store.write_task(index, arrays, dict(info, run=run_id))
            n_settings += _settings_in(spec, index)
            bar.update(_settings_in(spec, index), index=index)
        seconds = time.perf_counter() - start
    finally:
        if futures:
            client.cancel([f for f in futures if f.key in pending])
        if owned:
            client.close()
        if cluster is not None:
            cluster.close()
    return n_settings, seconds, label, n_workers


def _settings_in(spec, index):
    _, _, lo, hi = spec.task(index)
    return hi - lo
