"""Benchmark: the main job on a fresh machine against a warm one, and a new shape's kernel.

Run ``python benchmarks/bench_cold_start.py`` (the main job ``gaussian-pde --quick``; add
``--jobs quick full`` for the full one too). A fresh machine is an empty Numba cache: each
repeat runs the job in a new process with ``NUMBA_CACHE_DIR`` pointing at a new empty
folder (*cold*: Numba compiles every kernel), then once more on that folder (*warm*: it
loads them). Reported per job, the minimum over ``--repeat`` runs of

* ``cold_s``, ``warm_s``: wall seconds of the command (its process, start to end);
* ``cold_cpu_s``, ``warm_cpu_s``: its CPU seconds (``RUSAGE_CHILDREN``: on a shared
  machine the load slows the wall clock far more than the CPU time);
* ``compile_s``, ``compile_cpu_s``: cold minus warm, what a fresh machine pays;
* ``functions compiled``: the compilations of the cold run (Numba's ``numba:compile``
  events), and the five that cost most, with their seconds (without the functions they
  compiled in turn). Where the job compiles the integrator in a second process
  (:mod:`gaussian_pde.integrate._precompile`, beside the fields on a second core), that
  process's compilations are counted from a run of what it compiles (the integrator and
  the published replay's kernel) alone in another empty cache (*of them in a second
  process*).

The third table: the cold run's compilations one by one (which process compiled each:
``main`` or ``second``), the costliest first. ``load``: the machine's one-minute load
average before and after (the machine may be shared).

``--against ROOT``: the cold runs of this checkout and of the checkout ``ROOT`` (an
earlier version), in turns, ``--pairs`` times, each in a new empty cache: the median
cold wall seconds of each and their ratio pair by pair. Before and after a change, on a
machine whose speed drifts from one hour to the next, the ratio is the figure to read.

``new_shape``: seconds to compile a single-head kernel for a shape not yet asked for
(:meth:`~gaussian_pde.attention._compiled_fields.CompiledField.specialised`: what a batch
of a new type, ``d`` and ``k`` pays once per machine), each in a new process whose cache
already holds the generic kernels; the minimum over ``--repeat`` runs.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _record import write_record

ROOT = Path(__file__).resolve().parent.parent

#: the command line of each job
JOBS = {"quick": ["--quick"], "full": []}

#: Numba's compile events recorded into argv[1] at exit: [name, own seconds], in order (the
#: engine's functions without the stamp of its sources in their names)
_LISTEN = """
import atexit, json, sys, time
from numba.core import event

stack, done = [], []

class L(event.Listener):
    def on_start(self, ev):
        stack.append([time.perf_counter(), 0.0])

    def on_end(self, ev):
        t0, inner = stack.pop()
        dt = time.perf_counter() - t0
        if stack:
            stack[-1][1] += dt
        fn = ev.data["dispatcher"].py_func
        name = fn.__qualname__
        if fn.__module__.startswith("gaussian_pde.integrate."):   # the engine's source stamp
            try:
                from gaussian_pde.integrate._compiled_engine import engine_stamp
                name = name.removesuffix("_" + engine_stamp())
            except ImportError:         # (an older checkout, --root: no stamp)
                pass
        done.append([fn.__module__ + "." + name, dt - inner])

