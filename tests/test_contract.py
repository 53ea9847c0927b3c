"""No code outside ``attention/`` knows a concrete attention type: it calls the contract.

Every module of the package outside ``gaussian_pde/attention/`` and
``gaussian_pde/_generated/``, and ``derivations/generate.py``, is read with :mod:`ast`;
a *mention* is an identifier equal to a registered class's name (``Softmax``, ...) or a
string literal equal to a registered type name (``"softmax"``, ...), docstrings
excepted. There is no exception: the settings of the studies (which type, under which
normalisation) live in ``gaussian_pde/attention/_studies.py``, and the Transformer heads
of the training bridge come from ``gaussian_pde.attention.dot_product_head``.
"""

import ast
import pathlib

import pytest

import gaussian_pde as gp

ROOT = pathlib.Path(gp.__file__).resolve().parent
REPO = ROOT.parent


def _files():
    out = [p for p in ROOT.rglob("*.py")
           if not {"attention", "_generated"} & set(p.relative_to(ROOT).parts[:1])]
    return sorted(out) + [REPO / "derivations" / "generate.py"]


def _docstrings(tree):
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _names(path, identifiers, in_string):
    """The ``identifiers`` that ``path``'s code uses (names, attributes, imports), and its
    string constants, docstrings aside, for which ``in_string`` holds."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in identifiers:
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in identifiers:
            found.add(node.attr)
        elif isinstance(node, ast.alias) and (node.asname or node.name).split(".")[-1] in identifiers:
            found.add(node.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").rsplit(".", 1)[-1] in identifiers:
            found.add(node.module)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in skip and in_string(node.value)):
            found.add(repr(node.value))
    return found


def mentions(path):
    """The concrete type names and class names that ``path``'s code mentions."""
    names = set(gp.ATTENTIONS)
    return _names(path, {cls.__name__ for cls in gp.ATTENTIONS.values()},
                  lambda s: s.lower() in names)


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_concrete_type_outside_attention(path):
    rel = str(path.relative_to(REPO))
    found = mentions(path)
    assert not found, (f"{rel} names concrete attention types {sorted(found)}: call the "
                       "contract (gaussian_pde.Attention) and the registry instead")


def test_the_check_finds_a_mention(tmp_path):
    """The scan is not vacuous: code naming a type is caught, a docstring is not."""
    p = tmp_path / "m.py"
    p.write_text('"""Softmax and "l2" in prose."""\nfrom x import Softmax\nk = "l2"\n')
    assert mentions(p) == {"Softmax", "'l2'"}


def _type_modules():
    """The modules of the package that hold a registered type (``_softmax``, ...)."""
    return {cls.__module__.rsplit(".", 1)[-1] for cls in gp.ATTENTIONS.values()
            if cls.__module__.startswith("gaussian_pde.attention.")}


def test_the_compiled_fields_module_names_no_type():
    """``attention/_compiled_fields.py`` compiles every type's field from the type's own
    head body: it names no type, no type's module, and has no list of them (a new type
    is one new module, nothing here edited)."""
    path = ROOT / "attention" / "_compiled_fields.py"
    assert not mentions(path)
    modules = _type_modules()
    assert {"_softmax", "_l2"} <= modules
    found = _names(path, modules, lambda s: any(m in s for m in modules))
    assert not found, f"_compiled_fields.py names types' modules: {sorted(found)}"
