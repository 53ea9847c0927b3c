"""Execute every validation notebook (jupytext percent scripts) in quick mode.

``GAUSSIAN_PDE_NOTEBOOK_QUICK=1`` makes them small; each ends with its own assertions.
Figures go to a temporary folder; matplotlib uses the Agg backend.
"""

import pathlib
import runpy

import pytest

import gaussian_pde as gp

FOLDER = pathlib.Path(__file__).parent.parent / "notebooks"
#: the particle-validation notebooks of the registered types that have one (a type's
#: notebook is ``notebooks/<name>.py``); other notebooks can be added here
NAMES = [n for n in gp.ATTENTIONS if (FOLDER / f"{n}.py").is_file()] + ["blowup", "clusters",
                                                                      "closure_error", "stabilizers"]
NOTEBOOKS = [FOLDER / f"{n}.py" for n in NAMES]


def test_every_documented_notebook_exists():
    """A notebook is asked for only where a type's documentation names one."""
    import inspect

    for name, cls in gp.ATTENTIONS.items():
        doc = (inspect.getmodule(cls).__doc__ or "") + (cls.__doc__ or "")
        for word in doc.split():
            if word.strip("`.,;:()").startswith("notebooks/"):
                assert (FOLDER.parent / word.strip("`.,;:()")).is_file(), (name, word)
    assert all(p.is_file() for p in NOTEBOOKS) and len(NOTEBOOKS) > 2


#: the longest quick runs (Sinkhorn's scaling, the mixture, closure and stabiliser studies)
#: run with the slow tests
_SLOW = {"sinkhorn", "clusters", "closure_error", "stabilizers"}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in _SLOW
                                  else p for p in NOTEBOOKS], ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_asserts(path, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    monkeypatch.setenv("GAUSSIAN_PDE_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("GAUSSIAN_PDE_NOTEBOOK_OUT", str(tmp_path))
    text = path.read_text()
    assert "# %%" in text and "assert " in text  # percent format, ends in checks
    import matplotlib.pyplot as plt

    plt.close("all")
    runpy.run_path(str(path), run_name="__main__")
    # every notebook shows its comparison as a figure (left open for the docs gallery)
    assert plt.get_fignums(), "the notebook shows no figure"
    plt.close("all")


def test_every_notebook_states_what_it_validates():
    for path in sorted(NOTEBOOKS[0].parent.glob("*.py")):
        header = path.read_text().split("\n# %%", 1)[0]
        assert header.startswith("# %% [markdown]\n# # "), path.name     # a title first
        assert "**What this validates**" in header, path.name
