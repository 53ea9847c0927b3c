r"""Right-hand side and exact Jacobian of one trajectory of :func:`gaussian_pde.solve`.

The state of one trajectory is the factor :math:`L` alone (covariance only) or the
``d x (d + 1)`` matrix :math:`Z = [L \mid \alpha]` (with the mean), stored row-major,
so that :math:`\alpha' = N(\Sigma)\alpha` and :math:`L' = M(\Sigma)L` come out of the
same few matrix products. The mean's equation :math:`\alpha' = b + M\alpha` is linear
and homogeneous in :math:`\alpha` for every Gaussian-preserving type
(docs/math.md section 3.3): :math:`b = V\alpha` (softmax), :math:`b = VP^{-1}\alpha`
(L2), :math:`b = (V - M)\alpha` (Sinkhorn), and sums of these (multi-head), so

.. math:: Z' = [M L \mid N\alpha],\qquad N = \partial_\alpha b + M .

A type whose field matrix depends on the mean (``field_sees_mean``: linear attention,
:math:`M = V(\Sigma + \alpha\alpha^T)A`, a mean equation cubic in the mean) has the
same state and its own term, :math:`Z' = MZ`; it has no covariance-only state.

Each head supplies its own term, :meth:`~gaussian_pde.Attention.fused_term` (the
generated types hoist the weight-only products: one product ``P = W Z`` gives every
projection that the field needs), and optionally a one-call right-hand side for the
Fortran codes, :meth:`~gaussian_pde.Attention.fused_rhs`; the terms of the
:attr:`~gaussian_pde.Attention.heads` add up.

The exact Jacobian (heads that implement :meth:`~gaussian_pde.Attention.jacobian_parts`)
follows from :math:`dM[d\Sigma] = A\,d\Sigma\,C` and, for the mean rows, from
:math:`d(N\alpha) = A\,d\Sigma\,r`.
"""

from __future__ import annotations

import numpy as np

from ..attention import has_hook
from ._differences import central_jacobian

__all__ = ["moment_field", "fortran_rhs", "moment_jacobian", "mean_is_linear"]


def _heads(attention):
    return attention.heads


