"""Sphinx configuration of the gaussian_pde documentation.

Build: ``python -m sphinx -W -b html docs docs/_build/html`` (warnings are errors).
``GAUSSIAN_PDE_NOTEBOOK_QUICK=1`` runs the validation notebooks in their quick mode (CI);
without it they run in full. Generated at build time, never edited by hand (all ignored
by git): ``docs/api/`` (the API reference, from ``__all__``), ``docs/_gallery_src/`` (the
notebooks with their text cells in reST), ``docs/notebooks/`` (the executed gallery) and
``docs/_figures/`` (the picture of the architecture page).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE / "_ext"))

import gp_architecture  # noqa: E402
import gp_docs  # noqa: E402
from sphinx.ext.autodoc.mock import mock  # noqa: E402

import gaussian_pde  # noqa: E402

project = "gaussian_pde"
author = "the gaussian_pde authors"
copyright = "the gaussian_pde authors, BSD-3-Clause"
release = version = gaussian_pde.__version__

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx_gallery.gen_gallery",
    "gp_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# (sphinx-gallery also writes a copy of the notebooks' computation times at the top)
exclude_patterns = ["_build", "_gallery_src", "_static", "make_results.py",
                    "sg_execution_times.rst"]
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["custom.css"]

# MyST: docs/math.md is written with $...$ and $$...$$
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

# numpydoc / autodoc / autosummary
autosummary_generate = True
autosummary_imported_members = True
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
autodoc_default_options = {"members": True, "inherited-members": False}
autodoc_typehints = "none"
add_module_names = False

# The optional extras' packages (``train``: JAX, optax, diffrax, safetensors; ``sweep``:
# dask, distributed, zarr) are mocked wherever the build imports the package's modules: their
# API pages come from the docstrings, the build runs none of their code (the training and
# sweep results it shows are stored data), so the extra ``docs`` alone builds the site.
autodoc_mock_imports = ["jax", "optax", "diffrax", "safetensors", "dask", "distributed", "zarr"]

# The API pages, written from ``__all__`` before autosummary reads them.
with mock(autodoc_mock_imports):
    gp_docs.write_api_pages(HERE / "api")

# The architecture page's picture, drawn from the boxes and arrows of gp_architecture.
gp_architecture.draw(HERE / "_figures" / "architecture.png")

# The validation notebooks: their text cells turned into reST for sphinx-gallery.
QUICK = os.environ.get("GAUSSIAN_PDE_NOTEBOOK_QUICK") == "1"
gp_docs.write_gallery_sources(ROOT / "notebooks", HERE / "_gallery_src", quick=QUICK)
# the full mode reads the notebooks' longest runs from here (docs/make_results.py --notebooks)
os.environ.setdefault("GAUSSIAN_PDE_NOTEBOOK_RESULTS", str(HERE / "_static" / "results" / "notebooks"))
os.environ.setdefault("GAUSSIAN_PDE_NOTEBOOK_OUT", tempfile.mkdtemp(prefix="gp_notebooks_"))
os.environ.setdefault("MPLBACKEND", "Agg")
sphinx_gallery_conf = {
    "examples_dirs": "_gallery_src",
    "gallery_dirs": "notebooks",
    "filename_pattern": r".*\.py$",
    "within_subsection_order": "FileNameSortKey",
    "download_all_examples": False,
    "remove_config_comments": True,
    "show_signature": False,
    "image_scrapers": ("matplotlib",),
    "matplotlib_animations": False,
    "abort_on_example_error": True,
    "capture_repr": (),
    "min_reported_time": 0,
    # the page notebooks/sg_execution_times: each notebook's time in this build
    "write_computation_times": True,
}

# MathJax served from the site itself (the build machine and the reader may be offline).
mathjax_path = gp_docs.mathjax_path()
# (the theme marks the page body ``tex2jax_ignore``; Sphinx's math spans are processed)
mathjax2_config = {"tex2jax": {"inlineMath": [["\\(", "\\)"]],
                               "displayMath": [["\\[", "\\]"]],
                               "processEscapes": True,
                               "ignoreClass": "tex2jax_ignore|mathjax_ignore|document",
                               "processClass": "tex2jax_process|mathjax_process|math|output_area"},
                    **gp_docs.mathjax_fonts()}

# Theme
html_theme = "pydata_sphinx_theme"
html_title = f"gaussian_pde {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "navbar_align": "left",
    "header_links_before_dropdown": 8,
    "secondary_sidebar_items": ["page-toc"],
}
html_sidebars = {"**": ["sidebar-nav-bs"]}
html_show_sourcelink = False
html_copy_source = False

# linkcheck: no network here, so only the site's own links are checked.
linkcheck_ignore = [r"https?://.*"]
linkcheck_anchors = True

# Smart quotes and ellipses, but no dash ligatures: tables and prose quote command lines
# such as ``train --quick`` verbatim.
smartquotes_action = "qe"
