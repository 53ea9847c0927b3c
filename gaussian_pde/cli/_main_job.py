r"""The main job: ``gaussian-pde`` with no arguments.

``run`` writes, into ``--out`` (default ``./gaussian_pde_output``):

* :func:`gaussian_pde.studies._reproduce.reproduce`'s report (the 2-D regimes for every attention
  type, eigenvalue flows and the rank histograms with both protocols), whose main figure
  is ``regimes_softmax.png``;
* the built-in 2-D examples, one trajectory per attention type:

  - ``trajectories.npz``: times, means and covariances per attention type;
  - ``covariance_trajectories.png``: eigenvalues of the covariance over time and the
    normalised covariance :math:`\Sigma/\operatorname{tr}\Sigma` in the unit disk;
  - a section of ``report.md`` (status, blow-up times, final spectra).

``--examples`` runs the built-in examples alone (with a report of their own). Progress
(one line per finished step: the reproduction's regimes, histograms and figures, then each
example) goes to stderr unless ``--quiet``.
"""

from __future__ import annotations

import pathlib

import numpy as np

from .._common.io import save_figure, write_npz, write_text
from ..attention import ATTENTIONS, compiled_field_of, get_attention
from ..integrate import compile_on_two_cores, solve
from ..studies import EXAMPLES_MARKER
from ._options import add_out_argument, default_out, output_dir
from ._progress import progress_for

DEFAULT_OUT = default_out()


def builtin_examples():
    """One built-in 2-D example per attention type: name -> (attention, mean0, cov0).

    In the order of the registry (:data:`gaussian_pde.ATTENTIONS`): each type's own
    ``example_setting()``; a registered type without one is left out. ``mean0`` is
    callable (position-dependent) for types with positions.
    """
    return {name: (ex["attention"], ex["mean0"], ex["cov0"])
            for name, ex in _settings().items()}


def _settings():
    """Name -> the type's ``example_setting()`` dict, for the types that define one.

    A type's example is its own: a subclass that does not define ``example_setting``
    itself has none (it would repeat its parent's).
    """
    out = {}
    for name in ATTENTIONS:
        cls = get_attention(name)
        if "example_setting" not in vars(cls):
            continue
        ex = cls.example_setting()
        if ex is not None:
            out[name] = ex
    return out


def default_examples():
    """The main job's examples: name -> (attention, mean0, cov0, horizon).

    Every built-in example whose moments obey the Gaussian moment ODEs (a
    Gaussian-preserving type with a constant mean), in the order of the registry; the
    horizon is the example's ``horizon`` (default 20).
    """
    return {name: (ex["attention"], ex["mean0"], ex["cov0"], ex.get("horizon", 20.0))
            for name, ex in _settings().items()
            if ex["attention"].gaussian_preserving and not callable(ex["mean0"])}


def add_arguments(parser):
    """Options of the main job."""
    add_out_argument(parser, DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="a small, fast report")
    parser.add_argument("--examples", action="store_true",
                        help="run the built-in 2-D examples instead of the reproduction")


def run(args):
    """Write the reproduction report and the built-in examples (``--examples``: these alone)."""
    output_dir(args.out)
    examples_alone = getattr(args, "examples", False)
    # a fresh machine: compiling on both cores (the replay's kernel beside the integrator)
    compile_on_two_cores(_compile_ahead(),
                         () if examples_alone else (_PUBLISHED_KERNEL,))
    n_examples = len(default_examples()) + 1   # the solves and their figure
    if examples_alone:
        return run_examples(args, progress=progress_for(args, n_examples))
    from ._reproduce import progress_steps
    from ._reproduce import run as run_reproduce

    progress = progress_for(args, progress_steps() + n_examples)
    code = run_reproduce(args, progress=progress)
    if code:
        return code
    return run_examples(args, append=True, progress=progress)


#: the reproduction's published scheme, compiled (the replay's kernel)
_PUBLISHED_KERNEL = "gaussian_pde.studies._published:compile_kernel"


def _compile_ahead():
    """What the job compiles besides the integrator and the types' own kernels.

    The examples' fields (sums of heads, another package's kernels); the reproduction's
    published scheme (the replay) compiles in the second process, beside the integrator.
    """
    def examples():
        for att, *_ in default_examples().values():
            compiled_field_of(att)

    return (examples,)


