r"""Compiled (Numba) factor fields of the attention types, for the compiled integrators.

A type's :meth:`~gaussian_pde.Attention.compiled_field` returns a :class:`CompiledField`:
two compiled kernels with fixed signatures and the type's weights packed into one
float64 vector. The integrator (:mod:`gaussian_pde.integrate._compiled_batch`) is
compiled once against those signatures (first-class function types, cached on disk),
so it serves every type that supplies kernels, without knowing which type it is.

``rhs(P, d, m, y, out, ws)``
    The flat state ``y`` is :math:`Z = [L \mid \alpha]` (``d x m``, row-major;
    ``m = d`` without the mean, ``d + 1`` with it); ``out`` receives
    :math:`Z' = [M(\Sigma)L \mid b + M\alpha]` (docs/math.md sections 3 and 10);
    ``ws`` is scratch of at least :attr:`CompiledField.ws_size` entries.
``jac(P, d, m, y, J, ws) -> bool``
    The exact Jacobian :math:`\partial Z'/\partial Z` (``n x n``, ``n = dm``) into ``J``;
    ``False`` where no closed form holds there (the integrator takes central
    differences of ``rhs`` instead).

The packed vector holds a sum of heads, ``[H, (code, k, size, data...) * H]``, so that
a multi-head attention is the concatenation of its heads' packs and one kernel pair
serves every type and sum of types. The per-head formulas are those of
:mod:`gaussian_pde.integrate._fused`:

* softmax (data ``c, [cV; K; Q]``): :math:`Z' = \big((cVL)(KL)^T\big)(QZ)`, and
  :math:`V\alpha` added to the mean's column;
* L2 (data ``c, s = \sqrt{2c}, sV, sK, Q, V, K``): :math:`L' = sVL\,\Gamma\,QL`,
  :math:`\alpha' = V\alpha + sVL\,\Gamma(Q - K)\alpha`, with the gain
  :math:`\Gamma = (I + B^TB)^{-1}B^T` of :math:`B = sKL` (a Cholesky solve with
  :math:`I_k + BB^T` while :math:`\|B\|_F^2 < 10^3`, Householder QR of :math:`[B; I_d]`
  beyond, as :func:`gaussian_pde._common.linalg.l2_gain`);
* Sinkhorn (data ``A = cK^TQ, V``): :math:`L' = VL\,B\varphi(B^TB)`,
  :math:`B = L^TAL`, from the SVD (:func:`gaussian_pde._common.linalg.sinkhorn_cross`),
  :math:`\alpha' = V\alpha`;
* softmax with a query offset (data ``c, [cV; K; Q], q``; score
  :math:`c(Qx + q)^TKy`): softmax's products with :math:`q` added to the mean's column
  of :math:`QZ`: :math:`\alpha' = V\alpha +
  (cVL)(KL)^T(Q\alpha + q) = V\alpha + M\alpha + V\Sigma g`, :math:`g = cK^Tq` (the key
  bias of a score :math:`c(Qx + q)^T(Ky + k_b)` cancels); the covariance is softmax's;
* linear (data ``c, [cV; K; Q]``, as softmax): :math:`Z' = \big((cVZ)(KZ)^T\big)(QZ)`
  over the whole state :math:`Z = [L \mid \alpha]` (:math:`ZZ^T = \Sigma + \alpha\alpha^T`),
  no offset; it needs the mean in its own units (``m = d + 1``, mean units 1: the
  field is not homogeneous in the mean).

The Jacobian (softmax heads, with or without the offset, and L2 heads; Sinkhorn and
linear have none) follows
:math:`dM[d\Sigma] = A\,d\Sigma\,C` (:func:`gaussian_pde.integrate._field.analytic_jacobian`):
:math:`J_{ij,ab} = M_{ia}\delta_{jb} + A_{ia}(L^TB)_{bj} + (AL)_{ib}B_{aj}`,
:math:`B = CL`, and for the mean rows
:math:`\partial\alpha'_i/\partial L_{ab} = A_{ia}(L^Tr)_b + (AL)_{ib}r_a`,
:math:`\partial\alpha'/\partial\alpha = N`. With an L2 head it holds only while the
factor's column norms span less than
:data:`gaussian_pde.integrate._differences.JACOBIAN_SPREAD_MAX` (``1e4``).

Numba is imported when a type first asks for its compiled field, not with the package.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

__all__ = ["CompiledField", "kernels", "pack_head", "combine", "head_field", "add"]

#: head codes of the packed vector
SOFTMAX, L2, SINKHORN, LINEAR, SOFTMAX_OFFSET = 0, 1, 2, 3, 4
_HEADER = 3
#: the closed-form L2 Jacobian holds while the column norms of L span less than this
#: (gaussian_pde.integrate._differences.JACOBIAN_SPREAD_MAX)
_SPREAD_MAX = 1e4
#: ||B||_F^2 below which the L2 gain takes the Cholesky solve (linalg.GAIN_SOLVE_MAX)
_GAIN_SOLVE_MAX = 1e3


@dataclasses.dataclass(frozen=True)
class CompiledField:
    """What :meth:`~gaussian_pde.Attention.compiled_field` returns.

    Attributes
    ----------
    rhs, jac : numba dispatchers
        The kernels (signatures in the module docstring).
    params : ndarray, shape (p,)
        The packed weights.
    d : int
        Token dimension.
    ws_size : int
        Scratch the kernels need, for ``m = d + 1`` (enough for ``m = d``).
    exact_jacobian : bool
        Whether ``jac`` can return a closed form (otherwise it always returns False).
    """

    rhs: object
    jac: object
    params: np.ndarray
    d: int
    ws_size: int
    exact_jacobian: bool

    def specialised(self):
        """The same field with ``rhs`` compiled for its one head's type, ``d`` and ``k``.

        The constants let the compiler unroll the small loops: at ``d = k = 3`` the
        softmax field costs a third of the generic kernel's time, with the same
        operations in the same order (the same bits). The kernels are compiled at the
        first request of a type and shape (about a second, cached on disk), so the
        integrator asks for them only where a batch is large enough to repay that. A
        sum of heads, and a type whose body allocates (:data:`_COUNTED`: called, not
        inlined, so compiled in for nothing), keep the generic kernels (returned as they are).
        """
        if kernels() is None or self.rhs is not kernels()[0] or int(self.params[0]) != 1:
            return self         # a sum of heads, or a type's own kernels (another package's)
        if _BODIES[int(self.params[1])] in _COUNTED:
            return self         # a body that is called, not inlined: nothing to gain
        rhs = _specialised_rhs(int(self.params[1]), self.d, int(self.params[2]))
        return dataclasses.replace(self, rhs=rhs)


def pack_head(code, k, d, data):
    """One head's pack ``[code, k, size, data...]``, its scratch size and closed-form flag."""
    pack = np.concatenate([(float(code), float(k), 0.0), *data], axis=None)
    pack[2] = pack.size - _HEADER
    return pack, _head_ws(k, d), _closed_form(code)


