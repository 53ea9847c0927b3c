r"""Right-hand side and exact Jacobian of one trajectory of :func:`gaussian_pde.solve`.

The state of one trajectory is the factor :math:`L` alone (covariance only) or the
``d x (d + 1)`` matrix :math:`Z = [L \mid \alpha]` (with the mean), stored row-major,
so that :math:`\alpha' = N(\Sigma)\alpha` and :math:`L' = M(\Sigma)L` come out of the
same few matrix products. The mean's equation :math:`\alpha' = b + M\alpha` is linear
and homogeneous in :math:`\alpha` for every Gaussian-preserving type
(docs/math.md section 3.3): :math:`b = V\alpha` (softmax), :math:`b = VP^{-1}\alpha`
(L2), :math:`b = (V - M)\alpha` (Sinkhorn), and sums of these (multi-head), so

.. math:: Z' = [M L \mid N\alpha],\qquad N = \partial_\alpha b + M .

Per head, with the weight-only products hoisted and ``W`` the stacked weights, one
product ``P = W Z`` gives every projection that the field needs:

* **softmax**: :math:`P = [cV; K; Q]\,Z`, and
  :math:`Z' = (cVZ)\,G` with :math:`G = \begin{pmatrix}(KL)^T(QZ)\\ e_{d+1}^T/c\end{pmatrix}`:
  three products, the mean's :math:`V\alpha` riding in the last row of ``G``; near a
  steady state (``QL -> 0``) the field stays accurate to rounding;
* **L2**: by the push-through identity,
  :math:`ML = \sqrt{2c}\,VL\,G\,QL` with the gain :math:`G = (I + B^TB)^{-1}B^T` of
  :math:`B = \sqrt{2c}\,KL` (:func:`~gaussian_pde._common.linalg.l2_gain`: a Cholesky
  solve with :math:`I_k + BB^T` while :math:`\|B\|_F^2 < 10^3`, Householder QR of
  :math:`[B; I_d]` beyond, where a solve's errors of order the condition number times
  rounding would stall the step control once the covariance spreads over many orders of
  magnitude),
  and :math:`N\alpha = V\alpha + \sqrt{2c}\,VL\,G(Q - K)\alpha`;
* **Sinkhorn**: :math:`L' = VL\,B\varphi(B^TB)`, :math:`B = L^TAL`, and
  :math:`\alpha' = V\alpha`.

Other Gaussian-preserving types use their own ``factor_kernel`` and, for the mean,
``field_offset + field_matrix @ mean``.

The exact Jacobian (softmax and L2 heads) follows from :math:`dM[d\Sigma] = A\,d\Sigma\,C`
(:func:`gaussian_pde.integrate._field.analytic_jacobian`) and, for the mean rows, from
:math:`d(N\alpha) = A\,d\Sigma\,r` with :math:`r = C\alpha` (softmax) or
:math:`r = K^TQ\alpha - K^TKP^{-1}(\alpha + 2c\Sigma K^TQ\alpha)` (L2).
"""

from __future__ import annotations

import numpy as np

from .._common.linalg import l2_gain, l2_gain_parts, sinkhorn_cross
from ..attention._base import SingleHeadAttention
from ..attention._multihead import MultiHead
from ._compiled import kernel as compiled_kernel
from ._differences import central_jacobian, closed_form_holds

__all__ = ["moment_field", "fortran_rhs", "moment_jacobian", "head_kinds", "mean_is_linear"]

_dot = np.dot


def _heads(attention):
    if type(attention) is MultiHead or isinstance(attention, MultiHead):
        return attention.heads
    return (attention,)


#: kind of each attention class seen (a class-level property: one lookup per solve
#: instead of the ABC instance checks)
_KINDS = {}


def _kind(head):
    """``"softmax"``, ``"l2"``, ``"sinkhorn"`` (the generated module) or ``None``."""
    cls = type(head)
    try:
        return _KINDS[cls]
    except KeyError:
        gen = getattr(cls, "_generated", None)
        kind = (gen.__name__.rsplit(".", 1)[-1]
                if issubclass(cls, SingleHeadAttention) and gen is not None else None)
        _KINDS[cls] = kind
        return kind


