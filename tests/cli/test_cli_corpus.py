"""Bad command lines: one line on stderr, exit status 2, no traceback, for every subcommand.

Every case runs ``gaussian_pde.cli.main(argv)`` in a forked process with a time limit
(a bad value that slipped through would start a long study instead of failing), in a
fresh temporary folder that holds the input files the cases name.
"""

import multiprocessing
import os
import pathlib
import sys

import pytest

from gaussian_pde.cli._main import main

TIMEOUT = 30.0

GOOD_SPEC = """
[sweep]
attention = ["l2"]
dims = [2]
draws = 2
batch_size = 2

[solver]
horizon = 1.0

[record]
grid = 3
"""

#: file name -> contents, written into the case's folder
FILES = {
    "good.toml": GOOD_SPEC,
    "syntax.toml": "[sweep\nattention = ['l2']\n",
    "unknown_table.toml": GOOD_SPEC + "\n[solvr]\nrtol = 1e-6\n",
    "unknown_key.toml": GOOD_SPEC.replace("draws = 2", "draws = 2\ndraw = 3"),
    "wrong_type.toml": GOOD_SPEC.replace("draws = 2", 'draws = "two"'),
    "negative.toml": GOOD_SPEC.replace("draws = 2", "draws = -2"),
    "float_int.toml": GOOD_SPEC.replace("draws = 2", "draws = 2.5"),
    "bad_attention.toml": GOOD_SPEC.replace('["l2"]', '["relu"]'),
    "sigmoid.toml": GOOD_SPEC.replace('["l2"]', '["sigmoid"]'),
    "nan_horizon.toml": GOOD_SPEC.replace("horizon = 1.0", "horizon = nan"),
    "inf_rtol.toml": GOOD_SPEC.replace("horizon = 1.0", "horizon = 1.0\nrtol = inf"),
    "bad_method.toml": GOOD_SPEC.replace("horizon = 1.0", 'horizon = 1.0\nmethod = "Euler"'),
    "no_sweep.toml": "[solver]\nhorizon = 1.0\n",
    "empty.toml": "",
    "binary.toml": "\x00\x01\x02",
    "latin1.toml": GOOD_SPEC.replace("[solver]", "# r\xe9sum\xe9\n[solver]"),   # not UTF-8
    "table_as_value.toml": GOOD_SPEC.replace("horizon = 1.0", "horizon = {a = 1}"),
    "dims_empty.toml": GOOD_SPEC.replace("dims = [2]", "dims = []"),
    "weights.json": '{"Q": [[1, 0]], "K": [[1, 0]], "V": [[1, 0], [0, 1]]}',
    "weights_bad.json": '{"Q": [[1, 0]], "K": "x", "V": [[1, 0], [0, 1]]}',
    "weights_nan.json": '{"Q": [[NaN, 0]], "K": [[1, 0]], "V": [[1, 0], [0, 1]]}',
    "weights_syntax.json": '{"Q": [[1, 0]',
    "a_file": "not a folder",
    # legal specifications too large for the machine: refused before any work
    "huge_draws.toml": GOOD_SPEC.replace("draws = 2", "draws = 1000000000000"),
    "huge_grid.toml": GOOD_SPEC.replace("grid = 3", "grid = 100000000"),
    "huge_dims.toml": GOOD_SPEC.replace("dims = [2]", "dims = [1000000]"),
    "huge_tasks.toml": GOOD_SPEC.replace("draws = 2\nbatch_size = 2",
                                         "draws = 1000000000\nbatch_size = 1"),
    # the solver's n x n matrices (n = d^2 = 40,000: 24 GiB) and, below, d = 60 (0.2 GiB)
    # under an address-space limit: refused before any work, with the size
    "huge_solver.toml": GOOD_SPEC.replace("dims = [2]\ndraws = 2", "dims = [200]\ndraws = 1")
    + '\n[weights]\nkey = "independent"\n',
    "d60.toml": GOOD_SPEC.replace("dims = [2]\ndraws = 2", "dims = [60]\ndraws = 1")
    + '\n[weights]\nkey = "independent"\n',
}

#: case -> the address space it may add to what it maps when it starts (``ulimit -v``)
ADDRESS_SPACE = {"sweep-address-space-limit": 64 * 2**20}