def _head_ws(k, d):
    m = d + 1
    return 8 * (d + 2 * k + m + 2) * (m + k + 2) + 4 * (d + k) * (d + k)


def _closed_form(code):
    """Whether a head of type ``code`` has a closed-form Jacobian."""
    return code not in (SINKHORN, LINEAR)


def _field(d, params, head_ws, exact):
    """The :class:`CompiledField` of packed ``params`` (None without Numba)."""
    if kernels() is None:
        return None
    rhs, jac = kernels()
    return CompiledField(rhs=rhs, jac=jac, params=params, d=d,
                         ws_size=int(head_ws + 2 * d * (d + 1)), exact_jacobian=exact)


def head_field(code, k, d, data):
    """The :class:`CompiledField` of one head: ``combine(d, [pack_head(code, k, d, data)])``.

    The same field, packed in one pass (a batch packs one per trajectory).
    """
    params = np.concatenate([(1.0, float(code), float(k), 0.0), *data], axis=None)
    params[3] = params.size - 1 - _HEADER      # the head's size, after [heads, code, k]
    return _field(d, params, _head_ws(k, d), _closed_form(code))


def combine(d, parts):
    """A :class:`CompiledField` of the sum of heads ``parts`` (from :func:`pack_head`).

    None without Numba (the callers then take their NumPy paths).
    """
    params = np.concatenate([(float(len(parts)),), *(p for p, _, _ in parts)])
    return _field(d, params, max(w for _, w, _ in parts), all(e for _, _, e in parts))


