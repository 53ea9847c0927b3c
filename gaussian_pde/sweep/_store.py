"""Storage of sweep results: a Zarr store, one chunk per task, written atomically.

Layout of a results folder ``RESULTS``::

    RESULTS/manifest.json      format, specification, fingerprint, package version
    RESULTS/spec.toml          the complete specification (every default spelled out)
    RESULTS/results.zarr/      Zarr (format 2) group; root attributes hold the same metadata
        <attention>/d<d>/done         bool (draws,): row written (the completion flag)
        <attention>/d<d>/integrity    uint64 (tasks, arrays): the integrity record of each task
        <attention>/d<d>/status       int8 (draws,): code into attrs["statuses"]
        <attention>/d<d>/...          the recorded arrays, shape (draws, ...)
        time                          float (grid,): the coarse time grid
    RESULTS/tasks.log          one JSON line per stored task (informative, not authoritative)

Every array is chunked along the draws with ``batch_size`` rows (``draws`` when that is
fewer: a chunk is sized by what is stored), so a task owns exactly one chunk of each array
and no two tasks share a file. Zarr writes each chunk to a temporary file and renames it
into place; a task writes its data chunks first and its ``done`` chunk
last, so after an interruption at any instant (``kill -9`` included) a task is either
complete and flagged or unflagged, and an unflagged task is recomputed, overwriting
whatever partial chunks it left with the same bytes. Nothing is pickled: the store opens
with any Zarr reader (zarr-python 2 or 3, xarray, zarr.js, Julia's Zarr.jl).

Integrity. Between its data chunks and its ``done`` chunk a task writes its integrity
record, the row ``j`` of ``integrity`` (its own chunk): one 64-bit BLAKE2b digest per
recorded array (column order in ``integrity.attrs["arrays"]``) of the dtype, shape and
C-order bytes of the task's rows as written, and a last column, the digest of the row
before it and of ``j`` (so that a damaged or misplaced record is told from damaged data). A stored task is
*damaged* when a chunk of its rows does not decode, when the decoded rows do not match
their digest (a truncated chunk may decode silently to garbage; a deleted chunk reads as
the fill value, which is harmless only when the rows were the fill value), when its
record is missing or damaged, or when its ``done`` chunk does not decode or is partly
set. :meth:`SweepStore.repair` (run at every resume)
clears the flag and record of damaged tasks so they are recomputed;
:func:`load_results` raises :class:`DamagedResultsError` naming them. Verification reads
the whole store once (the cost of loading it) and hashes each task's rows.

Stores written before integrity records existed (no ``integrity`` arrays) still load and
resume, unverified: only what needs no record is checked (every chunk of a stored task
decodes, its ``done`` chunk is wholly set and its ``status`` rows are not the fill value
-1), a :class:`SweepIntegrityWarning` says so, and tasks added by a resume get no record
either. Run the sweep into a new folder to have it verified.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
import time
import warnings

import numpy as np

from .._common.io import plain_mode, write_json, write_text
from ._compute import OUTCOMES, STATUSES, result_layout, time_grid
from ._spec import SweepSpec

__all__ = ["SweepStore", "SweepResults", "load_results", "FORMAT", "DamagedResultsError",
           "SweepIntegrityWarning"]

#: identifies a results folder written by this module
FORMAT = "gaussian_pde.sweep/1"
_ZARR = "results.zarr"

_DIMS = {"final_cov": ["draw", "row", "col"], "eigenvalues": ["draw", "time", "eig"]}

#: name of the per-block array of integrity records, and its digest
_RECORD = "integrity"
INTEGRITY = "blake2b-64"
#: tasks named in full in a damage message
_NAMED = 5


class DamagedResultsError(ValueError):
    """A results folder holds damaged tasks: a chunk truncated, deleted or overwritten.

    Attributes
    ----------
    problems : dict
        Task index -> list of what is wrong with it (array and chunk file named).
    tasks : list of int
        The damaged task indices, sorted.
    """

    def __init__(self, message, problems):
        super().__init__(message)
        self.problems = {int(k): list(v) for k, v in problems.items()}
        self.tasks = sorted(self.problems)


class SweepIntegrityWarning(UserWarning):
    """Results that could not be fully verified, or damaged tasks that were recomputed."""


def _digest(name, values):
    """The 64-bit digest of one array's rows of a task (never 0: 0 means "no record")."""
    values = np.ascontiguousarray(values)
    h = hashlib.blake2b(digest_size=8, person=b"gaussian_pde")
    h.update(f"{name}:{values.dtype.str}:{values.shape}:".encode())
    h.update(values.tobytes())
    return int.from_bytes(h.digest(), "little") or 1