def head_kinds(attention):
    """The kinds of the heads of ``attention`` (see ``_kind``)."""
    return tuple(_kind(h) for h in _heads(attention))


def mean_is_linear(attention):
    r"""Whether :math:`\alpha' = N(\Sigma)\alpha` is known to hold (every head known).

    True for softmax, L2 and Sinkhorn heads: a scaled mean then obeys the same equation.
    """
    return all(k in _TERMS for k in head_kinds(attention))


# ----------------------------------------------------------------------------------------
# right-hand sides: Z -> Z' for one (d, m) state, m = d (covariance only) or d + 1
# ----------------------------------------------------------------------------------------

def _softmax(head, with_mean, out=None, counter=None):
    Q, K, V, c = head.Q, head.K, head.V, float(head.scale)
    d, k = head.d, head.k
    m = d + 1 if with_mean else d
    W = np.ascontiguousarray(np.vstack([c * V, K, Q]))
    # fortran_rhs: the same products on the flat state, counted, by one compiled call
    # (integrate._compiled), which needs none of the NumPy work arrays below
    kernel = compiled_kernel("softmax_field") if counter is not None else None
    if kernel is not None:
        return _compiled_softmax_rhs(kernel, W, c, m, out, counter)
    # work arrays and their views, made once: an evaluation is three products, called as
    # bound ndarray.dot methods (numpy's module-level dot adds a dispatch layer that costs
    # about as much as the product of these small matrices)
    P = np.empty((d + 2 * k, m))                 # [cVZ; KZ; QZ]
    G = np.empty((m, m))                         # (KZ)^T QZ, last row replaced below
    X, KZt, QZ = P[:d], P[d:d + k].T, P[d + k:]  # contiguous blocks: no copies in dot
    w_dot, kzt_dot, x_dot = W.dot, KZt.dot, X.dot
    if not with_mean:
        def term(L):
            w_dot(L, out=P)
            kzt_dot(QZ, out=G)
            return x_dot(G, out=out)
    else:
        # the last row of (KZ)^T QZ is (K alpha)^T QZ; [0, ..., 0, 1/c] instead turns the
        # last column of cVZ into V alpha, the offset b: Z' = (cVZ) G = [ML | M alpha + V alpha]
        last, offset = G[d], np.zeros(m)
        offset[d] = 1.0 / c

        def term(Z):
            w_dot(Z, out=P)
            kzt_dot(QZ, out=G)
            last[...] = offset
            return x_dot(G, out=out)

    if counter is None:
        return term
    # fortran_rhs without Numba: the three ndarray.dot calls in one Python frame
    flat = out.reshape(-1)
    if not with_mean:
        def rhs(t, y):
            counter.nfev += 1
            w_dot(y.reshape(d, m), out=P)
            kzt_dot(QZ, out=G)
            x_dot(G, out=out)
            return flat
    else:
        def rhs(t, y):
            counter.nfev += 1
            w_dot(y.reshape(d, m), out=P)
            kzt_dot(QZ, out=G)
            last[...] = offset
            x_dot(G, out=out)
            return flat

    rhs.field = term
    return rhs


def _compiled_softmax_rhs(kernel, W, c, m, out, counter):
    """:func:`fortran_rhs` of one softmax head by the compiled ``softmax_field``."""
    d = out.shape[0]
    flat = out.reshape(-1)
    ws = np.zeros((W.shape[0] + m + 1, m))
    if m > d:
        ws[-1, d] = 1.0 / c        # the mean's row of G (see integrate._compiled)

    def rhs(t, y):
        counter.nfev += 1
        kernel(y, W, ws, flat)
        return flat

    def field(Z):
        kernel(np.ascontiguousarray(Z, dtype=float).reshape(-1), W, ws, flat)
        return out

    rhs.field = field
    return rhs


