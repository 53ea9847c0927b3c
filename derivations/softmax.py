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


def thin_factor_form():
    r"""SymPy check: :math:`L' = cV L L^TK^TQL = (cVL)\,(KL)^T(QL)`, and the identity.

    The right-hand side is how the hoisted kernels evaluate it. Near a steady state
    (``K = -Q``, :math:`QL \to 0`) the field is tiny while ``L`` is O(1); computing the
    thin factors :math:`KL` and :math:`QL` directly keeps them (and the field) accurate to
    rounding, where :math:`(K^TQ)L` or :math:`L^TK^T` loses digits to cancellation.
    With :math:`[K; Q]` stacked once, one product gives both thin factors.
    """
    field = derive()
    L = S.L
    lhs = field.M.xreplace({S.Sigma: L * L.T}) * L
    rhs = (S.scale * S.V * L) * (S.K * L).T * (S.Q * L)
    return sp.simplify((lhs - rhs).doit()) == sp.ZeroMatrix(*lhs.shape)


def functions():
    """Generated-code functions (see :func:`derivations._symbolic.affine_functions`).

    The hoisted factor form is written in the thin-factor form of
    :func:`thin_factor_form` (checked symbolically) instead of the printer's default.
    """
    funcs = S.affine_functions(derive(), TITLE)
    kernel = next(f for f in funcs if isinstance(f, S.Kernel))
    funcs[funcs.index(kernel)] = S.Kernel(
        TITLE, kernel.latex,
        [("_w0", "scale * V"), ("_w1", "np.concatenate([K, Q], axis=-2)")],
        [("P", "_dot(_w1, L)")],
        "_dot(_dot(_w0, L), _dot(P[:_k].T, P[_k:]))",
        [("P", "_w1 @ L"), ("h", "P.shape[-2] // 2")],
        "(_w0 @ L) @ (_T(P[..., :h, :]) @ P[..., h:, :])",
        setup=(("_k", "K.shape[-2]"),))
    return funcs


CHECKS = dict(S.integration_checks(SCORE, derive))
CHECKS["thin-factor form of L' used by the hoisted kernels"] = thin_factor_form


if __name__ == "__main__":
    print(TITLE)
    S.print_field(derive())
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
