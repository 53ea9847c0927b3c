"""Write the study results the docs show into ``docs/_static/results/``.

    python docs/make_results.py [--only reproduce stabilizers clusters] [--quick]
    python docs/make_results.py --notebooks [NAME ...]

One folder per command, each written by the package's own command line:

``reproduce/``
    ``gaussian-pde reproduce --protocol published`` (the published replay and the
    certified limit of every attempt) and then ``gaussian-pde reproduce`` (the regimes,
    the rank histograms and the report with both tables);
``stabilizers/``
    ``gaussian-pde stabilizers``;
``clusters/``
    ``gaussian-pde clusters`` and ``gaussian-pde clusters --trust`` (the trust map);
``training/``
    ``gaussian-pde train`` (needs the extra ``train``).

``--notebooks`` writes ``notebooks/`` instead: the validation notebooks of
:data:`NOTEBOOKS` (all, or those named) run in their full mode and save their runs at the
largest number of tokens, which the docs build reads instead of making them again (it
makes the others, and they must reproduce the stored ones; see
``gaussian_pde.studies.stored_compare``). Write them again after a change to the
particles, the sampler or a notebook's settings: the docs build refuses stored runs that
the code no longer reproduces.

The benchmark records in ``benchmarks/`` are written by the benchmark scripts
themselves (``python benchmarks/NAME.py``). ``--quick`` passes ``--quick`` to the
commands that have it (a smoke run; its results are not the ones to publish).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "_static" / "results"

#: the validation notebooks whose full runs at the largest n are stored (the longest ones)
NOTEBOOKS = ("blowup", "l2", "masked", "multihead", "sigmoid", "sinkhorn", "softmax")

#: folder -> the gaussian-pde commands that write it, in order
COMMANDS = {
    "reproduce": [["reproduce", "--protocol", "published"], ["reproduce"]],
    "stabilizers": [["stabilizers"]],
    "clusters": [["clusters"], ["clusters", "--trust"]],
    "training": [["train"]],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=sorted(COMMANDS), default=list(COMMANDS))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--notebooks", nargs="*", choices=NOTEBOOKS, metavar="NAME",
                    help=f"write the notebooks' stored runs instead (all, or some of {NOTEBOOKS})")
    args = ap.parse_args(argv)
    if args.notebooks is not None:
        write_notebooks(args.notebooks or NOTEBOOKS)
        return 0
    for folder in args.only:
        for cmd in COMMANDS[folder]:
            quick = ["--quick"] if args.quick and cmd[:2] != ["reproduce", "--protocol"] else []
            full = [sys.executable, "-m", "gaussian_pde", *cmd, *quick,
                    "--out", str(RESULTS / folder)]
            print("$ python", " ".join(full[1:]), flush=True)
            subprocess.run(full, check=True)
    return 0


def write_notebooks(names):
    """Run each notebook in full mode with ``GAUSSIAN_PDE_NOTEBOOK_WRITE=1`` into ``notebooks/``."""
    out = RESULTS / "notebooks"
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "GAUSSIAN_PDE_NOTEBOOK_QUICK"}
    env.update(GAUSSIAN_PDE_NOTEBOOK_RESULTS=str(out), GAUSSIAN_PDE_NOTEBOOK_WRITE="1",
               MPLBACKEND="Agg")
    with tempfile.TemporaryDirectory(prefix="gp_notebooks_") as figures:
        env["GAUSSIAN_PDE_NOTEBOOK_OUT"] = figures
        for name in names:
            path = ROOT / "notebooks" / f"{name}.py"
            print(f"$ GAUSSIAN_PDE_NOTEBOOK_WRITE=1 python {path.relative_to(ROOT)}", flush=True)
            subprocess.run([sys.executable, str(path)], check=True, env=env, cwd=figures)


if __name__ == "__main__":
    raise SystemExit(main())
