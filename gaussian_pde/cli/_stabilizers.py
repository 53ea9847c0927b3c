"""``gaussian-pde stabilizers``: the residual / normalisation stabiliser study.

Writes ``summary.json``, ``stabilizers.png`` and ``report.md`` into ``--out`` (default
``./gaussian_pde_output/stabilizers``; see :mod:`gaussian_pde.studies._stabilizers`).
Progress: one line on stderr per cell of the grid, unless ``--quiet``.
"""

from __future__ import annotations

from ._options import add_out_argument, default_out, output_dir
from ._progress import progress_for

DEFAULT_OUT = default_out("stabilizers")


def add_arguments(parser):
    """Options of the subcommand."""
    add_out_argument(parser, DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (2 weight draws, 6 layers, 150 particles)")
    parser.add_argument("--seed", type=int, default=0,
                        help="first weight-draw seed (draws use seed, seed+1, ...)")


def run(args) -> int:
    """Run the study and write the report."""
    from ..studies import STUDY_MODES, STUDY_NORMS, run_study, write_study

    out = output_dir(args.out)
    if args.seed < 0:
        raise ValueError(f"`--seed` must be non-negative, got {args.seed}.")
    progress = progress_for(args, len(STUDY_MODES) * len(STUDY_NORMS) + 1)
    if args.quick:
        res = run_study(n_layers=6, seeds=(args.seed, args.seed + 1), n_particles=150,
                        n_per_dim=4, progress=progress)
    else:
        res = run_study(n_layers=12, seeds=tuple(args.seed + i for i in range(4)),
                        n_particles=600, progress=progress)
    summary = write_study(res, out)
    if progress is not None:
        progress(f"report: {out / 'report.md'}")
    for key, c in summary["claims"].items():
        print(key, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in c.items()})
    return 0