def _l2(head, with_mean, out=None):
    Q, K, V, c = head.Q, head.K, head.V, float(head.scale)
    d, k = head.d, head.k
    m = d + 1 if with_mean else d
    s = np.sqrt(2.0 * c)
    # [sVZ; sKZ; QZ] and, with the mean, (Q - K)Z, whose last column (Q - K) alpha
    # replaces that of QZ: one assignment per evaluation instead of a copy and a
    # difference
    blocks = [s * V, s * K, Q] + ([Q - K] if with_mean else [])
    W = np.ascontiguousarray(np.vstack(blocks))
    P = np.empty((W.shape[0], m))
    G = np.zeros((m, m))
    if with_mean:
        G[d, d] = 1.0 / s      # s V alpha / s = V alpha
    X, B, QZ, Gd = P[:d], P[d:d + k, :d], P[d + k:d + 2 * k], G[:d]
    qka, QKa = (QZ[:, d], P[d + 2 * k:, d]) if with_mean else (None, None)

    def gain():
        """``B^T (I_k + B B^T)^{-1} = (I_d + B^T B)^{-1} B^T`` (:func:`l2_gain`).

        NaN for a non-finite trial state (the step is then rejected) instead of
        LAPACK's convergence error.
        """
        if k == 1:
            b = B[0]
            n2 = float(b.dot(b))
            return (b / (1.0 + n2))[:, None] if n2 < 1e300 else _gain(B)
        return _gain(B)

    w_dot, x_dot = W.dot, X.dot

    def term(Z):
        w_dot(Z, out=P)
        if with_mean:
            qka[...] = QKa                       # [QL | (Q - K) alpha]
        _dot(gain(), QZ, out=Gd)
        return x_dot(G, out=out)

    return term


def _gain(B):
    """:func:`l2_gain`; NaN for a non-finite trial state (the step is rejected)."""
    try:
        return l2_gain(B)
    except np.linalg.LinAlgError:
        return np.full(B.shape[::-1], np.nan)


def _gain_parts(B):
    """:func:`l2_gain_parts`; NaN for a non-finite state."""
    try:
        return l2_gain_parts(B)
    except np.linalg.LinAlgError:
        k, d = B.shape
        return np.full((d, k), np.nan), np.full((k, k), np.nan)


def _sinkhorn(head, with_mean, out=None):
    K, Q, V, c = head.K, head.Q, head.V, float(head.scale)
    d = head.d
    A = c * (K.T @ Q)
    V = np.ascontiguousarray(V)
    if not with_mean:
        def term(L):
            return _dot(V, _dot(L, _cross(_dot(L.T, _dot(A, L)))), out=out)

        return term
    C = np.zeros((d + 1, d + 1))
    C[d, d] = 1.0              # alpha' = V alpha

    def term(Z):
        L = Z[:, :d]
        C[:d, :d] = _cross(_dot(L.T, _dot(A, L)))
        return _dot(V, _dot(Z, C), out=out)

    return term


def _cross(B):
    """:func:`sinkhorn_cross`; NaN for a non-finite trial state (the step is rejected)."""
    try:
        return sinkhorn_cross(B)
    except np.linalg.LinAlgError:
        return np.full_like(B, np.nan)


def _generic(head, with_mean, out=None):
    kernel = head.factor_kernel()
    d = head.d
    m = d + 1 if with_mean else d

    def value(Z):
        try:
            if not with_mean:
                return np.asarray(kernel(Z), dtype=float)
            L = np.ascontiguousarray(Z[:, :d])
            mean = Z[:, d].copy()
            cov = L @ L.T
            res = np.empty((d, d + 1))
            res[:, :d] = kernel(L)
            res[:, d] = head.field_offset(mean, cov) + head.field_matrix(cov) @ mean
            return res
        except np.linalg.LinAlgError:    # a non-finite trial state: reject the step
            return np.full((d, m), np.nan)

    if out is None:
        return value

    def term(Z):
        out[...] = value(Z)
        return out

    return term


_TERMS = {"softmax": _softmax, "l2": _l2, "sinkhorn": _sinkhorn}


