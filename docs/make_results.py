"""Write the study results the docs show into ``docs/_static/results/``.

    python docs/make_results.py [--only reproduce stabilizers clusters] [--quick]

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

The benchmark records in ``benchmarks/`` are written by the benchmark scripts
themselves (``python benchmarks/NAME.py``). ``--quick`` passes ``--quick`` to the
commands that have it (a smoke run; its results are not the ones to publish).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "_static" / "results"

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
    args = ap.parse_args(argv)
    for folder in args.only:
        for cmd in COMMANDS[folder]:
            quick = ["--quick"] if args.quick and cmd[:2] != ["reproduce", "--protocol"] else []
            full = [sys.executable, "-m", "gaussian_pde", *cmd, *quick,
                    "--out", str(RESULTS / folder)]
            print("$ python", " ".join(full[1:]), flush=True)
            subprocess.run(full, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
