"""The command line's stderr lines: the compile notice."""

import io

import pytest

from gaussian_pde.cli._progress import COMPILING, compile_notice

numba = pytest.importorskip("numba")


def _fresh():
    """A function Numba has not compiled (no disk cache: each call of this makes a new one)."""
    return numba.njit(lambda x: x + 1)


def test_compile_notice_says_once_that_it_compiles():
    out = io.StringIO()
    with compile_notice(stream=out):
        assert _fresh()(1) == 2
        assert _fresh()(2.0) == 3.0            # a second compile: no second line
    assert out.getvalue() == COMPILING + "\n"
    with compile_notice(stream=out):
        _fresh()(1)
    assert out.getvalue().count(COMPILING) == 2   # one per block


def test_compile_notice_is_silent_without_a_compile_or_when_off():
    f = _fresh()
    f(1)
    out = io.StringIO()
    with compile_notice(stream=out):
        f(2)                                   # compiled already: loaded, not compiled
    with compile_notice(False, stream=out):
        _fresh()(1)
    assert out.getvalue() == ""
    _fresh()(1)                                # the listener is gone after the block
    assert out.getvalue() == ""


def test_compile_notice_hears_a_child_compiling():
    """A child process compiling the integrator (the event ``COMPILE_ASIDE`` of
    :mod:`gaussian_pde.integrate._precompile`) is announced as a compile here, once for both."""
    from numba.core import event

    from gaussian_pde.integrate._precompile import COMPILE_ASIDE

    out = io.StringIO()
    with compile_notice(stream=out):
        with event.trigger_event(COMPILE_ASIDE):
            pass
        _fresh()(1)
    assert out.getvalue() == COMPILING + "\n"
