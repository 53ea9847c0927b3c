r"""Linear attention (no softmax normalisation): derivation of the moment equations.

Score :math:`s(x, y) = c\,\langle Qx, Ky\rangle = y^TAx` with :math:`A = cK^TQ`, and the
field is the unnormalised average

.. math::

    \Gamma[\mu](x) = V\int s(x, y)\,y\,d\mu(y)
                   = V\,\mathbb E[yy^T]\,Ax = V(\Sigma + \alpha\alpha^T)Ax

against :math:`\mu = \mathcal N(\alpha,\Sigma)`: affine (even linear) in ``x``, with

.. math::

    M = V(\Sigma + \alpha\alpha^T)A,\qquad b = 0,\qquad
    \alpha' = M\alpha,\qquad \Sigma' = M\Sigma + \Sigma M^T .

The field matrix depends on the mean as well as the covariance. The second moment
:math:`P = \Sigma + \alpha\alpha^T` obeys :math:`P' = MP + PM^T = VPAP + PA^TPV^T`:
plain softmax's covariance equation, so with :math:`V = I`,
:math:`P(t) = (P_0^{-1} - t(A + A^T))^{-1}`, blowing up at
:math:`t^* = 1/\lambda_{\max}(P_0^{1/2}(A + A^T)P_0^{1/2})`. In factor form the state
:math:`Z = [L \mid \alpha]` (``d x (d + 1)``) has :math:`ZZ^T = P`, and
:math:`Z' = MZ = (cVZ)(KZ)^T(QZ)`: one expression for the factor and the mean.

Run ``python derivations/linear.py`` (or ``python -m derivations.linear``) to print the
derivation and its checks.
"""

from __future__ import annotations

import sympy as sp

try:
    from . import _symbolic as S
    from . import softmax
except ImportError:  # run as a script
    import _symbolic as S
    import softmax

NAME = "linear"
TITLE = "Linear attention"
SCORE = S.scale * (S.Q * S.x).T * (S.K * S.y)
#: the second moment and the factor-form state [L | alpha]
P = S.Sigma + S.alpha * S.alpha.T
Z = sp.MatrixSymbol("Z", S.d, S.d + 1)


def derive():
    r"""The affine field :math:`b + Mx` of the unnormalised average of :data:`SCORE`.

    The score must be bilinear, :math:`s = y^TAx` (``H = 0``, ``g = 0``, no ``r(x)``):
    then :math:`\mathbb E[s(x, y)\,y] = \mathbb E[yy^T]Ax` with the Gaussian's second
    moment :math:`\mathbb E[yy^T] = \Sigma + \alpha\alpha^T`.
    """
    parts = S.decompose_quadratic_score(SCORE)
    rest = sp.expand(SCORE - (S.y.T * parts.A * S.x).T).doit()   # a 1 x 1 score
    if not (S.is_zero_matrix(parts.H) and S.is_zero_matrix(parts.g) and S.is_zero_matrix(rest)):
        raise ValueError("linear attention needs a bilinear score s = y^T A x")
    velocity = S.V * P * parts.A * S.x
    M = sp.expand(S.jacobian(velocity, S.x)).doit()
    b = sp.expand(velocity.subs(S.x, S.zero_vec)).doit()
    return S.AffineField(M=M, b=b, tilted_mean=P * parts.A * S.x, parts=parts)


def moment_equations():
    """``(M, mean_rhs, cov_rhs)`` of :func:`derive`."""
    field = derive()
    mean_rhs, cov_rhs, _ = S.moment_equations(field.M, field.b)
    return field.M, mean_rhs, cov_rhs


def factor_field():
    r""":math:`Z' = MZ` with :math:`\Sigma + \alpha\alpha^T` replaced by :math:`ZZ^T`."""
    return derive().M.xreplace({S.Sigma: Z * Z.T - S.alpha * S.alpha.T}).doit() * Z


def _factor_program():
    """:func:`factor_field` as the products the kernels evaluate, ``(cVZ)(KZ)^T(QZ)``."""
    return sp.MatMul(sp.MatMul(S.scale * S.V * Z, sp.Transpose(S.K * Z)), S.Q * Z)


#: the weights packed into the compiled head's ``data``: softmax's ``[c, cV, K, Q]``
INPUTS = softmax.INPUTS
#: the compiled head's field is :math:`Z' = M(P)Z` over the whole state, :math:`P = ZZ^T`
SECOND_MOMENT = True
#: the compiled head's products over the whole state: PZ = W Z, B = (cVZ)(KZ)^T
PZ = sp.MatrixSymbol("P", S.d + 2 * S.k, S.d + 1)
B = sp.MatrixSymbol("B", S.d, S.k)
P2 = sp.MatrixSymbol("P2", S.d, S.d)


