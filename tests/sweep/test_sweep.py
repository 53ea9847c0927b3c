"""Tests of gaussian_pde.sweep: specification, storage, resumption, Dask execution.

The cluster tests (marked slow) use a real ``dask.distributed.LocalCluster`` with two
worker processes on 127.0.0.1; no traffic leaves the loopback interface. Every cluster,
subprocess and thread has a timeout.
"""

import contextlib
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.sweep import (
    OUTCOMES,
    SchedulerUnreachableError,
    SweepSpec,
    classify_outcome,
    compute_batch,
    draw_setting,
    format_summary,
    limit_rank,
    load_results,
    run_sweep,
    summarize,
)
from gaussian_pde.sweep import _estimate as _sweep_estimate
from gaussian_pde.sweep import _run as _sweep_run

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: small sweep: 2 types x 2 dims x 6 draws, 2 settings per task -> 12 tasks
SMALL = """
[sweep]
attention = ["softmax", "l2"]
dims = [2, 3]
draws = 6
seed = 7
batch_size = 2

[solver]
horizon = 5.0

[record]
grid = 5
"""


def small_spec(**sweep):
    spec = SweepSpec.from_toml_string(SMALL)
    data = spec.to_dict()
    data["sweep"].update(sweep)
    return SweepSpec.from_dict(data)


