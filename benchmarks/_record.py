"""One place where every benchmark writes its result: JSON with the machine, versions and date.

Each script in ``benchmarks/`` ends with::

    from _record import write_record
    write_record("bench_solve", payload, args.json)

which writes ``docs/_static/results/benchmarks/<name>.json`` (or the path given) atomically.
The docs render their benchmark tables from these files; no measured number is typed by
hand anywhere. ``payload`` is any JSON-serialisable dict (NumPy scalars and arrays are
converted); the record adds:

``machine``
    processor, core count, memory, operating system, the BLAS in use;
``versions``
    Python, NumPy, SciPy, Numba, gaussian_pde (and JAX, diffrax where imported);
``date``
    UTC time of the run (ISO 8601);
``command``
    the command line that produced it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["RESULTS_DIR", "best_of", "machine_info", "versions", "write_record"]

#: where the docs read benchmark results from
RESULTS_DIR = Path(__file__).resolve().parent.parent / "docs" / "_static" / "results" / "benchmarks"


def machine_info() -> dict:
    """Processor, cores, memory and OS of this machine (what a reader needs to compare runs)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        pass
    blas = None
    try:
        from threadpoolctl import threadpool_info

        blas = [f"{i.get('internal_api')} {i.get('version')}" for i in threadpool_info()
                if i.get("user_api") == "blas"]
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": mem,
            "os": platform.platform(), "blas": blas}


def versions() -> dict:
    """Versions of Python and of the numerical packages that this process has imported."""
    out = {"python": platform.python_version(), "numpy": np.__version__}
    for name in ("scipy", "numba", "gaussian_pde", "jax", "diffrax", "optax", "dask"):
        mod = sys.modules.get(name)
        if mod is None and name in ("scipy", "numba", "gaussian_pde"):
            try:
                mod = __import__(name)
            except ImportError:
                mod = None
        if mod is not None:
            out[name] = getattr(mod, "__version__", None)
    return out


def best_of(fn, rounds, clock=time.perf_counter):
    """``(result, least seconds)`` of ``rounds`` calls of ``fn()``, timed with ``clock``.

    The least of repeated times is the one least disturbed by other work on the machine.
    ``clock``: ``time.perf_counter`` (wall, the default) or ``time.process_time`` (CPU
    of this process, all its threads). The result is that of the last call.
    """
    if rounds < 1:
        raise ValueError(f"`rounds` must be at least 1, got {rounds}.")
    out, best = None, float("inf")
    for _ in range(rounds):
        start = clock()
        out = fn()
        best = min(best, clock() - start)
    return out, best


def _plain(obj):
    """JSON-serialisable copy of ``obj`` (NumPy scalars and arrays to Python types)."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _plain(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None if np.isnan(obj) else ("inf" if obj > 0 else "-inf")
    return obj


def write_record(name: str, payload: dict, path: str | os.PathLike | None = None) -> Path:
    """Write ``payload`` with the machine, versions and date as JSON, atomically.

    Parameters
    ----------
    name : str
        Benchmark name (the file stem under :data:`RESULTS_DIR` when ``path`` is None).
    payload : dict
        The measured results.
    path : path-like, optional
        Where to write instead of ``RESULTS_DIR / f"{name}.json"``.

    Returns
    -------
    pathlib.Path
        The file written.
    """
    target = Path(path) if path is not None else RESULTS_DIR / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine_info(),
        "versions": versions(),
        "results": _plain(payload),
    }
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh, indent=1, allow_nan=False)
            fh.write("\n")
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _umask() -> int:
    """The process umask (read without changing it for longer than the call)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def parse_tables(text: str) -> dict:
    """Markdown tables and text lines of a script's output as ``{"tables", "notes"}``.

    A table is a run of lines starting with ``|`` (its second line the ``|---|`` rule); its
    title is the last non-empty text line before it. Every other non-empty line is a note.
    """
    tables, notes, lines = [], [], text.splitlines()
    i, last_text = 0, None
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].strip().startswith("|---"):
            cols = [c.strip() for c in line.strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
                i += 1
            title = last_text
            if title is not None and notes and notes[-1] == title:
                notes.pop()
            tables.append({"title": title, "columns": cols, "rows": rows})
            last_text = None
            continue
        if line:
            notes.append(line)
            last_text = line
        i += 1
    return {"tables": tables, "notes": notes}


def recorded_main(name: str, main) -> None:
    """Run ``main()`` with its output shown and recorded: ``--json PATH`` overrides the path.

    What the script prints is kept as it is on the terminal and written, parsed by
    :func:`parse_tables`, through :func:`write_record`.
    """
    import io

    argv, path = list(sys.argv[1:]), None
    if "--json" in argv:
        i = argv.index("--json")
        if i + 1 >= len(argv):
            raise SystemExit("--json needs a PATH")
        path = argv[i + 1]
        del argv[i:i + 2]
    sys.argv[1:] = argv

    class _Tee(io.TextIOBase):
        def __init__(self, stream):
            self.stream, self.buf = stream, io.StringIO()

        def write(self, s):
            self.stream.write(s)
            self.buf.write(s)
            return len(s)

        def flush(self):
            self.stream.flush()

    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        main()
    finally:
        sys.stdout = tee.stream
    target = write_record(name, parse_tables(tee.buf.getvalue()), path)
    print(f"recorded: {target}", file=sys.stderr)
