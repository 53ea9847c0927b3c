r"""Softmax attention: derivation of the Gaussian moment equations.

Score :math:`s(x, y) = c\,\langle Qx, Ky\rangle = y^T A x` with :math:`A = c\,K^TQ`.
The score is linear in ``y`` (``H = 0``), so the tilted Gaussian has mean
:math:`\alpha + \Sigma A x` and the velocity field is affine:

.. math::

    M = c\,V\Sigma K^TQ = V\Sigma A,\qquad b = V\alpha,

    \alpha' = V(\alpha + \Sigma A\alpha),\qquad \Sigma' = V\Sigma A\Sigma + \Sigma A^T\Sigma V^T.

Run ``python derivations/softmax.py`` to print the derivation and its checks.
"""

from __future__ import annotations

import sympy as sp

try:
    from . import _symbolic as S
except ImportError:  # run as a script
    import _symbolic as S

NAME = "softmax"
TITLE = "Softmax attention"
SCORE = S.scale * (S.Q * S.x).T * (S.K * S.y)


def derive():
    """The affine field of softmax attention against a Gaussian."""
    return S.quadratic_score_field(SCORE)


#: the stacked weights [K; Q] and their product with the state, P = [K L; Q L]
KQ = sp.BlockMatrix([[S.K], [S.Q]])
P = sp.MatrixSymbol("P", 2 * S.k, S.d)


def kernel_program():
    r"""The hoisted kernel :math:`L' = (cVL)\,(KL)^T(QL)` as a program of SymPy expressions.

    ``P = [K; Q] L`` (one product gives both thin factors), ``KL = P[:k]``, ``QL = P[k:]``;
    the products are grouped as the kernels evaluate them. Printed by
    :func:`derivations._symbolic.program_kernel` and checked by :func:`thin_factor_form`.
    """
    KL, QL = P[:S.k, :], P[S.k:, :]
    thin = sp.MatMul(sp.Transpose(KL), QL)
    return S.Program([(P, sp.MatMul(KQ, S.L))], (sp.MatMul(sp.MatMul(S.scale, S.V, S.L), thin),))


def thin_factor_form():
    r"""SymPy check: :math:`L' = cV L L^TK^TQL = (cVL)\,(KL)^T(QL)`, the printed kernel.

    The right-hand side is :func:`kernel_program` composed back (its block slices of
    :math:`[K; Q]L` resolved), i.e. what the hoisted kernels evaluate. Near a steady state
    (``K = -Q``, :math:`QL \to 0`) the field is tiny while ``L`` is O(1); computing the
    thin factors :math:`KL` and :math:`QL` directly keeps them (and the field) accurate to
    rounding, where :math:`(K^TQ)L` or :math:`L^TK^T` loses digits to cancellation.
    With :math:`[K; Q]` stacked once, one product gives both thin factors.
    """
    field = derive()
    return kernel_program().check(field.M.xreplace({S.Sigma: S.L * S.L.T}) * S.L)


def functions():
    """Generated-code functions (see :func:`derivations._symbolic.affine_functions`).

    The hoisted factor form is printed from :func:`kernel_program` (the thin-factor form,
    checked symbolically by :func:`thin_factor_form`) instead of the printer's default.
    """
    funcs = S.affine_functions(derive(), TITLE)
    kernel = next(f for f in funcs if isinstance(f, S.Kernel))
    funcs[funcs.index(kernel)] = S.program_kernel(
        kernel_program(), TITLE, kernel.latex, hoist=(S.scale * S.V, KQ),
        dims=({S.k: "_k"}, {S.k: "h"}), extra_batched=[("h", "P.shape[-2] // 2")],
        setup=[("_k", "K.shape[-2]")])
    return funcs


CHECKS = dict(S.integration_checks(SCORE, derive))
CHECKS["thin-factor form of L' used by the hoisted kernels"] = thin_factor_form


if __name__ == "__main__":
    print(TITLE)
    S.print_field(derive())
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
