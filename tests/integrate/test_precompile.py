"""Compiling on two cores (:mod:`gaussian_pde.integrate._precompile`): the integrator in a
child process, the fields here; what the child leaves in the cache is what this process
then loads, and a fresh machine says so in one line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gaussian_pde.integrate import _compiled_engine, _precompile

ROOT = Path(__file__).resolve().parents[2]


class _FakeChild:
    """A child process that does its work at ``wait``, recording its command in ``log``."""

    log = []

    def __init__(self, cmd, **kwargs):
        self.log.append(("start", cmd, kwargs))

    def wait(self):
        self.log.append("child done")
        return 0

    def kill(self):
        self.log.append("killed")


@pytest.fixture
def recorded(monkeypatch):
    """The compilations replaced by entries in a log: the child (:class:`_FakeChild`),
    the fields' kernels, and the integrator (loaded once, as ``_core`` is cached)."""
    import functools

    import gaussian_pde.attention as attention

    log = _FakeChild.log = []
    monkeypatch.setattr(subprocess, "Popen", _FakeChild)
    monkeypatch.setattr(attention, "compiled_field_kernels", lambda: log.append("fields") or ())
    monkeypatch.setattr(_compiled_engine, "_core",
                        functools.cache(lambda: log.append("integrator")))
    monkeypatch.setattr(_precompile, "_engine_cached", lambda: False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    return log


def test_a_cold_cache_starts_one_quiet_child_then_loads(recorded):
    """Where the integrator is not in the cache: one child compiles it (this package's
    root on its path, nothing to the terminal) while this process compiles the fields,
    then each of ``here`` in order; this process loads the integrator once the child is
    done, and a second call starts nothing."""
    assert _precompile.compile_on_two_cores((lambda: recorded.append(1),
                                             lambda: recorded.append(2)))
    (_, cmd, kwargs), *rest = recorded
    assert rest == ["fields", 1, 2, "child done", "integrator"]
    assert cmd[:2] == [sys.executable, "-c"] and cmd[3] == str(ROOT)
    assert "_core()" in cmd[2]
    assert all(kwargs[k] == subprocess.DEVNULL for k in ("stdin", "stdout", "stderr"))
    assert not _precompile.compile_on_two_cores()              # loaded here: no child
    assert recorded[6:] == ["fields"]


def test_the_child_compiles_aside_and_a_lone_process_all(recorded, monkeypatch):
    """``aside``: named for the child, after the integrator; this process calls them
    once the child is done (they load from the cache), and without a child compiles them."""
    monkeypatch.setitem(sys.modules, "aside_probe", type(sys)("aside_probe"))
    sys.modules["aside_probe"].run = lambda: recorded.append("aside")
    assert _precompile.compile_on_two_cores(aside=("aside_probe:run",))
    (_, cmd, _), *rest = recorded
    assert cmd[4:] == ["aside_probe:run"]
    assert rest == ["fields", "child done", "integrator", "aside"]
    _compiled_engine._core.cache_clear()
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert not _precompile.compile_on_two_cores(aside=("aside_probe:run",))
    assert recorded[5:] == ["fields", "integrator", "aside"]


def test_the_child_is_announced_as_a_numba_event(recorded):
    """While the child compiles, :data:`COMPILE_ASIDE` is on (a start and an end, around
    its work); nothing is raised where no child runs."""
    from numba.core import event

    class Listener(event.Listener):
        def on_start(self, ev):
            recorded.append("aside on")

        def on_end(self, ev):
            recorded.append("aside off")

    with event.install_listener(_precompile.COMPILE_ASIDE, Listener()):
        _precompile.compile_on_two_cores()
        assert recorded[1:] == ["aside on", "fields", "child done", "aside off", "integrator"]
        _compiled_engine._core.cache_clear()
        _precompile._engine_cached = lambda: True      # (restored by the fixture)
        assert not _precompile.compile_on_two_cores()
    assert recorded[6:] == ["fields", "integrator"]


def test_an_interrupt_stops_the_child(recorded):
    """An interrupt while this process compiles ends the child too."""
    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _precompile.compile_on_two_cores((interrupt,))
    assert recorded[1:] == ["fields", "killed", "child done"]


def test_one_core_or_a_warm_cache_compiles_here(recorded, monkeypatch):
    """One core, or the integrator in the cache: no child, all of it in this process."""
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert not _precompile.compile_on_two_cores()
    assert recorded == ["fields", "integrator"]
    _compiled_engine._core.cache_clear()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(_precompile, "_engine_cached", lambda: True)
    assert not _precompile.compile_on_two_cores()
    assert recorded[2:] == ["fields", "integrator"]


def _run(code, cache, *args):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=True)