# ----------------------------------------------------------------------------------------
# the loops (plain Python here, compiled by kernels())
# ----------------------------------------------------------------------------------------

def _mm(A, B, C):
    """``C = A @ B`` for small 2-D arrays."""
    r, q = A.shape
    c = B.shape[1]
    for i in range(r):
        for j in range(c):
            acc = 0.0
            for p in range(q):
                acc += A[i, p] * B[p, j]
            C[i, j] = acc


def _copy2(dst, src):
    """``dst[:, :] = src`` (2-D) as loops.

    An array assignment would compile its shape check's error message, and with it
    Numba's string formatting: some forty functions on a machine with an empty cache.
    """
    for i in range(dst.shape[0]):
        for j in range(dst.shape[1]):
            dst[i, j] = src[i, j]


def _cholesky_solve(H, X):
    """Solve ``H Y = X`` in place (``H`` symmetric positive definite, overwritten)."""
    k = H.shape[0]
    for j in range(k):
        s = H[j, j]
        for p in range(j):
            s -= H[j, p] * H[j, p]
        if not s > 0.0:
            return False
        s = math.sqrt(s)
        H[j, j] = s
        for i in range(j + 1, k):
            t = H[i, j]
            for p in range(j):
                t -= H[i, p] * H[j, p]
            H[i, j] = t / s
    c = X.shape[1]
    for col in range(c):
        for i in range(k):               # forward
            t = X[i, col]
            for p in range(i):
                t -= H[i, p] * X[p, col]
            X[i, col] = t / H[i, i]
        for i in range(k - 1, -1, -1):   # backward
            t = X[i, col]
            for p in range(i + 1, k):
                t -= H[p, i] * X[p, col]
            X[i, col] = t / H[i, i]
    return True


def _finite(A):
    for x in A.ravel():
        if not math.isfinite(x):
            return False
    return True


def _upper_solve(R, X):
    """Solve ``R Y = X`` in place, ``R`` upper triangular (square)."""
    n = R.shape[0]
    for col in range(X.shape[1]):
        for i in range(n - 1, -1, -1):
            t = X[i, col]
            for p in range(i + 1, n):
                t -= R[i, p] * X[p, col]
            X[i, col] = t / R[i, i]


def _gain_qr(B, G):
    """``G = R^{-1} Q_1^T`` from the QR of ``[B; I_d]`` (any finite scale)."""
    k, d = B.shape
    Bh = np.zeros((k + d, d))
    for i in range(k):
        for j in range(d):
            Bh[i, j] = B[i, j]
    for i in range(d):
        Bh[k + i, i] = 1.0
    Q, R = np.linalg.qr(Bh)
    Y = np.ascontiguousarray(Q[:k].T)
    _upper_solve(R, Y)
    _copy2(G, Y)


def _inverse_gram_qr(B, E):
    """``E = (I_k + BB^T)^{-1} = R_2^{-1}R_2^{-T}`` from the QR of ``[B^T; I_k]``."""
    k, d = B.shape
    Bh = np.zeros((d + k, k))
    for i in range(d):
        for j in range(k):
            Bh[i, j] = B[j, i]
    for i in range(k):
        Bh[d + i, i] = 1.0
    _, R = np.linalg.qr(Bh)
    Ri = np.eye(k)
    _upper_solve(R, Ri)
    _mm(Ri, np.ascontiguousarray(Ri.T), E)


def _gain(B, G, H, X, E, want_E):
    """The L2 gain ``G`` (``d x k``) of ``B`` (and ``E``); False where ``B`` is not finite."""
    k, d = B.shape
    n2 = 0.0
    for x in B.ravel():
        n2 += x * x
    if not math.isfinite(n2):
        if not _finite(B):
            return False
    if k == 1 and n2 < 1e300 and not want_E:
        for i in range(d):
            G[i, 0] = B[0, i] / (1.0 + n2)
        return True
    if n2 < _GAIN_SOLVE_MAX:
        for i in range(k):
            for j in range(k):
                acc = 1.0 if i == j else 0.0
                for p in range(d):
                    acc += B[i, p] * B[j, p]
                H[i, j] = acc
        if want_E:                        # E = H^{-1}, G = B^T E
            for i in range(k):
                for j in range(k):
                    E[i, j] = 1.0 if i == j else 0.0
            if _cholesky_solve(H, E):
                for i in range(d):
                    for j in range(k):
                        acc = 0.0
                        for p in range(k):
                            acc += B[p, i] * E[p, j]
                        G[i, j] = acc
                return True
        else:                             # X = H^{-1} B, G = X^T
            _copy2(X, B)
            if _cholesky_solve(H, X):
                for i in range(d):
                    for j in range(k):
                        G[i, j] = X[j, i]
                return True
    _gain_qr(np.ascontiguousarray(B), G)
    if want_E:
        _inverse_gram_qr(np.ascontiguousarray(B), E)
    return True


