r"""L2 attention: derivation of the Gaussian moment equations.

Score :math:`s(x, y) = -c\,|Qx - Ky|^2`. Differentiating in ``y`` gives
:math:`H = 2c\,K^TK` (positive semi-definite, so the tilted Gaussian always exists),
:math:`A = 2c\,K^TQ` and :math:`g = 0`; the tilted mean is
:math:`(I + 2c\,\Sigma K^TK)^{-1}(\alpha + 2c\,\Sigma K^TQ x)` and

.. math::

    M = 2c\,V(I + 2c\,\Sigma K^TK)^{-1}\Sigma K^TQ,\qquad
    b = V(I + 2c\,\Sigma K^TK)^{-1}\alpha .

No inverse of :math:`\Sigma`, ``K`` or ``Q`` appears: the formula holds for singular
covariances and for ``k < d``. Run ``python derivations/l2.py`` to print the derivation.

The printed code does not solve with :math:`I + 2c\,\Sigma K^TK` (whose condition number
grows with the covariance: an LU solve leaves relative errors of ``1e-7`` in the field
once :math:`\Sigma` spans eight orders of magnitude, and is singular in floating point at
:math:`\Sigma\sim 10^{300}`). With a factor :math:`R` of :math:`\Sigma` (:math:`L`, or
:math:`\Sigma^{1/2}` in the covariance forms) and :math:`B = \sqrt{2c}\,KR`, the
push-through identity gives

.. math::

    M = \sqrt{2c}\,VR\,G\,Q,\qquad b = V(\alpha - \sqrt{2c}\,RG\,K\alpha),\qquad
    G = (I + B^TB)^{-1}B^T,

and ``G`` is printed as the helper ``l2_gain``
(:class:`~derivations._symbolic.RegularizedGain`: a Cholesky solve while
:math:`\|B\|_F^2 < 10^3`, Householder QR of :math:`[B;\ I_d]` beyond), accurate for
every scale.
:func:`check_programs` checks the printed programs against the derived field on random
matrices (singular ones included).
"""

from __future__ import annotations

import numpy as np
import sympy as sp

try:
    from . import _symbolic as S
except ImportError:  # run as a script
    import _symbolic as S

NAME = "l2"
TITLE = "L2 attention"
SCORE = -S.scale * (S.Q * S.x - S.K * S.y).T * (S.Q * S.x - S.K * S.y)


def derive():
    """The affine field of L2 attention against a Gaussian."""
    return S.quadratic_score_field(SCORE)


def functions_direct():
    """The derived field printed as it stands (LU solves with ``P``), for the checks."""
    return S.affine_functions(derive(), TITLE)


# ------------------------------------------------------------ printed programs

_s = sp.sqrt(2 * S.scale)
_B = sp.MatrixSymbol("B", S.k, S.d)
_G = sp.MatrixSymbol("G", S.d, S.k)
_R = sp.MatrixSymbol("R", S.d, S.d)
_M = sp.MatrixSymbol("M", S.d, S.d)
_MR = sp.MatrixSymbol("MR", S.d, S.d)
_X = sp.MatrixSymbol("X", S.d, S.d)
_QL = sp.MatrixSymbol("QL", S.k, S.d)
_Ks = sp.MatrixSymbol("Ks", S.k, S.d)
_Vs = sp.MatrixSymbol("Vs", S.d, S.d)


def programs():
    r"""The printed straight-line programs (push-through form with the gain helper).

    ``R`` is the factor: :math:`\Sigma^{1/2}` in the covariance forms, ``L`` in the
    factor forms. :math:`M\Sigma` is printed as :math:`(MR)R^T`.
    """
    gain = S.RegularizedGain
    cov_steps = [(_R, S.PsdSqrt(S.Sigma)), (_B, _s * S.K * _R), (_G, gain(_B)),
                 (_M, _s * S.V * _R * _G * S.Q)]
    offset = S.V * S.alpha - _s * S.V * _R * _G * S.K * S.alpha
    cov = [(_MR, _M * _R)]
    dsigma = _MR * _R.T + _R * _MR.T
    kernel = S.Program([(_Ks, _s * S.K), (_Vs, _s * S.V), (_B, _Ks * S.L), (_G, gain(_B)),
                        (_QL, S.Q * S.L), (_X, _G * _QL)],
                       (sp.MatMul(_Vs, S.L, _X),))
    return {
        "field_matrix": S.Program(cov_steps, (_M,)),
        "field_offset": S.Program(cov_steps[:3], (offset,)),
        "moment_rhs": S.Program(cov_steps + cov, (_M * S.alpha + offset, dsigma)),
        "cov_rhs": S.Program(cov_steps + cov, (dsigma,)),
        "factor_rhs": S.Program([(_B, _s * S.K * S.L), (_G, gain(_B)), (_QL, S.Q * S.L),
                                 (_X, _G * _QL)], (_s * S.V * S.L * _X,)),
        "kernel": kernel,
    }