def moment_field(attention, with_mean, out=None):
    r"""``field(Z) -> Z'`` for one state ``Z`` of shape ``(d, d)`` or ``(d, d + 1)``.

    ``Z = L`` (covariance only) or ``[L | mean]``. The result is a new C-contiguous
    array of the same shape (``.ravel()`` is a view) or, with ``out`` (a C-contiguous
    float array of that shape), ``out`` itself, overwritten at every call: the Fortran
    steppers copy what the right-hand side returns, and a product written into its
    place spares an allocation per evaluation (a fifth of an evaluation of the paper
    workload's field, d = 5).
    """
    heads = _heads(attention)
    terms = [_TERMS.get(_kind(h), _generic)(h, with_mean, out if i == 0 else None)
             for i, h in enumerate(heads)]
    if len(terms) == 1:
        return terms[0]
    rest = terms[1:]

    if out is None:
        def field(Z):
            res = terms[0](Z)
            for term in rest:
                res = res + term(Z)
            return res
    else:
        def field(Z):
            terms[0](Z)
            for term in rest:
                np.add(out, term(Z), out=out)
            return out

    return field


def fortran_rhs(attention, with_mean, counter):
    r"""``rhs(t, y)`` of the flattened state for Hairer's Fortran codes.

    Each call adds one to ``counter.nfev`` and returns the field in one buffer,
    overwritten at the next call (the Fortran codes copy it at once; see
    :func:`moment_field`). ``rhs.field`` is the :func:`moment_field` of ``(d, m)``
    states that writes into the same buffer (one set of work arrays for both). For a
    single softmax head the three products run in one call compiled by Numba
    (:func:`gaussian_pde.integrate._compiled.softmax_field`: 0.6 us an evaluation of the
    d = 5 field instead of 1.0 us for three ``ndarray.dot`` calls of about 0.3 us each);
    its sums run in another order than BLAS's, so the field agrees with
    :func:`moment_field` to rounding, not bit for bit. Without Numba the NumPy products
    run, in one Python frame.
    """
    d = attention.d
    m = d + 1 if with_mean else d
    out = np.empty((d, m))
    heads = _heads(attention)
    if len(heads) == 1 and _kind(heads[0]) == "softmax":
        return _softmax(heads[0], with_mean, out, counter)
    field = moment_field(attention, with_mean, out=out)
    flat = out.reshape(-1)

    def rhs(t, y):
        counter.nfev += 1
        field(y.reshape(d, m))
        return flat

    rhs.field = field
    return rhs


# ----------------------------------------------------------------------------------------
# exact Jacobians (softmax and L2 heads)
# ----------------------------------------------------------------------------------------

def _head_parts(kind, head, L, mean):
    r"""``(M, A, C, N, r)`` of one head at ``L`` (``N, r`` only with a mean).

    :math:`dM[d\Sigma] = A\,d\Sigma\,C`, :math:`N = \partial_\alpha\alpha'`,
    :math:`d(N\alpha) = A\,d\Sigma\,r` (see the module docstring).
    """
    Q, K, V, c = head.Q, head.K, head.V, float(head.scale)
    d = head.d
    KtQ = K.T @ Q
    S = L @ L.T
    if kind == "softmax":
        A = c * V
        C = KtQ
        M = A @ S @ KtQ
        if mean is None:
            return M, A, C, None, None
        return M, A, C, V + M, KtQ @ mean
    # with the gain G = (I + B^T B)^{-1} B^T of B = sqrt(2c) K L and E = (I_k + B B^T)^{-1}
    # (l2_gain_parts: one factorisation, no inverse): P^{-1} = I - L G sqrt(2c) K,
    # P^{-1} Sigma K^T Q = L G Q / sqrt(2c) and C = K^T Q - 2c K^T K P^{-1} Sigma K^T Q
    # = K^T E Q, whose entries (down to 1/s^2) the difference would bury under its rounding
    s = np.sqrt(2 * c)
    G, E = _gain_parts(s * (K @ L))
    LG = L @ G
    Xi = np.eye(d) - s * (LG @ K)                    # P^{-1}
    P = (LG @ Q) / s
    A = (2 * c) * (V @ Xi)
    M = (2 * c) * (V @ P)
    C = K.T @ (E @ Q)
    if mean is None:
        return M, A, C, None, None
    # r = K^T Q alpha - K^T K P^{-1}(alpha + 2c Sigma K^T Q alpha) = K^T E (Q - K) alpha
    return M, A, C, V @ Xi + M, K.T @ (E @ ((Q - K) @ mean))


