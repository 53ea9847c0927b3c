"""The start-up time estimate of sweeps against the time the same run measured.

For each sweep, ``run_sweep(progress=True)`` prints its start line with the estimate (a
pilot of a few tasks, :mod:`gaussian_pde.sweep._estimate`) and then runs every task; the
record holds the estimate, its range, how far it reaches, and the run's measured time
(pilot included, as in the estimate). Where the estimate stops short of the largest
dimension, the measured time is that of the tasks it covers (from the results' task log).
The sweeps: softmax with K = -Q and one draw per dimension, d = 2..--max-d (the shape of
``dims = [2, ..., 101]``, cut to what runs in minutes), and the two examples. Run::

    python benchmarks/bench_sweep_estimate.py [--max-d 24] [--workers 1]
"""

import argparse
import contextlib
import io
import json
import pathlib
import tempfile

from gaussian_pde.sweep import SweepSpec, run_sweep

ROOT = pathlib.Path(__file__).resolve().parent.parent


def specs(max_d):
    one_draw = SweepSpec(attention=["softmax"], dims=list(range(2, max_d + 1)), draws=1,
                         batch_size=1)
    return {f"softmax d = 2..{max_d}, one draw": one_draw,
            "examples/sweep_small.toml": SweepSpec.from_toml(ROOT / "examples" / "sweep_small.toml"),
            "examples/sweep_linear.toml": SweepSpec.from_toml(ROOT / "examples"
                                                              / "sweep_linear.toml")}


def measure(spec, workers):
    """``(estimate, measured seconds, start line)`` of one run into a fresh folder."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "res"
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            report = run_sweep(spec, out, scheduler="inprocess" if workers == 1 else None,
                               workers=None if workers == 1 else workers, progress=True)
        est = report.estimate
        measured = report.seconds
        if est.d_reach is not None:
            lines = [json.loads(line) for line in (out / "tasks.log").read_text().splitlines()]
            measured = est.pilot_seconds + sum(
                line["seconds"] for line in lines
                if not line.get("pilot") and spec.task(line["task"])[1] <= est.d_reach)
    return est, measured, err.getvalue().splitlines()[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-d", type=int, default=24)
    parser.add_argument("--workers", type=int, default=1,
                        help="1: in-process; more: a local Dask cluster of that many workers")
    parser.add_argument("--json", default=None, help="write the record here")
    args = parser.parse_args(argv)
    rows, notes = [], []
    for name, spec in specs(args.max_d).items():
        est, measured, line = measure(spec, args.workers)
        rows.append([name, est.n_pilot, est.d_pilot, est.d_reach or max(spec.dims),
                     round(est.seconds, 2), round(est.low, 2), round(est.high, 2),
                     round(measured, 2), round(est.seconds / measured, 2)])
        notes.append(f"{name}: {line}")
        print(rows[-1], flush=True)
    payload = {"workers": args.workers, "tables": [{
        "title": "Start-up time estimate of a sweep against the run's measured time "
                 "(seconds, pilot included)",
        "columns": ["sweep", "tasks timed", "largest d timed", "estimated up to d",
                    "estimate", "low", "high", "measured", "estimate / measured"],
        "rows": rows}], "notes": notes}
    from _record import write_record

    print(write_record("bench_sweep_estimate", payload, args.json))


if __name__ == "__main__":
    main()