# ------------------------------------------------------------ the compiled head

#: :math:`s = \sqrt{2c}` as a symbol of its own in the compiled head's programs, so that
#: coefficients print as the kernel evaluates them (``2.0 * c / s``); :data:`DEFINITIONS`
#: gives its value for the checks
s_ = sp.Symbol("s", positive=True)
DEFINITIONS = {s_: _s}
#: the weights packed into the compiled head's ``data``: ``[c, s, sV, sK, Q, V, K]``
INPUTS = ((S.scale, "c", None, None), (s_, "s", None, None), (s_ * S.V, "sV", "d", "d"),
          (s_ * S.K, "sK", "k", "d"), (S.Q, "Q", "k", "d"), (S.V, "V", "d", "d"),
          (S.K, "K", "k", "d"))
_Bm = sp.MatrixSymbol("B", S.k, S.d)
_Gm = sp.MatrixSymbol("G", S.d, S.k)
_E = sp.MatrixSymbol("E", S.k, S.k)
_XL = sp.MatrixSymbol("X", S.d, S.d)
_GQ = sp.MatrixSymbol("GQ", S.d, S.d)
_QmK = sp.MatrixSymbol("QmK", S.k, S.d)
_QKa = sp.MatrixSymbol("QKa", S.k, 1)
_Xa = sp.MatrixSymbol("Xa", S.d, 1)
_Ga = sp.MatrixSymbol("Ga", S.d, 1)
_LG = sp.MatrixSymbol("LG", S.d, S.k)
_LGK = sp.MatrixSymbol("LGK", S.d, S.d)
_Xi = sp.MatrixSymbol("Xi", S.d, S.d)
_LGQ = sp.MatrixSymbol("LGQ", S.d, S.d)
_EQ = sp.MatrixSymbol("EQ", S.k, S.d)
_Eq = sp.MatrixSymbol("Eq", S.k, 1)


def head_programs():
    r"""The compiled head's programs: the field, its mean column, the Jacobian's parts.

    With :math:`B = sKL`, :math:`G = (I + B^TB)^{-1}B^T` (``gain``, the package's helper:
    a Cholesky solve or a QR) and :math:`E = (I_k + BB^T)^{-1}`:
    :math:`L' = (sVL)\,(G\,QL)`, :math:`\alpha' = (sVL)\,G(Q - K)\alpha + (sV\alpha)/s`;
    the parts :math:`A = 2cV(I - s\,LGK)`, :math:`C = K^T(EQ)`,
    :math:`M = (2c/s)\,V(LGQ)`, :math:`N = A/(2c) + M`, :math:`r = K^T(E(Q - K)\alpha)`.
    """
    gain, sV, sK = S.RegularizedGain(_Bm), s_ * S.V, s_ * S.K
    field = S.Program([(_Bm, sp.MatMul(sK, S.L)), ((_Gm,), (gain,)),
                       (_XL, sp.MatMul(sV, S.L)), (_GQ, sp.MatMul(_Gm, sp.MatMul(S.Q, S.L)))],
                      (sp.MatMul(_XL, _GQ),))
    mean = S.Program([(_QmK, sp.MatAdd(S.Q, -S.K)), (_QKa, sp.MatMul(_QmK, S.alpha)),
                      (_Xa, sp.MatMul(sV, S.alpha)), (_Ga, sp.MatMul(_Gm, _QKa))],
                     (sp.MatAdd(sp.MatMul(_XL, _Ga), sp.MatMul(s_ ** -1, _Xa)),))
    parts = S.Program([
        (_Bm, sp.MatMul(sK, S.L)), ((_Gm, _E), (gain, S.InverseGram(_Bm))),
        (_LG, sp.MatMul(S.L, _Gm)), (_LGK, sp.MatMul(_LG, S.K)),
        (_Xi, sp.MatAdd(sp.Identity(S.d), sp.MatMul(-s_, _LGK))),
        (_LGQ, sp.MatMul(_LG, S.Q)),
        (S.PART_A, sp.MatMul(2 * S.scale, sp.MatMul(S.V, _Xi))),
        (S.PART_M, sp.MatMul(2 * S.scale / s_, sp.MatMul(S.V, _LGQ))),
        (_EQ, sp.MatMul(_E, S.Q)), (S.PART_C, sp.MatMul(S.K.T, _EQ))], ())
    mean_parts = S.Program([
        (S.PART_N, sp.MatAdd(sp.MatMul(1 / (2 * S.scale), S.PART_A), S.PART_M)),
        (_QmK, sp.MatAdd(S.Q, -S.K)), (_QKa, sp.MatMul(_QmK, S.alpha)),
        (_Eq, sp.MatMul(_E, _QKa)), (S.PART_r, sp.MatMul(S.K.T, _Eq))], ())
    return field, mean, parts, mean_parts


