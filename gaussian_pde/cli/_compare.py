"""``gaussian-pde compare``: the moment ODEs against particle Monte Carlo.

Runs :func:`gaussian_pde.studies._compare.compare` on a built-in 2-D example of the chosen attention
type (or on weights from a JSON file) and writes into the output folder (default
``./gaussian_pde_output/compare``), atomically:

* ``compare_<type>.csv``: one row per ``(n, t)``, mean and standard error over seeds of
  every metric;
* ``compare_<type>.json``: settings, fitted slopes of error against ``n``, statuses, and
  the full arrays;
* ``compare_<type>_<figure>.png``: errors over time, error against ``n``, moments,
  diagnostics (effective sample size, non-Gaussianity).

The ``--attention`` choices are the registered types (:data:`gaussian_pde.ATTENTIONS`);
a type without a built-in example needs ``--weights``. Progress: one line on stderr per
particle run (and for the moment ODE and the figures), unless ``--quiet``.

Bad values are refused before any work, with one line naming the option: counts that are
not whole numbers of at least 1 (2 for ``--n`` and ``--num-times``), a ``--t-end`` or
``--dt`` that is not a finite positive number, and sizes whose arrays would not fit in
memory (``--n``, ``--seeds`` and ``--num-times`` together, with the size they would need:
:func:`gaussian_pde.studies.check_compare_memory`). The last line says over which output
times the slopes were fitted: only ``t = 0`` (the initial draw) when every particle run or
the moment ODE stopped before the next output time (a ``--t-end`` far beyond the
dynamics' range, say), and no slopes with a single ``--n``.
"""

from __future__ import annotations

import collections
import csv
import inspect
import io
import json
import pathlib

import numpy as np

from .._common.io import save_figure, write_json, write_text
from .._common.validation import validate_int, validate_positive
from ..attention import ATTENTIONS, SingleHeadAttention, get_attention
from ._options import add_out_argument, default_out, output_dir, whole_number
from ._progress import progress_for

DEFAULT_OUT = default_out("compare")


def compare_examples():
    """Built-in 2-D examples: name -> (attention, mean0, cov0, t_end).

    Those of the main job (:func:`gaussian_pde.cli._main_job.builtin_examples`), one per
    registered type that has one. ``mean0`` is callable (position-dependent) for masked
    attention.
    """
    from ._main_job import _settings

    return {name: (ex["attention"], ex["mean0"], ex["cov0"], ex.get("t_end", 1.0))
            for name, ex in _settings().items()}


def add_arguments(parser):
    parser.add_argument("--attention", default=next(iter(ATTENTIONS)), choices=list(ATTENTIONS),
                        help="registered attention type (default: %(default)s)")
    parser.add_argument("--n", type=whole_number, nargs="+", default=[500, 2000, 8000],
                        help="numbers of tokens, each at least 2 (default: %(default)s)")
    parser.add_argument("--seeds", type=whole_number, default=5,
                        help="seeds 0..SEEDS-1 (default: 5)")
    parser.add_argument("--t-end", type=float, default=None,
                        help="final time (default: per example)")
    parser.add_argument("--num-times", type=whole_number, default=11,
                        help="output times, at least 2 (default: 11)")
    parser.add_argument("--method", default="rk4", choices=["rk4", "RK45", "RK23", "DOP853"])
    parser.add_argument("--dt", type=float, default=None, help="RK4 step (default: t_end/50)")
    parser.add_argument("--chunk-size", type=whole_number, default=None,
                        help="queries per attention tile (default: all)")
    parser.add_argument("--float32", action="store_true", help="attention tiles in float32")
    parser.add_argument("--weights", default=None,
                        help="JSON file with Q, K, V (lists), optional scale, bias, mean0, cov0")
    add_out_argument(parser, DEFAULT_OUT)


