"""Scaling of gaussian_pde sweeps: settings per second and overhead per task.

For each batch size it measures

* ``direct``: ``compute_batch`` for every task in this process, nothing stored (baseline);
* ``inprocess``: ``run_sweep(scheduler="inprocess")`` (baseline + Zarr writes);
* ``dask-1``, ``dask-2``: ``run_sweep`` on a LocalCluster (127.0.0.1) with 1 and 2
  single-threaded worker processes, started and warmed up before the clock starts.

The overhead per task is ``wall * workers / tasks - direct / tasks``: the time a worker
slot spends per task beyond the computation itself (scheduling, serialisation, transfer,
the driver's writes). Run::

    python benchmarks/bench_sweep.py [--draws 100] [--batch-sizes 5 25] [--repeat 2]
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from gaussian_pde.sweep import SweepSpec, compute_batch, run_sweep


def make_spec(draws, batch_size):
    return SweepSpec.from_dict({
        "sweep": {"attention": ["softmax", "l2"], "dims": [3, 4], "draws": draws,
                  "seed": 1, "batch_size": batch_size},
        "solver": {"horizon": 10.0}})


def timed_direct(spec):
    start = time.perf_counter()
    for i in range(spec.n_tasks):
        compute_batch(spec, i)
    return time.perf_counter() - start


def timed_sweep(spec, scheduler, workdir):
    out = tempfile.mkdtemp(dir=workdir)
    shutil.rmtree(out)
    report = run_sweep(spec, out, scheduler=scheduler, progress=False)
    shutil.rmtree(out)
    return report.seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=100)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[5, 25])
    parser.add_argument("--repeat", type=int, default=2,
                        help="timings per measurement; the fastest is kept (shared machines)")
    args = parser.parse_args(argv)

    from distributed import Client

    from gaussian_pde.sweep._run import local_cluster

    rows = []
    workdir = tempfile.mkdtemp(prefix="bench_sweep_")
    clusters = {}
    try:
        for n in (1, 2):
            cluster = local_cluster(n)
            client = Client(cluster, timeout=60)
            # warm-up: import gaussian_pde and SciPy on every worker before timing
            client.run(lambda: compute_batch(make_spec(1, 1), 0) and None)
            clusters[n] = (cluster, client)
        for bs in args.batch_sizes:
            spec = make_spec(args.draws, bs)
            direct = min(timed_direct(spec) for _ in range(args.repeat))
            row = {"batch_size": bs, "tasks": spec.n_tasks, "settings": spec.n_settings,
                   "direct_s": direct}
            row["inprocess_s"] = min(timed_sweep(spec, "inprocess", workdir)
                                     for _ in range(args.repeat))
            for n, (_, client) in clusters.items():
                row[f"dask{n}_s"] = min(timed_sweep(spec, client, workdir)
                                        for _ in range(args.repeat))
            for key in ("direct", "inprocess", "dask1", "dask2"):
                row[f"{key}_settings_per_s"] = spec.n_settings / row[f"{key}_s"]
            per_task = direct / spec.n_tasks
            row["direct_ms_per_task"] = 1e3 * per_task
            row["inprocess_overhead_ms_per_task"] = 1e3 * (row["inprocess_s"] / spec.n_tasks
                                                           - per_task)
            for n in (1, 2):
                row[f"dask{n}_overhead_ms_per_task"] = 1e3 * (
                    row[f"dask{n}_s"] * n / spec.n_tasks - per_task)
            rows.append(row)
    finally:
        for cluster, client in clusters.values():
            client.close()
            cluster.close()
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"# machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} "
          f"(shared machine: numbers are indicative); numpy {np.__version__}, "
          f"python {sys.version.split()[0]}")
    print("| batch | tasks | settings | direct set/s | inprocess set/s | 1 worker set/s | "
          "2 workers set/s | compute ms/task | overhead ms/task (inproc, 1 w, 2 w) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch_size']} | {r['tasks']} | {r['settings']} | "
              f"{r['direct_settings_per_s']:.0f} | {r['inprocess_settings_per_s']:.0f} | "
              f"{r['dask1_settings_per_s']:.0f} | {r['dask2_settings_per_s']:.0f} | "
              f"{r['direct_ms_per_task']:.0f} | {r['inprocess_overhead_ms_per_task']:.1f}, "
              f"{r['dask1_overhead_ms_per_task']:.1f}, {r['dask2_overhead_ms_per_task']:.1f} |")
    return 0


if __name__ == "__main__":
    from _record import recorded_main

    recorded_main("bench_sweep", main)
