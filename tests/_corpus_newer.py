"""A bad-input corpus over the newer surfaces: mixtures, certified limits, the published
replay, analysis, exact solutions, particles and sweep sizes.

Each case is a name, a call (a function of no arguments) and what it must do:

``"error"``
    raise ``ValueError`` or ``TypeError`` whose message names the argument (the case's
    ``name`` string, e.g. ``"`types`"``), before any long work;
``"result"``
    return without an exception (a valid edge case that must not crash).

:func:`run_case` runs one case in a forked process with a time limit and a cap on its
address space, so a hang or a huge allocation fails its case (``"hang"``,
``"MemoryError"``) instead of blocking or swapping the machine.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import resource
import traceback

import numpy as np

import gaussian_pde as gp
from gaussian_pde import analysis
from gaussian_pde.studies import certified_limit, published_histograms

#: address space of a case's process (bytes): a request past it is a MemoryError there
MEMORY_CAP = 4 * 2**30


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    call: object
    expect: str          # "error" or "result"
    names: str = ""      # what the error message must mention


def _mix(K=2, d=2):
    rng = np.random.default_rng(0)
    return gp.GaussianMixture(np.full(K, 1 / K), rng.normal(size=(K, d)),
                              np.broadcast_to(0.1 * np.eye(d), (K, d, d)))


def _spec(**sweep):
    from gaussian_pde.sweep import SweepSpec

    data = {"sweep": {"attention": ["softmax"], "dims": [2], "draws": 2, "seed": 1,
                      "batch_size": 2}, "solver": {"horizon": 0.5}, "record": {"grid": 3},
            "weights": {}}
    for key, value in sweep.items():
        table, name = key.split("__") if "__" in key else ("sweep", key)
        data[table][name] = value
    return SweepSpec.from_dict(data)


def _run_spec(tmp, **sweep):
    from gaussian_pde.sweep import run_sweep

    return run_sweep(_spec(**sweep), os.path.join(tmp, "res"), scheduler="inprocess",
                     progress=False)


def _softmax(d=2):
    rng = np.random.default_rng(1)
    Q = rng.standard_normal((1, d))
    return gp.Softmax(Q, -Q, np.eye(d))


def _cases(tmp):
    att = _softmax()
    I2 = np.eye(2)
    cov = np.stack([I2, 0.8 * I2])
    out = []

    def add(id_, call, expect="error", names=""):
        out.append(Case(id_, call, expect, names))

    # the published replay
    for val, name in [(("sinkhorn",), "types"), ("softmax", "types"), ((), "types"),
                      (("softmax", "softmax"), "types")]:
        add(f"published-types-{val!r}", lambda v=val: published_histograms(types=v),
            names=f"`{name}`")
    for val in [("diag",), "identity", []]:
        add(f"published-values-{val!r}", lambda v=val: published_histograms(values=v),
            names="`values`")
    for val in [0, -1, 101, 2.0, True]:
        add(f"published-n_settings-{val!r}", lambda v=val: published_histograms(n_settings=v),
            names="`n_settings`")
    for val in [(), (6,), 3, ("3",)]:
        add(f"published-ds-{val!r}", lambda v=val: published_histograms(ds=v), names="`ds`")
    from gaussian_pde.studies import write_published_histograms

    def into_a_file():
        afile = os.path.join(tmp, "a_file")
        with open(afile, "w") as fh:
            fh.write("x")
        write_published_histograms(afile, n_settings=1)
    add("published-out-a-file", into_a_file, names="`out`")
    for where in ("/proc/gaussian_pde", "/proc"):
        add(f"published-out-{where}", lambda w=where: write_published_histograms(w, n_settings=1),
            names="`out`")
    # analysis
    add("classify-t_blowup-before-t0", lambda: analysis.classify_trajectory(
        [1.0, 2.0], cov, status="blowup", t_blowup=0.5), names="`t_blowup`")
    add("classify-t_blowup-complex", lambda: analysis.classify_trajectory(
        [1.0, 2.0], cov, status="blowup", t_blowup=1 + 1j), names="`t_blowup`")
    # a batch without its trajectories (no t_eval): K = -Q does not blow up, so nothing
    # decides it; with t_eval, one outcome per trajectory
    add("classify-batch", lambda: analysis.classify_solution(
        gp.solve_batch(att, cov, (0, 1))), names="`t_eval`")
    add("classify-batch-t_eval", lambda: analysis.classify_solution(
        gp.solve_batch(att, cov, (0, 1), t_eval=np.linspace(0, 1, 5))),
        "result")
    add("classify-batch-attentions", lambda: analysis.classify_solution(
        gp.solve_batch(att, cov, (0, 1), t_eval=np.linspace(0, 1, 5)), attention=[att]),
        names="`attention`")
    # mixtures
    mix = _mix()
    for k in (5, -3, 1.5, "0", None):
        add(f"component-{k!r}", lambda k=k: mix.component(k), names="`k`")
    for val in ("no", 0, None):
        add(f"sample-stratified-{val!r}", lambda v=val: mix.sample(10, stratified=v),
            names="`stratified`")
    add("sample-n-1e12", lambda: mix.sample(10**12), names="`n`")
    add("mixture-K-20000-merges", lambda: gp.solve_mixture(att, _mix(20_000), (0, 0.01),
                                                          merge_tol=0.1), names="`mixture`")
    for method in ("auto", "BDF", "Radau"):
        add(f"mixture-K-20000-{method}", lambda m=method: gp.solve_mixture(
            att, _mix(20_000), (0, 0.01), method=m), names="GiB")
    add("mixture-point-masses", lambda: gp.solve_mixture(
        att, gp.GaussianMixture([0.5, 0.5], [[0, 0], [1, 0]], np.zeros((2, 2, 2))),
        (0, 0.1)), "result")
    add("mixture-identical", lambda: gp.solve_mixture(
        att, gp.GaussianMixture([0.5, 0.5], [[0, 0], [0, 0]], [I2, I2]), (0, 0.1)),
        "result")
    # exact solutions, certified limits
    for t in (0.5 + 0j, [0.1, 0.2j], True):
        add(f"exact-t-{t!r}", lambda t=t: gp.exact_covariance(att, I2, t), names="`t`")
    Q = np.ones((1, 400)) / np.sqrt(400)
    add("certified-d400", lambda: certified_limit(gp.Softmax(Q, -Q, np.eye(400)),
                                                  np.eye(400)), names="`cov0")
    add("certified-1e16", lambda: certified_limit(_softmax(3), 1e16 * np.eye(3)), "result")
    # particles
    x0 = gp.sample_gaussian(np.zeros(2), I2, 20, seed=0)
    add("particles-progress-str", lambda: gp.simulate_particles(att, x0, (0, 0.1),
                                                                progress="yes"),
        names="`progress`")
    # sweep sizes (refused before any work, with the size)
    for key, val in [("draws", 10**12), ("record__grid", 10**8), ("dims", [10**6])]:
        add(f"sweep-{key}-{val!r}", lambda k=key, v=val: _run_spec(tmp, **{k: v}),
            names="GiB")
    # the solver's n x n matrices: n = d^2 = 40,000 entries, 24 GiB for one setting
    add("sweep-d200-independent", lambda: _run_spec(tmp, dims=[200], draws=1,
                                                    weights__key="independent"), names="GiB")
    add("sweep-draws-1e9-batch-1", lambda: _run_spec(tmp, draws=10**9, batch_size=1),
        names="GiB")
    add("sweep-batch-1e9-draws-4", lambda: _run_spec(tmp, draws=4, batch_size=10**9),
        "result")
    return out


def cases(tmp):
    """Every case, its files in the folder ``tmp``."""
    return _cases(tmp)


def _child(case, conn):
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))
    try:
        case.call()
    except (ValueError, TypeError) as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
    except BaseException as exc:    # noqa: BLE001 - any other exception is the finding
        conn.send((type(exc).__name__, traceback.format_exc()[-1500:]))
    else:
        conn.send(("result", ""))
    conn.close()
    os._exit(0)


def run_case(case, timeout=60.0):
    """``(verdict, detail)`` of one case in a forked process: ``"error"`` (detail: the
    message), ``"result"``, an exception's name, or ``"hang"``."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(case, child))
    proc.start()
    child.close()
    if not parent.poll(timeout):
        proc.kill()
        proc.join()
        return "hang", f"still running after {timeout} s"
    verdict, detail = parent.recv()
    proc.join()
    return verdict, detail


def verdict_ok(case, verdict, detail):
    if case.expect == "result":
        return verdict == "result"
    return verdict == "error" and case.names in detail
