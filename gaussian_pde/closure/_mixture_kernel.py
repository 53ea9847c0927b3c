r"""The mixture field's softmax over components, compiled: row by row, no (points, K) array.

For every point :math:`x_n` with features :math:`f_n = (1, x_n, x_n\otimes x_n)` and every
component :math:`k` with coefficients :math:`\theta_k` (the logit
:math:`\ell_{nk} = \theta_k^Tf_n = \log w_k + \log Z_k(x_n) - r(x_n)`) and outputs
:math:`o_k = (c_k, \operatorname{vec}B_k)`,

.. math:: R_n = \frac{\sum_k e^{\ell_{nk}}\,o_k}{\sum_k e^{\ell_{nk}}},

computed per point in three passes over the components: the logits (a vector loop over
:math:`k` for each feature), their maximum :math:`m_n`, then the exponentials
:math:`e^{\ell_{nk} - m_n}` with their sum and the weighted outputs, so nothing overflows
and the memory is :math:`O(N + K)` (one row of logits per block of points); the blocks of
points run in parallel. A term with :math:`\ell_{nk} < m_n - 50` is taken as zero: all of
them together weigh less than :math:`Ke^{-50} \approx 2\cdot10^{-22}K` against the
largest term's 1, far below rounding for any :math:`K` that fits in memory. Cost: about
:math:`(1 + d + d^2) + (d + d^2)` multiply-adds per (point, component), vectorised over
the components, and one exponential where the term counts.
"""

from __future__ import annotations

import math
import os

import numpy as np

try:
    import numba
    from numba import njit, prange

    if "NUMBA_THREADING_LAYER" not in os.environ:
        # GNU OpenMP (Numba's default where TBB is absent) kills a process that forks
        # after using it: multiprocessing, Dask's process workers and the test corpus
        # fork. "forksafe" takes TBB or the workqueue.
        numba.config.THREADING_LAYER = "forksafe"
except ImportError:             # pragma: no cover - numba is a dependency
    prange = range

    def njit(*args, **kwargs):
        return lambda f: f

__all__ = ["softmax_average"]


#: points per block: one row of K logits is reused across a block's points
_BLOCK = 64
#: logits this far below the row's maximum weigh nothing (module docstring)
_CUTOFF = -50.0


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def softmax_average(feat, coef, out):
    """``R[n] = sum_k softmax_k(coef[k] . feat[n]) out[k]``.

    ``feat`` (N, F), ``coef`` (K, F), ``out`` (K, R), all C-contiguous float64 and finite.
    The sums may be reassociated (vector loops over the components): results agree with
    the plain sums to rounding.
    """
    n_pts, n_feat = feat.shape
    n_comp, n_out = out.shape
    coef_t = np.ascontiguousarray(coef.T)        # (F, K): the loops over k run along rows
    out_t = np.ascontiguousarray(out.T)          # (R, K)
    res = np.empty((n_pts, n_out))
    for b in prange((n_pts + _BLOCK - 1) // _BLOCK):
        row = np.empty(n_comp)
        for i in range(b * _BLOCK, min(n_pts, (b + 1) * _BLOCK)):
            x = feat[i, 0]
            for k in range(n_comp):
                row[k] = x * coef_t[0, k]
            for f in range(1, n_feat):
                x = feat[i, f]
                for k in range(n_comp):
                    row[k] += x * coef_t[f, k]
            m = -np.inf
            for k in range(n_comp):
                m = max(m, row[k])
            s = 0.0
            for k in range(n_comp):
                z = row[k] - m
                e = math.exp(z) if z > _CUTOFF else 0.0
                row[k] = e
                s += e
            for r in range(n_out):
                acc = 0.0
                for k in range(n_comp):
                    acc += row[k] * out_t[r, k]
                res[i, r] = acc / s
    return res