def assert_same_results(a, b):
    """Bitwise equality of every stored array (NaN equal to NaN)."""
    assert a.spec == b.spec
    assert a.blocks.keys() == b.blocks.keys()
    for key, block in a.blocks.items():
        assert block.keys() == b.blocks[key].keys()
        for name, x in block.items():
            y = b.blocks[key][name]
            assert x.dtype == y.dtype and x.shape == y.shape, (key, name)
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), (key, name)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_lines(path):
    out = []
    with contextlib.suppress(FileNotFoundError):
        for line in (pathlib.Path(path) / "tasks.log").read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The small sweep run in-process, uninterrupted."""
    out = tmp_path_factory.mktemp("reference") / "res"
    report = run_sweep(small_spec(), out, scheduler="inprocess", progress=False)
    assert report.n_computed == report.n_tasks == 12
    return load_results(out)


# ------------------------------------------------------------------ specification
def test_spec_toml_round_trip_and_fingerprint():
    spec = small_spec()
    again = SweepSpec.from_toml_string(spec.to_toml())
    assert again == spec and again.fingerprint == spec.fingerprint
    assert spec.n_tasks == 12 and spec.n_settings == 24
    assert spec.task(0) == ("softmax", 2, 0, 2)
    assert spec.task(11) == ("l2", 3, 4, 6)
    assert small_spec(seed=8).fingerprint != spec.fingerprint


def test_example_spec_is_valid():
    spec = SweepSpec.from_toml(ROOT / "examples" / "sweep_small.toml")
    assert set(spec.attention) <= set(gp.ATTENTIONS)


@pytest.mark.parametrize("text, key", [
    ("[sweep]\nattention=['softmax']\ndims=[2]\ndraws=3\nsed=1\n", "sweep.sed"),
    ("[sweep]\nattention=['softmax']\ndims=[2]\ndraws=3\n[weights]\nkk=1\n", "weights.kk"),
    ("[sweep]\nattention=['softmax']\ndims=[2]\ndraws=3\n[solvr]\n", "solvr"),
    ("[sweep]\nattention=['softmax']\ndims=[2]\ndraws=3\n[weights]\nkey='minus'\n",
     "weights.key"),
    ("[sweep]\nattention=['softmaxx']\ndims=[2]\ndraws=3\n", "sweep.attention"),
    ("[sweep]\nattention=['softmax']\ndims=[2]\ndraws=3\nbatch_size=0\n", "sweep.batch_size"),
    ("[sweep]\nattention=['softmax']\ndims=[2]\ndraws=-5\n", "sweep.draws"),
    ("[sweep]\nattention=['softmax']\ndims=[2]\n", "sweep.draws"),
])
def test_bad_toml_names_key_and_file(tmp_path, text, key):
    path = tmp_path / "bad_spec.toml"
    path.write_text(text)
    with pytest.raises((ValueError, TypeError)) as info:
        SweepSpec.from_toml(path)
    assert key in str(info.value) and "bad_spec.toml" in str(info.value)


def test_bad_toml_syntax_names_file(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[sweep\n")
    with pytest.raises(ValueError, match="broken.toml.*not valid TOML"):
        SweepSpec.from_toml(path)


def test_attention_must_preserve_gaussians():
    for name, cls in gp.ATTENTIONS.items():
        if not cls.gaussian_preserving:
            with pytest.raises(ValueError, match="does not preserve Gaussians"):
                SweepSpec(attention=[name], dims=[2], draws=1)


def test_negative_draws_python_object():
    with pytest.raises(ValueError, match="`sweep.draws` must be at least 1, got -1"):
        SweepSpec(attention=["softmax"], dims=[2], draws=-1)


# ------------------------------------------------------------------ computation
def test_task_recomputes_alone_and_seeds_do_not_depend_on_batching(reference):
    spec = small_spec()
    alone = compute_batch(spec, 7)  # ("l2", 2, 2, 4)
    block = reference.blocks[("l2", 2)]
    for name, arr in alone.items():
        assert np.array_equal(arr, block[name][2:4], equal_nan=arr.dtype.kind == "f"), name
    # one setting per task: the same numbers for the same (attention, d, draw), up to the
    # rounding of the vectorised integrator (a different batch size is a different sweep;
    # the same task always recomputes bit for bit, checked above)
    single = compute_batch(small_spec(batch_size=1), spec.draws + 3)  # softmax, d=3, draw 3
    np.testing.assert_allclose(single["final_cov"][0],
                               reference.blocks[("softmax", 3)]["final_cov"][3], rtol=1e-12)
    # the same draw gives the same Sigma_0 and weights for every attention type
    a, c_a = draw_setting(spec, "softmax", 3, 4)
    b, c_b = draw_setting(spec, "l2", 3, 4)
    assert np.array_equal(c_a, c_b) and np.array_equal(a.Q, b.Q)
    assert np.array_equal(a.K, -a.Q) and a.k == 1


def test_blowup_times_match_the_exact_riccati_solution():
    # softmax, V = I, K = Q: A + A^T = 2 Q^T Q / sqrt(k) >= 0, so every draw blows up at
    # t* = 1 / lambda_max(Sigma0^1/2 (A + A^T) Sigma0^1/2) (docs/math.md section 4.1)
    spec = SweepSpec.from_dict({
        "sweep": {"attention": ["softmax"], "dims": [3], "draws": 4, "seed": 3,
                  "batch_size": 4},
        "weights": {"key": "query", "k": "full"}, "solver": {"horizon": 50.0}})
    res = compute_batch(spec, 0)
    assert np.all(res["outcome"] == OUTCOMES.index("blowup"))
    for draw in range(4):
        att, cov0 = draw_setting(spec, "softmax", 3, draw)
        w, U = np.linalg.eigh(cov0)
        s = U @ np.diag(np.sqrt(w)) @ U.T
        t_star = 1.0 / np.linalg.eigvalsh(s @ (att.A + att.A.T) @ s)[-1]
        # the estimate extrapolates from tr = 1e8 tr0: relative error well below 1e-6
        assert res["t_blowup"][draw] == pytest.approx(t_star, rel=1e-6)
        assert res["limit_rank"][draw] == 1  # blow-up along one direction


def test_classify_outcome_speaks_the_words_of_classify_trajectory():
    """One vocabulary: the stored codes index gp.Outcome, decided by classify_trajectory."""
    assert OUTCOMES == tuple(o.value for o in gp.Outcome)
    t = np.linspace(0.0, 1.0, 5)
    grow = np.array([np.eye(2) / (1.0 - 0.9 * s) for s in t])
    assert OUTCOMES[classify_outcome(t, grow, "blowup", 1.11)] == "blowup"
    assert OUTCOMES[classify_outcome(t, grow, "failed")] == "undecided"
    assert OUTCOMES[classify_outcome(t, grow, "error")] == "undecided"
    # settled at rank 1: one eigenvalue constant, the other decaying fast
    t = np.linspace(0.0, 50.0, 51)
    line = np.array([np.diag([1.0, np.exp(-s)]) for s in t])
    out = gp.classify_trajectory(t, line, status="steady")
    assert OUTCOMES[classify_outcome(t, line, "steady")] == out.outcome.value == "rank"
    assert limit_rank(line[-1], 1e-4) == gp.analysis.limit_rank(line[-1] / 1.0, rtol=0,
                                                                 atol=1e-4) == 1


# ------------------------------------------------------------------ storage and resumption
def test_interrupted_inprocess_run_resumes_to_identical_results(tmp_path, reference,
                                                                monkeypatch):
    out = tmp_path / "res"
    calls = []
    real = _sweep_run.compute_batch

    def interrupted(spec, index):
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append(index)
        return real(spec, index)

    monkeypatch.setattr(_sweep_run, "compute_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(small_spec(), out, scheduler="inprocess", progress=False)
    assert load_results(out).n_done == 10
    monkeypatch.setattr(_sweep_run, "compute_batch", real)
    report = run_sweep(small_spec(), out, scheduler="inprocess", progress=False)
    assert (report.n_skipped, report.n_computed) == (5, 7)
    assert_same_results(load_results(out), reference)
    tasks = [line["task"] for line in log_lines(out)]
    assert sorted(tasks) == list(range(12))  # each task stored exactly once
    again = run_sweep(small_spec(), out, scheduler="inprocess", progress=False)
    assert again.n_computed == 0 and again.n_skipped == 12


def test_store_is_open_zarr_with_metadata(reference, tmp_path):
    import zarr

    out = tmp_path / "res"
    run_sweep(small_spec(dims=[2], attention=["l2"]), out, scheduler="inprocess",
              progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["package_version"] == gp.__version__
    root = zarr.open_group(str(out / "results.zarr"), mode="r")
    assert root.attrs["fingerprint"] == manifest["fingerprint"]
    assert root.attrs["spec"]["sweep"]["dims"] == [2]
    arr = root["l2/d2/final_cov"]
    assert arr.chunks == (2, 2, 2) and arr.dtype == np.float64  # one chunk per task
    for name in ("status", "outcome", "limit_rank", "final_cov", "eigenvalues", "done"):
        assert root[f"l2/d2/{name}"].dtype != object
    assert SweepSpec.from_toml(out / "spec.toml") == small_spec(dims=[2], attention=["l2"])


def test_results_folder_of_another_spec_is_refused(tmp_path):
    out = tmp_path / "res"
    run_sweep(small_spec(draws=2), out, scheduler="inprocess", progress=False)
    with pytest.raises(ValueError, match=r"different sweep specification.*sweep\.draws"
                                         r".*start fresh.*rm -r"):
        run_sweep(small_spec(draws=3), out, scheduler="inprocess", progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a sweep results folder"):
        run_sweep(small_spec(draws=2), tmp_path / "other", scheduler="inprocess",
                  progress=False)


def test_local_workers_past_the_memory_are_refused_before_any_work(tmp_path):
    """Each local worker process takes about 200 MiB before its first task: 10^8 of them
    (1.95e7 GiB) are past half of any machine's memory; refused with the size and nothing
    written. Workers that are not a positive integer and a connection timeout that is not
    a finite positive number (Dask has no time span for inf) are refused too."""
    out = tmp_path / "res"
    with pytest.raises(ValueError, match=r"`workers` = 100000000 worker processes would "
                                         r"need 1\.95e\+07 GiB"):
        run_sweep(small_spec(), out, workers=10**8, progress=False)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="`workers` must be a positive integer"):
            run_sweep(small_spec(), out, workers=bad, progress=False)
    for bad in (float("inf"), float("nan"), 0.0):
        with pytest.raises(ValueError, match="`connect_timeout` must be a finite positive"):
            run_sweep(small_spec(), out, scheduler="inprocess", connect_timeout=bad,
                      progress=False)
    assert not out.exists()


def test_summary_counts(reference, capsys):
    rows = summarize(reference)
    assert len(rows) == 4
    for row in rows:
        assert row["done"] == row["total"] == 6
        assert sum(row["ranks"]) == 6 and len(row["ranks"]) == row["d"] + 1
        assert sum(row["outcomes"].values()) == pytest.approx(1.0)
    text = format_summary(rows)
    assert "softmax" in text and "undecided" in text and "rank" in text


def test_cli_run_and_summarize(tmp_path, capsys):
    from gaussian_pde.cli._main import main

    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(small_spec(draws=2).to_toml())
    out = tmp_path / "res"
    assert main(["sweep", "run", str(spec_path), "--out", str(out), "--inprocess",
                 "--no-progress"]) == 0
    assert "4 task(s) computed, 0 already stored" in capsys.readouterr().out
    fig = tmp_path / "fig.png"
    assert main(["sweep", "summarize", str(out), "--plot", str(fig)]) == 0
    printed = capsys.readouterr().out
    assert "8/8 settings" in printed and "l2" in printed
    assert fig.stat().st_size > 1000


# ------------------------------------------------------------------ scheduler errors
def test_unreachable_scheduler_fails_fast(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(SchedulerUnreachableError, match="no Dask scheduler answered at "
                                                        f"{address} within 2 s"):
        run_sweep(small_spec(), tmp_path / "res", scheduler=address, connect_timeout=2)
    assert time.monotonic() - start < 20


def test_importing_the_package_imports_no_dask():
    code = ("import sys, gaussian_pde, gaussian_pde.sweep; "
            "bad = [m for m in ('dask', 'distributed', 'zarr', 'matplotlib') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))


# ------------------------------------------------------------------ real Dask cluster
@pytest.fixture(scope="module")
def cluster():
    """Two single-threaded worker processes on 127.0.0.1; each task sleeps 0.3 s first,
    so that sweeps can be interrupted mid-way."""
    distributed = pytest.importorskip("distributed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(_sweep_run._DELAY_ENV, "0.3")  # inherited by the worker processes
        cl = _sweep_run.local_cluster(2)  # a distributed.LocalCluster on 127.0.0.1
    client = distributed.Client(cl, timeout=30)
    try:
        client.wait_for_workers(2, timeout=60)
        yield client
    finally:
        client.close(timeout=30)
        cl.close(timeout=30)


def _in_thread(fn):
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


@pytest.mark.slow
def test_local_cluster_matches_inprocess(cluster, reference, tmp_path):
    assert all(addr.startswith("tcp://127.0.0.1:") for addr in cluster.nthreads())
    report = run_sweep(small_spec(), tmp_path / "res", scheduler=cluster, progress=False)
    assert report.n_computed == 12 and report.n_workers == 2
    assert len({line["pid"] for line in log_lines(tmp_path / "res")}) == 2  # both worked
    assert_same_results(load_results(tmp_path / "res"), reference)


@pytest.mark.slow
def test_worker_killed_mid_sweep(cluster, reference, tmp_path):
    out = tmp_path / "res"
    pids = cluster.run(os.getpid)
    thread, box = _in_thread(lambda: run_sweep(small_spec(), out, scheduler=cluster,
                                               progress=False))
    deadline = time.monotonic() + 60
    while len(log_lines(out)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    landed = len(log_lines(out))
    victim = next(iter(pids.values()))
    os.kill(victim, signal.SIGKILL)
    assert 2 <= landed < 12, "the sweep was not interrupted mid-way"
    thread.join(120)
    assert not thread.is_alive(), "the sweep did not finish after a worker was killed"
    if "error" in box:
        raise box["error"]
    assert box["value"].n_computed == 12
    assert_same_results(load_results(out), reference)
    cluster.wait_for_workers(2, timeout=60)  # the nanny restarted the worker


@pytest.mark.slow
def test_driver_killed_and_resumed(cluster, reference, tmp_path):
    out = tmp_path / "res"
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(small_spec().to_toml())
    address = cluster.scheduler.address
    cmd = [sys.executable, "-m", "gaussian_pde", "sweep", "run", str(spec_path), "--out",
           str(out), "--scheduler", address, "--no-progress"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    driver = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while len(log_lines(out)) < 3 and time.monotonic() < deadline:
            assert driver.poll() is None, driver.communicate()
            time.sleep(0.02)
        driver.send_signal(signal.SIGKILL)  # kill -9
        driver.wait(30)
    finally:
        if driver.poll() is None:
            driver.kill()
    from gaussian_pde.sweep._store import SweepStore

    done = set(SweepStore(out, small_spec()).done_tasks())
    stored = len(done)
    assert 3 <= stored < 12, "the driver was not killed mid-sweep"
    rerun = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{12 - stored} task(s) computed, {stored} already stored" in rerun.stdout
    # tasks.log is informative: a task's line is appended after its `done` flag, so a kill
    # between the two loses the line of a task that is nevertheless stored (the flags are
    # the record). So: no task logged twice, every task stored, and the second run logged
    # exactly the tasks that were missing.
    lines = log_lines(out)
    tasks = [line["task"] for line in lines]
    assert len(tasks) == len(set(tasks)) and set(tasks) <= set(range(12))  # no duplicates
    assert set(SweepStore(out, small_spec()).done_tasks()) == set(range(12))
    second = {line["task"] for line in lines if line["run"] != lines[0]["run"]}
    assert second == set(range(12)) - done  # only the missing tasks were computed
    assert_same_results(load_results(out), reference)


@pytest.mark.slow
def test_cli_unreachable_scheduler(tmp_path):
    address = f"tcp://127.0.0.1:{free_port()}"
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(small_spec().to_toml())
    proc = subprocess.run(
        [sys.executable, "-m", "gaussian_pde", "sweep", "run", str(spec_path), "--out",
         str(tmp_path / "res"), "--scheduler", address, "--connect-timeout", "2"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
        text=True, timeout=60)
    assert proc.returncode == 3
    assert f"no Dask scheduler answered at {address}" in proc.stderr


def test_unknown_solver_method_is_refused_when_the_spec_is_built():
    """Regression: a spec with a misspelt solver method was accepted (and failed, or ran
    something else, only when a task ran)."""
    data = SweepSpec.from_toml_string(SMALL).to_dict()
    data["solver"]["method"] = "RK99"
    with pytest.raises(ValueError, match=r"solver\.method.*'RK99'"):
        SweepSpec.from_dict(data)
    with pytest.raises(ValueError, match=r"solver\.method"):
        SweepSpec.from_toml_string(SMALL.replace("horizon = 5.0",
                                                 'horizon = 5.0\nmethod = "dop853"'))
    for method in ("DOP853", "LSODA", "auto", "rosenbrock"):
        data["solver"]["method"] = method
        assert SweepSpec.from_dict(data).solver.method == method


def test_example_softmax_d2_certified_rank_one():
    # examples/sweep_small.toml: softmax, d = 2, K = -Q, V = I, horizon 20. At the horizon
    # most covariances still look full rank (the vanishing eigenvalue decays like 1/t);
    # the recorded limit rank is the certified one: d - rank(Q) = 1 for every setting.
    from gaussian_pde.sweep import OUTCOMES, compute_batch

    spec = SweepSpec.from_toml(ROOT / "examples" / "sweep_small.toml")
    assert spec.task(0)[:2] == ("softmax", 2)
    arrays = compute_batch(spec, 0)
    assert arrays["limit_rank"].size == spec.batch_size
    assert np.all(arrays["limit_rank"] == 1)
    assert np.all(arrays["outcome"] == OUTCOMES.index("rank"))


def test_example_sweep_certifies_every_setting():
    """The whole example sweep (softmax and L2, d = 2..4, K = -Q, V = I): every task
    computes, and every setting's certified limit has the rank d - rank(Q) that the
    theorem gives (docs/math.md 4.5). One L2 d = 3 task once stopped on a LAPACK
    "Singular matrix": a trial stage of the batched log-time integration met a gain
    matrix I + e H e whose entries reach 1e24, exactly singular in floating point."""
    from gaussian_pde.sweep import OUTCOMES, compute_batch

    spec = SweepSpec.from_toml(ROOT / "examples" / "sweep_small.toml")
    for task in range(spec.n_tasks):
        attention, d, lo, hi = spec.task(task)
        arrays = compute_batch(spec, task)
        assert np.all(arrays["outcome"] == OUTCOMES.index("rank")), (attention, d, lo)
        assert np.all(arrays["limit_rank"] == d - d // 2), (attention, d, lo)


def test_a_batch_larger_than_the_draws_stores_chunks_of_the_draws(tmp_path):
    """batch_size = 10**9 with 4 draws: one task, its chunks sized by the 4 rows stored."""
    import zarr

    out = tmp_path / "res"
    spec = small_spec(dims=[2], attention=["l2"], draws=4, batch_size=10**9)
    rep = run_sweep(spec, out, scheduler="inprocess", progress=False)
    assert rep.n_tasks == 1 and rep.n_computed == 1
    root = zarr.open_group(str(out / "results.zarr"), mode="r")
    assert root["l2/d2/final_cov"].chunks == (4, 2, 2)
    assert root["l2/d2/done"].chunks == (4,)
    res = load_results(out)
    assert res.n_done == 4
    ref = compute_batch(spec, 0)
    np.testing.assert_array_equal(res.blocks[("l2", 2)]["final_cov"], ref["final_cov"])


@pytest.mark.parametrize("change, needs", [
    ({"draws": 10**12}, "bookkeeping"),
    ({"draws": 10**9, "batch_size": 1}, "bookkeeping"),
    ({"dims": [10**6]}, "one task"),
    ({"batch_size": 10**9, "draws": 10**9}, "one task"),
    ({"record.grid": 10**8}, "one task"),
    ({"draws": 10**9, "batch_size": 10**5}, "results"),
])
def test_a_sweep_too_large_for_the_machine_is_refused_before_any_work(tmp_path, monkeypatch,
                                                                      change, needs):
    data = small_spec().to_dict()
    for key, value in change.items():
        table, name = key.split(".") if "." in key else ("sweep", key)
        data[table][name] = value
    spec = SweepSpec.from_dict(data)
    monkeypatch.setattr(_sweep_run, "compute_batch", lambda *a: pytest.fail("work started"))
    out = tmp_path / "res"
    with pytest.raises(ValueError, match=rf"{needs}.* GiB.*memory"):
        run_sweep(spec, out, scheduler="inprocess", progress=False)
    assert not out.exists()
    need = _sweep_run.sweep_resources(spec, "inprocess")
    # the estimate is the size of what would be stored: at least the rows of final_cov
    assert need["results_bytes"] >= 8 * spec.draws * min(spec.dims) ** 2


def test_a_long_sweep_says_its_size_before_the_first_task(tmp_path, monkeypatch, capsys):
    """dims 2..101: the size is on stderr at once, then the bar follows each task."""
    spec = small_spec(dims=list(range(2, 102)), draws=2, batch_size=1)

    def first_task(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(_sweep_run, "compute_batch", first_task)
    monkeypatch.setattr(_sweep_estimate, "compute_batch", first_task)   # the pilot's
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path / "res", scheduler="inprocess", progress=True)
    err = capsys.readouterr().err
    n_blocks = len(spec.blocks)
    assert f"sweep: {n_blocks * 2} task(s), {n_blocks * 2} settings in {n_blocks} block(s), " \
           "d up to 101" in err


def test_cli_refuses_a_sweep_too_large_with_one_line(tmp_path, capsys):
    from gaussian_pde.cli._main import main

    data = small_spec().to_dict()
    data["sweep"]["draws"] = 10**12
    (tmp_path / "big.toml").write_text(SweepSpec.from_dict(data).to_toml())
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "run", str(tmp_path / "big.toml"), "--inprocess", "--out",
              str(tmp_path / "res")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "GiB" in err
    assert not (tmp_path / "res").exists()


def _cost(c, b, q):
    """A pilot whose settings take ``c + b d^q`` seconds (a fixed cost and a power law)."""
    timed = []

    def pilot(spec, index, rows):
        d = spec.task(index)[1]
        timed.append((d, rows))
        return rows * (c + b * d**q), rows
    return pilot, timed


def test_a_huge_sweep_says_where_it_cannot_estimate(tmp_path, monkeypatch, capsys):
    """dims 2..101, one draw: the start line gives the size, then an estimate of the
    dimensions the pilot reaches and says that it cannot estimate beyond them."""
    import re

    spec = small_spec(dims=list(range(2, 102)), draws=1, batch_size=1)
    pilot, timed = _cost(1e-3, 1e-6, 5)

    def first_task(*args):
        raise KeyboardInterrupt
    monkeypatch.setattr(_sweep_estimate, "_run_pilot", lambda s, i, r, keep: pilot(s, i, r))
    monkeypatch.setattr(_sweep_estimate, "_warm_up", lambda *a: None)
    monkeypatch.setattr(_sweep_run, "compute_batch", first_task)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(spec, tmp_path / "res", scheduler="inprocess", progress=True)
    line = capsys.readouterr().err.splitlines()[0]
    assert line.startswith("sweep: ") and "d up to 101" in line
    found = re.search(r"; estimated time ~\S+ \S+ \(\S+ \S+ to \S+ \S+\) on one worker for "
                      r"d <= (\d+) \(\d+ task\(s\) timed, d up to (\d+), time per setting "
                      r"growing ~ d\^(\S+) there\); cannot estimate beyond d = (\d+): ", line)
    assert found, line
    reach, d_pilot, p, beyond = found.groups()
    assert reach == beyond and int(reach) == 2 * int(d_pilot) < 101
    assert float(p) == pytest.approx(5, abs=0.3)
    # the pilot kept within its budget (at most _PILOT_MAX over both types)
    assert sum(r * (1e-3 + 1e-6 * d**5) for d, r in timed) < _sweep_estimate._PILOT_MAX


@pytest.mark.parametrize("budget", [0.05, 1.0, 100.0])
def test_the_estimate_fits_the_growth_of_the_cost(budget):
    """Settings costing c + b d^q: the pilot times dimensions spread over the range, the
    fitted slope is q, and the estimate (and its range) holds the true time of the
    dimensions it covers, within the pilot's budget."""
    spec = small_spec(attention=["softmax"], dims=list(range(2, 41)), draws=3, batch_size=3)
    c, b, q = 2e-3, 1e-6, 5
    pilot, timed = _cost(c, b, q)
    est = _sweep_estimate.estimate_sweep(spec, budget=budget, pilot=pilot,
                                         warm_up=lambda *a: None)
    # one setting at d = 2 first (a task of 3), then one task (or part) per dimension
    assert timed[0] == (2, 1) and len({d for d, _ in timed}) == est.n_pilot >= 2
    assert sum(r * (c + b * d**q) for d, r in timed[:-1]) <= budget
    top = est.d_reach or 40
    true = sum(3 * (c + b * d**q) for d in range(2, top + 1))
    spent = est.pilot_seconds     # the wall time of the (simulated) pilot: ~0
    # (the range's ends, widened by 10% for the log-log interpolation between pilots)
    assert est.low - spent <= 1.1 * true and true <= 1.1 * (est.high - spent)
    assert est.seconds - spent == pytest.approx(true, rel=0.5)
    if np.isfinite(est.exponent):    # the growth was measured: the estimate reaches 2 d_pilot
        assert est.exponent == pytest.approx(q, abs=0.3)
        assert est.d_reach is None or est.d_reach == 2 * est.d_pilot
    else:                            # only fixed costs timed: no extrapolation at all
        assert est.d_reach == est.d_pilot
    if est.d_reach is not None:
        assert est.all_seconds > est.seconds


