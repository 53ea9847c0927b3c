"""Benchmark: the figure stage of ``gaussian-pde reproduce`` against its compute stage.

Run ``python benchmarks/bench_figures.py`` (``--runs N``, default 3; ``--quick`` for the
small run). Each run is a fresh process that calls :func:`gaussian_pde.studies.reproduce`
into a temporary folder, as ``gaussian-pde reproduce`` does, with Numba's cache warm
(one run beforehand, not recorded, compiles or loads it). From the run's own timing
(``results.json``, the same process for every stage):

* ``compute_s``: the true answers (regimes and rank histograms, on two processes);
* ``replay_s``: the published script replayed;
* ``figures_s``: the six figures, drawn and written;

each in wall and CPU seconds (CPU: this process and its finished children), and
``figures_over_compute`` = figures / compute, per run and for the medians. The claim
"reproduce spends less time drawing than computing" is ``figures_over_compute < 1``.
Per figure: the wall and CPU seconds of each figure in the process that drew it (the
full run draws them on two processes, so the figure stage takes less wall time than
their sum).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def one_run(out, quick):
    """One reproduce run in this process: its timing and the time of each figure."""
    from gaussian_pde.studies import reproduce

    timing = reproduce(out, seed=0, quick=quick)["timing"]
    replay = timing["published_replay_s"] or (0.0, 0.0)
    return {"compute_s": timing["compute_s"], "compute_cpu_s": timing["cpu_s"],
            "replay_s": replay[0], "replay_cpu_s": replay[1],
            "figures_s": timing["figures_s"][0], "figures_cpu_s": timing["figures_s"][1],
            "per_figure_s": {f"{name}.png": list(s) for name, s in timing["figure_s"].items()}}


def _run_child(quick):
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, __file__, "--one", tmp] + (["--quick"] if quick else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3, help="fresh processes, one run each")
    ap.add_argument("--quick", action="store_true", help="the small run (reproduce --quick)")
    ap.add_argument("--json", default=None, help="write the record here instead")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:      # a child: one run, its numbers as the last line
        print(json.dumps(one_run(Path(args.one), args.quick)))
        return
    _run_child(args.quick)        # Numba's cache: compiled or loaded, not recorded
    runs = [_run_child(args.quick) for _ in range(args.runs)]
    keys = ("compute_s", "compute_cpu_s", "replay_s", "replay_cpu_s", "figures_s",
            "figures_cpu_s")
    med = {k: statistics.median(r[k] for r in runs) for k in keys}
    names = list(runs[0]["per_figure_s"])
    per_fig = {n: [statistics.median(r["per_figure_s"][n][i] for r in runs) for i in (0, 1)]
               for n in names}
    rows = [[str(i + 1)] + [f"{r[k]:.2f}" for k in keys]
            + [f"{r['figures_s'] / r['compute_s']:.2f}"] for i, r in enumerate(runs)]
    out = {
        "runs": args.runs, "quick": args.quick,
        **{f"median_{k}": v for k, v in med.items()},
        "figures_over_compute": med["figures_s"] / med["compute_s"],
        "figures_over_compute_cpu": med["figures_cpu_s"] / med["compute_cpu_s"],
        "tables": [
            {"title": "reproduce, one fresh process per run: seconds (wall and CPU) of each "
                      "stage, and figures / compute",
             "columns": ["run", "compute", "compute CPU", "replay", "replay CPU", "figures",
                         "figures CPU", "figures / compute"],
             "rows": rows},
            {"title": "the figure stage, per figure, in the process that drew it (median seconds "
                      "over the runs)",
             "columns": ["figure", "wall", "CPU"],
             "rows": [[n, f"{v[0]:.2f}", f"{v[1]:.2f}"] for n, v in per_fig.items()]},
        ],
        "per_run": runs,
    }
    print(json.dumps({k: v for k, v in out.items() if k != "per_run"}, indent=1))
    from _record import write_record

    write_record("bench_figures", out, args.json)


if __name__ == "__main__":
    main()