COMPARE = ["compare", "--attention", "l2", "--n", "20", "--seeds", "1", "--num-times", "2",
           "--t-end", "0.1"]

#: id -> argv; every case must exit with status 2 and one line on stderr
CASES = {
    # flags the parser refuses
    "unknown-subcommand": ["nope"],
    "unknown-flag": ["compare", "--nope"],
    "unknown-global-flag": ["--nope"],
    "compare-n-text": ["compare", "--n", "abc"],
    "compare-n-missing": ["compare", "--n"],
    "compare-attention": ["compare", "--attention", "relu"],
    "compare-method": ["compare", "--method", "Euler"],
    "compare-seeds-float": ["compare", "--seeds", "1.5"],
    "stabilizers-seed-text": ["stabilizers", "--seed", "x"],
    "clusters-n-text": ["clusters", "--n", "many"],
    "reproduce-protocol": ["reproduce", "--protocol", "paper"],
    "reproduce-paper-tol-text": ["reproduce", "--paper-tol", "tight"],
    "sweep-no-action": ["sweep"],
    "sweep-run-no-spec": ["sweep", "run"],
    "sweep-both-places": ["sweep", "run", "good.toml", "--inprocess", "--scheduler", "x:1"],
    # values the parser takes but the run refuses (before any work)
    "compare-n-one": COMPARE[:4] + ["1"] + COMPARE[5:],
    "compare-n-negative": COMPARE[:4] + ["-20"] + COMPARE[5:],
    "compare-seeds-zero": COMPARE[:6] + ["0"] + COMPARE[7:],
    "compare-seeds-negative": COMPARE[:6] + ["-1"] + COMPARE[7:],
    "compare-num-times-zero": COMPARE[:8] + ["0"] + COMPARE[9:],
    "compare-t-end-nan": COMPARE[:10] + ["nan"],
    "compare-t-end-inf": COMPARE[:10] + ["inf"],
    "compare-t-end-negative": COMPARE[:10] + ["-1"],
    "compare-t-end-zero": COMPARE[:10] + ["0"],
    "compare-dt-zero": COMPARE + ["--dt", "0"],
    "compare-dt-nan": COMPARE + ["--dt", "nan"],
    "compare-chunk-size-zero": COMPARE + ["--chunk-size", "0"],
    # counts that are not whole numbers, or whose arrays would not fit in memory
    **{f"compare-{opt[2:]}-{label}": COMPARE + [opt, value]
       for opt in ("--n", "--seeds", "--num-times", "--chunk-size")
       for label, value in {"float": "2.5", "nan": "nan", "inf": "inf", "negative": "-1",
                            "zero": "0", "text": "x"}.items()},
    "compare-num-times-1e8": COMPARE[:8] + ["1e8"] + COMPARE[9:],
    "compare-num-times-huge": COMPARE[:8] + ["100000000"] + COMPARE[9:],
    "compare-seeds-1e8": COMPARE[:6] + ["1e8"] + COMPARE[7:],
    "compare-n-1e8": COMPARE[:4] + ["1e8"] + COMPARE[5:],
    "compare-n-1e308": COMPARE[:4] + ["1e308"] + COMPARE[5:],
    "compare-dt-inf": COMPARE + ["--dt", "inf"],
    "compare-dt-negative": COMPARE + ["--dt", "-1"],
    "compare-t-end-text": COMPARE[:10] + ["x"],
    "compare-weights-missing": COMPARE + ["--weights", "no_such.json"],
    "compare-weights-bad": COMPARE + ["--weights", "weights_bad.json"],
    "compare-weights-nan": COMPARE + ["--weights", "weights_nan.json"],
    "compare-weights-syntax": COMPARE + ["--weights", "weights_syntax.json"],
    "compare-weights-folder": COMPARE + ["--weights", "."],
    "clusters-n-zero": ["clusters", "--quick", "--n", "0"],
    # the same kinds of values in the siblings' counts; too large: the size they would need
    **{f"clusters-n-{label}": ["clusters", "--quick", "--n", value]
       for label, value in {"float": "2.5", "nan": "nan", "inf": "inf", "negative": "-1",
                            "1e8": "1e8", "1e308": "1e308", "huge": "100000"}.items()},
    **{f"train-seeds-{label}": ["train", "--quick", "--seeds", value, "--out", "res"]
       for label, value in {"float": "2.5", "nan": "nan", "zero": "0", "negative": "-1",
                            "1e8": "1e8"}.items()},
    **{f"train-workers-{label}": ["train", "--quick", "--workers", value, "--out", "res"]
       for label, value in {"float": "2.5", "nan": "nan", "zero": "0", "negative": "-1",
                            "1e8": "1e8"}.items()},
    **{f"sweep-workers-{label}": ["sweep", "run", "good.toml", "--workers", value,
                                  "--out", "res"]
       for label, value in {"float": "2.5", "nan": "nan", "negative": "-1",
                            "1e8": "1e8"}.items()},
    **{f"sweep-timeout-{label}": ["sweep", "run", "good.toml", "--connect-timeout", value,
                                  "--out", "res"]
       for label, value in {"inf": "inf", "nan": "nan", "zero": "0"}.items()},
    "stabilizers-seed-float": ["stabilizers", "--quick", "--seed", "1.5"],
    "stabilizers-seed-negative": ["stabilizers", "--quick", "--seed", "-1"],
    "reproduce-paper-tol-negative": ["reproduce", "--quick", "--paper-tol", "-1"],
    "reproduce-paper-tol-nan": ["reproduce", "--quick", "--paper-tol", "nan"],
    # bad TOML
    "toml-missing-file": ["sweep", "run", "no_such.toml", "--inprocess", "--out", "res"],
    "toml-folder": ["sweep", "run", ".", "--inprocess", "--out", "res"],
    **{f"toml-{name[:-5]}": ["sweep", "run", name, "--inprocess", "--out", "res"]
       for name in FILES if name.endswith(".toml") and name not in ("good.toml", "d60.toml")},
    "sweep-workers-zero": ["sweep", "run", "good.toml", "--workers", "0", "--out", "res"],
    "sweep-timeout-negative": ["sweep", "run", "good.toml", "--connect-timeout", "-1",
                               "--out", "res"],
    "sweep-address-space-limit": ["sweep", "run", "d60.toml", "--inprocess", "--out", "res"],
    "summarize-missing": ["sweep", "summarize", "no_such_results"],
    "summarize-file": ["sweep", "summarize", "a_file"],
    # output folders that cannot be used (root ignores permissions: a path below a file,
    # or in /proc, is unusable whoever runs it)
    **{f"out-{where}-{cmd}": [*argv, "--out", path]
       for cmd, argv in {"run": ["--quick"], "compare": COMPARE, "stabilizers": ["stabilizers", "--quick"],
                         "clusters": ["clusters", "--quick"], "reproduce": ["reproduce", "--quick"],
                         "sweep": ["sweep", "run", "good.toml", "--inprocess"]}.items()
       for where, path in {"file": "a_file", "below-file": "a_file/sub",
                           "proc": "/proc/gaussian_pde_out"}.items()},
    "summarize-plot-below-file": ["sweep", "summarize", "a_file", "--plot", "a_file/x.png"],
    # folders that exist but take no files: checked by writing, before any work
    **{f"out-{root[1:]}-{cmd}": [*argv, "--out", root]
       for cmd, argv in {"examples": ["--examples"], "compare": COMPARE,
                         "published": ["reproduce", "--protocol", "published"],
                         "stabilizers": ["stabilizers", "--quick"],
                         "sweep": ["sweep", "run", "good.toml", "--inprocess"]}.items()
       for root in ("/proc", "/sys") if os.path.isdir(root)},
    "summarize-plot-proc": ["sweep", "summarize", "a_file", "--plot", "/proc/x.png"],
    # a folder or a device that is not a results folder: named as such (not as `--plot`)
    "summarize-proc": ["sweep", "summarize", "/proc/self"],
    "summarize-device": ["sweep", "summarize", "/dev/null"],
    "summarize-folder": ["sweep", "summarize", "."],
}

