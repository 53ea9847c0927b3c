"""Small batched linear-algebra kernels used by the moment equations.

All functions act on the last two axes and broadcast over leading axes, so the same
code serves one trajectory and a stack of thousands.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg.blas import dnrm2 as _dnrm2
from scipy.linalg.lapack import dgeqrf as _dgeqrf
from scipy.linalg.lapack import dorgqr as _dorgqr
from scipy.linalg.lapack import dposv as _dposv
from scipy.linalg.lapack import dtrtrs as _dtrtrs

__all__ = ["T", "sym", "solve", "psd_sqrt", "sinkhorn_phi", "sinkhorn_cross", "l2_gain",
           "l2_gain_parts", "psd_factor", "numerical_rank", "has_full_numerical_rank",
           "JACOBIAN_SPREAD_MAX", "closed_form_holds"]


def T(X):
    """Transpose of the last two axes."""
    return X.swapaxes(-1, -2)


def sym(X):
    r"""Symmetric part :math:`(X + X^T)/2`."""
    return 0.5 * (X + T(X))


def solve(A, B):
    r""":math:`A^{-1} B` for stacks of square ``A`` (never forms the inverse)."""
    return np.linalg.solve(A, B)


def psd_sqrt(S):
    r"""Principal square root :math:`S^{1/2}` of a symmetric PSD matrix (stack).

    Eigenvalues below ``d * eps`` times the largest (rounding noise, which the square root
    would amplify to ``sqrt(eps)``) are set to zero, so a singular ``S`` gives a factor
    with an exact null space and the flow keeps its rank.
    """
    w, U = np.linalg.eigh(sym(S))
    cut = S.shape[-1] * np.finfo(float).eps * np.max(np.abs(w), axis=-1, keepdims=True)
    w = np.sqrt(np.where(w > cut, w, 0.0))
    return (U * w[..., None, :]) @ T(U)


def psd_factor(S):
    r"""A factor :math:`L` with :math:`LL^T = S` that keeps a null space exactly (stack).

    The principal square root :func:`psd_sqrt` where ``S`` has full numerical rank (the
    same cut); otherwise :math:`U\operatorname{diag}(w^{1/2})` from the eigenvectors, so
    that the columns of the null directions are exact zeros. The flows in factor form,
    :math:`L' = M(LL^T)L`, keep a zero column zero in floating point too, so the rank of
    the covariance is kept exactly; a null space spanned by generic vectors (the
    principal root's) is kept only up to rounding, which the flow can amplify (a
    Sinkhorn run at scale ``1e4`` grew a spurious eigenvalue of ``4e-8`` relative).
    """
    w, U = np.linalg.eigh(sym(S))
    if w.ndim == 1:
        # one matrix of full numerical rank (most calls): the same numbers in fewer
        # NumPy calls (the eigenvalues come sorted, so the largest |w| is at an end)
        cut = S.shape[-1] * np.finfo(float).eps * max(-w[0], w[-1])
        if w[0] > cut:
            return (U * np.sqrt(w)) @ U.T
    cut = S.shape[-1] * np.finfo(float).eps * np.max(np.abs(w), axis=-1, keepdims=True)
    keep = w > cut
    r = np.sqrt(np.where(keep, w, 0.0))
    root = (U * r[..., None, :]) @ T(U)
    if keep.all():
        return root
    full = keep.all(axis=-1)[..., None, None]
    return np.where(full, root, U * r[..., None, :])


def numerical_rank(S):
    r"""Eigenvalues of a PSD ``S`` (stack) above ``d * eps`` times its trace.

    Below that an eigenvalue of :math:`\Sigma/\operatorname{tr}\Sigma` is lost in the
    rounding of the covariance's entries (what ``numpy.linalg.matrix_rank`` counts).
    """
    w = np.linalg.eigvalsh(sym(S))
    tr = np.maximum(np.sum(w, axis=-1, keepdims=True), np.finfo(float).tiny)
    return np.sum(w > S.shape[-1] * np.finfo(float).eps * tr, axis=-1)


def has_full_numerical_rank(S):
    r"""Whether one PSD ``S`` has full numerical rank, by one shifted Cholesky factorisation.

    Full rank as :func:`numerical_rank` counts it: every eigenvalue above
    :math:`c = d\,\epsilon\operatorname{tr}S`. The factorisation is of
    :math:`S - (d + 3)c\,I`; one that succeeds in floating point is that of a matrix
    within :math:`d(d + 1)\epsilon\lVert S\rVert_2 \le (d + 1)c` of the shifted one
    (Higham, *Accuracy and Stability of Numerical Algorithms*, Theorem 10.3), so
    :math:`\lambda_{\min}(S) \ge (d + 3)c - (d + 1)c = 2c`. False means undecided (the
    eigenvalues decide).
    """
    d = S.shape[-1]
    c = d * np.finfo(float).eps * float(np.trace(S))
    if not c > 0:
        return False
    try:
        np.linalg.cholesky(S - ((d + 3) * c) * np.eye(d))
    except np.linalg.LinAlgError:
        return False
    return True


def sinkhorn_phi(G):
    r"""The matrix function :math:`\varphi(G) = 2\,(I + (I + 4G)^{1/2})^{-1}`.

    ``G`` is symmetric positive semi-definite. This is the function that solves the
    Gaussian Schroedinger system (see ``derivations/sinkhorn.py``): for whitened
    marginals and kernel :math:`e^{v^T B u}` the cross-covariance is
    :math:`\operatorname{Cov}(v, u) = B\,\varphi(B^T B)`. It needs no inverse of ``G``
    (:math:`\varphi(0) = 1`), so singular kernels are handled.
    """
    w, U = np.linalg.eigh(sym(G))
    w = np.clip(w, 0.0, None)
    f = 2.0 / (1.0 + np.sqrt(1.0 + 4.0 * w))
    return (U * f[..., None, :]) @ T(U)


def sinkhorn_cross(B):
    r"""The Sinkhorn cross-covariance :math:`B\,\varphi(B^TB)` from the SVD of ``B``.

    With :math:`B = U\,\mathrm{diag}(s)\,W^T`,
    :math:`B\varphi(B^TB) = U\,\mathrm{diag}\big(s\,\varphi(s^2)\big)\,W^T` and
    :math:`s\varphi(s^2) = 2s/(1 + \sqrt{1 + 4s^2})`. Equal to
    ``B @ sinkhorn_phi(B.T @ B)`` in exact arithmetic, but the Gram matrix
    :math:`B^TB` squares the condition number: when the covariance spreads over many
    orders of magnitude its eigendecomposition leaves relative errors of ``1e-9`` and
    more in the field, above the tolerances a solver is asked for. The SVD keeps them
    at rounding level. Leading axes broadcast.
    """
    U, s, Wt = np.linalg.svd(B)
    f = 2.0 * s / (1.0 + np.sqrt(1.0 + 4.0 * s * s))
    return (U * f[..., None, :]) @ Wt


#: the plain solve of :func:`l2_gain` is used while :math:`\|B\|_F^2` stays below this:
#: then :math:`\operatorname{cond}(I + BB^T) = 1 + s_{\max}^2 \le 1 + \|B\|_F^2` bounds the
#: relative error of the solve by about ``1e3`` rounding units (``2e-13``), and
#: :math:`BB^T` cannot overflow
GAIN_SOLVE_MAX = 1e3
_GAIN_SOLVE_NORM = float(np.sqrt(GAIN_SOLVE_MAX))


def _gain_solvable(B):
    r"""Whether :math:`\|B\|_F^2 <` ``GAIN_SOLVE_MAX``, per matrix of a stack.

    False for non-finite entries. One matrix: BLAS ``dnrm2``, which scales its sum and so
    neither overflows nor raises floating-point warnings.
    """
    if B.ndim == 2:
        return bool(_dnrm2(B.ravel()) < _GAIN_SOLVE_NORM)   # no square: no overflow
    with np.errstate(over="ignore", invalid="ignore"):
        return np.einsum("...ij,...ij->...", B, B) < GAIN_SOLVE_MAX


def _gain_by_solve(B):
    r"""``(G, E)`` from one solve with :math:`I_k + BB^T` (symmetric, eigenvalues >= 1)."""
    k = B.shape[-2]
    H = B @ T(B)
    H[..., np.arange(k), np.arange(k)] += 1.0
    E = np.linalg.inv(H)
    return T(B) @ E, E


def l2_gain(B):
    r"""The regularised gain :math:`(I + B^TB)^{-1}B^T` of a ``k x d`` matrix ``B`` (stack).

    This is the L2 attention's solve (docs/math.md section 3.3,
    :math:`B = \sqrt{2c}\,KL`). By the push-through identity it equals
    :math:`B^T(I_k + BB^T)^{-1}`; the ``k x k`` matrix :math:`I_k + BB^T` is symmetric with
    eigenvalues :math:`1 + s_i^2 \ge 1` (``s`` the singular values of ``B``), so its
    condition number is :math:`1 + s_{\max}^2 \le 1 + \|B\|_F^2`. Two paths:

    * :math:`\|B\|_F^2 <` ``GAIN_SOLVE_MAX`` (``1e3``; finite entries): one Cholesky
      solve with :math:`I_k + BB^T` (LAPACK ``dposv``; a stack: LU), relative error at
      most about ``1e3`` rounding units; several times cheaper than an SVD on the small
      matrices of the moment equations;
    * otherwise (a large or ill-scaled ``B``, or inf/NaN entries) Householder QR of
      :math:`[B;\ I_d] = QR`: :math:`G = R^{-1}Q_1^T` (:func:`_gain_by_qr`). A solve
      would leave relative errors of :math:`10^{-7}` in the field once the covariance
      spreads over eight orders of magnitude (far above a solver's tolerances, which
      then crawl), and is singular in floating point once :math:`s^2` swamps the
      identity. QR forms no :math:`B^TB` and is backward stable column by column, so
      every direction of a graded ``B`` keeps its own relative precision, singular or of
      any scale.

    Leading axes broadcast (each matrix of a stack takes its own path); shape
    ``(..., d, k)``. A complex ``B`` (the complex step of a Jacobian check) goes through
    the solve, which is analytic in ``B``; the QR path, whose Householder reflections
    take absolute values, is not.
    """
    if np.iscomplexobj(B):
        # complex-step differentiation (``Attention.exact_jacobian``): the same analytic
        # function through a solve, plain transposes (no conjugates), so that
        # Im F(L + i h E) / h is its derivative
        d = B.shape[-1]
        return np.linalg.solve(np.eye(d) + T(B) @ B, T(B))
    ok = _gain_solvable(B)
    if ok is True:
        # one matrix: LAPACK's Cholesky solve directly (numpy's solve costs several times
        # the arithmetic of a 2 x 2 to 5 x 5 system in its checks)
        H = B @ B.T
        H += np.eye(B.shape[0])
        _, X, info = _dposv(H, B, lower=1)
        if info == 0:
            return X.T
        return _gain_by_qr(B, with_E=False)[0]
    if ok is False or not np.any(ok):
        return _gain_by_qr(B, with_E=False)[0]
    G = np.empty(B.shape[:-2] + B.shape[:-3:-1])
    G[ok] = _gain_by_solve(B[ok])[0]
    G[~ok] = _gain_by_qr(B[~ok], with_E=False)[0]
    return G


def l2_gain_parts(B):
    r""":func:`l2_gain` ``G`` and the complement :math:`E = (I_k + BB^T)^{-1} = I_k - BG`.

    Both from the same path as :func:`l2_gain`: the inverse of :math:`I_k + BB^T` while
    :math:`\|B\|_F^2 <` ``GAIN_SOLVE_MAX`` (:math:`G = B^TE`), otherwise two
    Householder QRs, of :math:`[B;\ I_d]` for ``G`` and of :math:`[B^T;\ I_k] = Q_2R_2`
    for :math:`E = R_2^{-1}R_2^{-T}` (:func:`_gain_by_qr`). Formed as :math:`I_k - BG`
    it would lose all its digits where :math:`s \gg 1` (the exact entries are
    :math:`1/s^2`, the rounding of :math:`I_k - BG` is :math:`\varepsilon`); the exact
    Jacobian of the L2 field multiplies it by the factor, so that rounding would grow
    with the covariance.

    Returns
    -------
    G : ndarray, shape (..., d, k)
    E : ndarray, shape (..., k, k)
    """
    ok = _gain_solvable(B)
    if ok is True:
        return _gain_by_solve(B)
    if ok is False or not np.any(ok):
        return _gain_by_qr(B)
    k, d = B.shape[-2:]
    G = np.empty(B.shape[:-2] + (d, k))
    E = np.empty(B.shape[:-2] + (k, k))
    G[ok], E[ok] = _gain_by_solve(B[ok])
    G[~ok], E[~ok] = _gain_by_qr(B[~ok])
    return G, E


def _gain_by_qr(B, with_E=True):
    r"""``(G, E)`` of :func:`l2_gain_parts` from Householder QR (any finite scale).

    :math:`G = (I + B^TB)^{-1}B^T` is the solution operator of the ridge problem
    :math:`\min_x |Bx - y|^2 + |x|^2`, i.e. of the least-squares problem with the
    ``(k + d) x d`` matrix :math:`\hat B = [B;\ I_d]`: with :math:`\hat B = QR`,
    :math:`I + B^TB = R^TR` and :math:`G = R^{-1}Q_1^T` (:math:`Q_1` the first ``k``
    rows of ``Q``). Likewise :math:`E = (I_k + BB^T)^{-1} = R_2^{-1}R_2^{-T}` from the QR
    of :math:`[B^T;\ I_k]`. No :math:`B^TB` is formed, so nothing overflows, and
    Householder QR is backward stable column by column: a perturbation of each column
    small relative to that column. That is what the moment equations need. Once the
    columns of the factor :math:`L` (so those of :math:`B = \sqrt{2c}\,KL`) span many
    orders of magnitude, a small direction is held to its own precision. The SVD (LAPACK
    ``gesdd``), which this replaces, holds a small singular value only to
    :math:`\varepsilon s_{\max}`. On a 6-D run of two L2 heads whose covariance spans
    :math:`10^{21}`, the field it gave was wrong in the small directions by up to 4 times
    the solver's tolerance (QR: :math:`10^{-5}` of it). The implicit methods crawled
    on that noise. QR is also cheaper: 8 to 14 us for one small matrix through LAPACK
    (the SVD: about 30), and 0.7 ms for a stack of 144 (batched SVD: 1.4 ms).

    A matrix with inf or NaN entries gets NaN without reaching LAPACK (a non-finite trial
    state is a rejected step). Leading axes broadcast. ``E`` is None unless ``with_E``.
    """
    k, d = B.shape[-2:]
    if B.ndim == 2:
        # BLAS dnrm2 scales its sum: finite for finite entries (but for entries near the
        # top of the range), in one call instead of isfinite and all
        if not math.isfinite(_dnrm2(B.ravel())) and not np.isfinite(B).all():
            return np.full((d, k), np.nan), np.full((k, k), np.nan) if with_E else None
        return _ridge_gain(B, d), _inverse_gram(B, k) if with_E else None
    G = np.full(B.shape[:-2] + (d, k), np.nan)
    E = np.full(B.shape[:-2] + (k, k), np.nan) if with_E else None
    fin = np.isfinite(B).all(axis=(-2, -1))
    if np.any(fin):
        Bf = B[fin]
        Q, R = np.linalg.qr(np.concatenate([Bf, np.broadcast_to(np.eye(d), Bf.shape[:-2] + (d, d))],
                                           axis=-2))
        # R is upper triangular: LU with partial pivoting is back substitution here
        G[fin] = np.linalg.solve(R, T(Q[..., :k, :]))
        if not with_E:
            return G, None
        R2 = np.linalg.qr(np.concatenate([T(Bf), np.broadcast_to(np.eye(k), Bf.shape[:-2] + (k, k))],
                                         axis=-2), mode="r")
        Ri = np.linalg.solve(R2, np.broadcast_to(np.eye(k), R2.shape))
        E[fin] = Ri @ T(Ri)
    return G, E


_EYES = {}


def _eye(n):
    """A cached, read-only ``n x n`` identity."""
    e = _EYES.get(n)
    if e is None:
        e = _EYES[n] = np.eye(n)
        e.setflags(write=False)
    return e


def _qr_of_ridge(B, n):
    r"""LAPACK ``dgeqrf`` of :math:`[B;\ I_n]`: ``(qr, tau)``, :math:`R` in ``qr[:n]``'s upper triangle."""
    k = B.shape[0]
    A = np.empty((k + n, n), order="F")
    A[:k] = B
    A[k:] = _eye(n)
    qr, tau, _, _ = _dgeqrf(A, overwrite_a=1)
    return qr, tau


