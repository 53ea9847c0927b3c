"""The README and the docs pages: their code runs as written, the README stays short and
lists every command, and the version agrees with the changelog.

A ```python block is executed in a fresh namespace; when the next fenced block is a
```text block, what the code prints must be that text, line for line.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import pathlib
import re

import pytest

import gaussian_pde as gp

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)


def code_blocks(path):
    """``[(line, code, expected output or None)]`` of the ```python blocks of ``path``."""
    text = path.read_text()
    fences = [(m.group(1).strip(), m.group(2), m.start(), m.end()) for m in _FENCE.finditer(text)]
    out = []
    for i, (lang, body, start, end) in enumerate(fences):
        if lang != "python":
            continue
        expected = None
        if i + 1 < len(fences) and fences[i + 1][0] == "text" \
                and not text[end:fences[i + 1][2]].strip():
            expected = fences[i + 1][1]
        out.append((text.count("\n", 0, start) + 1, body, expected))
    return out


BLOCKS = [pytest.param(p, line, code, expected, id=f"{p.relative_to(ROOT)}:{line}")
          for p in PAGES for line, code, expected in code_blocks(p)]


def test_the_readme_has_examples_with_their_output():
    blocks = code_blocks(ROOT / "README.md")
    assert len(blocks) >= 3 and all(e is not None for _, _, e in blocks)


def test_the_block_reader_pairs_code_with_its_output(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("x\n```python\nprint(1)\n```\n\n```text\n1\n```\n```python\na = 2\n```\n")
    assert code_blocks(page) == [(2, "print(1)\n", "1\n"), (9, "a = 2\n", None)]


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("path, line, code, expected", BLOCKS)
def test_code_block_runs_and_prints_what_the_page_shows(path, line, code, expected,
                                                         monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(code, f"{path.name}:{line}", "exec"), {"__name__": "__main__"})
    if expected is not None:
        got = [ln.rstrip() for ln in buf.getvalue().strip("\n").splitlines()]
        assert got == [ln.rstrip() for ln in expected.strip("\n").splitlines()]


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def _leaf_commands(parser, prefix="gaussian-pde"):
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _leaf_commands(sub, f"{prefix} {name}")
                out += nested or [f"{prefix} {name}"]
    return out


def test_readme_command_table_lists_every_subcommand():
    from gaussian_pde.cli._main import build_parser

    text = (ROOT / "README.md").read_text()
    section = text.split("## Command line", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([^`]+)` \|", section, re.M))
    leaves = _leaf_commands(build_parser())
    assert len(leaves) >= 6
    assert set(leaves) <= listed, sorted(set(leaves) - listed)
    assert listed <= set(leaves) | {"gaussian-pde"}, sorted(listed - set(leaves))


def test_version_agrees_with_the_changelog():
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", text, re.M)
    assert versions, "no '## [X.Y.Z] - YYYY-MM-DD' entry"
    assert versions[0] == gp.__version__
    for v in versions:
        body = text.split(f"## [{v}]", 1)[1].split("\n## [", 1)[0]
        assert re.search(r"^### (Added|Changed|Fixed)$", body, re.M), v


def test_no_study_output_in_the_docs_source():
    """Results live in docs/_static/results/, never beside the maths."""
    stray = [p.name for p in (ROOT / "docs").iterdir()
             if p.suffix in (".json", ".png", ".npz") or p.name == "clusters"]
    assert not stray


def _docs_module(name):
    import importlib.util

    path = ROOT / "docs" / ("_ext" if name.startswith("gp_") else "") / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_docs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stored_notebook_runs_are_small_and_all_read():
    """``docs/make_results.py --notebooks`` writes only what the notebooks read, and little."""
    names = _docs_module("make_results").NOTEBOOKS
    folder = ROOT / "docs" / "_static" / "results" / "notebooks"
    files = sorted(folder.glob("*"))
    for p in files:
        assert p.suffix == ".npz" and any(p.stem == n or p.stem.startswith(n + "_")
                                          for n in names), p.name
    for name in names:
        text = (ROOT / "notebooks" / f"{name}.py").read_text()
        # the settings read GAUSSIAN_PDE_NOTEBOOK_RESULTS and _WRITE (tests/studies/test_notebook.py)
        assert "notebook_settings(" in text, name
        assert "notebook_compare(" in text or "settings.store(" in text, name
    assert sum(p.stat().st_size for p in files) < 400_000   # kept as data in the repository


def test_gallery_source_says_its_mode(monkeypatch):
    """A quick build's pages say so, and their sources differ from the full build's (so
    sphinx-gallery runs a notebook again when the mode changes)."""
    pytest.importorskip("sphinx")
    monkeypatch.syspath_prepend(str(ROOT / "docs" / "_ext"))
    gp_docs = _docs_module("gp_docs")
    text = (ROOT / "notebooks" / "softmax.py").read_text()
    full, quick = gp_docs.notebook_to_gallery(text), gp_docs.notebook_to_gallery(text, True)
    assert gp_docs.QUICK_NOTE in quick and gp_docs.QUICK_NOTE not in full
    assert quick.replace("\n\n" + gp_docs.QUICK_NOTE, "") == full


def _names_in_code(path):
    """Identifiers a module's code uses or defines (docstrings aside), and its identifier strings."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.value) for n in ast.walk(tree)
                  if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute):
            names.add(n.attr)
        elif isinstance(n, (ast.FunctionDef, ast.ClassDef)):
            names.add(n.name)
        elif isinstance(n, ast.alias):
            names |= {n.name.split(".")[-1], n.asname or ""}
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) \
                and id(n) not in docstrings and n.value.isidentifier():
            names.add(n.value)   # getattr(att, "compiled_field")
    return names


def test_architecture_picture_holds_against_the_code(tmp_path):
    """Every file a box of the picture names exists, every box is on an arrow, and the code
    at the using end of every arrow names what the arrow stands for (a hook, a loop)."""
    arch = _docs_module("gp_architecture")
    boxes = arch.boxes()
    for box in boxes.values():
        assert box.files, box.key
        for f in box.files:
            assert (ROOT / f).exists(), (box.key, f)
    ends = {k for a in arch.ARROWS for k in (a.tail, a.head)}
    assert ends <= set(boxes), sorted(ends - set(boxes))
    assert set(boxes) - ends == {"shared"}
    for a in arch.ARROWS:
        files = [ROOT / f for f in arch.user_files(a) if f.endswith(".py")]
        used = set().union(*(_names_in_code(p) for p in files))
        missing = [v for v in a.via if v not in used]
        assert not missing, (f"{a.tail} -> {a.head}: {missing} not in the code of "
                             f"{[str(p.relative_to(ROOT)) for p in files]}")


def test_architecture_picture_is_drawn(tmp_path):
    """The build's script writes a PNG sharp enough to open whole (the page scales it to its
    column), about as tall as wide so that the column keeps its text legible."""
    pytest.importorskip("matplotlib")
    out = _docs_module("gp_architecture").draw(tmp_path / "fig" / "architecture.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 1400 and 0.7 < height / width < 1.0


def test_architecture_page_names_only_files_that_exist():
    """Every ``.py`` path in the architecture page (``<type>`` read as ``softmax``) exists,
    under the repository or under ``gaussian_pde/``; a bare file name somewhere in them."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = set(re.findall(r"`([\w./<>-]+\.py)`", text))
    assert len(paths) >= 20
    files = {p.name for p in ROOT.rglob("*.py") if ".venv" not in p.parts}
    for p in sorted(paths):
        p = p.replace("<type>", "softmax")
        found = (ROOT / p).exists() or (ROOT / "gaussian_pde" / p).exists() \
            or ("/" not in p and p in files)
        assert found, p