#: known failures fixed at the root elsewhere (the numerics' validation of sweep specs)
KNOWN = {}


def _child(argv, folder, err_path, code_path, headroom=None):
    os.chdir(folder)
    if headroom is not None:
        import resource

        with open("/proc/self/statm") as fh:
            mapped = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (mapped + headroom, mapped + headroom))
    # pytest's capture replaced sys.stderr: write the child's to a file of its own
    fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    sys.stderr = os.fdopen(os.dup(fd), "w", buffering=1)
    sys.stdout = open(os.devnull, "w")
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    except BaseException:        # noqa: BLE001 - a traceback is the finding
        import traceback

        traceback.print_exc()
        code = "exception"
    sys.stderr.flush()
    pathlib.Path(code_path).write_text(str(code))
    os._exit(0)


def run_cli(argv, folder, headroom=None):
    """``(exit code or None on timeout, stderr)`` of ``main(argv)`` run in ``folder``
    (``headroom``: bytes of address space it may map beyond what it starts with)."""
    err, code = folder / "stderr.txt", folder / "code.txt"
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_child, args=(argv, folder, err, code, headroom))
    proc.start()
    proc.join(TIMEOUT)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return None, err.read_text() if err.exists() else ""
    return (code.read_text() if code.exists() else f"died ({proc.exitcode})"), err.read_text()


