"""Sphinx extension of the gaussian_pde docs.

It writes the API pages and the notebook gallery's sources, serves MathJax from the site,
and renders tables from the result JSON at build time.

Directives (usable from MyST as ```` ```{gp-table} NAME ```` and from reST):

``gp-table NAME``
    a table (with its caption and provenance line) built by ``gp_tables.NAME()`` from the
    JSON under ``docs/_static/results/``: no measured number is typed into a page;
``gp-cli-table``
    the subcommands of ``gaussian-pde``, read from its argparse parser.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import shutil
from pathlib import Path

import gp_tables
from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOG = logging.getLogger(__name__)

# --------------------------------------------------------------------------- API pages


def public_modules():
    """``[(module name, names)]``: the package and each public subpackage with ``__all__``.

    A subpackage's name that is the same object as a top-level one is listed only at the
    top level (one page per object).
    """
    import gaussian_pde as gp

    out = [("gaussian_pde", sorted(gp.__all__, key=str.lower))]
    for info in sorted(pkgutil.iter_modules(gp.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"gaussian_pde.{info.name}")
        names = [n for n in getattr(mod, "__all__", ())
                 if not (n in gp.__all__ and getattr(gp, n, None) is getattr(mod, n))]
        if names:
            out.append((mod.__name__, sorted(names, key=str.lower)))
    return out


def _kind(obj):
    if isinstance(obj, type):
        return "Classes"
    if callable(obj):
        return "Functions"
    return "Constants"


def write_api_pages(folder: Path) -> None:
    """Write ``folder/index.rst``: one autosummary per public module, by kind."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = ["API reference", "=============", "",
             "Every public name: ``gaussian_pde.__all__`` and the ``__all__`` of each public",
             "subpackage (a name that the package re-exports is listed under",
             "``gaussian_pde`` only). This page is generated at build time.", ""]
    for modname, names in public_modules():
        mod = importlib.import_module(modname)
        lines += [f"``{modname}``", "-" * (len(modname) + 4), "",
                  f".. automodule:: {modname}", "   :no-members:", "",
                  f".. currentmodule:: {modname}", ""]
        groups = {}
        for n in names:
            groups.setdefault(_kind(getattr(mod, n)), []).append(n)
        for kind in ("Classes", "Functions", "Constants"):
            if kind not in groups:
                continue
            lines += [f".. rubric:: {kind}", "", ".. autosummary::", "   :toctree: generated",
                      "   :nosignatures:", ""]
            lines += [f"   {n}" for n in groups[kind]] + [""]
    text = "\n".join(lines)
    target = folder / "index.rst"
    if not target.exists() or target.read_text() != text:
        target.write_text(text)


# --------------------------------------------------------------------- notebook gallery

_INLINE_MATH = re.compile(r"(?<!\$)\$([^$\n]+?)\$(?!\$)")
_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)]+)\)")


def _inline(text: str) -> str:
    """Markdown inline markup -> reST (math, code, links)."""
    def wrap(role_text, s, start, end):
        pre = "\\ " if start > 0 and (s[start - 1].isalnum() or s[start - 1] in ")]") else ""
        post = "\\ " if end < len(s) and (s[end].isalnum() or s[end] in "([") else ""
        return pre + role_text + post

    def sub(pattern, fmt, s):
        out, last = [], 0
        for m in pattern.finditer(s):
            out.append(s[last:m.start()])
            out.append(wrap(fmt(m), s, m.start(), m.end()))
            last = m.end()
        out.append(s[last:])
        return "".join(out)

    text = sub(_CODE, lambda m: f"``{m.group(1)}``", text)
    text = sub(_INLINE_MATH, lambda m: f":math:`{m.group(1)}`", text)
    text = _LINK.sub(lambda m: f"`{m.group(1)} <{m.group(2)}>`__", text)
    return text


def markdown_to_rst(lines: list[str]) -> list[str]:
    """The Markdown subset of the notebooks' text cells as reST."""
    out, in_math = [], False
    for line in lines:
        s = line.rstrip()
        if s.strip() == "$$":
            if not in_math:
                out += ["", ".. math::", ""]
            else:
                out.append("")
            in_math = not in_math
            continue
        if in_math:
            out.append("   " + s.strip())
            continue
        m = re.match(r"^(#{1,4})\s+(.*)$", s)
        if m:
            title = _inline(m.group(2))
            char = {1: "=", 2: "-", 3: "~", 4: "^"}[len(m.group(1))]
            out += ["", title, char * max(len(title), 3), ""]
            continue
        if re.match(r"^\s*[*-]\s", s) and out and out[-1].strip() and \
                not re.match(r"^\s*[*-]\s", out[-1]) and not out[-1].startswith("  "):
            out.append("")
        out.append(_inline(s))
    return out


