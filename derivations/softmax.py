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
#: P = W L = [cVL; KL; QL]; B = (cVL)(KL)^T; with the mean, Pa = W alpha
W = sp.BlockMatrix([[S.scale * S.V], [S.K], [S.Q]])
P = sp.MatrixSymbol("P", S.d + 2 * S.k, S.d)
B = sp.MatrixSymbol("B", S.d, S.k)
Pa = sp.MatrixSymbol("Pa", S.d + 2 * S.k, 1)
Sg = sp.MatrixSymbol("S", S.d, S.d)
#: the weights packed into the compiled head's ``data``: ``[c, cV, K, Q]`` (row-major)
INPUTS = ((S.scale, "c", None, None), (W, "W", "d + 2 * k", "d"))


def _rows(X, start, stop):
    return X[start:stop, :]


def kernel_program():
    r"""The kernel :math:`L' = \big((cVL)(KL)^T\big)(QL)` as a program of SymPy expressions.

    ``P = [cV; K; Q] L``: one product gives the three factors, ``cVL = P[:d]``,
    ``KL = P[d:d+k]`` and ``QL = P[d+k:]``; the products are grouped as the kernels
    evaluate them, the thin ``d x k`` product :math:`B = (cVL)(KL)^T` first. Printed into
    the compiled head body by :func:`derivations._symbolic.head_body` and checked by
    :func:`thin_factor_form`.
    """
    d, k = S.d, S.k
    return S.Program([(P, sp.MatMul(W, S.L)),
                      (B, sp.MatMul(_rows(P, 0, d), sp.Transpose(_rows(P, d, d + k))))],
                     (sp.MatMul(B, _rows(P, d + k, d + 2 * k)),))


def mean_program(bias=None):
    r""":math:`\alpha' = B(Q\alpha + q) + (cV\alpha)/c` after :func:`kernel_program`.

    ``Pa = [cV; K; Q]\alpha`` (one product for the three, as ``P``); ``bias``: the query
    bias :math:`q` added to :math:`Q\alpha` (biased softmax), None for none.
    """
    d, k = S.d, S.k
    steps = [(Pa, sp.MatMul(W, S.alpha))]
    Qa = _rows(Pa, d + k, d + 2 * k)
    if bias is not None:
        Qb = sp.MatrixSymbol("Qb", k, 1)
        steps.append((Qb, sp.MatAdd(Qa, bias)))
        Qa = Qb
    return S.Program(steps, (sp.MatAdd(sp.MatMul(B, Qa),
                                       sp.MatMul(S.scale ** -1, _rows(Pa, 0, d))),))


def parts_program():
    r"""The Jacobian's parts: :math:`A = cV`, :math:`C = K^TQ`, :math:`M = (A(LL^T))C`."""
    d, k = S.d, S.k
    return S.Program([(S.PART_A, _rows(W, 0, d)),
                      (S.PART_C, sp.MatMul(sp.Transpose(_rows(W, d, d + k)), _rows(W, d + k, d + 2 * k))),
                      (Sg, sp.MatMul(S.L, sp.Transpose(S.L))),
                      (S.PART_M, sp.MatMul(sp.MatMul(S.PART_A, Sg), S.PART_C))], ())


def mean_parts_program(bias=None):
    r""":math:`N = A/c + M = V + M` and :math:`r = C\alpha` (:math:`+ K^Tq` with a query bias)."""
    d, k = S.d, S.k
    r = sp.MatMul(S.PART_C, S.alpha)
    if bias is not None:
        r = sp.MatAdd(r, sp.MatMul(sp.Transpose(_rows(W, d, d + k)), bias))
    return S.Program([(S.PART_N, sp.MatAdd(sp.MatMul(S.scale ** -1, S.PART_A), S.PART_M)),
                      (S.PART_r, r)], ())


