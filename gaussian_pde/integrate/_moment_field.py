r"""One trajectory's state: its right-hand side, its Jacobian and the units of its mean.

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
same state, :math:`Z' = MZ`; it has no covariance-only state.

**One source.** The field and its Jacobian are the attention's
:meth:`~gaussian_pde.Attention.compiled_field` wherever it has one (every type of the
package, sums of heads, and plugins that bring kernels): the kernels that
:func:`gaussian_pde.solve_batch` and the compiled steps of :func:`gaussian_pde.solve`
integrate, written once in the type's module as plain Python
(:mod:`gaussian_pde.attention._compiled_fields`). The Jacobian kernel's closed form
follows from :math:`dM[d\Sigma] = A\,d\Sigma\,C` and, for the mean rows, from
:math:`d(N\alpha) = A\,d\Sigma\,r`; where it does not hold (an L2 head once the
factor's columns spread past
:data:`~gaussian_pde._common.differences.JACOBIAN_SPREAD_MAX`, a non-finite state)
column-scaled central differences of the same field replace it. A type without a
compiled field is integrated on its NumPy reference, :func:`reference_field` (the
derivation's ``factor_rhs`` and ``moment_rhs``), and its stiff steps take differences.

**Units.** The mean rides in the state divided by a power of 2 (:func:`mean_scale`), so
that the solvers' tolerances on it are relative to its size.
"""

from __future__ import annotations

import math

import numpy as np

from .._common.differences import central_jacobian
from ..attention import compiled_field_of

__all__ = ["reference_field", "compiled_field_values", "state_field", "moment_jacobian",
           "mean_scale", "mean_scales", "max_abs"]


def reference_field(attention, with_mean):
    r"""``field(Z) -> Z'`` by the attention's NumPy hooks, for one ``(d, m)`` state.

    The factor's rows are :meth:`~gaussian_pde.Attention.factor_rhs` (the derivation's
    :math:`L' = M(\Sigma)L`; :math:`M(\alpha, \Sigma)L` from
    :meth:`~gaussian_pde.Attention.field_matrix_with_mean` for a type whose field matrix
    sees the mean), the mean's column the first part of
    :meth:`~gaussian_pde.Attention.moment_rhs`, :math:`\alpha' = b + M\alpha`. Returns a
    new array; a non-finite trial state gives NaN (the step is then rejected).
    """
    d = attention.d
    m = d + 1 if with_mean else d
    sees_mean = attention.field_sees_mean

    def field(Z):
        Z = np.asarray(Z, dtype=float)
        L = Z[:, :d]
        try:
            if not with_mean:
                return np.array(attention.factor_rhs(L), dtype=float)
            mean = Z[:, d].copy()
            cov = L @ L.T
            res = np.empty((d, m))
            res[:, :d] = (attention.field_matrix_with_mean(cov, mean) @ L if sees_mean
                          else attention.factor_rhs(L))
            res[:, d] = attention.moment_rhs(mean, cov)[0]
            return res
        except np.linalg.LinAlgError:    # a non-finite trial state: reject the step
            return np.full((d, m), np.nan)

    return field


def state_field(attention, with_mean):
    r"""``field(Z) -> Z'`` of one ``(d, m)`` state, a new array at every call.

    The attention's :meth:`~gaussian_pde.Attention.compiled_field` where it has one (one
    compiled call an evaluation, :func:`compiled_field_values`), else
    :func:`reference_field` (``benchmarks/bench_solve_fields.py`` measures the two).
    """
    if attention.field_sees_mean and not with_mean:
        raise TypeError(f"the field matrix of {attention.name!r} attention depends on the "
                        "mean: its state must hold the mean (`with_mean`).")
    compiled = compiled_field_of(attention)
    if compiled is not None:
        return compiled_field_values(compiled, with_mean)
    return reference_field(attention, with_mean)


def compiled_field_values(compiled, with_mean):
    """``field(Z) -> Z'`` by the compiled kernel, a new array at every call.

    For differences and checks, which keep several values at once.
    """
    d = compiled.d
    m = d + 1 if with_mean else d
    kernel, params = compiled.rhs, compiled.params
    ws = np.zeros(compiled.ws_size)

    def field(Z):
        res = np.empty(d * m)
        # SciPy's implicit solvers may pass a strided view; the kernel takes contiguous
        kernel(params, d, m, np.ascontiguousarray(Z, dtype=float).reshape(-1), res, ws)
        return res.reshape(d, m)

    return field