def _record_row(j, digests):
    """The integrity record of row ``j``: the digests, then the digest of those and ``j``."""
    row = np.array(list(digests) + [0], dtype="u8")
    row[-1] = _digest(f"{_RECORD}[{j}]", row[:-1])
    return row


def _chunk_key(arr, j):
    """The store key (a file name in a folder store) of chunk ``j`` along the draws."""
    ndim = len(arr.shape)
    meta = getattr(arr, "metadata", None)
    sep = getattr(meta, "dimension_separator", None) or getattr(
        arr, "_dimension_separator", None) or "."
    if getattr(meta, "zarr_format", 2) == 3:  # pragma: no cover - this module writes format 2
        return "c/" + "/".join([str(j)] + ["0"] * (ndim - 1))
    return sep.join([str(j)] + ["0"] * (ndim - 1))


def _read_rows(arr, fill, on_error):
    """The whole array; a chunk that does not decode reads as ``fill`` and is reported.

    ``on_error(j, exc)`` is called for chunk ``j`` along the first axis.
    """
    try:
        return np.asarray(arr[:])
    except Exception:  # noqa: BLE001 - any codec error: locate the bad chunks below
        pass
    out = np.full(arr.shape, fill, dtype=arr.dtype)
    step = arr.chunks[0]
    for j in range(-(-arr.shape[0] // step)):
        lo = j * step
        try:
            out[lo:lo + step] = arr[lo:lo + step]
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            on_error(j, exc)
    return out


def _check_block(spec, group, b, attention, d, folder=None):
    """Read and verify one ``(attention, d)`` block.

    ``folder``, the results folder, tells a deleted chunk file from an overwritten one in
    the messages.

    Returns
    -------
    arrays : dict
        Name -> ndarray (``done`` included), undecodable chunks read as fill values.
    problems : dict
        Task index -> list of str, for the damaged tasks.
    orphans : list of int
        Tasks with an integrity record but no ``done`` flag (interrupted in between, or
        their ``done`` chunk was deleted): not stored, to be recomputed.
    verified : bool
        Whether the block has integrity records.
    """
    per, bs = spec.tasks_per_block, spec.batch_size
    layout = result_layout(spec, d)
    where = f"{_ZARR}/{attention}/d{d}"
    bad = {}  # (j, name) -> what went wrong

    def reader(name, arr, fill):
        def on_error(j, exc):
            bad[(j, name)] = (f"chunk {where}/{name}/{_chunk_key(arr, j)} cannot be decoded "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())})")
        return _read_rows(arr, fill, on_error)

    verified = _RECORD in group
    with _structure(folder or "the results folder"):
        opened = {name: group[name] for name in
                  ["done"] + ([_RECORD] if verified else []) + list(layout)}

    def chunk(name, j):
        return f"{where}/{name}/{_chunk_key(opened[name], j)}"

    # the done flags first: a concurrent writer stores data, record, then the flag, so a
    # flag seen set here has its data and record in place when they are read next
    done = reader("done", opened["done"], False)
    records = rec_names = None
    if verified:
        records = reader(_RECORD, opened[_RECORD], 0)
        rec_names = list(opened[_RECORD].attrs.get("arrays", list(layout)))
    arrays = {name: reader(name, opened[name], fill)
              for name, (_, _, fill) in layout.items()}
    arrays["done"] = done
    problems, orphans = {}, []
    for j in range(per):
        index = b * per + j
        lo, hi = j * bs, min((j + 1) * bs, spec.draws)
        flags = done[lo:hi]
        if (j, "done") in bad:
            problems[index] = [bad[(j, "done")]]
            continue
        if not flags.any():
            if records is not None and (j, _RECORD) not in bad and records[j].any():
                orphans.append(index)
            continue
        found = [text for (k, _), text in sorted(bad.items()) if k == j]
        if not flags.all():
            found.append(f"chunk {chunk('done', j)} is only partly "
                         "set (overwritten)")
        if records is None:
            if (j, "status") not in bad and np.any(arrays["status"][lo:hi] < 0):
                found.append(f"chunk {chunk('status', j)} holds "
                             "the fill value -1 in a computed row (deleted or overwritten)")
        elif (j, _RECORD) not in bad:
            row = records[j]
            if not row.any():
                found.append(f"its integrity record (chunk {chunk(_RECORD, j)}) is missing "
                             "(deleted)")
            elif row.size != len(rec_names) + 1 or \
                    _digest(f"{_RECORD}[{j}]", row[:-1]) != int(row[-1]):
                found.append(f"its integrity record (chunk {chunk(_RECORD, j)}) does not "
                             "match its own digest (truncated, overwritten or another "
                             "task's)")
            else:
                for k, name in enumerate(rec_names):
                    if name in arrays and (j, name) not in bad and \
                            _digest(name, arrays[name][lo:hi]) != int(row[k]):
                        key = chunk(name, j)
                        gone = folder is not None and not (pathlib.Path(folder) / key).exists()
                        found.append(f"chunk {key} " + (
                            "is missing (deleted)" if gone else "does not match its "
                            "integrity record (truncated or overwritten)"))
        if found:
            problems[index] = found
    return arrays, problems, orphans, verified


