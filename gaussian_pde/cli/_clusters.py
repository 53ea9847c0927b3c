"""``gaussian-pde clusters``: the Gaussian-mixture closure against particles.

With ``--trust``: the trust map of the closure's bias instead (``trust.md``,
``trust_map.png``, ``trust.json``; :mod:`gaussian_pde.studies._trust`).

Otherwise writes ``ellipses_d2.png``, ``ellipses_d3.png`` (and ``ellipses_all_*.png``),
``cluster_counts.png``, ``merge_times.png``, ``scaling.png``, ``summary.json`` and
``report.md`` into ``--out`` (default ``./gaussian_pde_output/clusters``; see
:mod:`gaussian_pde.studies._clusters`). Progress: one line on stderr per case, unless
``--quiet``.
"""

from __future__ import annotations

import json

from .._common.validation import validate_int
from ..closure import mixture_field_kernels
from ..integrate import compile_on_two_cores
from ._options import add_out_argument, default_out, output_dir, whole_number
from ._progress import progress_for

DEFAULT_OUT = default_out("clusters")


def add_arguments(parser):
    """Options of the subcommand."""
    add_out_argument(parser, DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true",
                        help="three cases, 150 particles, depth 2, a small n^-1/2 check "
                             "(instead of the full grid of 72 cases)")
    parser.add_argument("--n", type=whole_number, default=None,
                        help="particles per case, at least 20 (default 400, 150 with --quick)")
    parser.add_argument("--trust", action="store_true",
                        help="instead of the grid: the trust map of the closure's bias "
                             "(softmax / L2 / multi-head x attention scale x separation x d, "
                             "writes trust.md, trust_map.png, trust.json) and, without "
                             "--quick, the bias, former ratio and merge-gap sources of the "
                             "study's softmax cases")


def run(args) -> int:
    """Run the study and write the report."""
    from ..studies import check_case_memory, cluster_cases, run_clusters, write_clusters

    if args.n is not None:
        validate_int(args.n, "--n", minimum=20)
        if not args.trust:             # the grid's exact W2 distances (n x n)
            check_case_memory(args.n, "--n")
    out = output_dir(args.out)
    # a fresh machine: the engine in a second process beside the mixture's kernel
    compile_on_two_cores((mixture_field_kernels,), fields=False)
    if args.trust:
        return _run_trust(args, out)
    progress = progress_for(args, len(cluster_cases(args.quick)) + 2)
    res = run_clusters(quick=args.quick, n=args.n, progress=progress)
    summary = write_clusters(res, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    if progress is not None:
        progress(f"report: {out / 'report.md'}")
    return 0


def _run_trust(args, out) -> int:
    """``--trust``: :func:`gaussian_pde.studies._trust.run_trust` and its report."""
    from ..studies import (
        TRUST_GRID,
        growth_study,
        merge_gap_sources,
        remeasure_study,
        run_trust,
        study_case_count,
        write_trust,
    )

    grid = {} if args.n is None else {"n": args.n}
    n_cells = len(TRUST_GRID["kinds"]) * (2 * 2 if args.quick else len(TRUST_GRID["q"])
                                          * len(TRUST_GRID["radius"]) * len(TRUST_GRID["d"]))
    n_study = 0 if args.quick else study_case_count()
    progress = progress_for(args, n_cells + 3 * n_study + 1)
    res = run_trust(quick=args.quick, grid=grid, progress=progress)
    study = growth = merges = None
    if not args.quick:
        study = remeasure_study(progress=progress)
        growth = growth_study(progress=progress)
        merges = merge_gap_sources(progress=progress)
    write_trust(res, out, study=study, growth=growth, merges=merges)
    if progress is not None:
        progress(f"report: {out / 'trust.md'}")
    return 0
