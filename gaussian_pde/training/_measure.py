r"""Per-layer measures of a model's token clouds (docs/math.md 11.3).

For tokens :math:`X_\ell` after layer :math:`\ell` (all sequences of a batch pooled, the
input :math:`X_0` being the embedded tokens):

* drift from the input, :math:`\|X_\ell - X_0\|_F / \|X_0\|_F`, and from the previous
  layer, :math:`\|X_\ell - X_{\ell-1}\|_F / \|X_{\ell-1}\|_F`;
* :math:`W_2` between the Gaussian fits :math:`\mathcal N(\hat m_\ell, \hat\Sigma_\ell)` of
  consecutive layers (:func:`gaussian_pde.bures_wasserstein`), also divided by
  :math:`\sqrt{\operatorname{tr}\hat\Sigma_{\ell-1}}` (scale-free);
* activation growth :math:`\operatorname{tr}\hat\Sigma_\ell`;
* the centred relative change :math:`\|\bar X_\ell - \bar X_{\ell-1}\|_F/
  \|\bar X_{\ell-1}\|_F`, :math:`\bar X = X - \hat m` each layer centred on its own mean
  (the uncentred step drift counts a common shift, and for a layer without a residual it
  is of order one by construction: neither measures lost information);
* what is kept (:func:`information_metrics`): linear CKA with the input,
  :math:`\mathrm{CKA}(X, Y) = \|\bar Y^T\bar X\|_F^2/(\|\bar X^T\bar X\|_F\,
  \|\bar Y^T\bar Y\|_F)` (invariant to rotations and scale of either), and held-out
  linear probes: ridge regression from layer :math:`\ell` to the task's target (the
  readout's features; accuracy for classes, :math:`R^2` for a number) and to the embedded
  input token (:math:`R^2`). Information a layer has lost cannot come back through a
  linear probe; a probe that keeps its score through depth shows it was kept.
"""

from __future__ import annotations

import numpy as np

import gaussian_pde as gp

__all__ = ["gaussian_fit", "drift_metrics", "linear_cka", "ridge_probe", "information_metrics",
           "attention_spread"]


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
        cen = flat.reshape(L1, -1, t.shape[-1])
        cen = (cen - cen.mean(axis=1, keepdims=True)).reshape(L1, -1)
        cnorm = np.linalg.norm(cen, axis=1)
        centred = np.linalg.norm(cen[1:] - cen[:-1], axis=1) / cnorm[:-1]
    rel_in[~finite] = np.nan
    rel_step[~(finite[1:] & finite[:-1])] = np.nan
    centred[~(finite[1:] & finite[:-1])] = np.nan
    return {"rel_from_input": rel_in, "rel_step": rel_step, "w2_step": w2,
            "w2_step_rel": w2_rel, "trace": trace, "centred_step": centred}


def linear_cka(x, y):
    r"""Linear CKA of two sets of paired rows ``x`` (N, d1), ``y`` (N, d2), in [0, 1].

    .. math:: \mathrm{CKA} = \frac{\|\bar Y^T\bar X\|_F^2}
              {\|\bar X^T\bar X\|_F\,\|\bar Y^T\bar Y\|_F}

    (rows centred). ``NaN`` when either is not finite or constant.
    """
    x = np.asarray(x, float)
    y = np.asarray(y, float)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        return np.nan
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    # rescale first: the products of blown-up activations overflow
    sx, sy = np.abs(x).max(), np.abs(y).max()
    if sx == 0 or sy == 0:
        return np.nan
    x, y = x / sx, y / sy
    num = np.linalg.norm(y.T @ x) ** 2
    den = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    return float(num / den) if den > 0 else np.nan


def ridge_probe(features, target, *, classes=False, ridge=1e-3):
    r"""Held-out score of a ridge probe: accuracy (``classes``) or :math:`R^2`.

    The first half of the rows fits :math:`\min_W\|FW - T\|^2 + \lambda\|W\|^2` on
    standardised features (:math:`\lambda` = ``ridge`` times the number of fitted rows;
    a one-hot target for classes); the second half scores it. :math:`R^2 = 1 -
    \sum(T - \hat T)^2/\sum(T - \bar T)^2` over all target columns (the mean from
    the fitted half). ``NaN`` for non-finite features.
    """
    F = np.asarray(features, float)
    T = np.asarray(target)
    if not np.all(np.isfinite(F)):
        return np.nan
    n = F.shape[0] // 2
    mu, sd = F[:n].mean(axis=0), F[:n].std(axis=0)
    sd[sd == 0] = 1.0
    F = np.hstack([(F - mu) / sd, np.ones((F.shape[0], 1))])
    if classes:
        k = int(T.max()) + 1
        Y = np.eye(k)[T.astype(int)]
    else:
        Y = T.reshape(T.shape[0], -1).astype(float)
    A = F[:n].T @ F[:n] + ridge * n * np.eye(F.shape[1])
    W = np.linalg.solve(A, F[:n].T @ Y[:n])
    pred = F[n:] @ W
    if classes:
        return float(np.mean(np.argmax(pred, axis=1) == T[n:]))
    res = np.sum((Y[n:] - pred) ** 2)
    tot = np.sum((Y[n:] - Y[:n].mean(axis=0)) ** 2)
    return float(1.0 - res / tot) if tot > 0 else np.nan


