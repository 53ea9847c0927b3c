"""Fixtures of the attention tests."""

import sys

import pytest

from gaussian_pde.attention import _compiled_fields as cf


@pytest.fixture
def uncompiled(monkeypatch):
    """A call that binds every function marked by ``compiled_later`` back to plain Python
    for the rest of the test (after the test has made its compiled fields)."""
    def plain():
        for fn in cf._MARKED:
            for namespace in (sys.modules[fn.__module__].__dict__, cf.__dict__):
                if namespace.get(fn.__name__) is cf._DISPATCHERS.get(fn, fn):
                    monkeypatch.setitem(namespace, fn.__name__, fn)
    return plain
