"""``gaussian-pde clusters``: the Gaussian-mixture closure against particles.

Writes ``ellipses_d2.png``, ``ellipses_d3.png`` (and ``ellipses_all_*.png``),
``cluster_counts.png``, ``merge_times.png``, ``scaling.png``, ``summary.json`` and
``report.md`` into ``--out`` (default ``./gaussian_pde_output/clusters``; see
:mod:`gaussian_pde.studies._clusters`). Progress: one line on stderr per case, unless
``--quiet``.
"""

from __future__ import annotations

import json

from ._options import add_out_argument, default_out, output_dir
from ._progress import progress_for

DEFAULT_OUT = default_out("clusters")


def add_arguments(parser):
    """Options of the subcommand."""
    add_out_argument(parser, DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true",
                        help="three cases, 150 particles, depth 2, a small n^-1/2 check "
                             "(instead of the full grid of 72 cases)")
    parser.add_argument("--n", type=int, default=None,
                        help="particles per case (default 400, 150 with --quick)")


def run(args) -> int:
    """Run the study and write the report."""
    from ..studies._clusters import _cases, run_clusters, write_clusters

    out = output_dir(args.out)
    if args.n is not None and args.n < 20:
        raise ValueError(f"`--n` must be at least 20, got {args.n}.")
    progress = progress_for(args, len(_cases(args.quick)) + 2)
    res = run_clusters(quick=args.quick, n=args.n, progress=progress)
    summary = write_clusters(res, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if progress is not None:
        progress(f"report: {out / 'report.md'}")
    return 0
