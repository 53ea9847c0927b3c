r"""What the validation notebooks share: their settings and the particles-against-ODE block.

Every notebook in ``notebooks/`` runs in one of two modes, read from the environment:

``GAUSSIAN_PDE_NOTEBOOK_QUICK=1``
    the quick mode (small sizes; the test suite and the CI docs build);
``GAUSSIAN_PDE_NOTEBOOK_OUT``
    the folder of the figures (default ``notebook_figures``);
``GAUSSIAN_PDE_NOTEBOOK_RESULTS``
    full mode only: the folder of the stored runs at the largest number of tokens,
    ``<name>.npz`` (``python docs/make_results.py --notebooks`` writes them, the docs
    build reads them);
``GAUSSIAN_PDE_NOTEBOOK_WRITE=1``
    make every run and write the stored ones.

:func:`notebook_settings` reads them into a :class:`NotebookSettings`, and
:func:`notebook_compare` is the block that compares a notebook's particles with the moment
ODE (docs/math.md section 8) through :func:`~gaussian_pde.studies.stored_compare` and saves
the figures of the report.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

from .._common.validation import validate_choices, validate_int, validate_nonempty
from ._compare import stored_compare
from ._compare_plots import all_figures, plot_diagnostics, plot_errors, plot_moments, plot_scaling

__all__ = ["NotebookSettings", "notebook_compare", "notebook_settings"]

#: the environment variables that :func:`notebook_settings` reads
ENVIRONMENT = {"quick": "GAUSSIAN_PDE_NOTEBOOK_QUICK", "out": "GAUSSIAN_PDE_NOTEBOOK_OUT",
               "results": "GAUSSIAN_PDE_NOTEBOOK_RESULTS", "write": "GAUSSIAN_PDE_NOTEBOOK_WRITE"}
#: the figures of a :class:`~gaussian_pde.studies.CompareReport`, by the name in their file
FIGURES = {"moments": plot_moments, "diagnostics": plot_diagnostics, "errors": plot_errors,
           "scaling": plot_scaling}
#: resolution of the saved figures (dots per inch)
DPI = 90


@dataclasses.dataclass(frozen=True)
class NotebookSettings:
    """How a validation notebook runs: its mode, sizes, seeds and files.

    Attributes
    ----------
    name : str
        The notebook's name, the stem of its files (``notebooks/<name>.py``).
    quick : bool
        Quick mode (small sizes).
    out : pathlib.Path
        Folder of the figures.
    sizes : tuple of int or None
        Numbers of tokens of this mode (``None``: the notebook sets none here).
    seeds : range or None
        Seeds of this mode (``None``: the notebook sets none here).
    results : pathlib.Path or None
        Folder of the stored runs; always ``None`` in quick mode, where every run is made.
    write : bool
        Make every run and write the stored ones (only with a ``results`` folder).
    """

    name: str
    quick: bool
    out: pathlib.Path
    sizes: tuple | None
    seeds: range | None
    results: pathlib.Path | None
    write: bool

    def store(self, *parts):
        """The file of stored runs, ``<results>/<name>[_<part>...].npz``; ``None`` without one.

        Parameters
        ----------
        *parts : str
            Appended to the name with ``_`` (a notebook with several stored comparisons).

        Returns
        -------
        pathlib.Path or None
        """
        if self.results is None:
            return None
        return self.results / ("_".join((self.name, *parts)) + ".npz")

    def figure_path(self, *parts):
        """The file of a figure, ``<out>/<name>[_<part>...].png``.

        Parameters
        ----------
        *parts : str
            Appended to the name with ``_`` (``"moments"`` gives ``<name>_moments.png``).

        Returns
        -------
        pathlib.Path
        """
        return self.out / ("_".join((self.name, *parts)) + ".png")


def _counts(value, name):
    if value is None:
        return None
    return tuple(validate_int(v, name, minimum=1) for v in validate_nonempty(value, name))


def notebook_settings(name, *, quick_sizes=None, full_sizes=None, quick_seeds=None,
                      full_seeds=None, environ=None):
    """Read a validation notebook's settings from the environment.

    The quick mode is on when ``GAUSSIAN_PDE_NOTEBOOK_QUICK`` is ``"1"``; the figures go to
    ``GAUSSIAN_PDE_NOTEBOOK_OUT`` (default ``notebook_figures``, created here); in the full
    mode the stored runs are read from ``GAUSSIAN_PDE_NOTEBOOK_RESULTS`` (unset or empty:
    every run is made), and written there when ``GAUSSIAN_PDE_NOTEBOOK_WRITE`` is ``"1"``.

    Parameters
    ----------
    name : str
        The notebook's name, the stem of its stored runs and figures.
    quick_sizes, full_sizes : sequence of int or None
        Numbers of tokens in the quick and the full mode (both or neither).
    quick_seeds, full_seeds : int or None
        Numbers of seeds in the quick and the full mode (both or neither); the seeds are
        ``range(count)``.
    environ : mapping or None
        Where to read the variables (default: ``os.environ``).

    Returns
    -------
    NotebookSettings

    Raises
    ------
    TypeError
        If ``name`` is not a string, or a size or seed count is not an integer.
    ValueError
        If ``name`` is empty or holds a path separator, a size or count is below 1, or
        only one of a quick/full pair is given.

    Examples
    --------
    >>> s = notebook_settings("l2", quick_sizes=[100, 400], full_sizes=[500, 2000],
    ...                       quick_seeds=3, full_seeds=5,
    ...                       environ={"GAUSSIAN_PDE_NOTEBOOK_QUICK": "1",
    ...                                "GAUSSIAN_PDE_NOTEBOOK_OUT": "."})
    >>> s.quick, s.sizes, s.seeds, s.store(), s.figure_path("moments").name
    (True, (100, 400), range(0, 3), None, 'l2_moments.png')
    """
    if not isinstance(name, str):
        raise TypeError(f"`name` must be a string (the notebook's file stem), got "
                        f"{type(name).__name__}.")
    if not name or "/" in name or os.sep in name:
        raise ValueError(f"`name` must be a file stem without a folder, got {name!r}.")
    for quick_arg, full_arg, a, b in (("quick_sizes", "full_sizes", quick_sizes, full_sizes),
                                      ("quick_seeds", "full_seeds", quick_seeds, full_seeds)):
        if (a is None) != (b is None):
            raise ValueError(f"`{quick_arg}` and `{full_arg}` must be given together, got "
                             f"{a!r} and {b!r}.")
    env = os.environ if environ is None else environ
    quick = env.get(ENVIRONMENT["quick"]) == "1"
    sizes = {"quick": _counts(quick_sizes, "quick_sizes"), "full": _counts(full_sizes, "full_sizes")}
    seeds = {mode: None if count is None else range(validate_int(count, f"{mode}_seeds", minimum=1))
             for mode, count in (("quick", quick_seeds), ("full", full_seeds))}
    mode = "quick" if quick else "full"
    out = pathlib.Path(env.get(ENVIRONMENT["out"], "notebook_figures"))
    out.mkdir(parents=True, exist_ok=True)
    results = None if quick else env.get(ENVIRONMENT["results"]) or None
    results = results and pathlib.Path(results)
    write = results is not None and env.get(ENVIRONMENT["write"]) == "1"
    return NotebookSettings(name=name, quick=quick, out=out, sizes=sizes[mode], seeds=seeds[mode],
                            results=results, write=write)


def notebook_compare(settings, attention, mean0, cov0, *parts, figures=None, **kwargs):
    r"""Particles against the moment ODE at a notebook's sizes and seeds, with its figures.

    Runs :func:`~gaussian_pde.studies.stored_compare` with ``n=settings.sizes``,
    ``seeds=settings.seeds``, the stored runs ``settings.store(*parts)`` and
    ``write=settings.write``: the particle moments :math:`(\bar x_n, \Sigma_n)` against the
    solution :math:`(\alpha, \Sigma)` of the moment ODEs, with errors of order
    :math:`n^{-1/2}` (docs/math.md section 8). Each figure is saved as
    ``settings.figure_path(*parts, figure)`` and left open (the docs gallery shows it).

    Parameters
    ----------
    settings : NotebookSettings
        From :func:`notebook_settings`, with sizes and seeds.
    attention, mean0, cov0
        As for :func:`~gaussian_pde.studies.compare`.
    *parts : str
        Name the stored runs and figures of one of several comparisons in a notebook
        (``"flat"``: ``<name>_flat.npz``, ``<name>_flat_moments.png``).
    figures : sequence of str or None
        Which figures, in this order, among ``"moments"``, ``"diagnostics"``, ``"errors"``
        and ``"scaling"``; ``None``: :func:`~gaussian_pde.studies.all_figures`.
    **kwargs
        Passed to :func:`~gaussian_pde.studies.compare` (``t_eval``, ``method``, ``dt``, ...).

    Returns
    -------
    CompareReport

    Raises
    ------
    TypeError
        If ``settings`` is not a :class:`NotebookSettings`.
    ValueError
        If ``settings`` has no sizes or seeds, or ``figures`` names an unknown figure.
    """
    if not isinstance(settings, NotebookSettings):
        raise TypeError(f"`settings` must be a NotebookSettings (from notebook_settings), got "
                        f"{type(settings).__name__}.")
    if settings.sizes is None or settings.seeds is None:
        raise ValueError("`settings` must have sizes and seeds (notebook_settings(..., "
                         "quick_sizes=..., full_sizes=..., quick_seeds=..., full_seeds=...)).")
    if figures is not None:
        figures = validate_choices(figures, "figures", FIGURES)
    report = stored_compare(settings.store(*parts), attention, mean0, cov0, n=settings.sizes,
                            seeds=settings.seeds, write=settings.write, **kwargs)
    drawn = (all_figures(report) if figures is None
             else {figure: FIGURES[figure](report) for figure in figures})
    for figure, fig in drawn.items():
        fig.savefig(settings.figure_path(*parts, figure), dpi=DPI)
    return report
