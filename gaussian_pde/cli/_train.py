"""``gaussian-pde train``: train the paper's models side by side with the PDE simulator.

Writes ``summary.json``, ``report.md`` (with the verdict table), ``verdicts.md``, and the
figures ``training_<task>.png``, ``drift_<task>.png`` and ``bridge.png`` into ``--out``
(default ``./gaussian_pde_output/train``; see :mod:`gaussian_pde.training`). Needs the
optional extra ``train`` (JAX, optax); without it the command exits with status 2 and one
line naming the ``pip install`` to run. Progress: one line on stderr per trained (task,
variant) and per bridge, unless ``--quiet``.
"""

from __future__ import annotations

import importlib.util

from ._options import add_out_argument, default_out, output_dir
from ._progress import progress_for

DEFAULT_OUT = default_out("train")
#: what to install when JAX or optax is missing
INSTALL = 'pip install -e ".[train]"'

#: study sizes: the full study and --quick
FULL = dict(seeds=5, learning_rates=(1e-3, 1e-2, 1e-1), n_steps=200, batch=32, depth=4,
            bridge_tokens=(64, 256, 1024), bridge_sequences=4)
QUICK = dict(seeds=2, learning_rates=(1e-3, 1e-1), n_steps=60, batch=16, depth=3,
             bridge_tokens=(64, 256), bridge_sequences=2, optimize=False)


def add_arguments(parser):
    """Options of the subcommand."""
    add_out_argument(parser, DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (2 seeds, 2 learning rates, 60 steps, depth 3)")
    parser.add_argument("--seeds", type=int, default=None, metavar="N",
                        help="number of seeds 0..N-1 (default 5; --quick 2)")


def _missing_extra():
    """The first of JAX and optax that is not installed, or None."""
    for name in ("jax", "optax"):
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


def run(args) -> int:
    """Run the study and write the report."""
    missing = _missing_extra()
    if missing is not None:
        raise ValueError(f"`{missing}` is not installed; the training study needs the "
                         f"`train` extra: {INSTALL}")
    sizes = dict(QUICK if args.quick else FULL)
    n_seeds = sizes.pop("seeds") if args.seeds is None else args.seeds
    if n_seeds < 1:
        raise ValueError(f"`--seeds` must be at least 1, got {n_seeds}.")
    out = output_dir(args.out)
    from ..training import STUDY_TASKS, VARIANTS, run_training_study, write_training_study

    sizes.pop("seeds", None)
    n_bridged = sum(1 for v in VARIANTS if not VARIANTS[v].has_layernorm)
    progress = progress_for(args, len(STUDY_TASKS) * (len(VARIANTS) + n_bridged) + 1)
    res = run_training_study(seeds=tuple(range(n_seeds)), progress=progress, **sizes)
    v = write_training_study(res, out)
    if progress is not None:
        progress(f"report: {out / 'report.md'}")
    for claim, c in v.items():
        print(f"{claim}: holds in {c['holds']} of {c['total']} ({c['criterion']})")
    return 0
