r"""Softmax attention with query and key biases: derivation of the moment equations.

Score :math:`s(x, y) = c\,(Qx + q)^T(Ky + k_b)` (BERT, GPT-2: the projections carry
biases). It is linear in ``y``, :math:`s = y^T(Ax + g) + r(x)` with :math:`A = cK^TQ`,
:math:`g = cK^Tq` and :math:`r(x) = c(Qx + q)^Tk_b`, which cancels in the normalisation:
the key bias drops out. The tilted Gaussian has mean :math:`\alpha + \Sigma(Ax + g)`, so

.. math::

    M = V\Sigma A,\qquad b = V(\alpha + c\,\Sigma K^Tq),\qquad
    \alpha' = V(\alpha + \Sigma A\alpha + c\,\Sigma K^Tq),\qquad
    \Sigma' = V\Sigma A\Sigma + \Sigma A^T\Sigma V^T .

The covariance equation is that of plain softmax; the mean's equation has the extra
drift :math:`cV\Sigma K^Tq` (it is no longer homogeneous in the mean).

Run ``python derivations/biased_softmax.py`` (or ``python -m derivations.biased_softmax``)
to print the derivation and its checks.
"""

from __future__ import annotations

import sympy as sp

try:
    from . import _symbolic as S
    from . import softmax
except ImportError:  # run as a script
    import _symbolic as S
    import softmax

NAME = "biased_softmax"
TITLE = "Biased softmax attention"
q = sp.MatrixSymbol("q", S.k, 1)
k_b = sp.MatrixSymbol("k_b", S.k, 1)
SCORE = S.scale * (S.Q * S.x + q).T * (S.K * S.y + k_b)
#: the weights every generated function takes (``BiasedSoftmax.weights()``)
SIGNATURE = S.SIGNATURE + ("q", "k_b")
WEIGHTS_DOC = """q, k_b : ndarray, shape (..., k, 1)
    Query and key biases (the key bias cancels).
"""


def derive():
    """The affine field of the biased score (:func:`_symbolic.quadratic_score_field`)."""
    return S.quadratic_score_field(SCORE)


#: the weights packed into the compiled head's ``data``: softmax's and the query bias
INPUTS = softmax.INPUTS + ((q, "q", "k", "1"),)


#: ``M`` and ``b`` grouped as ``field_matrix`` and ``field_offset`` evaluate them:
#: softmax's :math:`c\,(V(\Sigma K^T))Q` and :math:`V(\alpha + c\,\Sigma(K^Tq))`, products of
#: :math:`O(d^2k)` and :math:`O(d^2)` where the derived order starts with :math:`V\Sigma`
FORMS = {"M": softmax.FORMS["M"],
         "b": sp.MatMul(S.V, sp.MatAdd(S.alpha, sp.MatMul(S.scale, sp.MatMul(
             S.Sigma, sp.MatMul(S.K.T, q)))))}


def functions():
    r"""The generated functions: the affine field, the moment equations and the compiled head.

    The head is softmax's programs (:func:`softmax.kernel_program`) with the query bias
    added to :math:`Q\alpha`: the covariance is softmax's, the mean gains :math:`V\Sigma g`.
    """
    return (S.affine_functions(derive(), TITLE, signature=SIGNATURE, weights_doc=WEIGHTS_DOC,
                               kernel=False, forms=FORMS)
            + softmax.compiled_functions(TITLE, INPUTS, bias=q))


def check_zero_bias():
    """At ``q = 0`` (any ``k_b``) the field is plain softmax's: ``M = V Sigma A``, ``b = V alpha``."""
    field = derive()
    zero = {q: sp.ZeroMatrix(S.k, 1)}
    A = S.scale * S.K.T * S.Q
    dM = S.simplify_matrix(field.M.xreplace(zero) - S.V * S.Sigma * A)
    db = S.simplify_matrix(field.b.xreplace(zero) - S.V * S.alpha)
    return all(e in (0, sp.ZeroMatrix(*e.shape)) or getattr(e, "is_ZeroMatrix", False)
               for e in (dM, db))


def check_key_bias_cancels():
    """Neither ``M`` nor ``b`` involves the key bias."""
    field = derive()
    return k_b not in field.M.free_symbols | field.b.free_symbols


_R = sp.Rational
CHECKS = dict(S.integration_checks(
    SCORE, derive,
    extra_1d={q: sp.Matrix([[sp.Symbol("q_b", real=True)]]),
              k_b: sp.Matrix([[sp.Symbol("k_bias", real=True)]])},
    extra_2d={q: sp.Matrix([[_R(1, 3)]]), k_b: sp.Matrix([[_R(-2, 5)]])}))
CHECKS["zero query bias is plain softmax"] = check_zero_bias
CHECKS["the key bias cancels"] = check_key_bias_cancels
CHECKS["thin-factor form of L' (softmax's)"] = softmax.thin_factor_form
CHECKS["mean column alpha' = B(Q alpha + q) + (cV alpha)/c"] = (
    lambda: softmax.mean_form(derive, bias=q))
CHECKS["Jacobian parts: M = A Sigma C, N, r = C alpha + K^T q"] = (
    lambda: softmax.jacobian_parts(derive, bias=q))
CHECKS["field_matrix's and field_offset's groupings are M and b"] = (
    lambda: S.check_forms(derive, FORMS))


if __name__ == "__main__":
    print(TITLE)
    S.print_field(derive())
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
