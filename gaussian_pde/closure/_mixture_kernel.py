r"""The mixture field's softmax over components, compiled: one pass, no (points, K) array.

For every point :math:`x_n` with features :math:`f_n = (1, x_n, x_n\otimes x_n)` and every
component :math:`k` with coefficients :math:`\theta_k` (the logit
:math:`\ell_{nk} = \theta_k^Tf_n = \log w_k + \log Z_k(x_n) - r(x_n)`) and outputs
:math:`o_k = (c_k, \operatorname{vec}B_k)`,

.. math:: R_n = \frac{\sum_k e^{\ell_{nk}}\,o_k}{\sum_k e^{\ell_{nk}}},

computed with a running maximum (the online softmax: when :math:`\ell_{nk}` exceeds the
maximum so far, the partial sums are rescaled by :math:`e^{m - \ell_{nk}}`), so nothing
overflows and the memory is :math:`O(N + K)`; the points run in parallel. Cost: about
:math:`(1 + d + d^2) + (d + d^2)` multiply-adds and one exponential per (point, component).
"""

from __future__ import annotations

import math

import numpy as np

try:
    from numba import njit, prange
except ImportError:             # pragma: no cover - numba is a dependency
    prange = range

    def njit(*args, **kwargs):
        return lambda f: f

__all__ = ["softmax_average"]


@njit(cache=True, parallel=True)
def softmax_average(feat, coef, out):
    """``R[n] = sum_k softmax_k(coef[k] . feat[n]) out[k]``.

    ``feat`` (N, F), ``coef`` (K, F), ``out`` (K, R), all C-contiguous float64.
    """
    n_pts, n_feat = feat.shape
    n_comp, n_out = out.shape
    res = np.empty((n_pts, n_out))
    for i in prange(n_pts):
        acc = np.zeros(n_out)
        m = -np.inf
        s = 0.0
        for k in range(n_comp):
            logit = 0.0
            for f in range(n_feat):
                logit += feat[i, f] * coef[k, f]
            if logit > m:
                scale = math.exp(m - logit)
                s *= scale
                for r in range(n_out):
                    acc[r] *= scale
                m = logit
            e = math.exp(logit - m)
            s += e
            for r in range(n_out):
                acc[r] += e * out[k, r]
        for r in range(n_out):
            res[i, r] = acc[r] / s
    return res