event.register("numba:compile", L())
atexit.register(lambda path=sys.argv[1]: json.dump(done, open(path, "w")))
"""

#: run in the child: the job, with its compile events
_JOB = _LISTEN + """
from gaussian_pde.cli._main import main
raise SystemExit(main(sys.argv[2:]))
"""

#: run in the child: what the job compiles in a second process (the integrator, and the
#: published replay's kernel beside it)
_INTEGRATOR = _LISTEN + """
import importlib
from gaussian_pde.cli._main_job import _PUBLISHED_KERNEL
from gaussian_pde.integrate._compiled_engine import _core
_core()
module, name = _PUBLISHED_KERNEL.split(":")
getattr(importlib.import_module(module), name)()
"""

#: run in the child: the generic kernels (loaded), then one shape's kernel, timed
_SHAPE = """
import sys, time
import gaussian_pde as gp
from gaussian_pde.attention import _compiled_fields as cf
cf.kernels()
head = gp.ATTENTIONS[sys.argv[1]].example(2, 0).compiled_field().heads[0]
d, k = (int(x) for x in sys.argv[2:4])
t = time.perf_counter()
cf._shape_rhs(head, d, k)
print(time.perf_counter() - t)
"""


def _child(args, cache, root=None):
    """Run ``python args`` with ``NUMBA_CACHE_DIR=cache`` on the package of ``root``
    (default: the one timed): (wall s, CPU s, stdout)."""
    root = ROOT if root is None else root
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(root))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], env=env, cwd=root,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise RuntimeError(f"{args[:3]} failed:\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def job_times(job, repeat, tmp):
    """Cold and warm runs of ``job`` (minima over ``repeat``), and the cold run's compiles."""
    best = {}
    compiled = None
    for r in range(repeat):
        cache = Path(tmp) / f"{job}-{r}"
        cache.mkdir()
        events = Path(tmp) / f"{job}-{r}.json"
        cmd = [*JOBS[job], "--quiet", "--out", str(Path(tmp) / "out")]
        runs = {"cold": _child(["-c", _JOB, str(events), *cmd], cache),
                "warm": _child(["-c", _JOB, str(Path(tmp) / "warm.json"), *cmd], cache)}
        for kind, (wall, cpu, _) in runs.items():
            best[f"{kind}_s"] = min(best.get(f"{kind}_s", wall), wall)
            best[f"{kind}_cpu_s"] = min(best.get(f"{kind}_cpu_s", cpu), cpu)
        if compiled is None:
            compiled = json.loads(events.read_text())
    best["compile_s"] = best["cold_s"] - best["warm_s"]
    best["compile_cpu_s"] = best["cold_cpu_s"] - best["warm_cpu_s"]
    aside = []
    if not any(name.endswith("_compiled_engine._steps") for name, _ in compiled):
        # the job compiled the integrator in a second process: its compiles, measured alone
        cache = Path(tmp) / f"{job}-integrator"
        cache.mkdir()
        events = Path(tmp) / f"{job}-integrator.json"
        _child(["-c", _INTEGRATOR, str(events)], cache)
        aside = [[name + " (2nd process)", t] for name, t in json.loads(events.read_text())]
    everything = ([[name, "main", t] for name, t in compiled]
                  + [[name.removesuffix(" (2nd process)"), "second", t] for name, t in aside])
    top = sorted(compiled + aside, key=lambda e: -e[1])[:5]
    return best, len(compiled) + len(aside), len(aside), top, everything


def per_function(everything, count=20):
    """The ``count`` costliest compiles, and the rest summed per process and module."""
    rows = sorted(everything, key=lambda e: -e[2])
    out = [[name.rsplit(".", 2)[-2] + "." + name.rsplit(".", 1)[-1], where, round(t, 2)]
           for name, where, t in rows[:count]]
    rest = {}
    for name, where, t in rows[count:]:
        module = name.split(".<locals>")[0].rsplit(".", 1)[0]
        key = ("numba (overloads)" if module.startswith("numba.") else module, where)
        rest[key] = rest.get(key, 0.0) + t
    out += [[f"the rest of {module}", where, round(t, 2)]
            for (module, where), t in sorted(rest.items(), key=lambda e: -e[1])]
    return out


def new_shape_times(repeat, tmp):
    """Seconds to compile one shape's kernel per type, in a cache with the generic kernels."""
    rows = []
    for name, d, k in [("softmax", 3, 2), ("biased_softmax", 4, 3), ("linear", 5, 2)]:
        best = float("inf")
        for r in range(repeat):
            cache = Path(tmp) / f"shape-{name}-{r}"
            cache.mkdir()
            _child(["-c", "from gaussian_pde.attention import _compiled_fields as cf; "
                    "cf.kernels()"], cache)
            best = min(best, float(_child(["-c", _SHAPE, name, str(d), str(k)], cache)[2]))
        rows.append([name, d, k, round(best, 3)])
    return rows


def _label(root):
    """``root``'s package version and commit, as ``0.12.1 (2f82ec9)``."""
    version = {}
    exec((Path(root) / "gaussian_pde" / "_version.py").read_text(), version)
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return f"{version['__version__']} ({commit or 'no commit'})"