def _nan(out):
    for i in range(out.size):
        out[i] = np.nan


def _softmax_rhs(data, k, d, m, y, out, ws):
    _softmax_core(data, k, d, m, y, out, ws, -1)


def _softmax_offset_rhs(data, k, d, m, y, out, ws):
    # the query bias q follows [cV; K; Q] in the data
    _softmax_core(data, k, d, m, y, out, ws, 1 + (d + 2 * k) * d)


def _softmax_core(data, k, d, m, y, out, ws, bias):
    # the products in the order of the NumPy loop's (integrate._compiled's
    # softmax_apply_stack): A = (cVL)(KL)^T first, then A (QZ); near a blow-up, where the
    # factor's entries pass 1e20, the order decides which cancellations round. Flat
    # indices: W = [cV; K; Q] row-major from data[1]; P = W Z with its factor block in
    # ws[:r d] (rows of d), its mean column in ws[r d:r d + r], A after it. Every entry
    # is one sum over p in increasing order, whichever loop runs innermost.
    # ``bias`` >= 0: the offset in ``data`` of a query bias added to the mean's column
    # of QZ (a score c (Qx + q)^T K y); -1: none
    c = data[0]
    r = d + 2 * k
    pm = r * d
    pa = pm + r
    for i in range(r):                         # P = W Z
        wi = 1 + i * d
        for j in range(d):
            acc = 0.0
            for p in range(d):
                acc += data[wi + p] * y[p * m + j]
            ws[i * d + j] = acc
    if m > d:
        # the mean's column, summed over p in the outer loop: one accumulator per row,
        # independent of each other, where a dot product per row waits on each add
        for i in range(r):
            ws[pm + i] = 0.0
        for p in range(d):
            yp = y[p * m + d]
            for i in range(r):
                ws[pm + i] += data[1 + i * d + p] * yp
    q0 = (d + k) * d
    qm = pm + d + k
    if bias >= 0 and m > d:                    # Q alpha + q
        for p in range(k):
            ws[qm + p] += data[bias + p]
    for i in range(d):                         # A = (cVL)(KL)^T
        for j in range(k):
            acc = 0.0
            for p in range(d):
                acc += ws[i * d + p] * ws[(d + j) * d + p]
            ws[pa + i * k + j] = acc
    for i in range(d):                         # Z' = A (QZ), + V alpha in the mean's column
        for j in range(d):
            acc = 0.0
            for p in range(k):
                acc += ws[pa + i * k + p] * ws[q0 + p * d + j]
            out[i * m + j] = acc
    if m > d:
        for i in range(d):
            out[i * m + d] = 0.0
        for p in range(k):
            qp = ws[qm + p]
            for i in range(d):
                out[i * m + d] += ws[pa + i * k + p] * qp
        for i in range(d):
            out[i * m + d] += ws[pm + i] / c


def _linear_rhs(data, k, d, m, y, out, ws):
    # softmax's products over the whole state: A = (cVZ)(KZ)^T sums over all m columns
    # (Z Z^T = Sigma + alpha alpha^T), then Z' = A (QZ), with no offset
    r = d + 2 * k
    pa = r * m
    for i in range(r):                         # P = W Z
        wi = 1 + i * d
        for j in range(m):
            acc = 0.0
            for p in range(d):
                acc += data[wi + p] * y[p * m + j]
            ws[i * m + j] = acc
    for i in range(d):                         # A = (cVZ)(KZ)^T
        for j in range(k):
            acc = 0.0
            for p in range(m):
                acc += ws[i * m + p] * ws[(d + j) * m + p]
            ws[pa + i * k + j] = acc
    q0 = (d + k) * m
    for i in range(d):                         # Z' = A (QZ)
        for j in range(m):
            acc = 0.0
            for p in range(k):
                acc += ws[pa + i * k + p] * ws[q0 + p * m + j]
            out[i * m + j] = acc


