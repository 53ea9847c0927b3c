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
NAMES = [n for n in gp.ATTENTIONS if (FOLDER / f"{n}.py").is_file()] + ["blowup", "clusters"]
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


#: the two longest quick runs (Sinkhorn's scaling, the mixture study) run with the slow tests
_SLOW = {"sinkhorn", "clusters"}


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
    runpy.run_path(str(path), run_name="__main__")
    assert list(tmp_path.glob("*.png"))
