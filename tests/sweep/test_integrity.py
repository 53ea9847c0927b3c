"""Damaged sweep stores: a chunk file truncated, deleted or overwritten.

A resume recomputes the damaged tasks (results identical to an undamaged run); loading or
summarizing raises a ``ValueError`` naming the task and the chunk file. The chunk files
are found from the Zarr metadata on disk (format 2 ``.zarray`` or format 3 ``zarr.json``),
independently of the package's own helpers.
"""

import hashlib
import json
import pathlib
import shutil
import warnings

import numpy as np
import pytest

from gaussian_pde.sweep import (
    DamagedResultsError,
    SweepIntegrityWarning,
    load_results,
    run_sweep,
    summarize,
)
from gaussian_pde.sweep._compute import result_layout
from tests.sweep.test_sweep import assert_same_results, small_spec

#: the damaged task: ("l2", 2, draws 2..3), chunk 1 of block l2/d2
TASK, BLOCK, CHUNK = 7, ("l2", 2), 1


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """An undamaged store of the small sweep (12 tasks), and its loaded results."""
    out = tmp_path_factory.mktemp("pristine") / "res"
    report = run_sweep(small_spec(), out, scheduler="inprocess", progress=False)
    assert report.n_computed == 12 and report.n_damaged == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", SweepIntegrityWarning)  # verified: no warning
        results = load_results(out)
    assert results.verified
    return out, results


@pytest.fixture
def store(pristine, tmp_path):
    """A fresh copy of the pristine store, to damage."""
    out = tmp_path / "res"
    shutil.copytree(pristine[0], out)
    return out


def chunk_file(out, attention, d, name, j):
    """The file holding chunk ``j`` (along the draws) of an array, from its metadata."""
    folder = pathlib.Path(out) / "results.zarr" / attention / f"d{d}" / name
    if (folder / ".zarray").exists():  # Zarr format 2: "j.0.0" (or "j/0/0")
        meta = json.loads((folder / ".zarray").read_text())
        sep = meta.get("dimension_separator") or "."
        return folder / sep.join([str(j)] + ["0"] * (len(meta["shape"]) - 1))
    meta = json.loads((folder / "zarr.json").read_text())  # Zarr format 3: "c/j/0/0"
    enc = meta["chunk_key_encoding"]
    default = enc["name"] == "default"
    sep = enc.get("configuration", {}).get("separator", "/" if default else ".")
    parts = [str(j)] + ["0"] * (len(meta["shape"]) - 1)
    return folder / (("c" + sep if default else "") + sep.join(parts))


