"""The stamps in the names of compiled functions cached on disk
(:mod:`gaussian_pde._common.compiled`): they change with any source the compiled code
reads, where Numba's own check reads only the file that defines the function."""

import os
import sys

import pytest

from gaussian_pde._common.compiled import imported_sources, sources_stamp, stamped


def _package(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package ``stamppkg`` on ``sys.path``: ``a`` imports ``b`` (relative, in
    parentheses over lines), ``b`` imports ``c`` from its package and a name of the
    package itself; ``d`` is imported by nobody; ``e`` only inside a function."""
    _package(tmp_path, {
        "stamppkg/__init__.py": "X = 1\n",
        "stamppkg/a.py": "import math\n\nfrom .b import (\n    SAFETY,\n)\n",
        "stamppkg/b.py": "from . import c\nfrom stamppkg import X\nSAFETY = 0.9\n",
        "stamppkg/c.py": "def f():\n    from . import e\n",
        "stamppkg/d.py": "",
        "stamppkg/e.py": "",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "stamppkg"
    for name in [m for m in sys.modules if m.startswith("stamppkg")]:
        del sys.modules[name]


def test_the_sources_are_the_top_level_imports_followed_within_the_prefixes(package):
    files = imported_sources(["stamppkg.a"], ["stamppkg"])
    assert {os.path.basename(f) for f in files} == {"a.py", "b.py", "c.py", "__init__.py"}
    assert {os.path.basename(f) for f in imported_sources(["stamppkg.a"], ["stamppkg.a"])} == {"a.py"}


def test_the_stamp_changes_with_a_source_and_only_then(package):
    files = imported_sources(["stamppkg.a"], ["stamppkg"])
    before = sources_stamp(files)
    assert sources_stamp(files) == before == sources_stamp(list(reversed(sorted(files))))
    assert sources_stamp(files, "other") != before
    b = package / "b.py"
    b.write_text("from . import c\nfrom stamppkg import X\nSAFETY = 0.8\n")     # same size
    st = os.stat(b)
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert sources_stamp(files) != before
    (package / "d.py").write_text("Y = 2\n")          # not a source of a: no change
    assert sources_stamp(imported_sources(["stamppkg.a"], ["stamppkg"])) == sources_stamp(files)


def test_a_stamped_copy_has_the_code_and_a_name_with_the_stamp():
    def f(x, y=2):
        """doc"""
        return x * y

    g = stamped(f, "0123abcd")
    assert g is stamped(f, "0123abcd") and g is not stamped(f, "other")
    assert g.__name__ == "f_0123abcd" and g.__qualname__.endswith("f_0123abcd")
    assert g.__code__ is f.__code__ and g.__doc__ == "doc" and g(3) == 6
    assert g.__module__ == f.__module__


@pytest.mark.parametrize("module", ["gaussian_pde.closure._mixture_kernel",
                                    "gaussian_pde.closure._mixture_field",
                                    "gaussian_pde.studies._certified_field",
                                    "gaussian_pde.studies._published_kernel"])
def test_the_kernels_cached_under_their_own_names_read_only_their_own_module(module):
    """These modules' kernels are cached on disk under plain names (Numba checks their
    own file only): they must not import this package's modules, whose edits would
    otherwise go unseen (the engine and the fields stamp their names instead)."""
    import importlib

    path = importlib.import_module(module).__file__
    assert imported_sources([module], ["gaussian_pde"]) == {path}
