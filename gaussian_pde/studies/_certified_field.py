r"""The certified limit's log-time field, as a field of the engine: its rhs and Jacobian.

The precision :math:`P = \Sigma^{-1}` in the variables of
:class:`~gaussian_pde.studies._certified._LDLState`, written once, in explicit loops over
the :math:`d\times d` factors, generic in the scalar type so that one source serves real
states and the complex steps; :mod:`._certified` sets up the frame and the states, runs
them on the engine (:func:`gaussian_pde.integrate.integrate_states`:
RODAS4P2 from the first step, its error control, output at the checkpoints) and decides
from the checkpoints. The tests run the same functions uncompiled (``py_func``) and hold
the field to the precision equation :math:`P' = -(PM + M^TP)` written directly.

* the field, autonomous in the augmented state :math:`y_a = (y, \tau)`
  (:math:`\dot\tau = 1`),

  .. math::

      \frac{d\ell_i}{d\tau} = -2Y_{ii}, \qquad
      \frac{dL}{d\tau} = L\,\Xi, \quad
      \Xi_{ij} = -\big(e^{\ell_i-\ell_j}Y_{ij} + Y_{ji}\big)\ (i > j),

  :math:`Y = \sum_{\mathrm{heads}} \tilde V X \tilde A\,t_sT` with
  :math:`\tilde V = L^TVL^{-T}`, :math:`\tilde A = L^{-1}AL^{-T}`, :math:`X = D^{-1}`
  (bilinear score) or :math:`X = 2D^{-1/2}(I + D^{-1/2}\tilde HD^{-1/2})^{-1}D^{-1/2}`
  (quadratic score, :math:`\tilde H = L^{-1}HL^{-T}`);
* its growth measure :math:`\operatorname{tr}\Sigma = \sum_{ij}(L^{-1})_{ij}^2e^{-\ell_i}`,
  which stops a row past its limit (the field leaves it in ``ws[0]``);
* the complex-step Jacobian :math:`J_{:j} = \operatorname{Im} f(y_a + i\epsilon e_j)/\epsilon`
  (exact to rounding: no difference is taken).

The engine's kernels (:func:`kernels`, the signatures of
:func:`gaussian_pde.attention.compiled_signatures`) read the weights from the packed
vector of :func:`pack`: ``[d, k, heads, log t_s, kinds (heads), V, A, H]`` (each
``heads x d x d``, row-major), the kind 0 for a bilinear score, 1 for a quadratic one.
"""

from __future__ import annotations

import functools

import numpy as np


def _mm(A, B, C):
    """``C = A @ B`` for small square matrices of any scalar type."""
    d = A.shape[0]
    for i in range(d):
        for j in range(d):
            acc = A[i, 0] * B[0, j]
            for m in range(1, d):
                acc += A[i, m] * B[m, j]
            C[i, j] = acc


def _factors(ya, k, d):
    r""":math:`\ell`, :math:`L` and :math:`L^{-1}` of an augmented state ``(y, tau)``.

    :math:`L_{ij} = \tilde L_{ij}/s_{ij}` (:math:`s_{ij} = T = e^{\tau}` on the block
    :math:`N\times R`), and :math:`(L^{-1})_{ij} = -\sum_{j\le m<i}L_{im}(L^{-1})_{mj}`.
    """
    ny = ya.size - 1
    T = np.exp(ya[ny])
    L = np.zeros((d, d), dtype=ya.dtype)
    p = d
    for i in range(d):
        L[i, i] = 1.0
        for j in range(i):
            L[i, j] = ya[p] / T if (i >= k and j < k) else ya[p]
            p += 1
    X = np.zeros((d, d), dtype=ya.dtype)
    for i in range(d):
        X[i, i] = 1.0
        for j in range(i):
            acc = L[i, j] * X[j, j]
            for m in range(j + 1, i):
                acc += L[i, m] * X[m, j]
            X[i, j] = -acc
    return ya[:d], L, X, T


def _solve_plain(G, B):
    r"""``G^{-1} B`` by elimination without pivoting.

    :math:`G = I + D^{-1/2}\tilde HD^{-1/2}` has a positive definite symmetric part, so no
    pivot vanishes; without pivoting the complex step stays analytic.
    """
    d = G.shape[0]
    G = G.copy()
    X = B.copy()
    for c in range(d):
        piv = G[c, c]
        for r in range(c + 1, d):
            f = G[r, c] / piv
            for m in range(c, d):
                G[r, m] -= f * G[c, m]
            for m in range(d):
                X[r, m] -= f * X[c, m]
    for c in range(d - 1, -1, -1):
        for m in range(d):
            acc = X[c, m]
            for j in range(c + 1, d):
                acc -= G[c, j] * X[j, m]
            X[c, m] = acc / G[c, c]
    return X


def _head_y(Y, kind, Vh, Ah, Hh, L, Li, ell, lt, d):
    r"""Adds one head's :math:`\tilde V X\tilde A\,t_sT` to ``Y``."""
    W1 = np.empty_like(L)
    Vt = np.empty_like(L)
    At = np.empty_like(L)
    LT = L.T.copy()
    LiT = Li.T.copy()
    _mm(Vh, LiT, W1)
    _mm(LT, W1, Vt)
    _mm(Ah, LiT, W1)
    _mm(Li, W1, At)
    if kind == 0:
        w = np.exp(lt - ell)
        for i in range(d):
            for j in range(d):
                acc = Vt[i, 0] * w[0] * At[0, j]
                for m in range(1, d):
                    acc += Vt[i, m] * w[m] * At[m, j]
                Y[i, j] += acc
        return
    Ht = np.empty_like(L)
    _mm(Hh, LiT, W1)
    _mm(Li, W1, Ht)
    e = np.exp(-0.5 * ell)
    G = np.empty_like(L)
    for i in range(d):
        for j in range(d):
            G[i, j] = e[i] * Ht[i, j] * e[j] + (1.0 if i == j else 0.0)
            W1[i, j] = e[i] * At[i, j]
    # T X A~ = 2 e^{lt} D^{-1/2} G^{-1} D^{-1/2} A~
    GA = _solve_plain(G, W1)
    two_t = 2.0 * np.exp(lt)
    for i in range(d):
        for j in range(d):
            acc = Vt[i, 0] * e[0] * GA[0, j]
            for m in range(1, d):
                acc += Vt[i, m] * e[m] * GA[m, j]
            Y[i, j] += two_t * acc