def damage(path, how):
    """Truncate, delete, fill with random bytes, or replace by another task's chunk."""
    path = pathlib.Path(path)
    data = path.read_bytes()
    assert len(data) > 2, path
    if how == "truncate":
        path.write_bytes(data[:len(data) // 2])
    elif how == "delete":
        path.unlink()
    elif how == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(len(data)))
    elif how == "foreign":  # a valid chunk of the same array, another task's values
        other = path.with_name(path.name.replace(str(CHUNK), str(CHUNK + 1), 1))
        assert other != path and other.read_bytes() != data
        path.write_bytes(other.read_bytes())
    else:  # pragma: no cover
        raise ValueError(how)


DAMAGES = ["truncate", "delete", "garbage"]
#: a float data array, a small integer one, the record itself and the completion flag
ARRAYS = ["final_cov", "status", "integrity", "done"]
#: garbage that decodes: another task's chunk (arrays whose chunks differ between tasks)
FOREIGN = [("foreign", "final_cov"), ("foreign", "eigenvalues"), ("foreign", "integrity")]
CASES = [(how, name) for how in DAMAGES for name in ARRAYS] + FOREIGN


def _relative(out, path):
    return path.relative_to(out).as_posix()


@pytest.mark.parametrize("how, name", CASES)
def test_resume_recomputes_a_damaged_task(store, pristine, how, name):
    path = chunk_file(store, *BLOCK, name, CHUNK)
    damage(path, how)
    lost_flag = name == "done" and how == "delete"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = run_sweep(small_spec(), store, scheduler="inprocess", progress=False)
    messages = [str(w.message) for w in caught if issubclass(w.category,
                                                             SweepIntegrityWarning)]
    assert report.n_computed == 1 and report.n_skipped == 11
    if lost_flag:  # a missing done chunk reads "not stored": recomputed as any missing task
        assert report.n_damaged == 0 and not messages
    else:
        assert report.n_damaged == 1
        assert len(messages) == 1 and "1 stored task(s) were damaged" in messages[0]
        assert f"task {TASK} (l2, d=2, draws 2..3)" in messages[0]
        assert _relative(store, path) in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", SweepIntegrityWarning)
        assert_same_results(load_results(store), pristine[1])
    again = run_sweep(small_spec(), store, scheduler="inprocess", progress=False)
    assert (again.n_computed, again.n_skipped, again.n_damaged) == (0, 12, 0)


@pytest.mark.parametrize("how, name", CASES)
def test_summarize_names_the_damaged_task(store, how, name):
    path = chunk_file(store, *BLOCK, name, CHUNK)
    damage(path, how)
    if name == "done" and how == "delete":
        # indistinguishable from a kill between the record and the flag: the task counts
        # as not computed, with a warning naming it (the summary says 22/24 settings)
        with pytest.warns(SweepIntegrityWarning, match=f"task\\(s\\) {TASK} have an "
                                                       "integrity record but no done flag"):
            rows = summarize(store)
        assert sum(r["done"] for r in rows) == 22
        return
    with pytest.raises(ValueError) as info:
        summarize(store)
    exc = info.value
    assert isinstance(exc, DamagedResultsError) and exc.tasks == [TASK]
    text = str(exc)
    assert f"task {TASK} (l2, d=2, draws 2..3)" in text
    assert _relative(store, path) in text  # the chunk file, e.g. results.zarr/l2/d2/status/1
    assert f"gaussian-pde sweep run {store / 'spec.toml'} --out {store}" in text
    if how == "delete" and name != "done":
        assert "missing" in text
    with pytest.raises(DamagedResultsError):
        load_results(store)


def test_several_damaged_tasks_are_all_named(store, pristine):
    damage(chunk_file(store, "softmax", 3, "eigenvalues", 0), "truncate")
    damage(chunk_file(store, "l2", 3, "nfev", 2), "garbage")
    with pytest.raises(DamagedResultsError) as info:
        load_results(store)
    assert info.value.tasks == [3, 11]
    assert "2 damaged task(s)" in str(info.value)
    with pytest.warns(SweepIntegrityWarning, match="2 stored task"):
        report = run_sweep(small_spec(), store, scheduler="inprocess", progress=False)
    assert (report.n_damaged, report.n_computed) == (2, 2)
    assert_same_results(load_results(store), pristine[1])


def test_cli_summarize_and_run_on_a_damaged_store(store, pristine, capsys):
    from gaussian_pde.cli._main import main

    path = chunk_file(store, *BLOCK, "final_cov", CHUNK)
    damage(path, "garbage")
    with pytest.raises(SystemExit) as info:
        main(["sweep", "summarize", str(store), "--no-plot"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert f"task {TASK}" in err and _relative(store, path) in err and "sweep run" in err
    with pytest.warns(SweepIntegrityWarning, match=f"task {TASK} "):
        assert main(["sweep", "run", str(store / "spec.toml"), "--out", str(store),
                     "--inprocess", "--no-progress"]) == 0
    assert "1 task(s) computed, 11 already stored" in capsys.readouterr().out
    assert main(["sweep", "summarize", str(store), "--no-plot"]) == 0
    assert "24/24 settings" in capsys.readouterr().out


def test_damaged_last_task_of_an_uneven_block(tmp_path):
    # draws 5 in batches of 2: the last task of each block owns an edge chunk of 1 row
    spec = small_spec(draws=5, dims=[2], attention=["l2"])
    ref, out = tmp_path / "ref", tmp_path / "res"
    run_sweep(spec, ref, scheduler="inprocess", progress=False)
    shutil.copytree(ref, out)
    damage(chunk_file(out, "l2", 2, "done", 2), "garbage")
    damage(chunk_file(out, "l2", 2, "eigenvalues", 2), "truncate")
    with pytest.raises(DamagedResultsError, match="task 2 .*done/2 cannot be decoded"):
        load_results(out)
    with pytest.warns(SweepIntegrityWarning, match="task 2 "):
        report = run_sweep(spec, out, scheduler="inprocess", progress=False)
    assert (report.n_damaged, report.n_computed) == (1, 1)
    assert_same_results(load_results(out), load_results(ref))


def test_damaged_time_grid(store, pristine):
    damage(pathlib.Path(store) / "results.zarr" / "time" / "0", "garbage")
    with pytest.raises(DamagedResultsError, match="time grid"):
        load_results(store)
    report = run_sweep(small_spec(), store, scheduler="inprocess", progress=False)
    assert report.n_computed == 0
    assert_same_results(load_results(store), pristine[1])


def test_integrity_record_is_documented_and_open(pristine):
    """A reader without gaussian_pde can check a task from the stored description."""
    import zarr

    out, _ = pristine
    root = zarr.open_group(str(out / "results.zarr"), mode="r")
    spec = small_spec()
    g = root["l2/d2"]
    rec = g["integrity"]
    names = list(rec.attrs["arrays"])
    assert names == list(result_layout(spec, 2))
    assert rec.dtype == np.uint64 and rec.shape == (3, len(names) + 1)
    assert rec.chunks[0] == 1 and rec.attrs["algorithm"] == "blake2b-64"

    def digest(name, rows):
        rows = np.ascontiguousarray(rows)
        h = hashlib.blake2b(digest_size=8, person=b"gaussian_pde")
        h.update(f"{name}:{rows.dtype.str}:{rows.shape}:".encode())
        h.update(rows.tobytes())
        return int.from_bytes(h.digest(), "little")

    row = np.asarray(rec[CHUNK])
    for k, name in enumerate(names):
        assert int(row[k]) == digest(name, g[name][2:4]), name
    assert int(row[-1]) == digest(f"integrity[{CHUNK}]", row[:-1])


# ------------------------------------------------------------------ stores without records
def make_legacy(out):
    """Turn a store into one written before integrity records existed."""
    for folder in (pathlib.Path(out) / "results.zarr").glob("*/d*/integrity"):
        shutil.rmtree(folder)
    for meta in (pathlib.Path(out) / "manifest.json", pathlib.Path(out) / "results.zarr"
                 / ".zattrs"):
        data = json.loads(meta.read_text())
        data.pop("integrity", None)
        meta.write_text(json.dumps(data))


def test_store_without_records_loads_unverified(store, pristine):
    make_legacy(store)
    with pytest.warns(SweepIntegrityWarning, match="without integrity records"):
        results = load_results(store)
    assert not results.verified
    assert_same_results(results, pristine[1])
    with pytest.warns(SweepIntegrityWarning, match="without integrity records"):
        report = run_sweep(small_spec(), store, scheduler="inprocess", progress=False)
    assert (report.n_computed, report.n_skipped) == (0, 12)


@pytest.mark.parametrize("name, how", [("final_cov", "garbage"), ("status", "delete"),
                                       ("done", "garbage"), ("eigenvalues", "garbage")])
def test_store_without_records_detects_what_it_can(store, pristine, name, how):
    make_legacy(store)
    path = chunk_file(store, *BLOCK, name, CHUNK)
    damage(path, how)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SweepIntegrityWarning)
        with pytest.raises(DamagedResultsError, match=f"task {TASK} .*{_relative(store, path)}"):
            load_results(store)
        report = run_sweep(small_spec(), store, scheduler="inprocess", progress=False)
        assert (report.n_damaged, report.n_computed) == (1, 1)
        assert_same_results(load_results(store), pristine[1])