def _explicit_values(d, k, seed):
    """Random rational weights and state (``d``, ``k``) with :math:`2c` a square: ``s`` rational."""
    rng = np.random.default_rng(seed)

    def rat(rows, cols):
        return sp.Matrix(rows, cols, lambda i, j: sp.Rational(int(rng.integers(-9, 10)), 4))

    return {S.Q: rat(k, d), S.K: rat(k, d), S.V: rat(d, d), S.L: rat(d, d),
            S.alpha: rat(d, 1), S.scale: sp.Rational(9, 8)}


def check_head_programs(seed=0, shapes=((2, 1), (2, 2), (3, 2))):
    r"""The compiled head's programs against the derived field, exactly (SymPy rationals).

    With :math:`c = 9/8` (:math:`s = 3/2`) and random rational weights: the programs
    composed back (the gain and :math:`E` by their definitions) give
    :math:`L' = M(LL^T)L` and :math:`\alpha' = b + M\alpha`; the parts give
    :math:`A\,d\Sigma\,C = \tfrac{d}{dt}M(LL^T + t\,d\Sigma)` at ``t = 0`` for a
    symmetric :math:`d\Sigma`, the printed ``M``, :math:`N\alpha = \alpha'(\alpha) -
    \alpha'(0)` and :math:`A\,d\Sigma\,r = \tfrac{d}{dt}\alpha'(LL^T + t\,d\Sigma)`.
    """
    field = derive()
    t = sp.Symbol("t")
    field_p, mean_p, parts_p, mean_parts_p = head_programs()
    ok = True
    for i, (d, k) in enumerate(shapes):
        vals = _explicit_values(d, k, seed + i)
        G = sp.Matrix(d, d, lambda a, b: sp.Rational(a + 2 * b + 1, 3))
        dSig = G + G.T
        Sig0 = vals[S.L] * vals[S.L].T

        def ex(expr, sig=Sig0, vals=vals):
            expr = S.expand_nodes(expr.xreplace(DEFINITIONS))
            return S.explicit(expr.xreplace({S.Sigma: S.Sigma}), {**vals, S.Sigma: sig})

        M0 = ex(field.M)
        mean = field.b + field.M * S.alpha
        got = [sp.simplify(e) for e in (ex(x) for x in S.Program(
            field_p.steps + mean_p.steps, field_p.returns + mean_p.returns).composed())]
        ok &= (got[0] - M0 * vals[S.L]).is_zero_matrix
        ok &= (got[1] - ex(mean)).is_zero_matrix
        targets = (S.PART_A, S.PART_C, S.PART_M, S.PART_N, S.PART_r)
        A, C, Mp, N, r = (ex(x) for x in S.Program(parts_p.steps + mean_parts_p.steps,
                                                    targets).composed())
        dM = ex(field.M, Sig0 + t * dSig).diff(t).subs(t, 0)
        dmean = ex(mean, Sig0 + t * dSig).diff(t).subs(t, 0)
        zero_a = {**vals, S.alpha: sp.zeros(d, 1)}
        ok &= (A * dSig * C - dM).applyfunc(sp.simplify).is_zero_matrix
        ok &= (Mp - M0).applyfunc(sp.simplify).is_zero_matrix
        ok &= (N * vals[S.alpha] - (ex(mean) - ex(mean, vals=zero_a))).applyfunc(
            sp.simplify).is_zero_matrix
        ok &= (A * dSig * r - dmean).applyfunc(sp.simplify).is_zero_matrix
    return bool(ok)


_BODY_DOC = r"""L2 attention: the compiled head's :math:`Z' = [L' \mid \alpha']`.

:math:`L' = (sVL)\,(G\,QL)`, :math:`\alpha' = (sVL)\,G(Q - K)\alpha + (sV\alpha)/s`,
:math:`G = (I + B^TB)^{-1}B^T` of :math:`B = sKL` (``gain``: a Cholesky solve while
:math:`\|B\|_F^2 < 10^3`, Householder QR beyond), :math:`s = \sqrt{2c}`. NaN where
:math:`B` is not finite. ``data = [c, s, sV, sK, Q, V, K]`` (row-major); ``y``: the state
:math:`Z = [L \mid \alpha]` (``d x m``, row-major); ``ws``: scratch. Plain Python,
compiled by Numba (``gaussian_pde.attention._compiled_fields``).
"""