def _l2_blocks(data, k, d):
    c, s = data[0], data[1]
    o = 2
    sV = data[o:o + d * d].reshape((d, d))
    o += d * d
    sK = data[o:o + k * d].reshape((k, d))
    o += k * d
    Q = data[o:o + k * d].reshape((k, d))
    o += k * d
    V = data[o:o + d * d].reshape((d, d))
    o += d * d
    K = data[o:o + k * d].reshape((k, d))
    return c, s, sV, sK, Q, V, K


def _l2_rhs(data, k, d, m, y, out, ws):
    c, s, sV, sK, Q, V, K = _l2_blocks(data, k, d)
    Z = y.reshape((d, m))
    o = 0
    X = ws[o:o + d * m].reshape((d, m))        # sV Z
    o += d * m
    B = ws[o:o + k * d].reshape((k, d))        # sK L
    o += k * d
    QZ = ws[o:o + k * m].reshape((k, m))       # [QL | (Q - K) alpha]
    o += k * m
    G = ws[o:o + d * k].reshape((d, k))
    o += d * k
    Gd = ws[o:o + d * m].reshape((d, m))
    o += d * m
    H = ws[o:o + k * k].reshape((k, k))
    o += k * k
    Xs = ws[o:o + k * d].reshape((k, d))
    _mm(sV, Z, X)
    for i in range(k):
        for j in range(d):
            acc = 0.0
            acq = 0.0
            for p in range(d):
                acc += sK[i, p] * Z[p, j]
                acq += Q[i, p] * Z[p, j]
            B[i, j] = acc
            QZ[i, j] = acq
        if m > d:
            acc = 0.0
            for p in range(d):
                acc += (Q[i, p] - K[i, p]) * Z[p, d]
            QZ[i, d] = acc
    if not _gain(B, G, H, Xs, H, False):
        _nan(out)
        return
    _mm(G, QZ, Gd)
    for i in range(d):
        for j in range(m):
            acc = 0.0
            for p in range(d):
                acc += X[i, p] * Gd[p, j]
            if j == d:
                acc += X[i, d] / s
            out[i * m + j] = acc


def _sinkhorn_rhs(data, k, d, m, y, out, ws):
    A = data[:d * d].reshape((d, d))
    V = data[d * d:2 * d * d].reshape((d, d))
    Z = y.reshape((d, m))
    L = np.ascontiguousarray(Z[:, :d])
    AL = ws[:d * d].reshape((d, d))
    Bm = np.empty((d, d))
    _mm(A, L, AL)
    _mm(np.ascontiguousarray(L.T), AL, Bm)
    if not _finite(Bm):
        _nan(out)
        return
    U, sv, Wt = np.linalg.svd(Bm)
    for j in range(d):
        f = 2.0 * sv[j] / (1.0 + math.sqrt(1.0 + 4.0 * sv[j] * sv[j]))
        for i in range(d):
            U[i, j] *= f
    C = np.zeros((m, m))
    _mm(U, Wt, C[:d, :d])
    if m > d:
        C[d, d] = 1.0                       # alpha' = V alpha
    VZ = ws[d * d:d * d + d * m].reshape((d, m))
    _mm(V, Z, VZ)
    for i in range(d):
        for j in range(m):
            acc = 0.0
            for p in range(m):
                acc += VZ[i, p] * C[p, j]
            out[i * m + j] = acc


def heads_rhs(P, d, m, y, out, ws):
    """``out = Z'``: the sum of the packed heads' fields at the flat state ``y``."""
    H = int(P[0])
    n = d * m
    acc = ws[:n]
    tmp = ws[n:2 * n]
    rest = ws[2 * n:]
    o = 1
    for h in range(H):
        code, k, size = int(P[o]), int(P[o + 1]), int(P[o + 2])
        data = P[o + _HEADER:o + _HEADER + size]
        target = out if H == 1 else tmp
        if code == SOFTMAX:
            _softmax_rhs(data, k, d, m, y, target, rest)
        elif code == L2:
            _l2_rhs(data, k, d, m, y, target, rest)
        elif code == LINEAR:
            _linear_rhs(data, k, d, m, y, target, rest)
        elif code == SOFTMAX_OFFSET:
            _softmax_offset_rhs(data, k, d, m, y, target, rest)
        else:
            _sinkhorn_rhs(data, k, d, m, y, target, rest)
        if H > 1:
            for i in range(n):
                acc[i] = tmp[i] if h == 0 else acc[i] + tmp[i]
        o += _HEADER + size
    if H > 1:
        for i in range(n):
            out[i] = acc[i]


