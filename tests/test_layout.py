"""The package's layout: concepts in layers, no upward imports and no import cycles.

Every import of a ``gaussian_pde`` module, at module level or inside a function, is
read from the source with :mod:`ast`. A subpackage may import only from its own layer
or below; the graph of module imports has no cycle.
"""

import ast
import pathlib

import pytest

import gaussian_pde as gp

ROOT = pathlib.Path(gp.__file__).resolve().parent

#: lowest first; a module may import from its own layer and the ones before it
LAYERS = [
    {"_version", "_common", "_generated"},
    {"attention"},
    {"_exact"},
    {"integrate"},
    {"particles"},
    {"closure"},
    {"analysis"},
    {"plotting"},
    {"studies"},
    {"sweep"},
    {"__init__"},
    # training is a client of the public package (``import gaussian_pde as gp``)
    {"training"},
    {"cli", "__main__"},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def _module_name(path):
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    return ".".join(parts), is_pkg


def _imports(path):
    """Absolute names of the gaussian_pde modules (or packages) that ``path`` imports."""
    mod, is_pkg = _module_name(path)
    package = mod.split(".") if is_pkg else mod.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "gaussian_pde":
                continue
            for alias in node.names:   # `from .. import plotting` imports a module
                sub = f"{target}.{alias.name}"
                path_ = ROOT.parent / sub.replace(".", "/")
                out.add(sub if path_.with_suffix(".py").exists() or path_.is_dir() else target)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "gaussian_pde"}
    out.discard(mod)
    return out


def _top(name):
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = {_module_name(p)[0]: p for p in ROOT.rglob("*.py")}


def test_every_top_level_name_has_a_layer():
    tops = {_top(m) for m in MODULES} | {"__main__"}
    assert tops <= set(LAYER), sorted(tops - set(LAYER))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_upward_import(module):
    path = MODULES[module]
    if path.name == "__main__.py":
        return
    here = LAYER[_top(module)]
    for target in _imports(path):
        there = LAYER[_top(target)]
        assert there <= here, f"{module} imports {target} from a higher layer"


def test_no_import_cycles():
    """Tarjan's strongly connected components on the module graph: all of size one."""
    graph = {}
    for mod, path in MODULES.items():
        targets = set()
        for t in _imports(path):
            # a package import means its __init__ module
            targets.add(t if t in MODULES else t.rsplit(".", 1)[0])
        graph[mod] = {t for t in targets if t in MODULES and t != mod}
    index, low, stack, on, cycles = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert cycles == []


def test_public_names_and_module_paths():
    import gaussian_pde.analysis
    import gaussian_pde.plotting
    import gaussian_pde.sweep  # noqa: F401

    missing = [name for name in gp.__all__ if not hasattr(gp, name)]
    assert missing == []


def _private_imports(path):
    """What ``path`` takes privately from another subpackage: its underscore modules, and
    underscore names from its face (``(target, name)``, ``name`` None for a module)."""
    mod, is_pkg = _module_name(path)
    here = _top(mod)
    package = mod.split(".") if is_pkg else mod.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            target, names = None, [a.name for a in node.names]
        else:
            continue
        for full in ([f"{target}.{n}" for n in names] if target else names):
            parts = full.split(".")
            if parts[0] != "gaussian_pde" or len(parts) < 3:
                continue
            there = parts[1]
            if there == here or there.startswith("_"):
                continue                 # its own package, or the shared _common/_generated
            private = [p for p in parts[2:] if p.startswith("_") and not p.startswith("__")]
            if private:
                out.append((".".join(parts[:-1]), parts[-1]))
    return sorted(out)


def test_no_sibling_imports_a_private_name_of_another():
    """Subpackages import each other through their public ``__init__`` faces: no underscore
    module of another subpackage, and no underscore name from its face."""
    found = []
    for mod, path in MODULES.items():
        if _top(mod) in ("__init__", "__main__"):
            continue
        found += [f"{mod} imports {name} from {target}" for target, name in _private_imports(path)]
    assert found == [], "import these from the subpackage (add them to its __init__):\n" + \
        "\n".join(found)


def test_the_private_import_check_finds_one(tmp_path, monkeypatch):
    """The scan is not vacuous: a module and a name are caught, a face import is not."""
    pkg = tmp_path / "gaussian_pde" / "studies"
    pkg.mkdir(parents=True)
    path = pkg / "_m.py"
    path.write_text("from ..closure._mixture import solve_mixture\n"
                    "from ..particles import _rng\n"
                    "from ..closure import GaussianMixture\n"
                    "from .._common.linalg import sym\n"
                    "from ._clusters import _cases\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path / "gaussian_pde")
    assert _private_imports(path) == [("gaussian_pde.closure._mixture", "solve_mixture"),
                                      ("gaussian_pde.particles", "_rng")]



# ------------------------------------------------------------------ function length
#: the longest function body (docstring excluded) that the package's code may hold
MAX_BODY_LINES = 120
REPO = ROOT.parent


def body_lines(func):
    """Lines of a function's body from its first statement after the docstring to its end."""
    body = func.body
    if (len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        body = body[1:]
    return func.end_lineno - body[0].lineno + 1


def _source_files():
    """The Python files of the package (generated code excepted) and of its scripts and tests."""
    out = [p for p in ROOT.rglob("*.py") if "_generated" not in p.relative_to(ROOT).parts]
    for folder in ("derivations", "benchmarks", "tests", "examples", "notebooks"):
        out += sorted((REPO / folder).rglob("*.py"))
    return sorted(out)


def long_bodies(path, rel=None, limit=MAX_BODY_LINES):
    """``{"rel::name": lines}`` of the functions of ``path`` whose body exceeds ``limit``."""
    rel = path.relative_to(REPO).as_posix() if rel is None else rel
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = body_lines(node)
            if n > limit:
                out[f"{rel}::{node.name}"] = n
    return out


def test_no_function_body_is_over_the_limit():
    found = {}
    for path in _source_files():
        found.update(long_bodies(path))
    over = {k: n for k, n in found.items() if n > MAX_BODY_LINES}
    assert over == {}, (f"function bodies over {MAX_BODY_LINES} lines (docstring excluded): "
                        f"split them into named steps: {over}")


def test_the_length_check_measures_a_body(tmp_path):
    """The measure is not vacuous: the docstring is left out, every other line counts."""
    path = tmp_path / "m.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_BODY_LINES + 1))
    path.write_text(f'def f():\n    """Doc.\n\n    More.\n    """\n{body}\n\n\ndef g():\n    return 1\n')
    tree = ast.parse(path.read_text())
    f, g = tree.body
    assert body_lines(f) == MAX_BODY_LINES + 1 and body_lines(g) == 1
    assert long_bodies(path, rel="m.py") == {"m.py::f": MAX_BODY_LINES + 1}