_PARTS_DOC = r"""L2 attention: the parts of the compiled head's Jacobian.

With :math:`G` the gain of :math:`B = sKL`, :math:`E = (I_k + BB^T)^{-1}` and
:math:`\Xi = I - sLGK`: :math:`A = 2cV\Xi`, :math:`C = K^TEQ`
(:math:`dM[d\Sigma] = A\,d\Sigma\,C`), :math:`M = (2c/s)\,VLGQ`, :math:`N = A/(2c) + M`,
:math:`r = K^TE(Q - K)\alpha`. False where the column norms of :math:`L` span
``SPREAD_MAX`` or more (the closed form loses its digits) or :math:`B` is not finite.
"""


def compiled_functions():
    """The printed head body and Jacobian parts (``field_body``, ``field_parts``)."""
    field, mean, parts, mean_parts = head_programs()
    # the products by calls: L2's head is the largest to compile, and next to its gain a
    # call per product is a few per cent of an evaluation
    return [S.head_body("field_body", _BODY_DOC, INPUTS, field, mean, calls=True),
            S.head_parts("field_parts", _PARTS_DOC, INPUTS, parts, mean_parts,
                         guards=("_kernels.spread_ok(Z, d)",))]


def _doc(text, *params):
    docs = {"Sigma": "Sigma : ndarray, shape (..., d, d)\n    Covariance.\n",
            "alpha": "alpha : ndarray, shape (..., d)\n    Mean.\n",
            "L": "L : ndarray, shape (..., d, d)\n    Factor of the covariance.\n"}
    return text + "\n" + S.STATE_DOC + "".join(docs[p] for p in params)


_GAIN_DOC = (r"with :math:`G = (I + B^TB)^{-1}B^T` from ``l2_gain`` of :math:`B = \sqrt{2c}\,KR`,"
             "\n" r":math:`R = \Sigma^{1/2}` (no solve with the ill-conditioned "
             r":math:`I + 2c\,\Sigma K^TK`).")


def functions():
    """Generated-code functions for L2 attention, printed from :func:`programs`."""
    field = derive()
    mean_rhs, cov_rhs, factor_rhs = S.moment_equations(S.M_sym, S.b_sym)
    eq_M, eq_b = S.latex_matrix(field.M), S.latex_matrix(field.b)
    progs = programs()
    code = {name: prog.code(S.NumpyMatrixPrinter({"alpha": "alpha[..., None]"}))
            for name, prog in progs.items() if name != "kernel"}
    vec = "[..., 0]"
    return [
        S.Function(
            "field_matrix", S.SIGNATURE + ("Sigma",),
            _doc(f"{TITLE}: linear part of the affine field, :math:`M = {eq_M}`,\n"
                 r"computed as :math:`M = \sqrt{2c}\,VRGQ` " + _GAIN_DOC, "Sigma"),
            *code["field_matrix"]),
        S.Function(
            "field_offset", S.SIGNATURE + ("alpha", "Sigma"),
            _doc(f"{TITLE}: constant part of the affine field, :math:`b = {eq_b}`,\n"
                 r"computed as :math:`b = V(\alpha - \sqrt{2c}\,RGK\alpha)` " + _GAIN_DOC,
                 "alpha", "Sigma"),
            code["field_offset"][0], (code["field_offset"][1][0] + vec,)),
        S.Function(
            "moment_rhs", S.SIGNATURE + ("alpha", "Sigma"),
            _doc(f"{TITLE}: :math:`\\alpha' = {S.latex_matrix(mean_rhs)}`, "
                 f":math:`\\Sigma' = {S.latex_matrix(cov_rhs)}`;\n"
                 r":math:`M` and :math:`b` as in ``field_matrix`` and ``field_offset``, "
                 r":math:`M\Sigma = (MR)R^T`.", "alpha", "Sigma"),
            code["moment_rhs"][0], (code["moment_rhs"][1][0] + vec, code["moment_rhs"][1][1])),
        S.Function(
            "cov_rhs", S.SIGNATURE + ("Sigma",),
            _doc(f"{TITLE}: covariance equation :math:`\\Sigma' = {S.latex_matrix(cov_rhs)}`"
                 r", :math:`M\Sigma = (MR)R^T`.", "Sigma"),
            *code["cov_rhs"]),
        S.Function(
            "factor_rhs", S.SIGNATURE + ("L",),
            _doc(f"{TITLE}: factor form :math:`L' = {S.latex_matrix(factor_rhs)}` with "
                 r":math:`\Sigma = LL^T`, computed as :math:`L' = \sqrt{2c}\,VL\,G\,QL`,"
                 "\n" r":math:`G = (I + B^TB)^{-1}B^T` from ``l2_gain`` of "
                 r":math:`B = \sqrt{2c}\,KL`;" "\nit keeps :math:`\\Sigma` symmetric PSD "
                 "and its rank.", "L"),
            *code["factor_rhs"]),
    ] + compiled_functions()


