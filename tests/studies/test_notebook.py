"""notebook_settings() and notebook_compare(), the validation notebooks' shared parts."""

import dataclasses
import pathlib

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.studies import NotebookSettings, compare, notebook_compare, notebook_settings
from tests.studies.test_compare import _fields_equal

ROOT = pathlib.Path(__file__).resolve().parents[2]
SIZES = dict(quick_sizes=[100, 400], full_sizes=[500, 2000, 8000], quick_seeds=3, full_seeds=5)


def _env(tmp_path, **values):
    env = {"GAUSSIAN_PDE_NOTEBOOK_OUT": str(tmp_path / "figures")}
    env.update({f"GAUSSIAN_PDE_NOTEBOOK_{k.upper()}": v for k, v in values.items()})
    return env


def test_quick_mode_makes_every_run(tmp_path):
    """Quick mode: the quick sizes and seeds, no stored runs even where a folder is named."""
    s = notebook_settings("l2", **SIZES, environ=_env(tmp_path, quick="1", results=str(tmp_path),
                                                      write="1"))
    assert s.quick and s.sizes == (100, 400) and s.seeds == range(3)
    assert s.results is None and s.store() is None and not s.write
    assert s.out == tmp_path / "figures" and s.out.is_dir()           # made here
    assert s.figure_path("moments") == tmp_path / "figures" / "l2_moments.png"
    assert s.figure_path() == tmp_path / "figures" / "l2.png"
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.quick = False


def test_full_mode_reads_and_writes_the_stored_runs(tmp_path):
    s = notebook_settings("masked", **SIZES, environ=_env(tmp_path, results=str(tmp_path)))
    assert not s.quick and s.sizes == (500, 2000, 8000) and s.seeds == range(5)
    assert s.store() == tmp_path / "masked.npz" and not s.write
    assert s.store("flat") == tmp_path / "masked_flat.npz"
    assert s.figure_path("ramp", "moments").name == "masked_ramp_moments.png"
    assert notebook_settings("masked", environ=_env(tmp_path, results=str(tmp_path),
                                                    write="1")).write
    for results in ({}, {"results": ""}):             # unset or empty: every run made here
        s = notebook_settings("masked", environ=_env(tmp_path, write="1", **results))
        assert s.results is None and s.store() is None and not s.write
    s = notebook_settings("clusters", environ=_env(tmp_path))
    assert s.sizes is None and s.seeds is None


def test_notebook_settings_reads_the_environment(tmp_path, monkeypatch):
    """By default from ``os.environ``, the variables that ``docs/make_results.py`` sets."""
    writer = (ROOT / "docs" / "make_results.py").read_text()
    for var in ("QUICK", "OUT", "RESULTS", "WRITE"):
        assert f"GAUSSIAN_PDE_NOTEBOOK_{var}" in writer
    monkeypatch.delenv("GAUSSIAN_PDE_NOTEBOOK_QUICK", raising=False)
    monkeypatch.setenv("GAUSSIAN_PDE_NOTEBOOK_OUT", str(tmp_path))
    monkeypatch.setenv("GAUSSIAN_PDE_NOTEBOOK_RESULTS", str(tmp_path / "stored"))
    monkeypatch.setenv("GAUSSIAN_PDE_NOTEBOOK_WRITE", "1")
    s = notebook_settings("softmax", **SIZES)
    assert (s.quick, s.out, s.store(), s.write) == (False, tmp_path, tmp_path / "stored" /
                                                    "softmax.npz", True)
    monkeypatch.setenv("GAUSSIAN_PDE_NOTEBOOK_QUICK", "1")
    assert notebook_settings("softmax", **SIZES).sizes == (100, 400)


def test_notebook_settings_bad_input(tmp_path):
    env = _env(tmp_path)
    with pytest.raises(TypeError, match="`name`"):
        notebook_settings(2, environ=env)
    for name in ("", "a/b"):
        with pytest.raises(ValueError, match="`name`"):
            notebook_settings(name, environ=env)
    with pytest.raises(ValueError, match="`quick_sizes` and `full_sizes`"):
        notebook_settings("l2", quick_sizes=[10], environ=env)
    with pytest.raises(ValueError, match="`quick_seeds` and `full_seeds`"):
        notebook_settings("l2", full_seeds=2, environ=env)
    with pytest.raises(ValueError, match="`quick_sizes`"):           # checked in either mode
        notebook_settings("l2", quick_sizes=[0, 10], full_sizes=[10], environ=env)
    with pytest.raises(ValueError, match="`full_sizes` must not be empty"):
        notebook_settings("l2", quick_sizes=[10], full_sizes=[], environ=env)
    with pytest.raises(TypeError, match="`full_seeds`"):
        notebook_settings("l2", quick_seeds=2, full_seeds="5", environ=env)


def test_notebook_compare_is_stored_compare_with_the_settings(tmp_path):
    """The report is the one ``compare`` makes at the settings' sizes and seeds; the figures
    are saved under the notebook's names; with ``write`` the stored runs are written and
    read back."""
    att = gp.Softmax(np.array([[1.0, 0.5]]), -np.array([[0.8, -0.2]]), np.eye(2))
    args = (att, np.array([0.5, -0.3]), np.array([[1.0, 0.3], [0.3, 0.6]]))
    kw = dict(t_eval=np.linspace(0, 0.2, 3), method="rk4", dt=0.05)
    sizes = dict(quick_sizes=[20, 40], full_sizes=[20, 40], quick_seeds=2, full_seeds=2)
    quick = notebook_settings("nb", **sizes, environ=_env(tmp_path, quick="1"))
    expected = compare(*args, n=[20, 40], seeds=range(2), **kw)
    _fields_equal(notebook_compare(quick, *args, **kw), expected)
    assert sorted(p.name for p in quick.out.iterdir()) == [
        "nb_diagnostics.png", "nb_errors.png", "nb_moments.png", "nb_scaling.png"]
    full = notebook_settings("nb", **sizes, environ=_env(tmp_path, results=str(tmp_path),
                                                         write="1"))
    _fields_equal(notebook_compare(full, *args, "flat", figures=("moments",), **kw), expected)
    assert (tmp_path / "nb_flat.npz").is_file()
    assert (quick.out / "nb_flat_moments.png").is_file()
    assert not (quick.out / "nb_flat_diagnostics.png").exists()
    read = dataclasses.replace(full, write=False)
    _fields_equal(notebook_compare(read, *args, "flat", figures=("moments",), **kw), expected)


def test_notebook_compare_bad_input(tmp_path):
    att = gp.Softmax(np.eye(2), np.eye(2), np.eye(2))
    with pytest.raises(TypeError, match="`settings`"):
        notebook_compare({"sizes": [10]}, att, np.zeros(2), np.eye(2))
    s = notebook_settings("nb", environ=_env(tmp_path, quick="1"))
    with pytest.raises(ValueError, match="`settings` must have sizes"):
        notebook_compare(s, att, np.zeros(2), np.eye(2))
    s = dataclasses.replace(s, sizes=(10,), seeds=range(1))
    with pytest.raises(ValueError, match="`figures`"):
        notebook_compare(s, att, np.zeros(2), np.eye(2), figures=("ellipses",))
    assert isinstance(s, NotebookSettings)
