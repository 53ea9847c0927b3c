r"""The attention of every setting of the package's studies, by type and normalisation.

The studies (``gaussian_pde.studies``) replay the published experiments and run the
package's own: each is defined for given types under given normalisations. That
knowledge lives here, in one place, so that the studies name no type: they iterate over
the labels below and build their attentions with the functions below.

* The published rank histograms (docs/math.md 9.4), :math:`K = -Q`, score matrix
  :math:`A = K^TQ/\sqrt d`:

  .. math::

      \text{softmax: } \texttt{Softmax}(Q, -Q, V, c = 1/\sqrt d),\qquad
      \text{L2: } \texttt{L2}(Q, -Q, V/\sqrt d, c = 1)

  (the L2 score's quadratic part :math:`2K^TK` is not scaled by the script).
* The 2-D regimes of the published ``2d_plots.py`` (:math:`d = 2`): softmax with
  :math:`c = 1/\sqrt 2`, L2 with :math:`V/\sqrt 2` and :math:`c = 1`, Sinkhorn unscaled,
  and the script's multi-head field: head :math:`h` takes row :math:`h` of :math:`Q, K`
  and row :math:`h` of :math:`V` (:math:`c = 1`), or, called with one head, softmax.
* The clusters and trust-map studies: :math:`k = d`, :math:`c = 1`; softmax
  :math:`(Q, -Q, V)`, L2 :math:`(Q, Q, -V)` and the multi-head sum of their halves.
* The closure-error study: every type without exact moments (the registry's
  non-Gaussian-preserving types) with the study's fixed weights; a type that takes a
  bias gets :math:`b = -1`.

The tables also say which type plays which part in a study: the published script's
parameters and seeds of each type (:data:`PUBLISHED_PANELS`, :data:`PUBLISHED_V_SEEDS`,
:data:`PUBLISHED_TIMED_TYPE`), the type of the regimes' eigenvalue flows
(:data:`REGIME_FLOW_TYPE`), and the clusters study's quick grid and reference family
(:data:`CLUSTER_QUICK_TYPES`, :data:`CLUSTER_REFERENCE_TYPE`).
"""

from __future__ import annotations

import inspect

import numpy as np

from ._l2 import L2
from ._multihead import MultiHead
from ._registry import ATTENTIONS
from ._sinkhorn import Sinkhorn
from ._softmax import Softmax

__all__ = ["PUBLISHED_TYPES", "REGIME_TYPES", "REGIME_PANELS", "REGIME_HORIZONS", "CLUSTER_TYPES",
           "published_attention", "regime_attention", "cluster_attention_of",
           "closure_study_types", "closure_study_attention",
           "PUBLISHED_PANELS", "PUBLISHED_V_SEEDS", "PUBLISHED_TIMED_TYPE", "REGIME_FLOW_TYPE",
           "CLUSTER_QUICK_TYPES", "CLUSTER_REFERENCE_TYPE"]

#: the published rank histograms' types, in the script's order (its V draws use seeds
#: 26 and 27 in this order)
PUBLISHED_TYPES = ("softmax", "l2")
#: the published script's parameters of each (type, value) panel of the rank histograms
#: (docs/math.md 9.5): Euler steps ``h`` for d = 3, 4, 5, tolerance ``tol`` on the norm
#: of the right-hand side, iteration cap ``max_iter`` and attempt cap ``n_max``
PUBLISHED_PANELS = {
    ("softmax", "identity"): {"h": (0.09, 0.05, 0.02), "tol": 1e-4, "max_iter": 60000,
                              "n_max": 1000},
    ("softmax", "random"): {"h": (0.09, 0.06, 0.02), "tol": 5e-5, "max_iter": 90000,
                            "n_max": 10000},
    ("l2", "identity"): {"h": (0.09, 0.06, 0.02), "tol": 1e-4, "max_iter": 60000,
                         "n_max": 1000},
    ("l2", "random"): {"h": (0.15, 0.15, 0.15), "tol": 5e-5, "max_iter": 50000,
                       "n_max": 1000},
}
#: the seed of each published type's draws of :math:`V = R^TR`
PUBLISHED_V_SEEDS = {"softmax": 26, "l2": 27}
#: the type whose d = 5 trajectory times one step of the published scheme
PUBLISHED_TIMED_TYPE = "softmax"
#: the types of the 2-D regime figures, in the order of the figures
REGIME_TYPES = ("softmax", "l2", "multihead", "sinkhorn")
#: the types drawn for each family of the 2-D regimes (the script's order)
REGIME_PANELS = {"zero": ("softmax", "l2", "multihead", "sinkhorn"),
                 "line": ("softmax", "l2"),
                 "plane": ("multihead",),
                 "two_lines": ("softmax", "l2"),
                 "blowup": ("softmax", "multihead", "l2", "sinkhorn"),
                 "depends": ("softmax", "l2", "multihead")}