def _compiled(funcs):
    """Compile the generated NumPy functions (``Function`` items) into a namespace."""
    linalg = S.load_linalg()
    funcs = [f for f in funcs if isinstance(f, S.Function)]       # not the compiled head
    src = S.render_module("l2.py", "check", funcs).split("__all__", 1)[1].split("\n", 1)[1]
    ns = {"np": np, "_T": linalg.T, "_l2_gain": linalg.l2_gain, "_solve": linalg.solve,
          "_psd_sqrt": linalg.psd_sqrt}
    exec(compile(src, "<l2 check>", "exec"), ns)
    return ns


def check_programs(seed=0, trials=30):
    r"""The printed programs against the derived field printed directly, on random matrices.

    For each trial: ``d`` in 1..5, ``k`` in 1..6 (``k < d`` and ``k > d``), a covariance of
    random rank (singular ones included), random weights and scale. Compares
    ``field_matrix``, ``field_offset``, ``moment_rhs``, ``cov_rhs``, ``factor_rhs`` and the
    kernel (one state and batched) with the direct printing of :func:`derive` (LU solves
    with :math:`I + 2c\Sigma K^TK`, accurate on these well-conditioned draws). Returns
    the largest relative difference.
    """
    new, ref = _compiled(functions()), _compiled(functions_direct())
    rng = np.random.default_rng(seed)
    worst = 0.0

    def rel(a, b):
        return np.abs(a - b).max() / max(np.abs(b).max(), 1e-300)

    for _ in range(trials):
        d, k = int(rng.integers(1, 6)), int(rng.integers(1, 7))
        r = int(rng.integers(1, d + 1))
        Q, K = rng.standard_normal((k, d)), rng.standard_normal((k, d))
        V, c = rng.standard_normal((d, d)), float(rng.uniform(0.2, 2.0))
        G = rng.standard_normal((d, r))
        Sig, a = G @ G.T, rng.standard_normal(d)
        L = new["_psd_sqrt"](Sig)
        w = (Q, K, V, c)
        worst = max(worst, rel(new["field_matrix"](*w, Sig), ref["field_matrix"](*w, Sig)),
                    rel(new["field_offset"](*w, a, Sig), ref["field_offset"](*w, a, Sig)),
                    rel(new["cov_rhs"](*w, Sig), ref["cov_rhs"](*w, Sig)),
                    rel(new["factor_rhs"](*w, L), ref["factor_rhs"](*w, L)))
        for x, y in zip(new["moment_rhs"](*w, a, Sig), ref["moment_rhs"](*w, a, Sig)):
            worst = max(worst, rel(x, y))
    return worst


def check_extreme_scale():
    r"""The printed field stays finite and accurate where the direct form fails.

    :math:`\Sigma = 10^{300}\,\mathrm{diag}(1, 10^{-6})` with ``k = 1`` (a rank-one
    :math:`K^TK`): :math:`I + 2c\Sigma K^TK` is singular in floating point, while
    :math:`M = \sqrt{2c}\,VRGQ` is finite and, for ``V = I`` and ``Q = K``, equals the
    projection limit :math:`\Sigma K^T(K\Sigma K^T)^{-1}K` to rounding.
    """
    new = _compiled(functions())
    K = np.array([[1.0, 1.0]])
    Sig = 1e300 * np.diag([1.0, 1e-6])
    M = new["field_matrix"](K, K, np.eye(2), 0.5, Sig)
    limit = Sig @ K.T @ np.linalg.inv(K @ Sig @ K.T) @ K
    return bool(np.all(np.isfinite(M)) and np.abs(M - limit).max() < 1e-12)


CHECKS = dict(S.integration_checks(SCORE, derive))
CHECKS.update({
    "printed programs (gain helper) equal the direct printing of the field": lambda:
        check_programs() < 1e-10,
    "printed field is finite and exact at Sigma ~ 1e300 (singular direct solve)":
        check_extreme_scale,
    "compiled head's programs and Jacobian parts (exact rationals)": check_head_programs,
})


if __name__ == "__main__":
    print(TITLE)
    S.print_field(derive())
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
