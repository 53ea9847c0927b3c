"""``gaussian-pde train``: train the paper's models side by side with the PDE simulator.

Writes ``summary.json``, ``report.md`` (with the verdict tables), ``verdicts.md``, and the
figures ``training_<task>.png``, ``drift_<task>.png``, ``stability_<task>.png``,
``layer_grads_<task>.png``, ``theory.png`` and ``bridge.png`` into ``--out`` (default
``./gaussian_pde_output/train``; see :mod:`gaussian_pde.training`). Needs the optional
extra ``train`` (JAX, optax); without it the command exits with status 2 and one line
naming the ``pip install`` to run. Progress: one line on stderr per trained group
(task, variant, depth, optimiser setting) and per bridge, unless ``--quiet``.

The learning rates are the API's default grid
(:data:`gaussian_pde.training.DEFAULT_LEARNING_RATES`) in both sizes, except the full
study's text task: it trains longer, so it trains at the rates of that grid where its
models learn best (:data:`TEXT`; ``benchmarks/bench_text_task.py`` measures the loss
against the bigram model and the cost).
"""

from __future__ import annotations

import importlib.util

from ._options import add_out_argument, default_out, output_dir, whole_number
from ._progress import progress_for

DEFAULT_OUT = default_out("train")
#: what to install when JAX or optax is missing
INSTALL = 'pip install -e ".[train]"'

#: variants of the depth sweep and of the regression and text tasks in the full study (the
#: others train at the base depth on the mixture task only)
CORE = ("pre_ln", "post_ln", "no_ln", "no_ln_sqrt", "no_ln_depth", "rezero", "no_residual",
        "neither", "pde_euler", "pde_euler_tL")

#: the full study's text task: Adam steps, width and learning rates (a sub-grid of the
#: default x2 grid): the best variant ends below the bigram model by more than the spread
#: over seeds, in a few CPU-minutes for the ten core variants and three seeds; each run is
#: scored on 2048 held-out sequences (a quarter of the standard error on the 128 of the
#: other tasks: the best of many runs is then not a lucky draw of the test sequences)
TEXT = dict(n_steps=3200, width=16, rates=tuple(1e-4 * 2.0 ** k for k in (5, 6)),
            eval_batch=2048)

#: study sizes: the full study and --quick
FULL = dict(seeds=3, tasks=("mixture", "regression", "text"), sweep_task="mixture",
            sweep_variants=CORE, task_variants={"regression": CORE, "text": CORE},
            depths=(2, 4, 8, 16, 32, 64), depth=4, large_depth=16, large_depth_seeds=1,
            n_steps=100, task_steps={"regression": 400, "text": TEXT["n_steps"]}, batch=16,
            width=8, task_width={"text": TEXT["width"]}, task_rates={"text": TEXT["rates"]},
            optims=("plain", "warmup_clip"),
            task_optims={"regression": ("plain",), "text": ("plain",)}, eval_batch=128,
            task_eval_batch={"text": TEXT["eval_batch"]},
            bridge_tokens=(64, 256, 1024), bridge_sequences=4)
QUICK = dict(seeds=1, tasks=("mixture",), sweep_task="mixture",
             variants=("pre_ln", "no_ln", "no_ln_depth", "no_residual", "neither", "pde_euler"),
             depths=(2, 8), depth=2, n_steps=40, batch=8, width=8, optims=("plain",),
             eval_batch=32, bridge_tokens=(32, 128), bridge_sequences=2, bridge_rates=(1e-3,),
             optimize=False)


def add_arguments(parser):
    """Options of the subcommand."""
    add_out_argument(parser, DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (1 seed, 6 variants, depths 2 and 8, mixture, 40 "
                             "steps)")
    parser.add_argument("--seeds", type=whole_number, default=None, metavar="N",
                        help="number of seeds 0..N-1 (default 3; --quick 1)")
    parser.add_argument("--workers", type=whole_number, default=None, metavar="N",
                        help="processes training groups side by side (default: the cores "
                             "this process may use); the results do not depend on it")


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
    sizes.pop("seeds", None)
    if n_seeds < 1:
        raise ValueError(f"`--seeds` must be at least 1, got {n_seeds}.")
    out = output_dir(args.out)
    from ..training import (
        check_study_memory,
        check_study_workers,
        default_workers,
        run_training_study,
        write_training_study,
    )

    check_study_memory(n_seeds, tasks=sizes["tasks"], eval_batch=sizes["eval_batch"],
                       name="--seeds")
    workers = check_study_workers(default_workers() if args.workers is None else args.workers,
                                  "--workers")

    progress = progress_for(args, None)
    res = run_training_study(seeds=tuple(range(n_seeds)), workers=workers, progress=progress,
                             **sizes)
    v = write_training_study(res, out)
    if progress is not None:
        progress(f"report: {out / 'report.md'}")
    for key in ("drift", "explosion"):
        for r in v[key]:
            print(f"{r['claim']} {r['pair']}: holds in {r['holds']} of {r['total']}")
    for r in v["simulator"]:
        print(f"simulator {r['pair']} ({r['task']}): {r['outcomes']}")
    t = v["theory"]
    print(f"theory: L* < L agrees with failure in {t['agree_failure']} of {t['total']}")
    return 0