def _spread_ok(Z, d):
    """Whether the non-zero column norms of ``L`` span less than ``_SPREAD_MAX``."""
    cmax = 0.0
    cmin = np.inf
    for j in range(d):
        s = 0.0
        for i in range(d):
            s += Z[i, j] * Z[i, j]
        c = math.sqrt(s)
        if c > cmax:
            cmax = c
        if c > 0 and c < cmin:
            cmin = c
    return not (cmax > _SPREAD_MAX * cmin)


def _head_parts(code, data, k, d, m, Z, A, C, M, N, r, ws):
    """``A, C, M`` (and ``N, r`` with the mean) of one head at ``Z`` (see the module)."""
    L = np.ascontiguousarray(Z[:, :d])
    S = np.empty((d, d))
    _mm(L, np.ascontiguousarray(L.T), S)
    if code == SOFTMAX or code == SOFTMAX_OFFSET:
        c = data[0]
        W = data[1:1 + (d + 2 * k) * d].reshape((d + 2 * k, d))
        Kt = np.ascontiguousarray(W[d:d + k].T)
        Q = W[d + k:d + 2 * k]
        _copy2(A, W[:d])
        _mm(Kt, Q, C)
        T1 = np.empty((d, d))
        _mm(A, S, T1)
        _mm(T1, C, M)
        if m > d:
            for i in range(d):
                for j in range(d):
                    N[i, j] = A[i, j] / c + M[i, j]
            for i in range(d):
                acc = 0.0
                for p in range(d):
                    acc += C[i, p] * Z[p, d]
                r[i] = acc
            if code == SOFTMAX_OFFSET:         # r = K^T (Q alpha + q)
                q = data[1 + (d + 2 * k) * d:]
                for i in range(d):
                    acc = 0.0
                    for p in range(k):
                        acc += Kt[i, p] * q[p]
                    r[i] += acc
        return True
    c, s, sV, sK, Q, V, K = _l2_blocks(data, k, d)
    B = np.empty((k, d))
    _mm(sK, L, B)
    G = np.empty((d, k))
    E = np.empty((k, k))
    H = np.empty((k, k))
    if not _gain(B, G, H, H, E, True):
        return False
    LG = np.empty((d, k))
    _mm(L, G, LG)
    Xi = np.empty((d, d))
    _mm(LG, np.ascontiguousarray(K), Xi)
    for i in range(d):
        for j in range(d):
            Xi[i, j] = (1.0 if i == j else 0.0) - s * Xi[i, j]
    Pm = np.empty((d, d))
    _mm(LG, np.ascontiguousarray(Q), Pm)
    _mm(V, Xi, A)
    _mm(V, Pm, M)
    for i in range(d):
        for j in range(d):
            A[i, j] *= 2.0 * c
            M[i, j] *= 2.0 * c / s
    EQ = np.empty((k, d))
    _mm(E, np.ascontiguousarray(Q), EQ)
    _mm(np.ascontiguousarray(K.T), EQ, C)
    if m > d:
        for i in range(d):
            for j in range(d):
                N[i, j] = A[i, j] / (2.0 * c) + M[i, j]
        qka = np.empty((k, 1))
        for i in range(k):
            acc = 0.0
            for p in range(d):
                acc += (Q[i, p] - K[i, p]) * Z[p, d]
            qka[i, 0] = acc
        Eq = np.empty((k, 1))
        _mm(E, qka, Eq)
        for i in range(d):
            acc = 0.0
            for p in range(k):
                acc += K[p, i] * Eq[p, 0]
            r[i] = acc
    return True