def kernel_program():
    r""":math:`Z' = \big((cVZ)(KZ)^T\big)(QZ)` as the compiled head evaluates it.

    ``P = [cV; K; Q] Z`` (one product for the three factors, softmax's
    :func:`softmax.kernel_program` over all ``m`` columns), :math:`B = (cVZ)(KZ)^T`
    (summed over the ``m`` columns), then :math:`BQZ`.
    """
    d, k = S.d, S.k
    W = softmax.W
    return S.Program([(PZ, sp.MatMul(W, Z)),
                      (B, sp.MatMul(PZ[:d, :], sp.Transpose(PZ[d:d + k, :])))],
                     (sp.MatMul(B, PZ[d + k:d + 2 * k, :]),))


def parts_program():
    r"""The Jacobian's parts: :math:`A = cV`, :math:`C = K^TQ`, :math:`M = (A(ZZ^T))C`.

    :math:`dM[dP] = A\,dP\,C` for the second moment :math:`P = ZZ^T` (the Jacobian is
    assembled over the whole state: ``second_moment``).
    """
    d, k = S.d, S.k
    W = softmax.W
    return S.Program([(S.PART_A, W[:d, :]),
                      (S.PART_C, sp.MatMul(sp.Transpose(W[d:d + k, :]), W[d + k:d + 2 * k, :])),
                      (P2, sp.MatMul(Z, sp.Transpose(Z))),
                      (S.PART_M, sp.MatMul(sp.MatMul(S.PART_A, P2), S.PART_C))], ())


def check_kernel_program():
    r"""SymPy: :func:`kernel_program` composed back is :func:`factor_field`, :math:`M(ZZ^T)Z`."""
    return kernel_program().check(factor_field())


def check_parts():
    r"""SymPy: :math:`M = A(\Sigma + \alpha\alpha^T)C`, and the printed ``M`` is :math:`M` at :math:`ZZ^T`."""
    parts = parts_program()
    got = dict(zip((S.PART_A, S.PART_C, S.PART_M), (
        S.resolve_block_slices(e)
        for e in S.Program(parts.steps, (S.PART_A, S.PART_C, S.PART_M)).composed())))
    M = derive().M
    at_Z = {S.Sigma: Z * Z.T - S.alpha * S.alpha.T}
    return (S.is_zero_matrix(M - got[S.PART_A] * P * got[S.PART_C])
            and S.is_zero_matrix(sp.expand(M.xreplace(at_Z)).doit() - got[S.PART_M]))


def compiled_functions():
    """The printed head body and Jacobian parts (``field_body``, ``field_parts``)."""
    body_doc = (f"{TITLE}: the compiled head's :math:`Z' = \\big((cVZ)(KZ)^T\\big)(QZ)`.\n\n"
                "Over the whole state :math:`Z = [L \\mid \\alpha]` (``d x m``, row-major in "
                "``y``;\n:math:`ZZ^T = \\Sigma + \\alpha\\alpha^T`), the mean in its own units "
                "(``m = d + 1``).\n``data = [c, cV, K, Q]`` (row-major); ``out`` receives "
                ":math:`Z'`; ``ws``: scratch.\nPlain Python, compiled by Numba "
                "(``gaussian_pde.attention._compiled_fields``).\n")
    parts_doc = (f"{TITLE}: the parts of the compiled head's Jacobian (``second_moment``).\n\n"
                 ":math:`A = cV`, :math:`C = K^TQ` (:math:`dM[dP] = A\\,dP\\,C`, "
                 ":math:`P = ZZ^T`),\n:math:`M = A(ZZ^T)C`; ``N`` and ``r`` are not used. "
                 "``Z``: the state as a ``d x m`` array.\n")
    state = Z
    return [S.head_body("field_body", body_doc, INPUTS, kernel_program(), state=state,
                        second_moment=True),
            S.head_parts("field_parts", parts_doc, INPUTS, parts_program(), state=state)]


def check_offset_is_zero():
    """``b = 0``: the field is linear in ``x`` (no normalisation, no bias)."""
    return S.is_zero_matrix(S.simplify_matrix(derive().b))


