"""``gaussian-pde stabilizers``: the residual / normalisation stabiliser study.

Writes ``summary.json``, ``stabilizers.png`` and ``report.md`` into ``--out``
(see :mod:`gaussian_pde.studies._stabilizers`).
"""

from __future__ import annotations


def add_arguments(parser):
    """Options of the subcommand."""
    parser.add_argument("--out", required=True, help="output folder (created if needed)")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (2 weight draws, 6 layers, 150 particles)")
    parser.add_argument("--seed", type=int, default=0,
                        help="first weight-draw seed (draws use seed, seed+1, ...)")


def run(args) -> int:
    """Run the study and write the report."""
    from ..studies._stabilizers import run_study, write_study

    if args.seed < 0:
        raise ValueError(f"`--seed` must be non-negative, got {args.seed}.")
    if args.quick:
        res = run_study(n_layers=6, seeds=(args.seed, args.seed + 1), n_particles=150,
                        n_per_dim=4)
    else:
        res = run_study(n_layers=12, seeds=tuple(args.seed + i for i in range(4)),
                        n_particles=600)
    summary = write_study(res, args.out)
    for key, c in summary["claims"].items():
        print(key, {k: (round(v, 4) if isinstance(v, float) else v) for k, v in c.items()})
    return 0
