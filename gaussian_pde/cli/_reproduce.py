"""``gaussian-pde reproduce``: regenerate the paper's Gaussian figures and a report.

Writes into ``--out`` (default ``./gaussian_pde_output``, the main job's folder: the main
job is this reproduction followed by the built-in examples). Progress: one line on stderr
per regime, histogram dimension and figure, unless ``--quiet``.
"""

from __future__ import annotations

import argparse

from ._options import add_out_argument, default_out, output_dir
from ._progress import progress_for

DEFAULT_OUT = default_out()


def progress_steps():
    """Number of progress messages of :func:`gaussian_pde.studies.reproduce`."""
    from ..studies import progress_steps as steps

    return steps()


def add_arguments(parser):
    """Options of ``gaussian-pde reproduce``."""
    add_out_argument(parser, DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="small grids and 10 settings per dimension (for tests)")
    parser.add_argument("--certify", action=argparse.BooleanOptionalAction, default=False,
                        help="integrate the histogram settings that the classification at "
                             "t = 1e8 leaves open with certified_limits, with their decay "
                             "exponents (about 35 s more CPU); by default (--no-certify) "
                             "they take the rank proved in docs/math.md 4.5")
    parser.add_argument("--protocol", choices=("accurate", "published"), default="accurate",
                        help="'accurate' (default): the reproduction above; 'published': "
                             "replay the published histogram protocol number for number "
                             "(docs/math.md section 9) into published_histograms.json, and "
                             "certify the limit of each of its settings "
                             "(published_certified.json); a later default run into the same "
                             "folder shows both in its report")


def run(args, progress=None):
    """Run the reproduction; returns the exit status.

    ``progress``: the callback to report through (default: a new one for ``args``).
    """
    from ..studies import reproduce

    out = output_dir(args.out)
    if getattr(args, "protocol", "accurate") == "published":
        return _run_published(args, out, progress)
    if progress is None:
        progress = progress_for(args, progress_steps())
    res = reproduce(out, seed=args.seed, quick=args.quick,
                    certify=getattr(args, "certify", False), progress=progress)
    t = res["timing"]
    print(f"gaussian-pde reproduce: wrote {res['report']} and {len(res['figures'])} figures "
          f"({t['compute_s']:.2f} s compute, {t['wall_s']:.2f} s with figures; "
          f"{t['speedup_wall']:.0f}x the published scripts, timed by one step of their "
          "scheme in this run)")
    return 0


def _run_published(args, out, progress):
    """``--protocol published``: the replay of docs/math.md section 9, one line per panel."""
    import time

    from ..studies import write_published_histograms

    if progress is None:
        progress = progress_for(args, 12)
    start = time.perf_counter()
    from ..studies import write_published_certified

    res = write_published_histograms(out, progress=progress, return_paths=True)
    cert = write_published_certified(out, res["paths"], progress=progress)
    print(f"gaussian-pde reproduce --protocol published: wrote {res['files'][0]}, "
          f"{res['files'][1]} and {cert['file']} ({time.perf_counter() - start:.2f} s; "
          f"certified limits {cert['certified_s']:.2f} s)")
    return 0
