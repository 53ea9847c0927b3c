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
    ]


def _compiled(funcs):
    """Compile generated functions (``Function`` items) into a namespace."""
    linalg = S.load_linalg()
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
})


if __name__ == "__main__":
    print(TITLE)
    S.print_field(derive())
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
