r"""Studies: the package's numerical experiments, each a function that returns its results.

The moment ODEs are checked against particles, the Gaussian closure is measured where it
is not exact, and the stabiliser claims are tested layer by layer. The command line
(``gaussian-pde compare``, ``reproduce``, ``stabilizers``) and the validation notebooks
in ``notebooks/`` run them through these names.

Moment ODEs against particle Monte Carlo (docs/math.md section 8)
    :func:`compare` (also ``gaussian_pde.compare``) returns a :class:`CompareReport`;
    :func:`fit_slope` is the least-squares slope of ``log(error)`` against ``log(n)``;
    :func:`mean_field_check_failures` lists the checks a report fails;
    :meth:`CompareReport.save` and :meth:`CompareReport.load` store a report, and
    :func:`stored_compare` reads the long runs of a stored one and runs the short ones
    again (the validation notebooks in the docs build).

The validation notebooks' shared parts
    :func:`notebook_settings` reads a notebook's mode, sizes, seeds and files from the
    ``GAUSSIAN_PDE_NOTEBOOK_*`` environment variables into a :class:`NotebookSettings`;
    :func:`notebook_compare` is their particles-against-ODE block (:func:`stored_compare`
    at those sizes and seeds, its figures saved).

Figures of a :class:`CompareReport`
    :func:`plot_errors`, :func:`plot_scaling`, :func:`plot_moments`,
    :func:`plot_diagnostics` and :func:`all_figures` return matplotlib figures. They
    import matplotlib when called; importing this module does not.

Error of the Gaussian closure (docs/math.md section 6)
    :func:`measure_closure_error` for the cases in :data:`CLOSURE_CASES`, built by
    :func:`closure_case`.

Many clusters: the Gaussian-mixture closure against particles
    :func:`run_clusters` and :func:`write_clusters` (``gaussian-pde clusters``), with
    :func:`error_scaling` for the :math:`n^{-1/2}` check; results as :class:`ClusterRun`.
    Where the closure can be trusted: ``gaussian_pde.studies._trust`` (``gaussian-pde
    clusters --trust``), the closure's bias separated from Monte Carlo (``closure_bias``)
    over a controlled grid (``run_trust``, ``write_trust``).

Residual and normalisation stabilisers (docs/math.md section 7)
    :func:`run_study`, :func:`summarize_study` and :func:`write_study`, over the modes
    :data:`STUDY_MODES` and normalisations :data:`STUDY_NORMS`, with the layers drawn by
    :func:`draw_layers` and the per-layer measures of :func:`depth_metrics`.

The paper's Gaussian results (docs/math.md sections 4 and 9)
    :func:`reproduce` writes the 2-D regimes (:data:`REGIMES`: the families of the
    published ``2d_plots.py`` with its draws and grid layout, for the attention types
    :data:`TYPES`; :func:`unit_trace_grid` is a polar grid of such initial covariances) and
    the rank histograms, with eigenvalues counted above :data:`PAPER_THRESHOLD` in the paper's
    protocol. :func:`published_histograms` replays the published histogram protocol of
    section 9 number for number (:func:`write_published_histograms` writes its JSON), and
    :func:`certified_limit` / :func:`certified_limits` decide the limit rank of a
    :math:`K = -Q` setting from the growth of :math:`\Sigma^{-1}` (docs/math.md 4.5).

Examples
--------
>>> from gaussian_pde import studies
>>> round(float(studies.fit_slope([100, 400, 1600], [0.1, 0.05, 0.025])), 6)
-0.5
"""

from ._certified import CertifiedLimit, certified_limit, certified_limits
from ._closure_error import CLOSURE_CASES, closure_case, measure_closure_error
from ._clusters import (
    ClusterRun,
    check_case_memory,
    cluster_cases,
    error_scaling,
    run_clusters,
    write_clusters,
)
from ._compare import (
    CompareReport,
    check_compare_memory,
    compare,
    compare_memory,
    fit_slope,
    mean_field_check_failures,
    stored_compare,
)
from ._compare_plots import all_figures, plot_diagnostics, plot_errors, plot_moments, plot_scaling
from ._notebook import NotebookSettings, notebook_compare, notebook_settings
from ._published import published_histograms, write_published_histograms
from ._published_certified import write_published_certified
from ._regimes import draw_figure, fixed_margins
from ._reproduce import (
    EXAMPLES_MARKER,
    PAPER_THRESHOLD,
    REGIMES,
    TYPES,
    progress_steps,
    reproduce,
    unit_trace_grid,
)
from ._stabilizers import (
    STUDY_MODES,
    STUDY_NORMS,
    depth_metrics,
    draw_layers,
    run_study,
    summarize_study,
    write_study,
)
from ._trust import (
    TRUST_GRID,
    growth_study,
    merge_gap_sources,
    remeasure_study,
    run_trust,
    study_case_count,
    write_trust,
)

__all__ = [
    "CLOSURE_CASES",
    "EXAMPLES_MARKER",
    "TRUST_GRID",
    "ClusterRun",
    "PAPER_THRESHOLD",
    "REGIMES",
    "STUDY_MODES",
    "STUDY_NORMS",
    "TYPES",
    "CertifiedLimit",
    "CompareReport",
    "NotebookSettings",
    "all_figures",
    "certified_limit",
    "certified_limits",
    "check_case_memory",
    "check_compare_memory",
    "closure_case",
    "cluster_cases",
    "compare",
    "compare_memory",
    "depth_metrics",
    "draw_figure",
    "draw_layers",
    "error_scaling",
    "fit_slope",
    "fixed_margins",
    "growth_study",
    "mean_field_check_failures",
    "notebook_compare",
    "notebook_settings",
    "merge_gap_sources",
    "measure_closure_error",
    "plot_diagnostics",
    "plot_errors",
    "plot_moments",
    "plot_scaling",
    "progress_steps",
    "published_histograms",
    "remeasure_study",
    "reproduce",
    "run_clusters",
    "run_study",
    "run_trust",
    "study_case_count",
    "summarize_study",
    "unit_trace_grid",
    "write_clusters",
    "write_published_histograms",
    "write_published_certified",
    "write_study",
    "stored_compare",
    "write_trust",
]