def _field(ya, kinds, V, A, H, log_ts, k, d, out):
    r"""Augmented field :math:`(\dot y, 1)` at ``ya = (y, tau)`` into ``out``; returns the trace.

    The trace :math:`\operatorname{tr}\Sigma = \sum_{ij}(L^{-1})_{ij}^2e^{-\ell_i}` (in the scalar
    type of ``ya``).
    """
    ny = ya.size - 1
    ell, L, Li, T = _factors(ya, k, d)
    lt = log_ts + ya[ny]
    Y = np.zeros((d, d), dtype=ya.dtype)
    for h in range(kinds.size):
        _head_y(Y, kinds[h], V[h], A[h], H[h], L, Li, ell, lt, d)
    Xi = np.zeros((d, d), dtype=ya.dtype)
    for i in range(d):
        out[i] = -2.0 * Y[i, i]
        for j in range(i):
            Xi[i, j] = -(np.exp(ell[i] - ell[j]) * Y[i, j] + Y[j, i])
    p = d
    for i in range(d):
        for j in range(i):
            acc = L[i, j + 1] * Xi[j + 1, j]
            for m in range(j + 2, i + 1):
                acc += L[i, m] * Xi[m, j]
            if i >= k and j < k:
                out[p] = T * acc + ya[p]
            else:
                out[p] = acc
            p += 1
    out[ny] = 1.0
    tr = 0.0 * Li[0, 0]
    for i in range(d):
        e = np.exp(-ell[i])
        for j in range(i + 1):
            tr += Li[i, j] * Li[i, j] * e
    return tr


def _jacobian(ya, kinds, V, A, H, log_ts, k, d, J):
    r"""Complex-step Jacobian :math:`J_{:j} = \operatorname{Im} f(y + i\epsilon e_j)/\epsilon`."""
    n1 = ya.size
    eps = 1e-30
    yc = np.empty(n1, dtype=np.complex128)
    fc = np.empty(n1, dtype=np.complex128)
    for j in range(n1):
        for i in range(n1):
            yc[i] = ya[i]
        yc[j] += 1j * eps
        _field(yc, kinds, V, A, H, log_ts, k, d, fc)
        for i in range(n1):
            J[i, j] = fc[i].imag / eps




def _unpack(P):
    """``d, k, kinds, V, A, H, log t_s`` of a packed vector (views of it)."""
    d, k, nh = int(P[0]), int(P[1]), int(P[2])
    o = 4 + nh
    size = nh * d * d
    V = P[o:o + size].reshape((nh, d, d))
    A = P[o + size:o + 2 * size].reshape((nh, d, d))
    H = P[o + 2 * size:o + 3 * size].reshape((nh, d, d))
    return d, k, P[4:o], V, A, H, P[3]


def pack(kinds, V, A, H, ts, k):
    r"""The engine's ``params`` of the rows: one packed vector each (module docstring).

    Parameters
    ----------
    kinds : tuple of str
        ``"bilinear"`` or ``"quadratic"`` per head.
    V, A, H : ndarray, shape (nb, heads, d, d)
        The heads in the frame :math:`[U_R, U_N]`.
    ts : ndarray, shape (nb,)
        Time scales :math:`t_s`.
    k : int
        :math:`\operatorname{rank}Q`.

    Returns
    -------
    ndarray, shape (nb, 4 + heads + 3 heads d^2)
    """
    nb, nh, d = V.shape[0], V.shape[1], V.shape[-1]
    code = [0.0 if kd == "bilinear" else 1.0 for kd in kinds]
    head = np.array([d, k, nh, 0.0] + code, dtype=float)
    P = np.empty((nb, head.size + 3 * nh * d * d))
    P[:, :head.size] = head
    P[:, 3] = np.log(np.asarray(ts, dtype=float))
    P[:, head.size:] = np.concatenate([np.reshape(X, (nb, -1)) for X in (V, A, H)], axis=1)
    return P


def rhs(P, d, m, y, out, ws):
    """The engine's field kernel: :func:`_field` of the packed weights; ``ws[0] = tr Sigma``."""
    dd, k, kinds, V, A, H, log_ts = _unpack(P)
    ws[0] = _field(y, kinds, V, A, H, log_ts, k, dd, out)


def jac(P, d, m, y, J, ws):
    """The engine's Jacobian kernel: :func:`_jacobian` of the packed weights (always held)."""
    dd, k, kinds, V, A, H, log_ts = _unpack(P)
    _jacobian(y, kinds, V, A, H, log_ts, k, dd, J)
    return True


_HELPERS = ("_mm", "_factors", "_solve_plain", "_head_y", "_field", "_jacobian", "_unpack")


@functools.cache
def kernels():
    """``(rhs, jac)`` compiled with the engine's signatures (Numba, cached on disk).

    The helpers are compiled in place (module globals), so the uncompiled source stays
    at ``py_func``.
    """
    from .._common.compiled import engine_field_kernels
    from ..attention import compiled_signatures

    return engine_field_kernels(globals(), _HELPERS, compiled_signatures())