def thin_factor_form():
    r"""SymPy check: :math:`L' = cV L L^TK^TQL = \big((cVL)(KL)^T\big)(QL)`, the printed kernel.

    The right-hand side is :func:`kernel_program` composed back (its block slices of
    :math:`[cV; K; Q]L` resolved), i.e. what the compiled kernels evaluate. Near a steady
    state (``K = -Q``, :math:`QL \to 0`) the field is tiny while ``L`` is O(1); computing
    the thin factors :math:`KL` and :math:`QL` directly keeps them (and the field) accurate
    to rounding, where :math:`(K^TQ)L` or :math:`L^TK^T` loses digits to cancellation.
    With :math:`[cV; K; Q]` stacked once, one product gives all three factors.
    """
    field = derive()
    return kernel_program().check(field.M.xreplace({S.Sigma: S.L * S.L.T}) * S.L)


def mean_form(derive=derive, bias=None):
    r"""SymPy check: :func:`mean_program` after :func:`kernel_program` is :math:`b + M\alpha`."""
    field = derive()
    mean = S.Program(kernel_program().steps + mean_program(bias).steps, mean_program(bias).returns)
    return mean.check((field.b + field.M * S.alpha).xreplace({S.Sigma: S.L * S.L.T}))


def jacobian_parts(derive=derive, bias=None):
    r"""SymPy check of the printed parts, :math:`M = A\Sigma C`, ``N``, ``r`` (:func:`_symbolic.check_parts`)."""
    return S.check_parts(derive(), parts_program(), mean_parts_program(bias))


BODY_DOC = r"""{title}: the compiled head's :math:`Z' = [L' \mid \alpha']`.

:math:`L' = \big((cVL)(KL)^T\big)(QL)`, :math:`\alpha' = B(Q\alpha{q}) + (cV\alpha)/c`
with :math:`B = (cVL)(KL)^T`. ``data = [c, cV, K, Q{qd}]`` (row-major); ``y``: the state
:math:`Z = [L \mid \alpha]` (``d x m``, row-major, ``m = d`` without the mean); ``out``
receives :math:`Z'`; ``ws``: scratch. Plain Python, compiled by Numba
(``gaussian_pde.attention._compiled_fields``).
"""

PARTS_DOC = r"""{title}: the parts of the compiled head's Jacobian.

:math:`A = cV`, :math:`C = K^TQ` (:math:`dM[d\Sigma] = A\,d\Sigma\,C`),
:math:`M = A(LL^T)C`; with the mean (``m > d``) :math:`N = A/c + M = V + M`
(:math:`\partial\alpha'/\partial\alpha`) and :math:`r = C\alpha{r}`
(:math:`d\alpha'[d\Sigma] = A\,d\Sigma\,r`). ``Z``: the state as a ``d x m`` array.
"""


def compiled_functions(title, inputs=INPUTS, bias=None):
    """The printed head body and Jacobian parts (``field_body``, ``field_parts``)."""
    fmt = dict(title=title, q=" + q" if bias is not None else "", qd=", q" if bias is not None else "",
               r=" + K^Tq" if bias is not None else "")
    return [S.head_body("field_body", BODY_DOC.format(**fmt), inputs, kernel_program(),
                        mean_program(bias)),
            S.head_parts("field_parts", PARTS_DOC.format(**fmt), inputs, parts_program(),
                         mean_parts_program(bias))]


#: the field matrix grouped as ``field_matrix`` evaluates it, :math:`c\,(V(\Sigma K^T))Q`:
#: three products of :math:`O(d^2k)` where :math:`V\Sigma` first costs :math:`O(d^3)` (the
#: heads of a wide model, :math:`k = d/H`, stay cheap)
FORMS = {"M": sp.MatMul(S.scale, sp.MatMul(sp.MatMul(S.V, sp.MatMul(S.Sigma, S.K.T)), S.Q))}


def functions():
    """Generated-code functions: :func:`derivations._symbolic.affine_functions` and the compiled head."""
    return (S.affine_functions(derive(), TITLE, kernel=False, forms=FORMS)
            + compiled_functions(TITLE))


CHECKS = dict(S.integration_checks(SCORE, derive))
CHECKS["thin-factor form of L' printed into the compiled head"] = thin_factor_form
CHECKS["mean column alpha' = B Q alpha + (cV alpha)/c"] = mean_form
CHECKS["Jacobian parts: M = A Sigma C, N, r"] = jacobian_parts
CHECKS["field_matrix's grouping c (V (Sigma K^T)) Q is M"] = lambda: S.check_forms(derive, FORMS)


if __name__ == "__main__":
    print(TITLE)
    S.print_field(derive())
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