def _ridge_gain(B, d):
    r""":math:`G = R^{-1}Q_1^T` from the QR of :math:`[B;\ I_d]` (one matrix)."""
    qr, tau = _qr_of_ridge(B, d)
    R = qr[:d].copy(order="F")     # dorgqr overwrites qr; dtrtrs reads the upper triangle
    Q, _, _ = _dorgqr(qr, tau, overwrite_a=1)
    G, _ = _dtrtrs(R, Q[:B.shape[0]].T)
    return G


def _inverse_gram(B, k):
    r""":math:`(I_k + BB^T)^{-1} = R_2^{-1}R_2^{-T}` from the QR of :math:`[B^T;\ I_k]`."""
    qr, _ = _qr_of_ridge(B.T, k)
    R2 = qr[:k]                    # two triangular solves read its upper triangle only
    X, _ = _dtrtrs(R2, _eye(k), trans=1)
    E, _ = _dtrtrs(R2, X)
    return E


#: a closed-form Jacobian built from the L2 gain is used while the non-zero column norms
#: of the factor span less than this ratio (its error grows like the spread squared times
#: eps: about 1e-8 of the solver's tolerance at this spread; gaussian_pde._common.differences)
JACOBIAN_SPREAD_MAX = 1e4


def closed_form_holds(L):
    """Whether the non-zero column norms of ``L`` (``(..., d, d)``) span < the limit."""
    L = np.asarray(L, dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        c = np.sqrt(np.einsum("...ij,...ij->...j", L, L))
        cmax = c.max(axis=-1)
        cmin = np.where(c > 0, c, np.inf).min(axis=-1)
        return ~(cmax > JACOBIAN_SPREAD_MAX * cmin)     # NaN and all-zero: True
