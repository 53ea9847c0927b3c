"""The training extra is optional: the package, its main job and the CLI work without JAX."""

import subprocess
import sys
import textwrap

import pytest

#: a meta-path hook that makes JAX and optax look uninstalled
_BLOCK = textwrap.dedent("""
    import importlib.abc, sys
    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in ('jax', 'jaxlib', 'optax'):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None
    sys.meta_path.insert(0, _Block())
""")


def _run(code, cwd=None):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def test_import_gaussian_pde_does_not_import_jax():
    code = ("import sys, gaussian_pde, gaussian_pde.training, gaussian_pde.cli._main\n"
            "from gaussian_pde.training import VARIANTS, TASKS, load_gpt2, model_spec\n"
            "bad = [m for m in ('jax', 'optax') if m in sys.modules]\n"
            "print(bad); sys.exit(1 if bad else 0)")
    r = _run(code)
    assert r.returncode == 0, r.stdout + r.stderr


def test_main_job_does_not_import_jax():
    code = ("import sys, gaussian_pde.cli._main_job as m, gaussian_pde.cli._main as c\n"
            "c.build_parser()\n"
            "sys.exit(1 if 'jax' in sys.modules else 0)")
    assert _run(code).returncode == 0


def test_cli_without_jax_exits_2_naming_the_install(tmp_path):
    code = _BLOCK + ("from gaussian_pde.cli._main import main\n"
                     f"raise SystemExit(main(['train', '--quick', '--out', {str(tmp_path)!r}]))")
    r = _run(code)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and 'pip install -e ".[train]"' in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_lazy_names_without_jax_fail_clearly():
    code = _BLOCK + ("import gaussian_pde.training as t\n"
                     "spec = t.model_spec('no_ln', depth=2)\n"
                     "try:\n    t.train\nexcept ModuleNotFoundError as e:\n"
                     "    print('missing', e)\n")
    r = _run(code)
    assert r.returncode == 0 and "missing" in r.stdout, r.stderr


def test_help_lists_train():
    pytest.importorskip("argparse")
    r = _run("from gaussian_pde.cli._main import main; main(['--help'])")
    assert "train" in r.stdout


def test_cli_out_that_is_a_file_is_refused(tmp_path, capsys):
    pytest.importorskip("jax")     # without the extra the command names the pip install first
    pytest.importorskip("optax")
    from gaussian_pde.cli._main import main

    f = tmp_path / "a_file"
    f.write_text("x")
    with pytest.raises(SystemExit) as e:
        main(["train", "--quick", "--out", str(f)])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gaussian-pde train: error: `--out` is an existing file, not a folder: {f}."]


def test_cli_help_names_the_default_folder(capsys):
    from gaussian_pde.cli._main import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "gaussian_pde_output/train" in out and "--seeds" in out and "--quick" in out