def test_the_estimate_schedules_the_tasks_on_the_workers():
    """One long last task: two workers do not halve it (list scheduling, in order)."""
    assert _sweep_estimate._wall([1.0, 1.0, 1.0, 10.0], 2) == 11.0
    assert _sweep_estimate._wall([1.0] * 4, 2) == 2.0
    assert _sweep_estimate._wall([1.0] * 4, 1) == 4.0


def test_a_setting_s_growth_not_measured_is_not_extrapolated():
    """Costs flat over the timed dimensions (fixed costs only): no growth to fit, so the
    estimate covers the timed dimensions only and says so."""
    spec = small_spec(attention=["softmax"], dims=[2, 4, 50], draws=1, batch_size=1)
    est = _sweep_estimate.estimate_sweep(
        spec, budget=1.0, pilot=lambda s, i, r: (0.01 * r if s.task(i)[1] < 50 else 1.0, r),
        warm_up=lambda *a: None)
    assert est.d_reach == 4 and est.d_pilot == 4 and np.isnan(est.exponent)
    words = _sweep_estimate.estimate_words(est, "one worker")
    assert "cannot estimate beyond d = 4" in words


def test_a_small_sweep_s_estimate_holds(tmp_path, capsys):
    """A real sweep of a few seconds (softmax, K = -Q, d = 2..12, one draw): the start-up
    estimate is within 3x of the time measured by the same run (both include the pilot,
    whose whole tasks are stored, not computed twice)."""
    spec = small_spec(attention=["softmax"], dims=list(range(2, 13)), draws=1, batch_size=1)
    report = run_sweep(spec, tmp_path / "res", scheduler="inprocess", progress=True)
    line = capsys.readouterr().err.splitlines()[0]
    est = report.estimate
    assert "; estimated time ~" in line and est.n_pilot >= 2, line
    assert report.n_computed == spec.n_tasks and len(est.kept) >= 2
    assert len(log_lines(tmp_path / "res")) == spec.n_tasks    # no task computed twice
    assert est.d_reach is None
    assert 1 / 3 <= est.seconds / report.seconds <= 3, (line, report.seconds)