def heads_jac(P, d, m, y, J, ws):
    """The closed-form Jacobian of :func:`heads_rhs` into ``J``; False where none holds."""
    H = int(P[0])
    Z = y.reshape((d, m))
    o = 1
    codes_ok = True
    has_l2 = False
    for _ in range(H):
        code, size = int(P[o]), int(P[o + 2])
        if code == SINKHORN or code == LINEAR:
            codes_ok = False
        if code == L2:
            has_l2 = True
        o += _HEADER + size
    if not codes_ok:
        return False
    if has_l2 and not _spread_ok(Z, d):
        return False
    n = d * m
    for i in range(n):
        for j in range(n):
            J[i, j] = 0.0
    A = np.empty((d, d))
    C = np.empty((d, d))
    M = np.empty((d, d))
    N = np.empty((d, d))
    r = np.empty(d)
    B = np.empty((d, d))
    LtB = np.empty((d, d))
    AL = np.empty((d, d))
    L = np.ascontiguousarray(Z[:, :d])
    Lt = np.ascontiguousarray(L.T)
    o = 1
    for _ in range(H):
        code, k, size = int(P[o]), int(P[o + 1]), int(P[o + 2])
        data = P[o + _HEADER:o + _HEADER + size]
        o += _HEADER + size
        if not _head_parts(code, data, k, d, m, Z, A, C, M, N, r, ws):
            return False
        _mm(C, L, B)
        _mm(Lt, B, LtB)
        _mm(A, L, AL)
        for i in range(d):
            for j in range(d):
                row = i * m + j
                for a in range(d):
                    for b in range(d):
                        J[row, a * m + b] += A[i, a] * LtB[b, j] + AL[i, b] * B[a, j]
                    J[row, a * m + j] += M[i, a]
        if m > d:
            Ltr = np.empty(d)
            for b in range(d):
                acc = 0.0
                for p in range(d):
                    acc += L[p, b] * r[p]
                Ltr[b] = acc
            for i in range(d):
                row = i * m + d
                for a in range(d):
                    for b in range(d):
                        J[row, a * m + b] += A[i, a] * Ltr[b] + AL[i, b] * r[a]
                    J[row, a * m + d] += N[i, a]
    for i in range(n):
        for j in range(n):
            if not math.isfinite(J[i, j]):
                return False
    return True


_HELPERS = ("_mm", "_copy2", "_cholesky_solve", "_finite", "_upper_solve", "_gain_qr",
            "_inverse_gram_qr", "_gain", "_nan", "_softmax_core", "_softmax_rhs",
            "_softmax_offset_rhs", "_l2_blocks", "_l2_rhs",
            "_sinkhorn_rhs", "_linear_rhs", "_spread_ok", "_head_parts")


#: helpers inlined at the Numba IR level into their callers
_INLINED = ("_softmax_core", "_gain")
#: the helpers that allocate, or return arrays: compiled with Numba's reference counting;
#: the rest, and the kernels, without it (see :func:`kernels`)
_COUNTED = ("_finite", "_gain_qr", "_inverse_gram_qr", "_gain", "_l2_blocks", "_l2_rhs", "_sinkhorn_rhs",
            "_head_parts")


@functools.cache
def signatures():
    """The Numba signatures of ``rhs`` and ``jac`` (the integrator's argument types; built once)."""
    from numba import types as T

    vec, mat = T.float64[::1], T.float64[:, ::1]
    return (T.void(vec, T.int64, T.int64, vec, vec, vec),
            T.boolean(vec, T.int64, T.int64, vec, mat, vec))


@functools.cache
def kernels():
    """``(rhs, jac)``: :func:`heads_rhs` and :func:`heads_jac` compiled (cached on disk).

    None without Numba.
    """
    try:
        from numba import njit
    except ImportError:         # pragma: no cover - numba is a dependency
        return None

    g = globals()
    for name in _HELPERS:     # the helpers first: the kernels call them as compiled globals
        if not hasattr(g[name], "py_func"):
            # the shared softmax body is inlined into its two callers, so that the kernels
            # compiled for a shape see its loop bounds as constants
            inline = "always" if name in _INLINED else "never"
            g[name] = njit(cache=True, error_model="numpy", inline=inline,
                           _nrt=name in _COUNTED)(g[name])
    rhs_sig, jac_sig = signatures()
    opts = dict(cache=True, error_model="numpy", boundscheck=False)
    return (njit(rhs_sig, _nrt=False, **opts)(heads_rhs),
            njit(jac_sig, **opts)(heads_jac))