def _from_weights(path, name):
    try:
        spec = json.loads(pathlib.Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"`--weights` cannot be read as JSON: {path} ({exc}).") from None
    if not isinstance(spec, dict) or not {"Q", "K", "V"} <= set(spec):
        raise ValueError("`--weights` must be a JSON object with keys Q, K, V.")
    cls = get_attention(name)
    if not issubclass(cls, SingleHeadAttention):
        raise ValueError(f"`--weights` is supported for single-head types only, not {name}; "
                         "use the Python API.")
    kwargs = {"scale": spec.get("scale")}
    if "bias" in inspect.signature(cls).parameters:
        kwargs["bias"] = float(spec.get("bias", 0.0))
    att = cls(spec["Q"], spec["K"], spec["V"], **kwargs)
    d = att.d
    mean0 = np.asarray(spec.get("mean0", np.zeros(d)), dtype=float)
    cov0 = np.asarray(spec.get("cov0", np.eye(d)), dtype=float)
    return att, mean0, cov0, 1.0


def _csv(rows):
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def run(args):
    from ..studies import check_compare_memory, compare

    for value in args.n:
        validate_int(value, "--n", minimum=2)
    validate_int(args.seeds, "--seeds", minimum=1)
    validate_int(args.num_times, "--num-times", minimum=2)
    if args.chunk_size is not None:
        validate_int(args.chunk_size, "--chunk-size", minimum=1)
    if args.dt is not None:
        validate_positive(args.dt, "--dt")
    if args.weights is not None:
        att, mean0, cov0, t_end = _from_weights(args.weights, args.attention)
    else:
        examples = compare_examples()
        if args.attention not in examples:
            raise ValueError(f"`--attention` {args.attention} has no built-in example; give "
                             "its weights with `--weights`.")
        att, mean0, cov0, t_end = examples[args.attention]
    if args.t_end is not None:
        t_end = validate_positive(args.t_end, "--t-end")
    check_compare_memory(att.d, max(args.n), len(args.n), args.seeds, args.num_times,
                         names=("`--n`", "`--seeds`", "`--num-times`"))
    out = output_dir(args.out)
    t_eval = np.linspace(0.0, t_end, args.num_times)
    dt = args.dt if args.dt is not None else t_end / 50
    with_ode = att.gaussian_preserving and not callable(mean0)
    progress = progress_for(args, int(with_ode) + len(args.n) * args.seeds + 1)
    report = compare(att, mean0, cov0, n=args.n, seeds=range(args.seeds), t_eval=t_eval,
                     method=args.method, dt=dt, chunk_size=args.chunk_size,
                     dtype=np.float32 if args.float32 else np.float64, progress=progress)
    stem = f"compare_{att.name}"
    write_text(out / f"{stem}.csv", _csv(report.table()))
    data = report.to_dict()
    data["slope_times"] = report.slope_times.tolist()
    data["settings"] = {"n": args.n, "seeds": args.seeds, "t_end": t_end,
                        "num_times": args.num_times, "method": args.method, "dt": dt,
                        "float32": bool(args.float32), "attention": repr(att)}
    write_json(out / f"{stem}.json", data)
    paths = [out / f"{stem}.csv", out / f"{stem}.json"]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..studies import all_figures

    figures = all_figures(report)
    for name, fig in figures.items():
        paths.append(save_figure(fig, out / f"{stem}_{name}.png", dpi=110))
        plt.close(fig)
    if progress is not None:
        progress(f"figures: {', '.join(figures)}")
    print(f"gaussian-pde compare ({att.name}): wrote {', '.join(str(p) for p in paths)}"
          + _slopes_words(report))
    return 0


def _slopes_words(report):
    """The end of the last line: the slopes and the output times they are fitted over."""
    if not report.slopes:
        return ""                      # no moment ODE to compare with
    if report.n.size < 2:
        return "; no slopes of error against n (they need two or more values of `--n`)"
    times = report.slope_times
    slopes = ", ".join(f"{k} {v:.3f}" for k, v in report.slopes.items() if np.isfinite(v))
    if not slopes or times.size == 0:
        return "; no slopes of error against n (no output time at which every run has a value)"
    if times.size > 1:
        return f"; slopes of error against n over t in [{times[0]:.6g}, {times[-1]:.6g}]: {slopes}"
    runs = collections.Counter(report.status.ravel().tolist())
    stops = ", ".join(f"{count} {status}" for status, count in runs.items())
    return (f"; slopes of error against n at t = {times[0]:.6g} only, the initial draw: the "
            f"particle runs ({stops}) or the moment ODE ({report.ode_status}) stopped before "
            f"t = {report.t[1]:.6g} (a smaller `--t-end` or `--dt` reaches further): {slopes}")