def check_second_moment_riccati():
    r""":math:`(\Sigma + \alpha\alpha^T)' = MP + PM^T` with :math:`M = VPA` (softmax's equation for P)."""
    M, mean_rhs, cov_rhs = moment_equations()
    dP = cov_rhs + mean_rhs * S.alpha.T + S.alpha * mean_rhs.T
    diff = sp.expand(dP - (M * P + P * M.T)).doit()
    return (S.is_zero_matrix(S.simplify_matrix(diff))
            and S.is_zero_matrix(M - S.scale * S.V * P * S.K.T * S.Q))


def check_factor_form():
    r""":math:`Z' = (cVZ)(KZ)^T(QZ)` is :math:`[ML \mid M\alpha]` for :math:`Z = [L \mid \alpha]`.

    Checked with explicit entries (``d = 2``, ``k = 1``): the printed kernel's products,
    the factor field of :func:`factor_field`, and the moment equations of :func:`derive`
    at :math:`\Sigma = LL^T` agree entry by entry.
    """
    dims = {S.d: 2, S.k: 1}
    Ls = sp.Matrix(2, 2, sp.symbols("l11 l12 l21 l22", real=True))
    al = sp.Matrix(sp.symbols("a1 a2", real=True))
    subs = {S.Q: sp.Matrix([sp.symbols("q1 q2", real=True)]),
            S.K: sp.Matrix([sp.symbols("k1 k2", real=True)]),
            S.V: sp.Matrix(2, 2, sp.symbols("v11 v12 v21 v22", real=True)),
            S.scale: S.scale, S.alpha: al, S.Sigma: Ls * Ls.T}
    Zs = Ls.row_join(al)
    M, mean_rhs, _ = moment_equations()
    expected = (S.explicit(M, subs) * Ls).row_join(S.explicit(mean_rhs, subs))
    for expr in (factor_field(), _factor_program()):
        got = S.explicit(expr.subs(dims), {**subs, Z.subs(dims): Zs})
        if not (sp.expand(got - expected)).is_zero_matrix:
            return False
    return True


def check_by_integration(subs, dim, points=None):
    r""":math:`V\int s(x, y)\,y\,\mathcal N(y;\alpha,\Sigma)\,dy` by :func:`sympy.integrate`, minus ``b + Mx``."""
    xs = sp.Matrix(sp.symbols(f"x1:{dim + 1}", real=True))
    ys = sp.Matrix(sp.symbols(f"y1:{dim + 1}", real=True))
    Sig, al = subs[S.Sigma], subs[S.alpha]
    weight = sp.exp(-sp.Rational(1, 2) * ((ys - al).T * Sig.inv() * (ys - al))[0, 0])

    def integrate_all(f):
        for yi in ys:
            f = sp.integrate(f, (yi, -sp.oo, sp.oo), conds="none")
        return f

    field = derive()
    norm = integrate_all(weight)
    diffs = []
    for point in (points or [xs]):
        point = sp.Matrix(point)
        s = S.explicit(SCORE, {**subs, S.x: point, S.y: ys})[0, 0]
        avg = sp.Matrix([integrate_all(sp.expand(s * yi) * weight) / norm for yi in ys])
        derived = S.explicit(field.b + field.M * S.x, {**subs, S.x: point})
        diffs.append(sp.simplify(S.explicit(S.V, subs) * avg - derived))
    return sp.Matrix.hstack(*diffs).is_zero_matrix


def check_1d():
    """Direct integration, ``d = 1``, every weight a symbol."""
    q, kk, v, a = sp.symbols("q k_1 v a", real=True)
    c, sig = sp.symbols("c sigma", positive=True)
    return check_by_integration({S.Q: sp.Matrix([[q]]), S.K: sp.Matrix([[kk]]),
                                 S.V: sp.Matrix([[v]]), S.alpha: sp.Matrix([a]),
                                 S.Sigma: sp.Matrix([[sig**2]]), S.scale: c}, 1)


def check_2d():
    """Direct integration, ``d = 2``, ``k = 1`` (singular ``A``), correlated covariance."""
    R = sp.Rational
    subs = {S.Q: sp.Matrix([[1, R(1, 2)]]), S.K: sp.Matrix([[R(-1, 3), 1]]),
            S.V: sp.Matrix([[1, R(1, 4)], [0, 2]]), S.alpha: sp.Matrix([R(1, 2), -1]),
            S.Sigma: sp.Matrix([[2, R(1, 2)], [R(1, 2), 1]]), S.scale: R(1, 2)}
    return check_by_integration(subs, 2, [[0, 0], [1, 0], [R(-1, 2), 2]])