def mean_is_linear(attention):
    r"""Whether :math:`\alpha' = N(\Sigma)\alpha` is known to hold (every head's ``mean_is_linear``).

    A scaled mean then obeys the same equation.
    """
    return attention.mean_is_linear()


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
    terms = [h.fused_term(with_mean, out if i == 0 else None) for i, h in enumerate(heads)]
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
    states that writes into the same buffer (one set of work arrays for both). A single
    head's own :meth:`~gaussian_pde.Attention.fused_rhs` is used where it has one (a
    softmax head: the three products in one call compiled by Numba, 0.6 us an
    evaluation of the d = 5 field instead of 1.0 us; its sums run in another order than
    BLAS's, so the field agrees with :func:`moment_field` to rounding, not bit for bit).
    Otherwise the attention's :meth:`~gaussian_pde.Attention.compiled_field` where it
    has one (every other type of the package, and sums of heads): one compiled call an
    evaluation instead of the NumPy products of :func:`moment_field`, which remain for a
    type without either (``benchmarks/bench_solve_fields.py`` measures the two).
    """
    d = attention.d
    m = d + 1 if with_mean else d
    out = np.empty((d, m))
    heads = _heads(attention)
    if len(heads) == 1:
        fast = heads[0].fused_rhs(with_mean, out, counter)
        if fast is not None:
            return fast
    hook = getattr(attention, "compiled_field", None)
    compiled = hook() if hook is not None else None
    if compiled is not None:
        return _compiled_field_rhs(compiled, d, m, out, counter)
    field = moment_field(attention, with_mean, out=out)
    flat = out.reshape(-1)

    def rhs(t, y):
        counter.nfev += 1
        field(y.reshape(d, m))
        return flat

    rhs.field = field
    return rhs


def _compiled_field_rhs(compiled, d, m, out, counter):
    """:func:`fortran_rhs` by the attention's compiled field (one call an evaluation).

    The kernel is the generic one of :meth:`~gaussian_pde.Attention.compiled_field`
    (compiled once for every type and shape, cached on disk), the field
    :func:`gaussian_pde.solve_batch` integrates; it agrees with :func:`moment_field` to
    rounding.
    """
    kernel, params = compiled.rhs, compiled.params
    ws = np.zeros(compiled.ws_size)
    flat = out.reshape(-1)

    def rhs(t, y):
        counter.nfev += 1
        # SciPy's implicit solvers may pass a strided view; the kernel takes contiguous
        kernel(params, d, m, y if y.flags.c_contiguous else np.ascontiguousarray(y), flat, ws)
        return flat

    def field(Z):
        kernel(params, d, m, np.ascontiguousarray(Z, dtype=float).reshape(-1), flat, ws)
        return out

    rhs.field = field
    return rhs


# ----------------------------------------------------------------------------------------
# exact Jacobians (heads that implement jacobian_parts)
# ----------------------------------------------------------------------------------------

def moment_jacobian(attention, with_mean):
    r"""Exact Jacobian ``jac(t, y)`` of :func:`moment_field` (flattened state), or ``None``.

    Available when every head implements :meth:`~gaussian_pde.Attention.jacobian_parts`.
    With :math:`B = CL` and :math:`U = AL`, the factor rows are
    :math:`\partial L'_{ij}/\partial L_{ab} = M_{ia}\delta_{jb} + A_{ia}(B^TL)_{jb} +
    U_{ib}B_{aj}`, the mean rows :math:`\partial\alpha'_i/\partial L_{ab} =
    A_{ia}(L^Tr)_b + U_{ib}r_a` and :math:`\partial\alpha'/\partial\alpha = N`;
    :math:`\partial L'/\partial\alpha = 0`. Where a head's closed form loses its digits
    (:meth:`~gaussian_pde.Attention.jacobian_holds`: an L2 head once the factor's
    columns spread past
    :data:`~gaussian_pde.integrate._differences.JACOBIAN_SPREAD_MAX`), column-scaled
    central differences of the field replace it.
    """
    if not all(has_hook(type(h), "jacobian_parts") for h in _heads(attention)):
        return None
    closed = _closed_form_jacobian(attention, with_mean)
    limited = _limited_classes(attention)
    if not limited:
        return closed
    # differences of the field where the closed form loses its digits, built on first
    # need (most runs never get there)
    d = attention.d
    m = d + 1 if with_mean else d
    field = []

    def jac(t, y):
        Z = np.asarray(y, dtype=float).reshape(d, m)
        if all(cls.jacobian_holds(Z[:, :d]) for cls in limited):
            return closed(t, y)
        if not field:
            field.append(moment_field(attention, with_mean))
        return central_jacobian(field[0], Z)

    return jac


def _limited_classes(attention):
    """The head classes whose closed-form Jacobian holds only in part of the state space."""
    out = []
    for h in _heads(attention):
        cls = type(h)
        if has_hook(cls, "jacobian_holds") and cls not in out:
            out.append(cls)
    return out


def _closed_form_jacobian(attention, with_mean):
    """The closed-form Jacobian of :func:`moment_jacobian`."""
    heads = _heads(attention)
    d = attention.d
    m = d + 1 if with_mean else d
    n = d * m
    eye = np.eye(d)
    parts = [(type(h).jacobian_parts, h.weights()) for h in heads]

    outer = np.multiply.outer

    def jac(t, y):
        Z = np.asarray(y, dtype=float).reshape(d, m)
        L = Z[:, :d]
        mean = Z[:, d] if with_mean else None
        JL = None                  # (i, a, j, b) and (i, b, a, j) parts of dL'_ij/dL_ab
        for head_parts, weights in parts:
            M, A, C, N, r = head_parts(weights, L, mean)
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
