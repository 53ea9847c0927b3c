r"""Per-layer measures of a model's token clouds (docs/math.md 11.3).

For tokens :math:`X_\ell` after layer :math:`\ell` (all sequences of a batch pooled, the
input :math:`X_0` being the embedded tokens):

* drift from the input, :math:`\|X_\ell - X_0\|_F / \|X_0\|_F`, and from the previous
  layer, :math:`\|X_\ell - X_{\ell-1}\|_F / \|X_{\ell-1}\|_F`;
* :math:`W_2` between the Gaussian fits :math:`\mathcal N(\hat m_\ell, \hat\Sigma_\ell)` of
  consecutive layers (:func:`gaussian_pde.bures_wasserstein`), also divided by
  :math:`\sqrt{\operatorname{tr}\hat\Sigma_{\ell-1}}` (scale-free);
* activation growth :math:`\operatorname{tr}\hat\Sigma_\ell`.
"""

from __future__ import annotations

import numpy as np

import gaussian_pde as gp

__all__ = ["gaussian_fit", "drift_metrics"]


def gaussian_fit(x):
    """Mean and covariance (``ddof = 0``) of tokens ``x`` (..., n, d), pooled over leading axes."""
    x = np.asarray(x, float).reshape(-1, np.shape(x)[-1])
    m = x.mean(axis=0)
    xc = x - m
    return m, xc.T @ xc / x.shape[0]


def drift_metrics(tokens):
    r"""Drift and growth along depth from tokens ``(L + 1, ..., n, d)``.

    Returns a dict of arrays: ``rel_from_input`` (L + 1,), ``rel_step`` (L,),
    ``w2_step`` (L,), ``w2_step_rel`` (L,), ``trace`` (L + 1,). Layers whose tokens are not
    finite give ``NaN``.
    """
    t = np.asarray(tokens, float)
    L1 = t.shape[0]
    flat = t.reshape(L1, -1)
    finite = np.all(np.isfinite(flat), axis=1)
    with np.errstate(all="ignore"):
        norms = np.linalg.norm(flat, axis=1)
        rel_in = np.linalg.norm(flat - flat[0], axis=1) / norms[0]
        rel_step = np.linalg.norm(flat[1:] - flat[:-1], axis=1) / norms[:-1]
    fits = [gaussian_fit(t[i]) if finite[i] else None for i in range(L1)]
    trace = np.array([np.trace(f[1]) if f is not None else np.nan for f in fits])
    w2 = np.full(L1 - 1, np.nan)
    for i in range(L1 - 1):
        a, b = fits[i], fits[i + 1]
        if a is not None and b is not None and max(trace[i], trace[i + 1]) < 1e150:
            w2[i] = float(gp.bures_wasserstein(a[0], a[1], b[0], b[1]))
    with np.errstate(all="ignore"):
        w2_rel = w2 / np.sqrt(trace[:-1])
    rel_in[~finite] = np.nan
    rel_step[~(finite[1:] & finite[:-1])] = np.nan
    return {"rel_from_input": rel_in, "rel_step": rel_step, "w2_step": w2,
            "w2_step_rel": w2_rel, "trace": trace}