_COUNT = """
import sys
from numba.core import event
from gaussian_pde.integrate._precompile import compile_on_two_cores, _engine_cached
from gaussian_pde.integrate import _compiled_engine
seen = []
class L(event.Listener):
    def on_start(self, ev):
        seen.append(ev.data["dispatcher"].py_func.__qualname__)
    def on_end(self, ev):
        pass
event.register("numba:compile", L())
cached = _engine_cached()
child = compile_on_two_cores()
stamp = _compiled_engine.engine_stamp()
engine = [n for n in seen if n in {f"{p}_{stamp}" for p in _compiled_engine._PIECES}]
print(cached, child, len(seen), len(engine))
"""


@pytest.mark.slow
def test_a_fresh_cache_then_a_warm_one(tmp_path):
    """A fresh cache (an empty ``NUMBA_CACHE_DIR``): the child compiles the integrator
    (this process compiles none of its pieces); a second process loads everything,
    compiling nothing."""
    cold = _run(_COUNT, tmp_path).stdout.split()
    assert cold[:2] == ["False", "True"] and int(cold[2]) > 0 and cold[3] == "0"
    warm = _run(_COUNT, tmp_path).stdout.split()
    assert warm == ["True", "False", "0", "0"]


@pytest.mark.slow
def test_the_command_line_says_compiling_once(tmp_path):
    """The examples on a fresh cache: the one line that says Numba compiles, once, the
    child's compilation included; on the warm cache none."""
    from gaussian_pde.cli._progress import COMPILING

    code = "from gaussian_pde.cli._main import main; raise SystemExit(main())"
    cache = tmp_path / "cache"
    cache.mkdir()
    args = ["--examples", "--out", str(tmp_path / "out")]
    for expected in (1, 0):
        err = _run(code, cache, *args).stderr.splitlines()
        assert err.count(COMPILING) == expected


def test_the_engine_is_cached_under_a_stamp_of_every_source_it_compiles_in():
    """The tableaux, the LU and the events' constants are compiled into the engine from
    other modules than its own: their files are in its stamp, and its compiled
    functions carry the stamp in their names (Numba's cache reads only their own file)."""
    from gaussian_pde._common.compiled import imported_sources

    sources = imported_sources([_compiled_engine.__name__, _compiled_engine._steppers.__name__],
                               ("gaussian_pde.integrate", "gaussian_pde._common"))
    names = {Path(f).relative_to(ROOT / "gaussian_pde").as_posix() for f in sources}
    assert {"_common/tableaux.py", "_common/lu.py", "_common/factor_rotation.py",
            "integrate/_events.py", "integrate/_steppers.py",
            "integrate/_compiled_engine.py"} <= names
    drive, _ = _compiled_engine._core()
    stamp = _compiled_engine.engine_stamp()
    assert len(stamp) == 16
    if hasattr(drive, "py_func"):                  # (not under NUMBA_DISABLE_JIT)
        assert drive.py_func.__qualname__ == f"_drive_{stamp}"
        for name in _compiled_engine._PIECES:
            assert _compiled_engine._function(name).py_func.__name__ == f"{name}_{stamp}"


_NFEV = """
import numpy as np
import gaussian_pde as gp
Q = np.array([[1.0, 0.5]])
sol = gp.solve(gp.Softmax(Q, -Q, np.eye(2)), np.zeros(2), np.array([[1.0, 0.3], [0.3, 0.6]]),
               t_span=(0, 10))
print(gp.__file__, sol.nfev)
"""


@pytest.mark.slow
def test_an_edit_of_the_tableaux_alone_compiles_the_engine_again(tmp_path):
    """A copy of the package, run on one cache before and after an edit of the step-size
    safety factor in ``_common/tableaux.py`` (no other file touched): the second run
    takes the new factor (other evaluations), not the engine compiled with the old one."""
    import shutil

    copy = tmp_path / "src"
    shutil.copytree(ROOT / "gaussian_pde", copy / "gaussian_pde",
                    ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    cache.mkdir()
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(copy))

    def nfev():
        out = subprocess.run([sys.executable, "-c", _NFEV], env=env, cwd=tmp_path,
                             capture_output=True, text=True, check=True).stdout.split()
        assert out[0] == str(copy / "gaussian_pde" / "__init__.py")
        return int(out[1])

    before = nfev()
    tableaux = copy / "gaussian_pde" / "_common" / "tableaux.py"
    text = tableaux.read_text()
    assert text.count("SAFETY, MIN_FACTOR = 0.9, 0.2") == 1
    tableaux.write_text(text.replace("SAFETY, MIN_FACTOR = 0.9, 0.2", "SAFETY, MIN_FACTOR = 0.8, 0.2"))
    assert nfev() != before