def moment_jacobian(attention, with_mean):
    r"""Exact Jacobian ``jac(t, y)`` of :func:`state_field` (flattened state), or ``None``.

    The Jacobian kernel of the attention's
    :meth:`~gaussian_pde.Attention.compiled_field` where it has a closed form
    (``exact_jacobian``): with :math:`B = CL` and :math:`U = AL`, the factor rows
    :math:`\partial L'_{ij}/\partial L_{ab} = M_{ia}\delta_{jb} + A_{ia}(B^TL)_{jb} +
    U_{ib}B_{aj}`, the mean rows :math:`\partial\alpha'_i/\partial L_{ab} =
    A_{ia}(L^Tr)_b + U_{ib}r_a` and :math:`\partial\alpha'/\partial\alpha = N`;
    :math:`\partial L'/\partial\alpha = 0`; for a head whose field matrix depends on the
    second moment (linear attention) the whole state's rows, docs/math.md (3.16). At a
    state where the kernel has no closed form (it returns False: an L2 head past
    :data:`~gaussian_pde._common.differences.JACOBIAN_SPREAD_MAX`, a non-finite
    state), column-scaled central differences of the same field
    (:func:`~gaussian_pde._common.differences.central_jacobian`). ``None`` where the
    attention has no compiled closed form: the solvers then take their own differences.
    """
    compiled = compiled_field_of(attention)
    if compiled is None or not compiled.exact_jacobian:
        return None
    d = attention.d
    m = d + 1 if with_mean else d
    n = d * m
    kernel, params = compiled.jac, compiled.params
    ws = np.zeros(compiled.ws_size)
    field = []

    def jac(t, y):
        y = np.ascontiguousarray(y, dtype=float)
        J = np.empty((n, n))
        if kernel(params, d, m, y, J, ws):
            return J
        # differences of the field where the closed form loses its digits, built on
        # first need (most runs never get there)
        if not field:
            field.append(compiled_field_values(compiled, with_mean))
        return central_jacobian(field[0], y.reshape(d, m))

    return jac


def mean_scale(mean0, rtol, atol):
    r"""Units of the mean in the solver's state for ``method="auto"``.

    A power of 2 near :math:`(\text{rtol}/\text{atol})\max_i|\alpha_{0,i}|`. The
    solvers control the error of every entry :math:`y_i` to
    :math:`\text{atol} + \text{rtol}\,|y_i|`; for the scaled mean that is
    :math:`\text{rtol}\,(\max_i|\alpha_{0,i}| + |\alpha_i|)` in the mean's own units:
    relative to the mean's size as a vector, whatever its scale, instead of the absolute
    ``atol`` (made for the entries of ``L``) on entries of the mean that pass near zero,
    which made the mean dictate the step size (up to 1.3 times the evaluations of the
    covariance alone, for errors far below ``rtol``). Identity (1) without a mean or for
    a zero mean; only for a type whose mean equation is linear
    (``Attention.mean_is_linear``, checked by the caller).
    Computed on Python floats (a short solve spends microseconds, not tens, on it).
    """
    if mean0 is None:
        return 1.0
    return _units(max_abs(mean0), rtol, atol)


def mean_scales(mean0s, rtol, atol):
    """:func:`mean_scale` of every row of ``mean0s`` (``(B, d)``), as an array.

    The sizes of a finite stack in one NumPy reduction (the same numbers: a maximum of
    absolute values is exact), then the units as :func:`mean_scale` takes them.
    """
    if np.isfinite(mean0s).all():
        sizes = np.max(np.abs(mean0s), axis=1, initial=0.0).tolist()
    else:
        sizes = [max_abs(mu) for mu in mean0s]
    return np.array([_units(size, rtol, atol) for size in sizes])


def _units(size, rtol, atol):
    if not (size > 0 and math.isfinite(size)):
        return 1.0
    exponent = round(math.log2(rtol / atol) + math.log2(size))
    return 2.0 ** min(max(exponent, -1000), 1000)


def max_abs(vector):
    r""":math:`\max_i |v_i|` of a 1-D float array, as a Python float."""
    return max(map(abs, vector.tolist()), default=0.0)