def run_examples(args, append=False, progress=None):
    """The built-in 2-D examples: trajectories, a figure and a short report.

    With ``append`` the report becomes a section at the end of an existing ``report.md``.
    ``progress``: called with a short message after each example and after the figure.
    """
    out = output_dir(args.out)
    results = {}
    for name, (att, m0, c0, horizon) in default_examples().items():
        t_eval = np.linspace(0.0, horizon, 301)
        results[name] = solve(att, m0, c0, (0.0, horizon), t_eval=t_eval)
        if progress is not None:
            progress(f"example: {name} -> {results[name].status}")
    arrays = {}
    for name, sol in results.items():
        arrays[f"{name}_t"] = sol.t
        arrays[f"{name}_mean"] = sol.mean
        arrays[f"{name}_cov"] = sol.cov
    write_npz(out / "trajectories.npz", **arrays)
    fig_path = _figure(results, out / "covariance_trajectories.png")
    if progress is not None:
        progress(f"figure: {fig_path.name}")
    report = out / "report.md"
    if append and report.exists():   # replace an earlier examples section, never repeat it
        head = report.read_text().split(EXAMPLES_MARKER, 1)[0].rstrip("\n")
        text = head + "\n\n" + EXAMPLES_MARKER + "\n" + _report(results, fig_path.name, "##")
    else:
        text = _report(results, fig_path.name, "#")
    write_text(report, text)
    print(f"gaussian-pde: wrote the built-in examples: {fig_path}, {out / 'trajectories.npz'} "
          f"and their report in {report}")
    return 0


def _figure(results, path):
    """``covariance_trajectories.png``: a column per example (drawn as reproduce's figures)."""
    from ..studies import draw_figure

    return pathlib.Path(draw_figure(lambda fig: _draw_examples(fig, results), path,
                                    save_figure))


def _draw_examples(fig, results):
    """Top: eigenvalues of Sigma over time; bottom: Sigma / tr Sigma in the unit disk."""
    from matplotlib.patches import Circle

    from ..studies import fixed_margins

    fig.set_size_inches(3.6 * len(results), 7)
    axes = fig.subplots(2, len(results), squeeze=False)
    for j, (name, sol) in enumerate(results.items()):
        eig = np.linalg.eigvalsh(sol.cov)
        ax = axes[0, j]
        ax.semilogy(sol.t, eig[:, 1], label=r"$\lambda_{\max}(\Sigma)$")
        ax.semilogy(sol.t, eig[:, 0], label=r"$\lambda_{\min}(\Sigma)$")
        ax.set_title(f"{name}: {sol.status}")
        ax.set_xlabel("t (depth)")
        ax.legend(fontsize=8)
        ax = axes[1, j]
        tr = np.trace(sol.cov, axis1=1, axis2=2)
        a, b, c = sol.cov[:, 0, 0] / tr, sol.cov[:, 1, 1] / tr, sol.cov[:, 0, 1] / tr
        ax.add_patch(Circle((0, 0), 1, fill=False, color="0.6"))
        sc = ax.scatter(a - b, 2 * c, c=sol.t, s=6, cmap="viridis")
        ax.plot(a[0] - b[0], 2 * c[0], "o", color="tab:red", label="start")
        ax.set_aspect("equal")
        ax.set_xlim(-1.1, 1.1)
        ax.set_ylim(-1.1, 1.1)
        ax.set_xlabel(r"$(a-b)/\mathrm{tr}$")
        ax.set_ylabel(r"$2c/\mathrm{tr}$")
        ax.legend(fontsize=8, loc="lower right")
        fig.colorbar(sc, ax=ax, label="t", shrink=0.7)
    fig.suptitle(r"Covariance $\Sigma(t) = [[a, c], [c, b]]$ of the Gaussian solution; "
                 r"bottom: $\Sigma/\mathrm{tr}\,\Sigma$ in the unit disk")
    fixed_margins(fig, left=0.786, right=0.389, bottom=0.317, top=0.683, wspace=0.402,
                  hspace=0.111)


def _report(results, fig_name, heading):
    lines = [f"{heading} Built-in 2-D examples", "",
             "One trajectory per attention type: the moment ODEs integrated with "
             "`gaussian_pde.solve` (DOP853, factor form); data in `trajectories.npz` "
             "(`<type>_t`, `<type>_mean`, `<type>_cov`).", "",
             "| attention | status | t_final | blow-up time | final eigenvalues of Sigma |",
             "|---|---|---|---|---|"]
    for name, sol in results.items():
        eig = np.linalg.eigvalsh(sol.cov_final)
        tb = "-" if sol.t_blowup is None else f"{sol.t_blowup:.8g}"
        lines.append(f"| {name} | {sol.status} | {sol.t_final:.6g} | {tb} | "
                     f"{', '.join(f'{e:.4g}' for e in eig)} |")
    lines += ["", f"![covariance trajectories]({fig_name})", ""]
    return "\n".join(lines)