def _stored_time(root, grid):
    """The stored time grid, or None if it does not decode or differs from ``grid``."""
    try:
        stored = np.asarray(root["time"][:])
    except Exception:  # noqa: BLE001 - any codec error counts as damage
        return None
    ok = stored.shape == grid.shape and np.allclose(stored, grid, rtol=1e-12, atol=0.0)
    return stored if ok else None


def _describe(spec, problems):
    """The damaged tasks of ``problems`` in words (the first few in full)."""
    parts = []
    for index in sorted(problems)[:_NAMED]:
        attention, d, lo, hi = spec.task(index)
        parts.append(f"task {index} ({attention}, d={d}, draws {lo}..{hi - 1}): "
                     + "; ".join(problems[index]))
    if len(problems) > _NAMED:
        parts.append(f"and {len(problems) - _NAMED} more task(s): "
                     + ", ".join(str(i) for i in sorted(problems)[_NAMED:]))
    return "; ".join(parts)


def _zarr():
    try:
        import zarr
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError("sweep results need zarr: pip install 'gaussian_pde[sweep]'") from None
    return zarr


def _zarr3(zarr):
    return int(zarr.__version__.split(".")[0]) >= 3


def _create_array(zarr, group, name, shape, chunks, dtype, fill, dims):
    attrs = {"_ARRAY_DIMENSIONS": dims}  # lets xarray open each block as a Dataset
    if _zarr3(zarr):
        arr = group.create_array(name, shape=shape, chunks=chunks, dtype=dtype,
                                 fill_value=fill, attributes=attrs)
    else:  # pragma: no cover - zarr 2 (Python 3.10)
        arr = group.create_dataset(name, shape=shape, chunks=chunks, dtype=dtype,
                                   fill_value=fill)
        arr.attrs.update(attrs)
    return arr


class DamagedStoreError(ValueError):
    """The Zarr store's structure (a group, an array or its metadata) is damaged.

    Missing or not decoding: unlike a damaged chunk, a resume cannot repair it.
    """


@contextlib.contextmanager
def _structure(folder):
    """Reading the store's groups and arrays, whose damage is a :class:`DamagedStoreError`.

    A missing group or array, or metadata that does not decode: one error naming the
    folder.
    """
    try:
        yield
    except (DamagedResultsError, DamagedStoreError):
        raise
    except (KeyError, ValueError, OSError, AttributeError) as exc:
        what = " ".join(str(exc).split()) or type(exc).__name__
        raise DamagedStoreError(
            f"{folder}: the Zarr store {_ZARR} is damaged (a group, an array or its "
            f"metadata is missing or does not decode: {type(exc).__name__}: {what}); a "
            "resume cannot repair it: run the sweep into a new folder.") from None


def _open_group(zarr, path, mode):
    if _zarr3(zarr):
        return zarr.open_group(store=str(path), mode=mode, zarr_format=2)
    return zarr.open_group(store=str(path), mode=mode)  # pragma: no cover


def _package_version():
    from .._version import __version__

    return __version__


