"""``gaussian-pde reproduce``: regenerate the paper's Gaussian figures and a report."""

from __future__ import annotations

DEFAULT_OUT = "gaussian_pde_reproduce"


def add_arguments(parser):
    """Options of ``gaussian-pde reproduce``."""
    parser.add_argument("--out", default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="small grids and 10 settings per dimension (for tests)")
    parser.add_argument("--paper-tol", type=float, default=1e-3,
                        help="the paper protocol's stopping tolerance on the Frobenius norm "
                             "of the right-hand side (default: %(default)s)")


def run(args):
    """Run the reproduction; returns the exit status."""
    from ..studies._reproduce import reproduce

    res = reproduce(args.out, seed=args.seed, quick=args.quick,
                    paper_tol=getattr(args, "paper_tol", 1e-3))
    t = res["timing"]
    print(f"gaussian-pde reproduce: wrote {res['report']} and {len(res['figures'])} figures "
          f"({t['compute_s']:.2f} s compute, {t['wall_s']:.2f} s with figures)")
    return 0