def _cells(text: str):
    """``[(kind, lines)]`` of a percent script; kind is "markdown" or "code"."""
    cells, kind, buf = [], None, []
    for line in text.splitlines():
        if line.startswith("# %%"):
            if kind is not None:
                cells.append((kind, buf))
            kind, buf = ("markdown" if "[markdown]" in line else "code"), []
        else:
            if kind is None:
                kind = "code"
            buf.append(line)
    if kind is not None:
        cells.append((kind, buf))
    return cells


def _uncomment(lines):
    return [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in lines]


#: the note on a page executed in quick mode (it also changes the example's source, so
#: sphinx-gallery runs it again when a build changes mode)
QUICK_NOTE = (".. note::\n   This page was executed in the quick mode "
              "(``GAUSSIAN_PDE_NOTEBOOK_QUICK=1``): small sizes, not the full run.")


def notebook_to_gallery(text: str, quick: bool = False) -> str:
    """A percent script as a sphinx-gallery example (reST header docstring, text blocks)."""
    cells = _cells(text)
    if not cells or cells[0][0] != "markdown":
        raise ValueError("a notebook must start with a markdown cell holding its title")
    header = "\n".join(markdown_to_rst(_uncomment(cells[0][1]))).strip("\n")
    if quick:
        header += "\n\n" + QUICK_NOTE
    parts = ['r"""', header.replace('"""', "'''"), '"""', ""]
    for kind, lines in cells[1:]:
        while lines and not lines[-1].strip():
            lines = lines[:-1]
        if not lines:
            continue
        if kind == "markdown":
            parts += ["# %%"] + [("# " + ln).rstrip() for ln in markdown_to_rst(_uncomment(lines))]
            parts.append("")
        else:
            parts += ["# %%"] + lines + [""]
    return "\n".join(parts) + "\n"


def write_gallery_sources(src: Path, dst: Path, quick: bool = False) -> None:
    """``src/*.py`` (percent scripts) -> ``dst`` in sphinx-gallery form, with its header.

    The header says which mode the build runs (``quick``) and links the page of the
    notebooks' computation times that sphinx-gallery writes (``sg_execution_times``).
    """
    dst.mkdir(parents=True, exist_ok=True)
    wanted = {"GALLERY_HEADER.rst"}
    mode = ("in their quick mode (``GAUSSIAN_PDE_NOTEBOOK_QUICK=1``, the CI build)" if quick
            else "in their full mode")
    header = ("Validation notebooks\n====================\n\n"
              "Each notebook states what it validates, runs the comparison (the moment "
              "equations against particles, an exact solution against the numerical one, "
              "an error against the number of tokens) and ends with the assertions that "
              "make it a test: ``python -m pytest tests/test_notebooks.py`` runs them in "
              "quick mode. The pages here were executed when the site was built, "
              f"{mode}; :doc:`sg_execution_times` lists how long each one took. In the "
              "full mode the longest runs (the largest numbers of tokens) are read from "
              "``docs/_static/results/notebooks/``, written by ``python docs/make_results.py "
              "--notebooks``; the shorter runs are made again and must reproduce them.\n\n"
              ".. toctree::\n   :hidden:\n\n   sg_execution_times\n")
    _write_if_changed(dst / "GALLERY_HEADER.rst", header)
    for path in sorted(src.glob("*.py")):
        wanted.add(path.name)
        _write_if_changed(dst / path.name, notebook_to_gallery(path.read_text(), quick))
    for stale in dst.iterdir():
        if stale.name not in wanted and stale.is_file():
            stale.unlink()


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


# -------------------------------------------------------------------------- MathJax

#: combined configurations, the first one present is used, and the parts of MathJax 2
#: that each needs in the site (its TeX input, its output and fonts, the menus)
_MATHJAX_CONFIGS = {
    "TeX-AMS_CHTML": ("jax/output/CommonHTML", "fonts/HTML-CSS/TeX/woff"),
    "TeX-AMS-MML_HTMLorMML-full": ("jax/output/HTML-CSS", "jax/output/NativeMML",
                                   "fonts/HTML-CSS"),
    "TeX-AMS-MML_HTMLorMML": ("jax/output/HTML-CSS", "jax/output/NativeMML", "fonts/HTML-CSS"),
}
_MATHJAX_COMMON = ("MathJax.js", "config", "extensions", "jax/input/TeX", "jax/input/MathML",
                   "jax/element", "localization/en")