def _measured(out, spec, top):
    """Seconds of the stored tasks with d <= top, from the results' task log."""
    return sum(line["seconds"] for line in log_lines(out) if spec.task(line["task"])[1] <= top)


@pytest.mark.slow
def test_an_extrapolated_estimate_holds(tmp_path):
    """A pilot too short for the largest dimensions (softmax, K = -Q, d = 2..20, 2 s):
    the extrapolated estimate is within 3x of the tasks' measured time (about 20 s)."""
    spec = small_spec(attention=["softmax"], dims=list(range(2, 21)), draws=1, batch_size=1)
    _sweep_estimate._warm_up(spec, "softmax", 2)      # the kernels loaded, as in a run
    est = _sweep_estimate.estimate_sweep(spec, budget=2.0)
    assert est.d_pilot < 20 and np.isfinite(est.exponent) and not est.kept
    out = tmp_path / "res"
    run_sweep(spec, out, scheduler="inprocess", progress=False)
    top = est.d_reach or 20
    measured = _measured(out, spec, top)
    assert 1 / 3 <= (est.seconds - est.pilot_seconds) / measured <= 3, (est, measured)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [
    pytest.param(lambda: small_spec(attention=["softmax"], dims=list(range(2, 25)), draws=1,
                                    batch_size=1), id="softmax-d2-24-one-draw"),
    pytest.param(lambda: SweepSpec.from_toml(ROOT / "examples" / "sweep_small.toml"),
                 id="sweep_small"),
    pytest.param(lambda: SweepSpec.from_toml(ROOT / "examples" / "sweep_linear.toml"),
                 id="sweep_linear")])