@pytest.fixture
def folder(tmp_path):
    for name, text in FILES.items():
        (tmp_path / name).write_text(text, encoding="latin-1" if "latin1" in name else None)
    return tmp_path


@pytest.mark.parametrize("argv, headroom", [
    pytest.param(argv, ADDRESS_SPACE.get(name), id=name,
                 marks=[pytest.mark.xfail(strict=False, reason=KNOWN[name])]
                 if name in KNOWN else []) for name, argv in CASES.items()])
def test_bad_command_line(argv, headroom, folder):
    code, err = run_cli(argv, folder, headroom)
    assert code is not None, f"still running after {TIMEOUT} s: {argv}\n{err}"
    assert "Traceback" not in err, err
    assert code == "2", f"exit status {code}, stderr:\n{err}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"{len(lines)} lines on stderr:\n{err}"
    assert lines[0].startswith("gaussian-pde"), lines[0]
    assert "error" in lines[0], lines[0]


def test_good_spec_runs(folder):
    """The baseline the TOML cases perturb is a valid sweep (so each case tests one thing)."""
    code, err = run_cli(["-q", "sweep", "run", "good.toml", "--inprocess", "--out", "res"],
                        folder)
    assert code == "0", err


@pytest.mark.parametrize("name, headroom, says", [
    ("huge_solver.toml", None, "the solver's n x n matrices, n = 40000"),
    ("d60.toml", ADDRESS_SPACE["sweep-address-space-limit"], "address-space limit (ulimit -v")])
def test_a_sweep_too_large_for_the_memory_names_the_size(name, headroom, says, folder):
    """Refused before any work (no results folder), one line with the size in GiB and
    the limit it passes: half the machine's memory, or what `ulimit -v` leaves."""
    code, err = run_cli(["sweep", "run", name, "--inprocess", "--out", "res"], folder,
                        headroom)
    assert code == "2" and "GiB" in err and says in err, err
    assert not (folder / "res").exists()


def _remove(path):
    import shutil

    shutil.rmtree(path) if path.is_dir() else path.unlink()


@pytest.mark.parametrize("damage", [
    pytest.param(lambda zarr: _remove(zarr / "l2" / "d2"), id="group-deleted"),
    pytest.param(lambda zarr: _remove(zarr / "l2" / "d2" / "status"), id="array-deleted"),
    pytest.param(lambda zarr: (zarr / ".zattrs").write_text("garbage"), id="metadata-garbage"),
    pytest.param(lambda zarr: (zarr / "l2" / "d2" / "done" / ".zarray").write_text("{"),
                 id="array-metadata-truncated"),
])
def test_a_results_folder_with_a_damaged_structure(damage, folder):
    """A Zarr store whose group, array or metadata is gone or garbage (not a chunk, which
    a resume repairs): `sweep summarize` and `sweep run` say so in one line, exit 2."""
    code, err = run_cli(["-q", "sweep", "run", "good.toml", "--inprocess", "--out", "res"],
                        folder)
    assert code == "0", err
    damage(folder / "res" / "results.zarr")
    for argv in (["sweep", "summarize", "res", "--no-plot"],
                 ["-q", "sweep", "run", "good.toml", "--inprocess", "--out", "res"]):
        code, err = run_cli(argv, folder)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == "2" and "Traceback" not in err and len(lines) == 1, err
        assert "the Zarr store results.zarr is damaged" in lines[0], lines[0]
