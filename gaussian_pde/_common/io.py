"""Atomic file output: a result is written to a temporary file and renamed into place.

An interrupted run never leaves a half-written file under a final name.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import stat
import tempfile

import numpy as np

__all__ = ["atomic_path", "write_text", "write_json", "write_npz", "save_figure",
           "ensure_output_dir", "ensure_output_file", "plain_mode", "write_probe"]


def write_probe(folder):
    """Create and delete a file in ``folder``: the one check root's ``os.access`` cannot fake.

    Returns None when it works, else the reason (``strerror``).
    """
    try:
        fd, probe = tempfile.mkstemp(prefix=".gaussian_pde-probe-", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def ensure_output_dir(path, name="out"):
    """Create ``path`` if needed and check, by writing a probe file, that it takes files.

    ``os.access`` answers yes to root for ``/proc`` or a read-only mount, so the check
    writes (and deletes) a file before any work is done.
    """
    path = pathlib.Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"`{name}` cannot be created as a folder: {path} ({exc.strerror}).") from None
    if not path.is_dir():
        raise ValueError(f"`{name}` is not a writable folder: {path} (it is a file).")
    reason = write_probe(path)
    if reason is not None:
        raise ValueError(f"`{name}` is not a writable folder: {path} ({reason}).")
    return path


def ensure_output_file(path, name="out"):
    """Check, before any work, that a file can be written at ``path`` (its folder is made).

    The path must not be an existing folder, and its folder must take a probe file.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        raise ValueError(f"`{name}` must be a file path, got the folder {path}.")
    ensure_output_dir(path.parent if str(path.parent) else pathlib.Path("."), name)
    return path


def current_umask():
    """The process's file-mode creation mask (read without changing it where possible)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)   # no /proc: set and restore (the only portable way to read it)
    os.umask(mask)
    return mask


def plain_mode(path, directory=False):
    """The permission bits a plain ``open(path, "w")`` (or ``mkdir``) would leave on ``path``.

    An existing file keeps its mode; a new one gets ``0o666 & ~umask`` (``0o777 & ~umask``
    for a folder), which is what :func:`tempfile.mkstemp` (always ``0o600``) does not give.
    """
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return (0o777 if directory else 0o666) & ~current_umask()


@contextlib.contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success.

    The file ends with the mode a plain ``open`` would give it (:func:`plain_mode`).
    """
    path = pathlib.Path(path)
    mode = plain_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix,
                               dir=path.parent)
    try:
        os.fchmod(fd, mode)
    finally:
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
    """Save a matplotlib figure atomically.

    A PNG is compressed at zlib level 1 unless ``pil_kwargs`` says otherwise: the files
    are as small as at the default level 6 (plots are mostly flat colour) and the
    encoding takes half the time.
    """
    path = pathlib.Path(path)
    fmt = path.suffix.lstrip(".") or "png"
    if fmt == "png":
        kwargs.setdefault("pil_kwargs", {"compress_level": 1})
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=fmt, **kwargs)
    return path