def test_the_start_up_estimate_holds(spec, tmp_path):
    """The start-up estimate of a whole run against the run's measured time: within 3x."""
    spec = spec()
    report = run_sweep(spec, tmp_path / "res", scheduler="inprocess", progress=True)
    est = report.estimate
    top = est.d_reach or max(spec.dims)
    measured = report.seconds if est.d_reach is None else (
        est.pilot_seconds + _measured(tmp_path / "res", spec, top))
    assert 1 / 3 <= est.seconds / measured <= 3, (est, report.seconds)


@pytest.mark.parametrize("progress", [False, True])
def test_a_task_out_of_memory_names_the_task_and_its_size(tmp_path, monkeypatch, capsys,
                                                          progress):
    """An allocation that fails in a task (in the run, or in the estimate's pilot): a
    MemoryError naming the task and what it asks for; the CLI prints it on one line."""
    from gaussian_pde.cli._main import main

    def compiled_allocation(*args):
        raise MemoryError("Allocation failed (probably too large)")
    monkeypatch.setattr(_sweep_run, "compute_batch", compiled_allocation)
    monkeypatch.setattr(_sweep_estimate, "compute_batch", compiled_allocation)
    spec = small_spec(attention=["l2"], dims=[3], draws=2)
    with pytest.raises(MemoryError, match=r"sweep task 0 \(l2, d = 3, draws 0\.\.1\) ran out "
                                          r"of memory \(Allocation failed .*\); it asks for "
                                          r"about \S+ GiB, \S+ GiB of them the solver's n x n "
                                          r"matrices \(n = 9\)"):
        run_sweep(spec, tmp_path / "res", scheduler="inprocess", progress=progress)
    (tmp_path / "spec.toml").write_text(spec.to_toml())
    argv = ["sweep", "run", str(tmp_path / "spec.toml"), "--inprocess", "--out",
            str(tmp_path / "res2")] + ([] if progress else ["--no-progress"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert exc.value.code == 2 and len(err) == 1 and "out of memory: sweep task 0" in err[0]


def test_the_memory_check_counts_the_solver_s_matrices(monkeypatch):
    """d = 200 with one draw: a few MiB of results, but the solver's two n x n matrices,
    n = d^2, are 16 n^2 bytes (24 GiB): counted in the task, refused up front."""
    spec = small_spec(attention=["softmax"], dims=[200], draws=1)
    need = _sweep_run.sweep_resources(spec, "inprocess")
    assert need["solver_bytes"] == 16.0 * (200 * 200) ** 2
    assert need["task_bytes"] > need["solver_bytes"]
    # the mean's column where the field sees the mean: n = d (d + 1)
    linear = small_spec(attention=["linear"], dims=[10], draws=1)
    assert _sweep_run.sweep_resources(linear)["solver_bytes"] == 16.0 * (10 * 11) ** 2
    # explicit Runge-Kutta pairs hold no n x n matrix
    data = spec.to_dict()
    data["solver"]["method"] = "RK45"
    assert _sweep_run.sweep_resources(SweepSpec.from_dict(data))["solver_bytes"] == 0
    monkeypatch.setattr(_sweep_run, "_memory_bytes", lambda: 32 * 2**30)   # half: 16 GiB
    with pytest.raises(ValueError, match=r"one task would hold 23\.\d GiB .*solver's n x n "
                                         r"matrices, n = 40000 .*lower sweep\.dims"):
        _sweep_run.check_resources(spec, "inprocess")


def test_the_progress_bar_weighs_the_time_left_by_the_estimate():
    """Tasks of growing cost: after the cheap first one, the time left is scaled by the
    predicted seconds of those left (9 times its own), not by their count (2 times)."""
    import io
    import re

    stream = io.StringIO()
    bar = _sweep_run._Progress(3, 1, True, stream=stream)
    bar.weigh({0: 1.0, 1: 1.0, 2: 8.0}, [0, 1, 2])
    bar.start = time.perf_counter() - 2.0             # the first task took 2 s
    bar.update(1, force=True, index=0)
    eta = float(re.search(r"eta (\d+)s", stream.getvalue()).group(1))
    assert 17 <= eta <= 19, stream.getvalue()
    unweighted = _sweep_run._Progress(3, 1, True, stream=io.StringIO())
    unweighted.start = bar.start
    unweighted.update(1, force=True)
    assert "eta 4s" in unweighted.stream.getvalue()