def _doc(what, args_doc):
    return f"{TITLE}: {what}\n{S.STATE_DOC}{args_doc}"


_ALPHA_DOC = "alpha : ndarray, shape (..., d)\n    Mean.\n"
_SIGMA_DOC = "Sigma : ndarray, shape (..., d, d)\n    Covariance.\n"


def functions():
    r"""The generated functions: the field matrix, the moment equations, the factor field.

    ``field_matrix`` and ``moment_rhs`` take the mean; ``factor_rhs`` takes the state
    :math:`Z = [L \mid \alpha]` and ``second_moment_rhs`` the second moment :math:`P`.
    """
    M, mean_rhs, cov_rhs = moment_equations()
    sig = S.SIGNATURE
    eq_M = S.latex_matrix(M)
    Pm = sp.MatrixSymbol("P", S.d, S.d)
    M_of_P = S.scale * S.V * Pm * S.K.T * S.Q      # M = cVPK^TQ (check_second_moment_riccati)
    dP = M_of_P * Pm + Pm * M_of_P.T
    return [
        S.Function("field_matrix", sig + ("alpha", "Sigma"),
                   _doc(f"linear part of the affine field, :math:`M = {eq_M}` "
                        "(the offset is zero).", _ALPHA_DOC + _SIGMA_DOC),
                   [("alpha", "alpha[..., None]"), ("M", S.numpy_code(M))], ("M",)),
        S.Function("moment_rhs", sig + ("alpha", "Sigma"),
                   _doc(f":math:`\\alpha' = {S.latex_matrix(mean_rhs)}`, "
                        f":math:`\\Sigma' = {S.latex_matrix(cov_rhs)}`, :math:`M = {eq_M}`.",
                        _ALPHA_DOC + _SIGMA_DOC),
                   [("alpha", "alpha[..., None]"), ("M", S.numpy_code(M)),
                    ("dalpha", S.numpy_code(S.M_sym * S.alpha)),
                    ("dSigma", S.numpy_code(S.M_sym * S.Sigma + S.Sigma * S.M_sym.T))],
                   ("dalpha[..., 0]", "dSigma")),
        S.Function("factor_rhs", sig + ("Z",),
                   _doc(f"factor form :math:`Z' = {S.latex_matrix(_factor_program())}` of "
                        ":math:`Z = [L \\mid \\alpha]`\n(:math:`ZZ^T = \\Sigma + "
                        "\\alpha\\alpha^T`): :math:`[ML \\mid M\\alpha]` in one product.",
                        "Z : ndarray, shape (..., d, d + 1)\n    The factor and the mean.\n"),
                   [("dZ", S.numpy_code(_factor_program()))], ("dZ",)),
        S.Function("second_moment_rhs", sig + ("P",),
                   _doc(f":math:`P' = {S.latex_matrix(dP)}` of the second moment "
                        ":math:`P = \\Sigma + \\alpha\\alpha^T`.",
                        "P : ndarray, shape (..., d, d)\n    Second moment.\n"),
                   [("M", S.numpy_code(M_of_P))], ("M @ P + P @ _T(M)",)),
    ] + compiled_functions()


CHECKS = {"direct integration, d = 1": check_1d, "direct integration, d = 2": check_2d,
          "the offset is zero": check_offset_is_zero,
          "the second moment obeys softmax's covariance equation": check_second_moment_riccati,
          "factor form Z' = (cVZ)(KZ)^T(QZ)": check_factor_form,
          "the compiled head's program is the factor form": check_kernel_program,
          "Jacobian parts: M = A (Sigma + alpha alpha^T) C": check_parts}


def equations_latex():
    """The ``derivations/equations.md`` section."""
    M, mean_rhs, cov_rhs = moment_equations()
    return [f"Score: $s(x, y) = {S.latex_matrix(SCORE)}$, field "
            "$\\Gamma(x) = V\\,\\mathbb E[s(x, y)\\,y]$ (no normalisation)", "",
            f"$$M = {S.latex_matrix(M)},\\qquad b = 0$$", "",
            f"$$\\alpha' = {S.latex_matrix(mean_rhs)}$$", "",
            f"$$\\Sigma' = {S.latex_matrix(cov_rhs)}$$", "",
            f"$$Z' = {S.latex_matrix(_factor_program())},\\qquad Z = [L \\mid \\alpha]$$", ""]


if __name__ == "__main__":
    print(TITLE)
    field = derive()
    print("  M =", field.M)
    print("  b =", field.b)
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