@functools.cache
def _specialised_rhs(code, d, k):
    """:func:`heads_rhs` of one head of type ``code`` with ``d`` and ``k`` compiled in.

    The body is the generic kernel's (``_softmax_rhs``, ``_l2_rhs``, ...)
    called with constant ``d``, ``k`` and ``m`` (``d`` or ``d + 1``) and inlined
    (:func:`_inlined_bodies`), so the compiler sees its loop bounds; the signature is
    :func:`signatures`' (the integrator takes it as it takes the generic one).

    The closure holds integers only, and the bodies are module globals: Numba keys its
    disk cache on the closure's values, so each type and shape is compiled once per
    installation, not once per process. The branches on ``CODE`` are pruned at compile
    time (a constant of the closure): each kernel holds one body. Hence the calls written
    out per type and ``m``: behind one shared dispatch helper the branches are not pruned,
    and every kernel compiles all five bodies (several times the first compile).
    """
    from numba import njit

    kernels()                 # the bodies compiled first (they are called as globals)
    _inlined_bodies()
    CODE, D, K, M1 = int(code), int(d), int(k), int(d) + 1

    def rhs(P, d, m, y, out, ws):
        data = P[1 + _HEADER:]
        rest = ws[2 * d * m:]
        if CODE == SOFTMAX:
            if m == D:
                _softmax_rhs_inlined(data, K, D, D, y, out, rest)
            else:
                _softmax_rhs_inlined(data, K, D, M1, y, out, rest)
        elif CODE == L2:
            if m == D:
                _l2_rhs_inlined(data, K, D, D, y, out, rest)
            else:
                _l2_rhs_inlined(data, K, D, M1, y, out, rest)
        elif CODE == SINKHORN:
            if m == D:
                _sinkhorn_rhs_inlined(data, K, D, D, y, out, rest)
            else:
                _sinkhorn_rhs_inlined(data, K, D, M1, y, out, rest)
        elif CODE == LINEAR:
            if m == D:
                _linear_rhs_inlined(data, K, D, D, y, out, rest)
            else:
                _linear_rhs_inlined(data, K, D, M1, y, out, rest)
        elif m == D:
            _softmax_offset_rhs_inlined(data, K, D, D, y, out, rest)
        else:
            _softmax_offset_rhs_inlined(data, K, D, M1, y, out, rest)

    rhs_sig, _ = signatures()
    return njit(rhs_sig, cache=True, error_model="numpy", boundscheck=False, _nrt=False)(rhs)


#: the single-head bodies by type code (:data:`SOFTMAX` ...), as :func:`_specialised_rhs`
#: calls them: ``<name>_inlined``, defined by :func:`_inlined_bodies`
_BODIES = ("_softmax_rhs", "_l2_rhs", "_sinkhorn_rhs", "_linear_rhs", "_softmax_offset_rhs")
_softmax_rhs_inlined = _l2_rhs_inlined = _sinkhorn_rhs_inlined = None
_linear_rhs_inlined = _softmax_offset_rhs_inlined = None


@functools.cache
def _inlined_bodies():
    """Define the globals ``<body>_inlined`` of :data:`_BODIES` that the kernels of a shape call.

    Inlined in Numba's IR, a body sees the shape as constants (its loops unrolled and
    vectorised where they can be, each sum in the same order: the same bits); a body
    that needs reference counting (:data:`_COUNTED`) is called instead.
    """
    from numba import njit

    g = globals()
    for name in _BODIES:
        body = g[name]
        if name not in _COUNTED:
            body = njit(cache=True, error_model="numpy", inline="always", _nrt=False)(body.py_func)
        g[name + "_inlined"] = body


def add(fields):
    """The :class:`CompiledField` of a sum of fields, or None (one is None, or other kernels)."""
    if not fields or any(f is None for f in fields) or kernels() is None:
        return None
    rhs, jac = kernels()
    if any(f.rhs is not rhs or f.jac is not jac for f in fields):
        return None
    heads = sum(int(f.params[0]) for f in fields)
    params = np.concatenate([[float(heads)], *[f.params[1:] for f in fields]])
    return CompiledField(rhs=rhs, jac=jac, params=params, d=fields[0].d,
                         ws_size=max(f.ws_size for f in fields) + 2 * fields[0].d ** 2 + 2 * fields[0].d,
                         exact_jacobian=all(f.exact_jacobian for f in fields))
