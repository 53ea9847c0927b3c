"""Storage of sweep results: a Zarr store, one chunk per task, written atomically.

Layout of a results folder ``RESULTS``::

    RESULTS/manifest.json      format, specification, fingerprint, package version
    RESULTS/spec.toml          the complete specification (every default spelled out)
    RESULTS/results.zarr/      Zarr (format 2) group; root attributes hold the same metadata
        <attention>/d<d>/done         bool (draws,): row written (the completion flag)
        <attention>/d<d>/status       int8 (draws,): code into attrs["statuses"]
        <attention>/d<d>/...          the recorded arrays, shape (draws, ...)
        time                          float (grid,): the coarse time grid
    RESULTS/tasks.log          one JSON line per stored task (informative, not authoritative)

Every array is chunked along the draws with ``batch_size`` rows, so a task owns exactly one
chunk of each array and no two tasks share a file. Zarr writes each chunk to a temporary
file and renames it into place; a task writes its data chunks first and its ``done`` chunk
last, so after an interruption at any instant (``kill -9`` included) a task is either
complete and flagged or unflagged, and an unflagged task is recomputed, overwriting
whatever partial chunks it left with the same bytes. Nothing is pickled: the store opens
with any Zarr reader (zarr-python 2 or 3, xarray, zarr.js, Julia's Zarr.jl).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import tempfile
import time

import numpy as np

from .._common.io import write_json, write_text
from ._compute import OUTCOMES, STATUSES, result_layout, time_grid
from ._spec import SweepSpec

__all__ = ["SweepStore", "SweepResults", "load_results", "FORMAT"]

#: identifies a results folder written by this module
FORMAT = "gaussian_pde.sweep/1"
_ZARR = "results.zarr"

_DIMS = {"final_cov": ["draw", "row", "col"], "eigenvalues": ["draw", "time", "eig"]}


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
        self.root = _open_group(self._zarr, self.path / _ZARR, "r+")
        self._arrays = {}

    # ------------------------------------------------------------------ creation
    def _metadata(self):
        return {"format": FORMAT, "spec": self.spec.to_dict(),
                "fingerprint": self.spec.fingerprint, "package": "gaussian_pde",
                "package_version": _package_version(), "n_tasks": self.spec.n_tasks,
                "n_settings": self.spec.n_settings, "statuses": list(STATUSES),
                "outcomes": list(OUTCOMES)}

    def _create(self):
        path = self.path
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise ValueError(f"{path} exists and is not a sweep results folder (no "
                             "manifest.json); choose a new --out folder.")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{path.name}.init-", dir=path.parent))
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
                for name, (shape, dtype, fill) in layout.items():
                    dims = _DIMS.get(name, ["draw"])
                    _create_array(zarr, g, name, (spec.draws,) + shape,
                                  (spec.batch_size,) + shape, dtype, fill, dims)
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
        """Sorted list of the task indices whose results are stored."""
        spec, done = self.spec, []
        per = spec.tasks_per_block
        for b, (attention, d) in enumerate(spec.blocks):
            rows = np.asarray(self._array(attention, d, "done")[:])
            for j in range(per):
                lo = j * spec.batch_size
                if rows[lo:lo + spec.batch_size].all():
                    done.append(b * per + j)
        return done

    def missing_tasks(self):
        """Task indices still to compute, in order."""
        done = set(self.done_tasks())
        return [i for i in range(self.spec.n_tasks) if i not in done]

    def write_task(self, index, arrays, info=None):
        """Store the result of task ``index``: data chunks first, then its ``done`` chunk."""
        attention, d, lo, hi = self.spec.task(index)
        for name, (shape, _, _) in result_layout(self.spec, d).items():
            value = np.asarray(arrays[name])
            if value.shape != (hi - lo,) + shape:
                raise ValueError(f"task {index}: `{name}` has shape {value.shape}, expected "
                                 f"{(hi - lo,) + shape}.")
            self._array(attention, d, name)[lo:hi] = value
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
    """

    def __init__(self, spec, package_version, time_, blocks, statuses, outcomes):
        self.spec = spec
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
    """
    path = pathlib.Path(path)
    manifest = _read_manifest(path) if path.is_dir() else None
    if manifest is None:
        raise ValueError(f"{path} is not a sweep results folder (no manifest.json).")
    spec = SweepSpec.from_dict(manifest["spec"], source=path / "manifest.json")
    zarr = _zarr()
    root = _open_group(zarr, path / _ZARR, "r")
    blocks = {}
    for attention, d in spec.blocks:
        g = root[f"{attention}/d{d}"]
        names = list(result_layout(spec, d)) + ["done"]
        blocks[(attention, d)] = {name: np.asarray(g[name][:]) for name in names}
    return SweepResults(spec, manifest["package_version"], np.asarray(root["time"][:]),
                        blocks, manifest["statuses"], manifest["outcomes"])
