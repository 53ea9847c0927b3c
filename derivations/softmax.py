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


#: the stacked weights W = [cV; K; Q] and their product with the state,
#: P = W L = [cVL; KL; QL]
W = sp.BlockMatrix([[S.scale * S.V], [S.K], [S.Q]])
P = sp.MatrixSymbol("P", S.d + 2 * S.k, S.d)


def kernel_program():
    r"""The hoisted kernel :math:`L' = \big((cVL)(KL)^T\big)(QL)` as a program of SymPy expressions.

    ``P = [cV; K; Q] L``: one product gives the three factors, ``cVL = P[:d]``,
    ``KL = P[d:d+k]`` and ``QL = P[d+k:]``; the products are grouped as the kernels
    evaluate them, the thin ``d x k`` product first. Printed by
    :func:`derivations._symbolic.program_kernel` and checked by :func:`thin_factor_form`.
    """
    VL, KL, QL = P[:S.d, :], P[S.d:S.d + S.k, :], P[S.d + S.k:, :]
    return S.Program([(P, sp.MatMul(W, S.L))],
                     (sp.MatMul(sp.MatMul(VL, sp.Transpose(KL)), QL),))


def thin_factor_form():
    r"""SymPy check: :math:`L' = cV L L^TK^TQL = \big((cVL)(KL)^T\big)(QL)`, the printed kernel.

    The right-hand side is :func:`kernel_program` composed back (its block slices of
    :math:`[cV; K; Q]L` resolved), i.e. what the hoisted kernels evaluate. Near a steady
    state (``K = -Q``, :math:`QL \to 0`) the field is tiny while ``L`` is O(1); computing
    the thin factors :math:`KL` and :math:`QL` directly keeps them (and the field) accurate
    to rounding, where :math:`(K^TQ)L` or :math:`L^TK^T` loses digits to cancellation.
    With :math:`[cV; K; Q]` stacked once, one product gives all three factors: on stacks
    of small matrices, where each product's cost is its overhead per matrix, three products
    per evaluation instead of four.
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
        kernel_program(), TITLE, kernel.latex, hoist=(W,),
        dims=({S.d: "_d", S.k: "_k"}, {S.d: "_d", S.k: "_k"}),
        extra_batched=[("_d", "L.shape[-1]"), ("_k", "(P.shape[-2] - _d) // 2")],
        setup=[("_d", "V.shape[-1]"), ("_k", "K.shape[-2]")])
    return funcs


CHECKS = dict(S.integration_checks(SCORE, derive))
CHECKS["thin-factor form of L' used by the hoisted kernels"] = thin_factor_form


if __name__ == "__main__":
    print(TITLE)
    S.print_field(derive())
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