def against(job, other, pairs, tmp):
    """Cold runs of ``job`` on this checkout and on ``other``, in turns: a table row.

    Each pair runs both, each in a new empty cache, the order alternating from pair to
    pair (a machine whose speed drifts slows both alike); the row holds the median cold
    wall seconds of each and the ratio this / other pair by pair (median, min, max).
    """
    walls = {"this": [], "other": []}
    for r in range(pairs):
        order = [("this", ROOT), ("other", other)]
        for which, root in (order if r % 2 == 0 else order[::-1]):
            cache = Path(tmp) / f"against-{job}-{which}-{r}"
            cache.mkdir()
            cmd = [*JOBS[job], "--quiet", "--out", str(Path(tmp) / f"out-{which}")]
            wall, _, _ = _child(["-c", _JOB, str(Path(tmp) / "against.json"), *cmd], cache,
                                root)
            walls[which].append(wall)
    ratios = np.array(walls["this"]) / np.array(walls["other"])
    return [f"gaussian-pde {' '.join(JOBS[job])}".strip(), _label(ROOT), _label(other), pairs,
            round(float(np.median(walls["this"])), 2), round(float(np.median(walls["other"])), 2),
            round(float(np.median(ratios)), 3), round(float(ratios.min()), 3),
            round(float(ratios.max()), 3)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=["quick"])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the record here instead")
    parser.add_argument("--root", default=None,
                        help="time the gaussian_pde of this checkout instead (a comparison)")
    parser.add_argument("--against", default=None, metavar="ROOT",
                        help="also time the cold runs against the checkout ROOT, in turns")
    parser.add_argument("--pairs", type=int, default=5,
                        help="pairs of cold runs with --against (default: %(default)s)")
    args = parser.parse_args()
    global ROOT
    ROOT = Path(args.root).resolve() if args.root else ROOT
    rows, notes, functions = [], [], None
    load = [round(os.getloadavg()[0], 2)]
    with tempfile.TemporaryDirectory() as tmp:
        for job in args.jobs:
            best, n, n_aside, top, everything = job_times(job, args.repeat, tmp)
            if functions is None:
                functions = (job, per_function(everything))
            rows.append([f"gaussian-pde {' '.join(JOBS[job])}".strip()]
                        + [round(best[k], 2) for k in ("cold_s", "warm_s", "compile_s",
                                                       "cold_cpu_s", "warm_cpu_s",
                                                       "compile_cpu_s")] + [n, n_aside])
            notes.append(f"gaussian-pde {' '.join(JOBS[job])}: the costliest compiles of "
                         "the cold run (s, without the functions they compiled): "
                         + ", ".join(f"{name.rsplit('.', 1)[-1]} {t:.1f}" for name, t in top)
                         + ".")
            print(rows[-1], file=sys.stderr)
        shapes = new_shape_times(args.repeat, tmp)
        paired = ([against(job, Path(args.against).resolve(), args.pairs, tmp)
                   for job in args.jobs] if args.against else [])
    load.append(round(os.getloadavg()[0], 2))
    payload = {
        "tables": [
            {"title": "The main job on a fresh machine (empty NUMBA_CACHE_DIR) and on a warm "
                      "one: seconds, minimum over the repeats",
             "columns": ["job", "cold wall", "warm wall", "compile wall", "cold CPU",
                         "warm CPU", "compile CPU", "functions compiled",
                         "of them in a second process"],
             "rows": rows},
            {"title": "Compiling a single-head kernel for a new type and shape (seconds)",
             "columns": ["type", "d", "k", "compile s"], "rows": shapes},
            {"title": f"What the cold run of gaussian-pde {' '.join(JOBS[functions[0]])} "
                      "compiles: each function's own seconds (without the functions it "
                      "compiled), the costliest, then the rest per module",
             "columns": ["function", "process", "seconds"], "rows": functions[1]},
        ] + ([{"title": "The cold run against an earlier version, in turns (each in an "
                        "empty cache): median wall seconds, and the ratio pair by pair",
               "columns": ["job", "this", "against", "pairs", "this cold wall",
                           "its cold wall", "ratio median", "ratio min", "ratio max"],
               "rows": paired}] if paired else []),
        "notes": notes,
        "load": load,
        "repeat": args.repeat,
    }
    print(write_record("bench_cold_start", payload, args.json))


if __name__ == "__main__":
    main()
