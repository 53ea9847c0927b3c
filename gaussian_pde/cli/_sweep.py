"""``gaussian-pde sweep``: resumable parameter sweeps (local or on a Dask cluster).

::

    gaussian-pde sweep run SPEC.toml [--out RESULTS] [--scheduler tcp://HOST:PORT]
                                     [--workers N] [--inprocess]
    gaussian-pde sweep summarize RESULTS [--plot FILE | --no-plot]

``run`` is resumable: rerun the same command after an interruption and only the missing
tasks are computed. Its results folder defaults to
``./gaussian_pde_output/sweep/<SPEC file name without .toml>``; its progress bar (stderr)
is turned off by ``--no-progress`` or ``--quiet``. ``summarize`` draws its figure into
``RESULTS/summary.png`` unless ``--plot`` says otherwise.
"""

from __future__ import annotations

import pathlib
import sys

from .._common.validation import validate_positive
from ._options import check_output_dir, default_out, output_dir, whole_number


def default_results(spec):
    """The default results folder of ``sweep run SPEC``."""
    return pathlib.Path(default_out("sweep")) / pathlib.Path(spec).stem


def add_arguments(parser):
    sub = parser.add_subparsers(dest="sweep_command", metavar="{run,summarize}")
    sub.required = True
    p = sub.add_parser("run", help="run or resume a sweep",
                       description="Run a sweep, or resume it: tasks already stored in "
                                   "--out are not recomputed.")
    p.add_argument("spec", help="sweep specification (TOML)")
    p.add_argument("--out", default=None, metavar="FOLDER",
                   help="results folder, created or resumed (default: "
                        f"{default_results('SPEC')}, after the spec file's name)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler", default=None,
                       help="address of an existing Dask scheduler, e.g. tcp://HOST:8786 "
                            "(default: start a local cluster on 127.0.0.1)")
    where.add_argument("--inprocess", action="store_true",
                       help="run the tasks in this process, without Dask")
    p.add_argument("--workers", type=whole_number, default=None,
                   help="worker processes of the local cluster (default: one per core)")
    p.add_argument("--connect-timeout", type=float, default=10.0,
                   help="seconds to wait for the scheduler (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar on stderr (the same as --quiet)")
    s = sub.add_parser("summarize", help="print and plot outcome fractions and rank histograms",
                       description="Print outcome fractions and limit-rank counts by "
                                   "attention type and dimension, and plot them.")
    s.add_argument("results", help="results folder of a sweep")
    s.add_argument("--plot", default=None, metavar="FILE",
                   help="figure file, its folder created if needed "
                        "(default: RESULTS/summary.png)")
    s.add_argument("--no-plot", action="store_true", help="print only")


def run(args):
    from .. import sweep

    if args.sweep_command == "run":
        if args.workers is not None and (args.scheduler or args.inprocess):
            raise ValueError("--workers applies only to the local cluster (no --scheduler, "
                             "no --inprocess).")
        if args.workers is not None:
            sweep.check_local_workers(args.workers, "--workers")
        validate_positive(args.connect_timeout, "--connect-timeout")
        scheduler = "inprocess" if args.inprocess else args.scheduler
        out = check_output_dir(args.out if args.out is not None
                               else default_results(args.spec))
        quiet = args.no_progress or getattr(args, "quiet", False)
        try:
            report = sweep.run_sweep(args.spec, out, scheduler=scheduler,
                                     workers=args.workers, progress=not quiet,
                                     connect_timeout=args.connect_timeout)
        except sweep.SchedulerUnreachableError as exc:
            print(f"gaussian-pde sweep: error: {exc}", file=sys.stderr)
            return 3
        print(f"gaussian-pde sweep: {report.n_computed} task(s) computed, "
              f"{report.n_skipped} already stored, {report.n_tasks} in all "
              f"({report.n_settings_computed} settings in {report.seconds:.1f} s on "
              f"{report.scheduler}); results in {report.path}")
        return 0
    if not args.plot and not (pathlib.Path(args.results) / "manifest.json").is_file():
        # the default figure goes into RESULTS: say what RESULTS is, not that it takes no file
        raise ValueError(f"{args.results} is not a sweep results folder (no manifest.json).")
    path = None
    if not args.no_plot:
        path = pathlib.Path(args.plot) if args.plot else pathlib.Path(args.results) / "summary.png"
        if path.is_dir():
            raise ValueError(f"`--plot` is a folder, not a file: {path}.")
        check_output_dir(path.parent, "--plot")
    results = sweep.load_results(args.results)
    rows = sweep.summarize(results)
    print(f"sweep in {args.results}: {results.n_done}/{results.spec.n_settings} settings "
          f"computed (gaussian_pde {results.package_version})")
    print(sweep.format_summary(rows))
    if path is not None:
        output_dir(path.parent, "--plot")
        sweep.plot_summary(rows, path)
        print(f"figure: {path}")
    return 0