def information_metrics(tokens, target, *, readout="mean", classes=False, max_tokens=2048):
    r"""Per layer: CKA with the input, and probes of the target and of the input.

    ``tokens`` (L + 1, B, n, d) as :func:`drift_metrics`; ``target`` (B,) the task's
    target. The target probe reads the readout's features of each sequence (the mean of
    its tokens, or its last token); the input probe maps each token of layer
    :math:`\ell` to its embedded input token (at most ``max_tokens`` tokens, the first
    ones). Returns ``cka_input``, ``probe_target``, ``probe_input``: arrays (L + 1,).
    """
    t = np.asarray(tokens, float)
    L1, B, n, d = t.shape
    flat = t.reshape(L1, B * n, d)[:, :max_tokens]
    feats = t.mean(axis=2) if readout == "mean" else t[:, :, -1]
    cka = np.array([linear_cka(flat[0], flat[i]) for i in range(L1)])
    pt = np.array([ridge_probe(feats[i], target, classes=classes) for i in range(L1)])
    pin = np.array([ridge_probe(flat[i], flat[0]) for i in range(L1)])
    return {"cka_input": cka, "probe_target": pt, "probe_input": pin}


def attention_spread(Q, K, tokens, scale):
    r"""Predicted and measured effective sample size of one attention layer's weights.

    For head :math:`h` and query :math:`x_i` the weights are
    :math:`w_{ij}\propto e^{a_i^Ty_j}` with :math:`a_i = c\,K_h^TQ_hx_i`. Against keys
    :math:`y\sim\mathcal N(\alpha, \Sigma)` the fraction of effective tokens,
    :math:`(\mathbb E w)^2/\mathbb E w^2`, is
    :math:`\big(e^{a^T\alpha + a^T\Sigma a/2}\big)^2/e^{2a^T\alpha + 2a^T\Sigma a}
    = e^{-a^T\Sigma a}`, so one effective token needs about :math:`e^{a^T\Sigma a}` tokens.
    Measured: :math:`(\sum_j w_{ij})^2/(n\sum_j w_{ij}^2)` on the sequences' own tokens.

    Parameters
    ----------
    Q, K : array_like, shape (H, k, d)
        The layer's query and key maps.
    tokens : array_like, shape (B, n, d)
        The tokens the layer attends over (each sequence its own keys).
    scale : float
        The score scale :math:`c`.

    Returns
    -------
    dict
        ``predicted`` and ``measured``: the median over queries, heads and sequences of the
        effective fraction; ``spread``: the median :math:`a^T\Sigma a` (:math:`\Sigma` each
        sequence's token covariance); ``tokens_needed``: :math:`e^{\text{spread}}`. ``NaN``
        for non-finite tokens.
    """
    Q, K = np.asarray(Q, float), np.asarray(K, float)
    x = np.asarray(tokens, float)
    if not np.all(np.isfinite(x)):
        return {"predicted": np.nan, "measured": np.nan, "spread": np.nan,
                "tokens_needed": np.nan}
    A = scale * np.einsum("hkd,hke->hde", K, Q)                 # a_i = A_h x_i
    a = np.einsum("hde,bne->bhnd", A, x)
    xc = x - x.mean(axis=1, keepdims=True)
    S = np.einsum("bnd,bne->bde", xc, xc) / x.shape[1]
    spread = np.einsum("bhnd,bde,bhne->bhn", a, S, a)
    s = np.einsum("bhnd,bmd->bhnm", a, x)
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        meas = 1.0 / (x.shape[1] * np.sum(w * w, axis=-1))
    med = float(np.median(spread))
    with np.errstate(over="ignore"):
        needed = float(np.exp(med))
    return {"predicted": float(np.median(np.exp(-spread))), "measured": float(np.median(meas)),
            "spread": med, "tokens_needed": needed}