#: (family, type) -> horizon of the regime panels that stop before their family's: the
#: L2 and Sinkhorn "blow-up" panels grow exponentially (their fields are bounded in
#: Sigma: no finite-time singularity, docs/math.md 3.3 and 4.3). Followed far, the
#: growing covariance becomes so elongated that the steps crawl (at traces of 1e9 to 1e16
#: on the published grid), so these panels stop at a time where every trajectory of the
#: published grid has grown by more than 1e3 but (almost) none crawls yet.
REGIME_HORIZONS = {("blowup", "l2"): 30.0, ("blowup", "sinkhorn"): 12.0}
#: the type whose eigenvalue flows the regimes figure draws
REGIME_FLOW_TYPE = "softmax"
#: the families of the clusters study (and of the trust map), in the study's order
CLUSTER_TYPES = ("softmax", "l2", "multihead")
#: the families of the three cases of the quick clusters grid, in the grid's order
CLUSTER_QUICK_TYPES = ("l2", "softmax", "multihead")
#: the clusters study's reference family (Gaussian-preserving): its exact one-component
#: case checks the :math:`n^{-1/2}` error, its ``V = I`` cases are the main ellipse
#: figures, the trust map runs its one-Gaussian control, and the remeasure, growth and
#: merge-gap studies revisit its cases
CLUSTER_REFERENCE_TYPE = "softmax"

_SQRT2 = np.sqrt(2.0)
_E = (np.diag([1.0, 0.0]), np.diag([0.0, 1.0]))


def _check(kind, kinds, what):
    if kind not in kinds:
        raise ValueError(f"`kind` must be one of {kinds} ({what}), got {kind!r}.")


def published_attention(kind, q, v, d):
    r"""The attention of one published rank-histogram setting, :math:`K = -Q`.

    Parameters
    ----------
    kind : {"softmax", "l2"}
        One of :data:`PUBLISHED_TYPES`.
    q, v : ndarray
        :math:`Q` (shape ``(d // 2, d)``) and :math:`V` (``(d, d)``).
    d : int
        Token dimension.
    """
    _check(kind, PUBLISHED_TYPES, "the published histograms")
    if kind == "softmax":
        return Softmax(q, -q, v, scale=1.0 / np.sqrt(d))
    return L2(q, -q, v / np.sqrt(d), scale=1.0)


def regime_attention(kind, Q, K, V, heads=2):
    r"""The attention of one panel of the published 2-D regimes (``d = 2``).

    Parameters
    ----------
    kind : str
        One of :data:`REGIME_TYPES`.
    Q, K : ndarray, shape (k, 2)
        Query and key matrices.
    V : ndarray, shape (2, 2)
        Value matrix.
    heads : int
        For the multi-head field: the script's number of heads (rows of :math:`Q, K`
        beyond :math:`Q`'s are empty heads); one head is the softmax field.
    """
    _check(kind, REGIME_TYPES, "the 2-D regimes")
    if kind == "softmax":
        return Softmax(Q, K, V, scale=1 / _SQRT2)
    if kind == "l2":
        return L2(Q, K, V / _SQRT2, scale=1.0)
    if kind == "sinkhorn":
        return Sinkhorn(Q, K, V, scale=1.0)
    if heads == 1:
        return MultiHead([Softmax(Q, K, V, scale=1 / _SQRT2)])
    return MultiHead([Softmax(Q[h:h + 1], K[h:h + 1], _E[h] @ V, scale=1.0)
                      for h in range(min(heads, Q.shape[0]))])


def cluster_attention_of(kind, Q, V):
    r"""The attention of the clusters study, score scale 1.

    Softmax :math:`(Q, -Q, V)`, L2 :math:`(Q, Q, -V)` or the multi-head sum of their halves.

    Parameters
    ----------
    kind : str
        One of :data:`CLUSTER_TYPES`.
    Q, V : ndarray, shape (d, d)
        Query and value matrices.
    """
    _check(kind, CLUSTER_TYPES, "the clusters study")
    if kind == "softmax":
        return Softmax(Q, -Q, V, scale=1.0)
    if kind == "l2":
        return L2(Q, Q, -V, scale=1.0)
    return MultiHead([Softmax(Q, -Q, V / 2, scale=1.0), L2(Q, Q, -V / 2, scale=1.0)])


def closure_study_types():
    """The registered types without exact moments (registry order): the closure-error cases."""
    return tuple(name for name, cls in ATTENTIONS.items() if not cls.gaussian_preserving)


def closure_study_attention(kind, Q, K, V):
    r"""The attention ``kind`` (a type of :func:`closure_study_types`) on ``(Q, K, V)``.

    A type that takes a bias gets :math:`b = -1`.
    """
    _check(kind, closure_study_types(), "types without exact moments")
    cls = ATTENTIONS[kind]
    extra = {"bias": -1.0} if "bias" in inspect.signature(cls).parameters else {}
    return cls(Q, K, V, **extra)