def moment_jacobian(attention, with_mean):
    r"""Exact Jacobian ``jac(t, y)`` of :func:`moment_field` (flattened state), or ``None``.

    Available when every head is softmax or L2. With :math:`B = CL` and
    :math:`U = AL`, the factor rows are
    :math:`\partial L'_{ij}/\partial L_{ab} = M_{ia}\delta_{jb} + A_{ia}(B^TL)_{jb} +
    U_{ib}B_{aj}`, the mean rows :math:`\partial\alpha'_i/\partial L_{ab} =
    A_{ia}(L^Tr)_b + U_{ib}r_a` and :math:`\partial\alpha'/\partial\alpha = N`;
    :math:`\partial L'/\partial\alpha = 0`. With an L2 head, states whose factor
    columns span more than
    :data:`~gaussian_pde.integrate._differences.JACOBIAN_SPREAD_MAX` get column-scaled
    central differences of the field instead, where that closed form loses its digits.
    """
    kinds = head_kinds(attention)
    if not all(k in ("softmax", "l2") for k in kinds):
        return None
    closed = _closed_form_jacobian(attention, kinds, with_mean)
    if "l2" not in kinds:
        return closed
    # an L2 head's closed form loses digits once the factor's columns spread
    # (gaussian_pde.integrate._differences): differences of the field beyond, built on
    # first need (most runs never get there)
    d = attention.d
    m = d + 1 if with_mean else d
    field = []

    def jac(t, y):
        Z = np.asarray(y, dtype=float).reshape(d, m)
        if closed_form_holds(Z[:, :d]):
            return closed(t, y)
        if not field:
            field.append(moment_field(attention, with_mean))
        return central_jacobian(field[0], Z)

    return jac


def _closed_form_jacobian(attention, kinds, with_mean):
    """The closed-form Jacobian of :func:`moment_jacobian` (softmax and L2 heads)."""
    heads = _heads(attention)
    d = attention.d
    m = d + 1 if with_mean else d
    n = d * m
    eye = np.eye(d)

    outer = np.multiply.outer

    def jac(t, y):
        Z = np.asarray(y, dtype=float).reshape(d, m)
        L = Z[:, :d]
        mean = Z[:, d] if with_mean else None
        JL = None                  # (i, a, j, b) and (i, b, a, j) parts of dL'_ij/dL_ab
        for kind, head in zip(kinds, heads):
            M, A, C, N, r = _head_parts(kind, head, L, mean)
            B = C @ L
            U = A @ L
            iajb = outer(A, B.T @ L) + outer(M, eye)
            ibaj = outer(U, B)
            if JL is None:
                JL, JL2 = iajb, ibaj
                if with_mean:
                    JmL = outer(A, L.T @ r) + outer(U, r).transpose(0, 2, 1)
                    Jmm = N
            else:
                JL, JL2 = JL + iajb, JL2 + ibaj
                if with_mean:
                    JmL = JmL + outer(A, L.T @ r) + outer(U, r).transpose(0, 2, 1)
                    Jmm = Jmm + N
        factor = JL.transpose(0, 2, 1, 3) + JL2.transpose(0, 3, 2, 1)
        if not with_mean:
            return factor.reshape(n, n)
        J = np.zeros((d, m, d, m))
        J[:, :d, :, :d] = factor
        J[:, d, :, :d] = JmL
        J[:, d, :, d] = Jmm
        return J.reshape(n, n)

    return jac
