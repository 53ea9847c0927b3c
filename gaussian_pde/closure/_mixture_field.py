r"""The mixture closure's field as a field of the engine: its rhs kernel and measures.

The state of :func:`gaussian_pde.solve_mixture` with :math:`K \ge 2` components,
:math:`y = (\alpha_1, \dots, \alpha_K, L_1, \dots, L_K)` (means, then factors, row-major:
``K d + K d^2`` entries), follows the Gauss-Hermite closure of :mod:`._mixture`,

.. math::

    \alpha_k' = \sum_j W_j\,\Gamma(\alpha_k + L_kz_j),\qquad
    L_k' = \sum_j W_j\,\Gamma(\alpha_k + L_kz_j)\,z_j^T,\qquad
    \Gamma(x) = \sum_{\text{heads}} V\sum_k\pi_k(x)\,(c_k + B_kx),

with, per head of quadratic score (module docstring of :mod:`._mixture`; the means and
log weights tilted by :math:`e^{g^Ty}` first), :math:`P_k = I + \Sigma_kH`,
:math:`c_k = P_k^{-1}\alpha_k`, :math:`B_k = P_k^{-1}\Sigma_kA` and the logits
:math:`\log w_k + a_k + b_k^Tx + x^TM_kx` of :func:`._mixture._head_velocity`
(:math:`a_k = -\frac12\log\det P_k - \frac12\alpha_k^THc_k`,
:math:`b_k = \frac12A^T(c_k + \alpha_k) - \frac12B_k^TH\alpha_k`, :math:`M_k = \frac12B_k^TA`),
softmax over :math:`k` with the largest logit subtracted (terms more than 50 below it
taken as zero); a linear head (its field sees
the mixture's second moment only) adds :math:`V\big(\sum_kw_k(\Sigma_k +
\alpha_k\alpha_k^T)\big)Ax`. A point mass (:math:`L_k = 0`) moves with
:math:`\Gamma(\alpha_k)` and keeps :math:`L_k' = 0`.

Besides the rate, the kernel leaves the measures the engine's events read (a plain state
with a covariance, ``CoreOptions.cov_rows``) in ``ws``: the trace of the total covariance
in ``ws[0]``, a factor :math:`F` of it (``d x q``, :math:`q = K(d + 1)`, row-major) from
``ws[1]`` and its rate :math:`F'` after it,

.. math::

    F = \big[\sqrt{w_1}L_1, \dots, \sqrt{w_K}L_K,\ \sqrt{w_1}(\alpha_1 - \bar\alpha),
        \dots, \sqrt{w_K}(\alpha_K - \bar\alpha)\big],\qquad
    FF^T = \Sigma_{\mathrm{tot}} = \sum_kw_k(\Sigma_k + \alpha_k\alpha_k^T)
           - \bar\alpha\bar\alpha^T,

(:math:`\bar\alpha = \sum_kw_k\alpha_k`, :math:`F'` the same with the rates), so the
total covariance is positive semi-definite by construction. Called with ``m = 0`` the
kernel leaves only the trace and :math:`F` (no rate: the cost of a few products of
:math:`d \times d` matrices, not counted as an evaluation by the engine); with
``m = -1`` also the merge events' values after the room of :math:`F'` (the engine's
``CoreOptions.gaps``): each single-linkage merge height :math:`h_j` (ascending) of the
components' Bures-Wasserstein distances,

.. math:: W_2^2 = |\alpha_i - \alpha_k|^2 + \operatorname{tr}\Sigma_i
          + \operatorname{tr}\Sigma_k - 2\operatorname{tr}
          \big(\Sigma_i^{1/2}\Sigma_k\Sigma_i^{1/2}\big)^{1/2},

minus ``merge_tol``: a merge event fires where one of them falls to zero or below.

:func:`pack` lays the weights out: ``[d, K, heads, nodes, kinds (heads), tilts (heads),
w (K), log w (K), V, A, H (heads x d x d each), g (heads x d), z (nodes x d),
W (nodes), merge_tol]``; the kind 0 for a score linear in the key token (:math:`H = 0`), 1 for one
with :math:`H`, 2 for a linear head. No closed-form Jacobian: ``jac`` returns False and
the engine takes central differences.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["pack", "kernels", "KIND_SCORE", "KIND_SCORE_H", "KIND_LINEAR"]

#: a component whose logit is this far below the largest weighs nothing: all of them
#: together weigh less than :math:`Ke^{-50} \approx 2\cdot10^{-22}K` against the largest
#: term's 1 (as in :mod:`._mixture_kernel`)
_CUTOFF = -50.0
#: the head kinds of :func:`pack`
KIND_SCORE, KIND_SCORE_H, KIND_LINEAR = 0, 1, 2
_EPS = float(np.finfo(float).eps)


def _unpack(P):
    """``d, K, kinds, tilts, w, logw, V, A, H, g, Z, W`` of a packed vector (views of it)."""
    d, K, nh, N = int(P[0]), int(P[1]), int(P[2]), int(P[3])
    o = 4
    kinds = P[o:o + nh]
    o += nh
    tilts = P[o:o + nh]
    o += nh
    w = P[o:o + K]
    o += K
    logw = P[o:o + K]
    o += K
    s = nh * d * d
    V = P[o:o + s].reshape((nh, d, d))
    o += s
    A = P[o:o + s].reshape((nh, d, d))
    o += s
    H = P[o:o + s].reshape((nh, d, d))
    o += s
    g = P[o:o + nh * d].reshape((nh, d))
    o += nh * d
    Z = P[o:o + N * d].reshape((N, d))
    o += N * d
    W = P[o:o + N]
    return d, K, kinds, tilts, w, logw, V, A, H, g, Z, W


def _lu_solve_logdet(G, X):
    r"""``X <- G^{-1}X`` and :math:`\log|\det G|`, by LU with partial pivoting, in place.

    Never raises: a state whose :math:`P_k = I + \Sigma_kH` is singular or not finite (a
    wild trial state of a step, which the step's error test then rejects) gives inf or
    NaN, where ``numpy.linalg`` would raise.
    """
    d = G.shape[0]
    r = X.shape[1]
    logdet = 0.0
    for c in range(d):
        p = c
        for i in range(c + 1, d):
            if abs(G[i, c]) > abs(G[p, c]):
                p = i
        if p != c:
            for j in range(d):
                G[c, j], G[p, j] = G[p, j], G[c, j]
            for j in range(r):
                X[c, j], X[p, j] = X[p, j], X[c, j]
        piv = G[c, c]
        logdet += math.log(abs(piv)) if piv != 0.0 else -np.inf
        for i in range(c + 1, d):
            f = G[i, c] / piv
            for j in range(c, d):
                G[i, j] -= f * G[c, j]
            for j in range(r):
                X[i, j] -= f * X[c, j]
    for c in range(d - 1, -1, -1):
        for j in range(r):
            acc = X[c, j]
            for i in range(c + 1, d):
                acc -= G[c, i] * X[i, j]
            X[c, j] = acc / G[c, c]
    return logdet


def _head_terms(kind, tilt, Vh, Ah, Hh, gh, logw, means, covs, coef, outc):
    """One quadratic head's logit coefficients and outputs, into ``coef`` and ``outc``.

    ``coef[k] = [log w_k + a_k, b_k, vec M_k]`` (``1 + d + d^2``) and
    ``outc[k] = [c_k, vec B_k]`` (``d + d^2``).
    """
    K, d = means.shape
    mu = means.copy()
    lw = logw.copy()
    if tilt:
        for k in range(K):
            acc = 0.0
            for i in range(d):
                acc += means[k, i] * gh[i]
            quad = 0.0
            for i in range(d):
                sg = 0.0
                for j in range(d):
                    sg += covs[k, i, j] * gh[j]
                mu[k, i] = means[k, i] + sg
                quad += sg * gh[i]
            lw[k] = logw[k] + acc + 0.5 * quad
    SA = np.empty((d, d))
    for k in range(K):
        for i in range(d):
            for j in range(d):
                acc = 0.0
                for p in range(d):
                    acc += covs[k, i, p] * Ah[p, j]
                SA[i, j] = acc
        a = 0.0
        if kind == KIND_SCORE_H:
            Pk = np.eye(d)
            for i in range(d):
                for j in range(d):
                    acc = 0.0
                    for p in range(d):
                        acc += covs[k, i, p] * Hh[p, j]
                    Pk[i, j] += acc
            rhs = np.empty((d, d + 1))
            for i in range(d):
                rhs[i, 0] = mu[k, i]
                for j in range(d):
                    rhs[i, 1 + j] = SA[i, j]
            logdet = _lu_solve_logdet(Pk, rhs)
            sol = rhs
            a = -0.5 * logdet
            for i in range(d):
                outc[k, i] = sol[i, 0]
                for j in range(d):
                    outc[k, d + i * d + j] = sol[i, 1 + j]
        else:
            for i in range(d):
                outc[k, i] = mu[k, i]
                for j in range(d):
                    outc[k, d + i * d + j] = SA[i, j]
        # b_k = A^T (c_k + alpha_k) / 2 (- B_k^T H alpha_k / 2), M_k = B_k^T A / 2
        for i in range(d):
            acc = 0.0
            for p in range(d):
                acc += (outc[k, p] + mu[k, p]) * Ah[p, i]
            coef[k, 1 + i] = 0.5 * acc
        if kind == KIND_SCORE_H:
            Ha = np.empty(d)
            for j in range(d):
                acc = 0.0
                for p in range(d):
                    acc += mu[k, p] * Hh[p, j]
                Ha[j] = acc
            hc = 0.0
            for j in range(d):
                hc += Ha[j] * outc[k, j]
            a -= 0.5 * hc
            for i in range(d):
                acc = 0.0
                for j in range(d):
                    acc += outc[k, d + j * d + i] * Ha[j]
                coef[k, 1 + i] -= 0.5 * acc
        coef[k, 0] = lw[k] + a
        for i in range(d):
            for j in range(d):
                acc = 0.0
                for p in range(d):
                    acc += outc[k, d + p * d + i] * Ah[p, j]
                coef[k, 1 + d + i * d + j] = 0.5 * acc


def _measures(w, means, L, dm, dL, ws, rate):
    r"""The trace of :math:`\Sigma_{\mathrm{tot}}`, :math:`F` and (``rate``) :math:`F'` into ``ws``."""
    K, d = means.shape
    q = K * (d + 1)
    mbar = np.zeros(d)
    dbar = np.zeros(d)
    for k in range(K):
        for i in range(d):
            mbar[i] += w[k] * means[k, i]
            if rate:
                dbar[i] += w[k] * dm[k, i]
    tr = 0.0
    off = 1 + d * q
    for k in range(K):
        sw = math.sqrt(w[k])
        for i in range(d):
            for j in range(d):
                v = sw * L[k, i, j]
                ws[1 + i * q + k * d + j] = v
                tr += v * v
                if rate:
                    ws[off + i * q + k * d + j] = sw * dL[k, i, j]
            v = sw * (means[k, i] - mbar[i])
            ws[1 + i * q + K * d + k] = v
            tr += v * v
            if rate:
                ws[off + i * q + K * d + k] = sw * (dm[k, i] - dbar[i])
    ws[0] = tr


def _covariances(L):
    r"""The components' covariances :math:`\Sigma_k = L_kL_k^T` of their factors ``(K, d, d)``."""
    K, d = L.shape[0], L.shape[1]
    covs = np.empty((K, d, d))
    for k in range(K):
        for i in range(d):
            for j in range(d):
                acc = 0.0
                for p in range(d):
                    acc += L[k, i, p] * L[k, j, p]
                covs[k, i, j] = acc
    return covs


def _heads_at(kinds, tilts, V, A, H, g, logw, means, L):
    r"""Every head's terms at the state: ``(coefT, outT, lin)``.

    Per quadratic head, transposed for loops along the components: the logit
    coefficients ``coefT`` (F, K) of the features :math:`f = (1, x, x\otimes x)`, and the
    outputs with :math:`V` folded in, ``outT`` (R, K): :math:`(Vc_k, \operatorname{vec}VB_k)`;
    per linear head its map ``lin`` :math:`V\big(\sum_kw_k(\Sigma_k + \alpha_k\alpha_k^T)\big)A`.
    """
    nh = kinds.size
    K, d = means.shape
    covs = _covariances(L)
    # per head: the logit coefficients and outputs (quadratic), or the linear map (linear)
    coef = np.zeros((nh, K, 1 + d + d * d))
    outc = np.zeros((nh, K, d + d * d))
    lin = np.zeros((nh, d, d))
    for h in range(nh):
        kind = int(kinds[h])
        if kind == KIND_LINEAR:
            top = -np.inf
            for k in range(K):
                top = max(top, logw[k])
            wn = np.empty(K)
            tot = 0.0
            for k in range(K):
                wn[k] = math.exp(logw[k] - top)
                tot += wn[k]
            S = np.zeros((d, d))
            for k in range(K):
                c = wn[k] / tot
                for i in range(d):
                    for j in range(d):
                        S[i, j] += c * (covs[k, i, j] + means[k, i] * means[k, j])
            VS = V[h] @ S
            lin[h] = VS @ A[h]
        else:
            _head_terms(kind, tilts[h] != 0.0, V[h], A[h], H[h], g[h], logw, means, covs,
                        coef[h], outc[h])
    F = 1 + d + d * d
    R = d + d * d
    coefT = np.empty((nh, F, K))
    outT = np.empty((nh, R, K))
    for h in range(nh):
        for k in range(K):
            for f in range(F):
                coefT[h, f, k] = coef[h, k, f]
            for i in range(d):
                acc = 0.0
                for p in range(d):
                    acc += V[h, i, p] * outc[h, k, p]
                outT[h, i, k] = acc
                for j in range(d):
                    acc = 0.0
                    for p in range(d):
                        acc += V[h, i, p] * outc[h, k, d + p * d + j]
                    outT[h, d + i * d + j, k] = acc
    return coefT, outT, lin


def _quadrature(kinds, coefT, outT, lin, means, L, Z, W, dm, dL):
    r"""The quadrature of the closure's rates into ``dm`` and ``dL``.

    :math:`\alpha_k' = \sum_jW_j\Gamma(x_{kj})`, :math:`L_k' = \sum_jW_j\Gamma(x_{kj})z_j^T`
    at the nodes :math:`x_{kj} = \alpha_k + L_kz_j` (a point mass: at its mean alone).
    """
    nh = kinds.size
    K, d = means.shape
    F, R = coefT.shape[1], outT.shape[1]
    x = np.empty(d)
    G = np.empty(d)
    feat = np.empty(F)
    logit = np.empty(K)
    act = np.empty(K, dtype=np.int64)
    ew = np.empty(K)
    r = np.empty(R)
    N = W.size
    for k in range(K):
        point = True
        for i in range(d):
            for j in range(d):
                if L[k, i, j] != 0.0:
                    point = False
        nodes = 1 if point else N
        for n in range(nodes):
            for i in range(d):
                acc = means[k, i]
                if not point:
                    for p in range(d):
                        acc += Z[n, p] * L[k, i, p]
                x[i] = acc
                G[i] = 0.0
            feat[0] = 1.0
            for i in range(d):
                feat[1 + i] = x[i]
                for j in range(d):
                    feat[1 + d + i * d + j] = x[i] * x[j]
            for h in range(nh):
                if int(kinds[h]) == KIND_LINEAR:
                    for i in range(d):
                        acc = 0.0
                        for j in range(d):
                            acc += lin[h, i, j] * x[j]
                        G[i] += acc
                    continue
                # the softmax over the components of V (c_j + B_j x), largest logit first
                for c in range(K):
                    logit[c] = coefT[h, 0, c]
                for f in range(1, F):
                    v = feat[f]
                    for c in range(K):
                        logit[c] += v * coefT[h, f, c]
                top = -np.inf
                for c in range(K):
                    top = max(top, logit[c])
                tot = 0.0
                nact = 0
                for c in range(K):      # the components that weigh (module docstring)
                    z = logit[c] - top
                    if z > _CUTOFF:
                        e = math.exp(z)
                        tot += e
                        act[nact] = c
                        ew[nact] = e
                        nact += 1
                for q in range(R):
                    acc = 0.0
                    for a in range(nact):
                        acc += ew[a] * outT[h, q, act[a]]
                    r[q] = acc / tot
                for i in range(d):
                    acc = r[i]
                    for j in range(d):
                        acc += r[d + i * d + j] * x[j]
                    G[i] += acc
            if point:
                for i in range(d):
                    dm[k, i] = G[i]
                continue
            for i in range(d):
                wg = W[n] * G[i]
                dm[k, i] += wg
                for p in range(d):
                    dL[k, i, p] += wg * Z[n, p]


def _rates(P, y, out, ws, rate):
    """The closure's rate of ``y`` into ``out`` (``rate``) and the measures into ``ws``."""
    d, K, kinds, tilts, w, logw, V, A, H, g, Z, W = _unpack(P)
    means = y[:K * d].reshape((K, d))
    L = y[K * d:K * d + K * d * d].reshape((K, d, d))
    dm = np.zeros((K, d))
    dL = np.zeros((K, d, d))
    if not rate:
        _measures(w, means, L, dm, dL, ws, False)
        return
    coefT, outT, lin = _heads_at(kinds, tilts, V, A, H, g, logw, means, L)
    _quadrature(kinds, coefT, outT, lin, means, L, Z, W, dm, dL)
    for k in range(K):
        for i in range(d):
            out[k * d + i] = dm[k, i]
            for j in range(d):
                out[K * d + k * d * d + i * d + j] = dL[k, i, j]
    _measures(w, means, L, dm, dL, ws, True)


def _matmul(A, B, out):
    """``out = A @ B`` for square ``d x d`` arrays, each entry summed in increasing order."""
    d = A.shape[0]
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += A[i, p] * B[p, j]
            out[i, j] = acc


def _psd_sqrt(S, out):
    r"""The principal square root of a symmetric PSD ``S`` into ``out`` (``S`` overwritten).

    As :func:`gaussian_pde._common.linalg.psd_sqrt`: eigenvalues of :math:`(S + S^T)/2`
    below ``d * eps`` times the largest in magnitude count as zero. Loops but for the
    eigendecomposition (each NumPy operation would be one more function to compile).
    """
    d = S.shape[0]
    for i in range(d):
        for j in range(i):
            S[i, j] = S[j, i] = 0.5 * (S[i, j] + S[j, i])
    w, U = np.linalg.eigh(S)
    top = 0.0
    for i in range(d):
        top = max(top, abs(w[i]))
    cut = d * _EPS * top
    for i in range(d):
        for j in range(d):
            acc = 0.0
            for p in range(d):
                if w[p] > cut:
                    acc += U[i, p] * math.sqrt(w[p]) * U[j, p]
            out[i, j] = acc


def _bures_wasserstein(m1, S1, m2, S2, work):
    r"""The Bures-Wasserstein distance of two Gaussians, as :func:`gaussian_pde.bures_wasserstein`.

    .. math:: W_2^2 = |m_1 - m_2|^2 + \operatorname{tr}S_1 + \operatorname{tr}S_2
              - 2\operatorname{tr}\big(S_1^{1/2}S_2S_1^{1/2}\big)^{1/2},

    on the inputs scaled to order one (:math:`W_2` is homogeneous), clipped at zero.
    ``work``: scratch, ``(4, d, d)``.
    """
    d = m1.size
    c = 0.0
    top1 = 0.0
    top2 = 0.0
    for i in range(d):
        c = max(c, abs(m1[i] - m2[i]))
        for j in range(d):
            top1 = max(top1, abs(S1[i, j]))
            top2 = max(top2, abs(S2[i, j]))
    c = max(c, math.sqrt(top1), math.sqrt(top2))
    if not (math.isfinite(c) and c > 0):
        c = 1.0
    A, R, X, C = work[0], work[1], work[2], work[3]
    w2 = 0.0
    for i in range(d):
        w2 += ((m1[i] - m2[i]) / c) ** 2
        w2 += S1[i, i] / c / c + S2[i, i] / c / c
        for j in range(d):
            A[i, j] = S1[i, j] / c / c
    _psd_sqrt(A, R)
    for i in range(d):              # (A is free again: S2 / c^2)
        for j in range(d):
            A[i, j] = S2[i, j] / c / c
    _matmul(R, A, C)                # X = R (S2 / c^2) R
    _matmul(C, R, X)
    _psd_sqrt(X, C)
    for i in range(d):
        w2 -= 2.0 * C[i, i]
    return math.sqrt(max(w2, 0.0)) * c


def _merge_gaps(P, y, gaps):
    r"""The merge events' values: each single-linkage merge height minus ``merge_tol``.

    The heights (ascending) are the minimum spanning tree's edges (Prim's algorithm) on
    the components' Bures-Wasserstein distances, as
    :func:`gaussian_pde.closure.merge_heights` of
    :func:`gaussian_pde.closure.pairwise_bures_wasserstein`; ``merge_tol`` is the last
    entry of ``P`` (:func:`pack`).
    """
    d, K = int(P[0]), int(P[1])
    tol = P[P.size - 1]
    means = y[:K * d].reshape((K, d))
    S = _covariances(y[K * d:K * d + K * d * d].reshape((K, d, d)))
    work = np.empty((4, d, d))
    dist = np.zeros((K, K))
    for i in range(K):
        for k in range(i + 1, K):
            dist[i, k] = dist[k, i] = _bures_wasserstein(means[i], S[i], means[k], S[k], work)
    inside = np.zeros(K, dtype=np.bool_)
    inside[0] = True
    best = np.empty(K)
    for q in range(K):
        best[q] = dist[0, q]
    for s in range(K - 1):
        j = -1
        for q in range(K):
            if not inside[q] and (j < 0 or best[q] < best[j]):
                j = q
        gaps[s] = best[j]
        inside[j] = True
        for q in range(K):
            best[q] = min(best[q], dist[j, q])
    for s in range(1, K - 1):       # ascending (insertion: K is small)
        v = gaps[s]
        r = s - 1
        while r >= 0 and gaps[r] > v:
            gaps[r + 1] = gaps[r]
            r -= 1
        gaps[r + 1] = v
    for s in range(K - 1):
        gaps[s] -= tol


def rhs(P, d, m, y, out, ws):
    """The engine's field kernel: the closure's rate and measures.

    ``m = 0``: the measures only; ``m = -1``: the measures and the merge events' values
    (:func:`_merge_gaps`) after the room of :math:`F'` (``CoreOptions.gaps``).
    """
    _rates(P, y, out, ws, m > 0)
    if m < 0:                          # (d: the state's size; the tokens' is P[0])
        dt, K = int(P[0]), int(P[1])
        q = _measures_size(dt, K)
        _merge_gaps(P, y, ws[q:q + K - 1])


def jac(P, d, m, y, J, ws):
    """No closed-form Jacobian: the engine takes central differences."""
    return False


def _measures_size(d, K):
    """The entries of the measures in the scratch: the trace, :math:`F` and :math:`F'`."""
    return 1 + 2 * d * K * (d + 1)


def ws_size(d, K, merges=False):
    """The scratch the kernel writes: the trace, :math:`F` and :math:`F'` (``d x K(d + 1)``).

    With ``merges``, the ``K - 1`` merge events' values after them.
    """
    return _measures_size(d, K) + (K - 1 if merges else 0)


def pack(heads, weights, Z, W, merge_tol=None):
    r"""The engine's ``params`` (one row) of a mixture's heads, weights and nodes.

    Parameters
    ----------
    heads : list
        :func:`gaussian_pde.attention.quadratic_heads` ``(attention, fields=True)``: each a
        :class:`~gaussian_pde.attention.QuadraticScore` or a head with a ``second_moment_map``.
    weights : ndarray, shape (K,)
        The component weights.
    Z, W : ndarray, shapes (N, d) and (N,)
        The standard Gauss-Hermite nodes and weights.
    merge_tol : float, optional
        The merge events' tolerance (:func:`_merge_gaps`), the last entry (NaN: none).

    Returns
    -------
    ndarray, shape (1, p)
        Or None where a head is of a kind the kernel does not know (neither a quadratic
        score nor a ``second_moment_map``).
    """
    from ..attention import QuadraticScore

    K = weights.size
    d = Z.shape[1]
    kinds, tilts, Vs, As, Hs, gs = [], [], [], [], [], []
    zero = np.zeros((d, d))
    for h in heads:
        linear = None if isinstance(h, QuadraticScore) else getattr(
            h, "second_moment_map", lambda: None)()
        if isinstance(h, QuadraticScore):
            kinds.append(KIND_SCORE if h.H is None else KIND_SCORE_H)
            tilts.append(0.0 if h.g is None else 1.0)
            Vs.append(h.V)
            As.append(h.A)
            Hs.append(zero if h.H is None else h.H)
            gs.append(np.zeros(d) if h.g is None else h.g)
        elif linear is not None:
            V, A = linear
            kinds.append(KIND_LINEAR)
            tilts.append(0.0)
            Vs.append(V)
            As.append(A)
            Hs.append(zero)
            gs.append(np.zeros(d))
        else:
            return None
    nh = len(kinds)
    head = np.array([d, K, nh, W.size] + kinds + tilts, dtype=float)
    parts = [head, weights, np.log(weights)] + [np.ravel(np.asarray(X, dtype=float))
                                                for X in (*Vs, *As, *Hs, *gs)]
    parts += [np.ravel(Z), np.ravel(W), [np.nan if merge_tol is None else float(merge_tol)]]
    return np.concatenate(parts)[None, :]


_HELPERS = ("_unpack", "_lu_solve_logdet", "_head_terms", "_measures", "_heads_at",
            "_quadrature", "_rates", "_covariances", "_matmul", "_psd_sqrt",
            "_bures_wasserstein", "_merge_gaps", "_measures_size")


@functools.cache
def kernels():
    """``(rhs, jac)`` compiled with the engine's signatures (Numba, cached on disk).

    The helpers are compiled in place (module globals), so the uncompiled source stays
    at ``py_func``; the loops over the components of ``_quadrature`` may be vectorised
    (its sums reassociated).
    """
    from .._common.compiled import engine_field_kernels
    from ..attention import compiled_signatures

    return engine_field_kernels(globals(), _HELPERS, compiled_signatures(),
                                fast=("_quadrature",))
