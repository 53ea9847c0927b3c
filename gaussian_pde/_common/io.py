"""Atomic file output: a result is written to a temporary file and renamed into place.

An interrupted run never leaves a half-written file under a final name.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile

import numpy as np

__all__ = ["atomic_path", "write_text", "write_json", "write_npz", "save_figure",
           "ensure_output_dir"]


def ensure_output_dir(path, name="out"):
    """Create ``path`` if needed and check that it is a writable folder."""
    path = pathlib.Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"`{name}` cannot be created as a folder: {path} ({exc.strerror}).") from None
    if not path.is_dir() or not os.access(path, os.W_OK):
        raise ValueError(f"`{name}` is not a writable folder: {path}.")
    return path


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success."""
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix,
                               dir=path.parent)
    os.close(fd)
    try:
        yield pathlib.Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path, text):
    """Write a text file atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return pathlib.Path(path)


def write_json(path, data):
    """Write JSON atomically (NumPy scalars and arrays are converted)."""
    def default(o):
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
        return str(o)

    return write_text(path, json.dumps(data, indent=2, default=default) + "\n")


def write_npz(path, **arrays):
    """Write an ``.npz`` archive (NumPy's open format, no pickled objects) atomically."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **{k: np.asarray(v) for k, v in arrays.items()})
    return pathlib.Path(path)


def save_figure(fig, path, **kwargs):
    """Save a matplotlib figure atomically."""
    path = pathlib.Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", **kwargs)
    return path
