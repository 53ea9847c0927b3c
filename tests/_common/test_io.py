"""Atomic output: files end with the mode a plain ``open`` would give them."""

import os
import stat

import numpy as np
import pytest

from gaussian_pde._common.io import save_figure, write_json, write_npz, write_text


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(params=[0o022, 0o002, 0o077])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _writers(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure()
    yield "a.txt", lambda p: write_text(p, "x\n")
    yield "a.json", lambda p: write_json(p, {"a": np.float64(1.0)})
    yield "a.npz", lambda p: write_npz(p, a=np.arange(3))
    yield "a.png", lambda p: save_figure(fig, p)
    plt.close(fig)


def test_new_files_follow_the_umask(tmp_path, umask):
    for name, write in _writers(tmp_path):
        path = tmp_path / name
        write(path)
        plain = tmp_path / ("plain-" + name)
        with open(plain, "w"):
            pass
        assert _mode(path) == _mode(plain) == 0o666 & ~umask, name
    assert not list(tmp_path.glob(".*.tmp*"))


def test_an_overwritten_file_keeps_its_mode(tmp_path, umask):
    path = tmp_path / "keep.txt"
    path.write_text("old")
    os.chmod(path, 0o640)
    write_text(path, "new")
    assert path.read_text() == "new" and _mode(path) == 0o640


def test_a_sweep_results_folder_follows_the_umask(tmp_path, umask):
    pytest.importorskip("zarr")
    from gaussian_pde.sweep import SweepSpec, run_sweep

    spec = SweepSpec.from_dict({"sweep": {"attention": ["softmax"], "dims": [2], "draws": 1,
                                          "seed": 1, "batch_size": 1},
                                "solver": {"horizon": 0.1}})
    out = tmp_path / "res"
    run_sweep(spec, out, scheduler="inprocess")
    assert _mode(out) == 0o777 & ~umask
    for name in ("manifest.json", "spec.toml"):
        assert _mode(out / name) == 0o666 & ~umask
