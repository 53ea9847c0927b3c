"""Small batched linear-algebra kernels used by the moment equations.

All functions act on the last two axes and broadcast over leading axes, so the same
code serves one trajectory and a stack of thousands.
"""

from __future__ import annotations

import numpy as np

__all__ = ["T", "sym", "solve", "psd_sqrt", "sinkhorn_phi", "sinkhorn_cross"]


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