def _read_manifest(path):
    manifest = pathlib.Path(path) / "manifest.json"
    try:
        data = json.loads(manifest.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{manifest} is unreadable ({exc}); the folder is not a complete "
                         "sweep results folder.") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{manifest} is not a gaussian_pde sweep manifest "
                         f"(format {data.get('format') if isinstance(data, dict) else None!r}).")
    return data


def _spec_difference(a, b):
    """Dotted keys whose values differ between two nested spec dicts."""
    keys = []
    for table in sorted(set(a) | set(b)):
        ta, tb = a.get(table, {}), b.get(table, {})
        for key in sorted(set(ta) | set(tb)):
            if ta.get(key) != tb.get(key):
                keys.append(f"{table}.{key}: {ta.get(key)!r} (stored) vs {tb.get(key)!r}")
    return keys


class SweepStore:
    """A results folder: created for a specification, or reopened to resume it.

    Parameters
    ----------
    path : path-like
        The results folder.
    spec : SweepSpec
        The specification; an existing folder must hold the same one (and the same package
        version), otherwise :class:`ValueError` says how they differ and how to start fresh.
    """

    def __init__(self, path, spec):
        self.path = pathlib.Path(path)
        self.spec = spec
        self._zarr = _zarr()
        manifest = _read_manifest(self.path) if self.path.is_dir() else None
        if manifest is None:
            self._create()
        else:
            self._check(manifest)
        self._arrays = {}
        with _structure(self.path):
            self.root = _open_group(self._zarr, self.path / _ZARR, "r+")
            #: blocks with integrity records (all, unless written before records existed)
            self._recorded = {(a, d) for a, d in spec.blocks
                              if _RECORD in self.root[f"{a}/d{d}"]}

    @property
    def verified(self):
        """Whether every task stored from now on (and before) carries an integrity record."""
        return len(self._recorded) == len(self.spec.blocks)

    # ------------------------------------------------------------------ creation
    def _metadata(self):
        return {"format": FORMAT, "spec": self.spec.to_dict(),
                "fingerprint": self.spec.fingerprint, "package": "gaussian_pde",
                "package_version": _package_version(), "n_tasks": self.spec.n_tasks,
                "n_settings": self.spec.n_settings, "statuses": list(STATUSES),
                "outcomes": list(OUTCOMES), "integrity": INTEGRITY}

    def _create(self):
        path = self.path
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise ValueError(f"{path} exists and is not a sweep results folder (no "
                             "manifest.json); choose a new --out folder.")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            mode = plain_mode(path, directory=True)
            tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.init-", dir=path.parent))
            os.chmod(tmp, mode)   # mkdtemp gives 0o700 whatever the umask
        except OSError as exc:   # e.g. below /proc, or a read-only file system
            raise ValueError(f"`out` cannot be created as a sweep results folder: {path} "
                             f"({exc.strerror or exc}).") from None
        try:
            meta = self._metadata()
            root = _open_group(self._zarr, tmp / _ZARR, "w")
            root.attrs.update(meta)
            spec, zarr = self.spec, self._zarr
            grid = time_grid(spec)
            t = _create_array(zarr, root, "time", grid.shape, grid.shape, "f8", np.nan,
                              ["time"])
            t[:] = grid
            for attention, d in spec.blocks:
                g = root.require_group(attention).require_group(f"d{d}")
                g.attrs.update({"attention": attention, "d": d})
                layout = dict(result_layout(spec, d), done=((), "bool", False))
                rows = min(spec.batch_size, spec.draws)   # a chunk holds what a task stores
                for name, (shape, dtype, fill) in layout.items():
                    dims = _DIMS.get(name, ["draw"])
                    _create_array(zarr, g, name, (spec.draws,) + shape,
                                  (rows,) + shape, dtype, fill, dims)
                names = list(result_layout(spec, d))
                n = len(names) + 1
                rec = _create_array(zarr, g, _RECORD, (spec.tasks_per_block, n), (1, n),
                                    "u8", 0, ["task", "array"])
                rec.attrs.update({"arrays": names, "algorithm": INTEGRITY,
                                  "description": "per task (row) and array (column): "
                                  "64-bit BLAKE2b (person 'gaussian_pde') of "
                                  "'name:dtype:shape:' and the C-order bytes of the task's "
                                  "rows, read as a little-endian integer; the last column "
                                  "is that of the row before it, named 'integrity[j]' for "
                                  "row j; a row of zeros: no record"})
            write_text(tmp / "spec.toml", f"# written by gaussian_pde {meta['package_version']}"
                       f"; fingerprint {meta['fingerprint']}\n" + spec.to_toml())
            write_json(tmp / "manifest.json", meta)  # last: its presence marks a whole folder
            if path.exists():
                path.rmdir()  # empty (checked above)
            os.rename(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _check(self, manifest):
        fresh = (f"To start fresh, delete the folder (rm -r {self.path}) or pass another "
                 "--out; to continue it, run with the specification stored in "
                 f"{self.path / 'spec.toml'}.")
        if manifest.get("fingerprint") != self.spec.fingerprint:
            diff = _spec_difference(manifest.get("spec", {}), self.spec.to_dict())
            raise ValueError(f"{self.path} holds results of a different sweep specification "
                             f"(differs in {'; '.join(diff) or 'its fingerprint'}); refusing "
                             f"to mix them. {fresh}")
        version = _package_version()
        if manifest.get("package_version") != version:
            raise ValueError(f"{self.path} was written by gaussian_pde "
                             f"{manifest.get('package_version')}, this is {version}; resuming "
                             f"would mix results of two versions. {fresh}")

    # ------------------------------------------------------------------ tasks
    def _array(self, attention, d, name):
        key = f"{attention}/d{d}/{name}"
        arr = self._arrays.get(key)
        if arr is None:
            arr = self._arrays[key] = self.root[key]
        return arr

    def done_tasks(self):
        """Sorted list of the task indices flagged as stored.

        A ``done`` chunk that does not decode counts as not stored; :meth:`repair`
        verifies the stored data.
        """
        spec, done = self.spec, []
        per = spec.tasks_per_block
        for b, (attention, d) in enumerate(spec.blocks):
            rows = _read_rows(self._array(attention, d, "done"), False, lambda j, exc: None)
            for j in range(per):
                lo = j * spec.batch_size
                if rows[lo:lo + spec.batch_size].all():
                    done.append(b * per + j)
        return done

    def missing_tasks(self):
        """Task indices still to compute, in order."""
        done = set(self.done_tasks())
        return [i for i in range(self.spec.n_tasks) if i not in done]

    def repair(self):
        """Verify every stored task; clear the flag and record of the damaged ones.

        Returns
        -------
        dict
            Task index -> list of what was wrong, for the tasks cleared (now missing, so
            that a resume recomputes them). The ``time`` array is rewritten if damaged.
        """
        spec, damaged = self.spec, {}
        for b, (attention, d) in enumerate(spec.blocks):
            with _structure(self.path):
                group = self.root[f"{attention}/d{d}"]
            _, problems, _, _ = _check_block(spec, group, b,
                                             attention, d, self.path)
            damaged.update(problems)
        for index in sorted(damaged):
            attention, d, lo, hi = spec.task(index)
            # whole chunks are written, so a chunk that does not decode is never read here
            self._array(attention, d, "done")[lo:hi] = False
            if (attention, d) in self._recorded:
                j = index % spec.tasks_per_block
                self._array(attention, d, _RECORD)[j:j + 1] = 0
        grid = time_grid(spec)
        if _stored_time(self.root, grid) is None:
            self.root["time"][:] = grid
        return damaged

    def write_task(self, index, arrays, info=None):
        """Store the result of task ``index``.

        Its data chunks first, then its integrity record, then its ``done`` chunk.
        """
        attention, d, lo, hi = self.spec.task(index)
        layout = result_layout(self.spec, d)
        digests = []
        for name, (shape, dtype, _) in layout.items():
            value = np.asarray(arrays[name])
            if value.shape != (hi - lo,) + shape:
                raise ValueError(f"task {index}: `{name}` has shape {value.shape}, expected "
                                 f"{(hi - lo,) + shape}.")
            value = np.ascontiguousarray(value, dtype=dtype)  # as stored and read back
            self._array(attention, d, name)[lo:hi] = value
            digests.append(_digest(name, value))
        if (attention, d) in self._recorded:
            j = index % self.spec.tasks_per_block
            self._array(attention, d, _RECORD)[j:j + 1] = _record_row(j, digests)[None]
        self._array(attention, d, "done")[lo:hi] = True
        line = dict(info or {}, task=int(index), time=time.time())
        with contextlib.suppress(OSError), open(self.path / "tasks.log", "a") as fh:
            fh.write(json.dumps(line) + "\n")


class SweepResults:
    """Results of a sweep loaded into memory (plain NumPy arrays, nothing pickled).

    Attributes
    ----------
    spec : SweepSpec
    package_version : str
    time : ndarray
        The coarse time grid of ``eigenvalues``.
    blocks : dict
        ``(attention, d) -> {name: ndarray}`` with one row per draw, including ``done``
        (rows not yet computed hold the fill values: NaN or -1).
    statuses, outcomes : tuple of str
        Names of the stored ``status`` and ``outcome`` codes.
    verified : bool
        Whether every stored task was checked against its integrity record (``False``
        for a store written before integrity records existed: see the module notes).
    """

    def __init__(self, spec, package_version, time_, blocks, statuses, outcomes,
                 verified=True):
        self.spec = spec
        self.verified = bool(verified)
        self.package_version = package_version
        self.time = time_
        self.blocks = blocks
        self.statuses = tuple(statuses)
        self.outcomes = tuple(outcomes)

    @property
    def n_done(self):
        """Number of settings computed."""
        return int(sum(b["done"].sum() for b in self.blocks.values()))

    @property
    def complete(self):
        """Whether every setting is computed."""
        return self.n_done == self.spec.n_settings

    def __repr__(self):
        return (f"SweepResults({len(self.blocks)} blocks, {self.n_done}/"
                f"{self.spec.n_settings} settings, gaussian_pde {self.package_version})")


def load_results(path):
    """Load a results folder written by :func:`gaussian_pde.sweep.run_sweep`.

    Works on a partial (interrupted) sweep too: see ``SweepResults.blocks[...]["done"]``.
    Every stored task is verified against its integrity record first.

    Raises
    ------
    DamagedResultsError
        (a :class:`ValueError`) naming the damaged tasks and their chunk files, if a
        stored task's chunk was truncated, deleted or overwritten; rerunning the sweep on
        the folder recomputes them.
    """
    path = pathlib.Path(path)
    manifest = _read_manifest(path) if path.is_dir() else None
    if manifest is None:
        raise ValueError(f"{path} is not a sweep results folder (no manifest.json).")
    spec = SweepSpec.from_dict(manifest["spec"], source=path / "manifest.json")
    zarr = _zarr()
    with _structure(path):
        root = _open_group(zarr, path / _ZARR, "r")
    blocks, problems, orphans, verified = {}, {}, [], True
    for b, (attention, d) in enumerate(spec.blocks):
        with _structure(path):
            group = root[f"{attention}/d{d}"]
        arrays, damaged, lost, recorded = _check_block(spec, group, b, attention, d, path)
        names = list(result_layout(spec, d)) + ["done"]
        blocks[(attention, d)] = {name: arrays[name] for name in names}
        problems.update(damaged)
        orphans += lost
        verified &= recorded
    rerun = (f"rerun the sweep on this folder, which recomputes exactly the damaged tasks: "
             f"gaussian-pde sweep run {path / 'spec.toml'} --out {path} (or run_sweep(spec, "
             f"'{path}'))")
    if problems:
        raise DamagedResultsError(
            f"{path} holds {len(problems)} damaged task(s) (a chunk file truncated, deleted "
            f"or overwritten): {_describe(spec, problems)}. Refusing to load results that "
            f"would summarize wrongly; to repair, {rerun}.", problems)
    grid = time_grid(spec)
    stored = _stored_time(root, grid)
    if stored is None:
        raise DamagedResultsError(
            f"{path}: the time grid ({_ZARR}/time) does not decode or differs from the "
            f"specification's; to repair, {rerun}.", {})
    if orphans:
        warnings.warn(f"{path}: task(s) {', '.join(map(str, orphans))} have an integrity "
                      "record but no done flag (interrupted while being stored, or their "
                      "done chunk was deleted): they count as not computed; to compute "
                      f"them, {rerun}.", SweepIntegrityWarning, stacklevel=2)
    if not verified:
        warnings.warn(f"{path} was written without integrity records (by a gaussian_pde "
                      "before they existed): only decoding and the status rows were "
                      "checked, so a deleted or overwritten chunk may go unnoticed. Run the "
                      "sweep into a new folder to have it verified.", SweepIntegrityWarning,
                      stacklevel=2)
    return SweepResults(spec, manifest["package_version"], stored, blocks,
                        manifest["statuses"], manifest["outcomes"], verified=verified)