def local_mathjax() -> tuple[Path, str] | None:
    """``(folder, config)`` of a MathJax 2 on this machine (Debian's or the PyPI wheel's)."""
    candidates = [Path("/usr/share/javascript/mathjax")]
    try:
        import jupyter_server_mathjax

        candidates.append(Path(jupyter_server_mathjax.__file__).parent / "static")
    except ImportError:
        pass
    for folder in candidates:
        if not (folder / "MathJax.js").is_file():
            continue
        for config in _MATHJAX_CONFIGS:
            if (folder / "config" / f"{config}.js").is_file():
                return folder, config
    return None


def mathjax_path() -> str:
    """``mathjax_path`` for conf.py: the copy in ``_static/mathjax`` when one exists."""
    found = local_mathjax()
    if found is None:
        return "https://cdn.jsdelivr.net/npm/mathjax@2/MathJax.js?config=TeX-AMS_CHTML"
    return f"mathjax/MathJax.js?config={found[1]}"


def mathjax_fonts() -> dict:
    """MathJax 2's ``HTML-CSS`` settings for the local copy: its web fonts where TeX's are absent.

    The PyPI wheel's copy ships only the STIX-Web fonts; left to its default (TeX), the
    HTML-CSS output asks for TeX font files that are not there and shows "[Math
    Processing Error]" for every formula that needs one of their glyphs.
    """
    found = local_mathjax()
    if found is None or (found[0] / "fonts" / "HTML-CSS" / "TeX").is_dir():
        return {}
    return {"HTML-CSS": {"availableFonts": [], "preferredFont": None, "webFont": "STIX-Web",
                         "imageFont": None}}


def _copy_mathjax(app, exception):
    found = local_mathjax()
    if exception is not None or found is None or app.builder.format != "html":
        return
    src, config = found
    dst = Path(app.outdir) / "_static" / "mathjax"
    for part in _MATHJAX_COMMON + _MATHJAX_CONFIGS[config]:
        s, d = src / part, dst / part
        if not s.exists():
            continue
        if s.is_dir():
            shutil.copytree(s, d, dirs_exist_ok=True)
        else:
            d.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(s, d)


# ------------------------------------------------------------------------ directives


def table_node(header, rows, caption=None):
    """A docutils table of strings."""
    table = nodes.table(classes=["gp-table"])
    if caption:
        table += nodes.title(text=caption)
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)
    thead = nodes.thead()
    group += thead
    thead += _row(header)
    tbody = nodes.tbody()
    group += tbody
    for r in rows:
        tbody += _row(r)
    return table


def _row(cells):
    row = nodes.row()
    for c in cells:
        entry = nodes.entry()
        entry += inline_paragraph(str(c))
        row += entry
    return row


class TableDirective(SphinxDirective):
    """``gp-table NAME``: the tables returned by ``gp_tables.NAME()``."""

    required_arguments = 1
    has_content = False

    def run(self):
        name = self.arguments[0]
        fn = getattr(gp_tables, name, None)
        if fn is None:
            raise self.error(f"gp-table: no table function {name!r} in gp_tables")
        for dep in gp_tables.sources(name):
            self.env.note_dependency(str(dep))
        out = []
        for item in fn():
            if isinstance(item, str):
                out.append(inline_paragraph(item))
            else:
                out.append(table_node(*item))
        return out


def inline_paragraph(text):
    """A paragraph in which ```code``` spans are literals (the rest is plain text)."""
    para = nodes.paragraph()
    for i, part in enumerate(text.split("`")):
        if part:
            para += nodes.literal(text=part) if i % 2 else nodes.Text(part)
    return para


class CliTableDirective(SphinxDirective):
    """``gp-cli-table``: one row per subcommand of ``gaussian-pde`` (from its parser)."""

    has_content = False

    def run(self):
        return [table_node(["command", "what it does"], cli_rows())]


def cli_rows():
    """``[(command, help)]`` for every subcommand, nested ones (``sweep run``) included."""
    import argparse

    from gaussian_pde.cli._main import build_parser

    rows = []

    def walk(parser, prefix):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    rows.append((f"{prefix} {name}", helps.get(name) or ""))
                    walk(sub, f"{prefix} {name}")

    walk(build_parser(), "gaussian-pde")
    return rows


def setup(app):
    app.add_directive("gp-table", TableDirective)
    app.add_directive("gp-cli-table", CliTableDirective)
    app.connect("build-finished", _copy_mathjax)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
