r"""Sinkhorn attention: the Gaussian Schroedinger system and its closed form.

The attention plan is the entropic coupling of :math:`\mu` with itself for the kernel
:math:`e^{s(x,y)}`, :math:`s(x,y) = y^T A x`, :math:`A = c\,K^TQ` (docs/math.md section 2.1):
:math:`\pi(dx,dy) = e^{s(x,y) + f(x) + g(y)}\mu(dx)\mu(dy)` with both marginals equal to
:math:`\mu = \mathcal N(\alpha,\Sigma)`. The velocity is
:math:`\Gamma(x) = V\,\mathbb E_\pi[y\mid x]`.

Derivation
----------
Whiten with any factor :math:`\Sigma = LL^T`: :math:`x = \alpha + Lu`, :math:`y = \alpha + Lv`,
:math:`u, v \sim \mathcal N(0, I)`. Up to terms absorbed in the potentials, the kernel
becomes :math:`e^{v^T B u}` with :math:`B = L^T A L`. With quadratic potentials the
coupling of ``(u, v)`` is Gaussian with covariance :math:`\begin{pmatrix} I & D\\ D^T & I
\end{pmatrix}`, and matching its precision's cross block to the kernel gives the
Schroedinger (fixed-point) equation

.. math:: D = (I - DD^T)\,B^T .

Its solution is :math:`D = \varphi(B^TB)\,B^T` with
:math:`\varphi(g) = 2/(1 + \sqrt{1 + 4g})`: as :math:`\varphi(G)` commutes with
:math:`G = B^TB`, the equation reduces on each singular value ``s`` of ``B`` to the scalar
equation :math:`s\varphi(s^2) = s - s^3\varphi(s^2)^2`, i.e.
:math:`g\,\varphi(g)^2 + \varphi(g) - 1 = 0` (:func:`reduced_fixed_point`, with
:math:`B = USW^T` and the functional calculus of :math:`B^TB = WS^2W^T`), whose positive
root SymPy solves for :func:`derive_phi`. Then
:math:`\mathbb E[v\mid u] = D^T u` and, pushing the flow back,

.. math::

    L' = V L\,B\,\varphi(B^TB),\qquad \alpha' = V\alpha,\qquad
    \Sigma' = V C + C^T V^T,\quad C = \operatorname{Cov}_\pi(y, x) = S B\varphi(B^TB) S,

with :math:`S = \Sigma^{1/2}` in the covariance form. Nothing is inverted: the formula holds
for singular ``A`` (``k < d``) and singular :math:`\Sigma` (where :math:`B` vanishes,
:math:`\varphi = 1` and :math:`D = 0`). The scalar case is solved from scratch by
:func:`solve_scalar_schroedinger`, and the matrix closed form is checked against the
fixed-point equations on random (also singular) matrices by :func:`check_matrix_fixed_point`.

Code generation
---------------
The generated module is printed from the SymPy expressions of :func:`derive` (matrix
symbols, :class:`~derivations._symbolic.GramFunctionCross` for :math:`B\varphi(B^TB)`,
whose helper is printed from the derived :data:`PHI`): every printed program is composed
back into one expression and compared with the derivation (:func:`check_programs`), so
the derivation and the code cannot diverge.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import sympy as sp

try:
    from . import _symbolic as S
except ImportError:  # run as a script
    import _symbolic as S

NAME = "sinkhorn"
TITLE = "Sinkhorn attention"

g_sym = sp.Symbol("g", nonnegative=True)
s_sym = sp.Symbol("s", positive=True)
u = sp.MatrixSymbol("u", S.d, 1)
v = sp.MatrixSymbol("v", S.d, 1)
#: the interaction matrix of the score y^T A x, and its definition from the weights
A = sp.MatrixSymbol("A", S.d, S.d)
A_DEF = S.scale * S.K.T * S.Q
#: name of the generated helper computing B phi(B^T B) from the SVD of B
HELPER = "_cross_phi"
# singular value decomposition B = U S W^T used to reduce the matrix equations
_U, _W, _S = (sp.MatrixSymbol(c, S.d, S.d) for c in ("U", "W", "S"))


def reduced_fixed_point(phi):
    r"""The fixed point :math:`D = (I - DD^T)B^T`, :math:`D = \varphi(B^TB)B^T`, per singular value.

    ``phi`` is a :class:`~sympy.Lambda` of one scalar. With :math:`B = USW^T` (``U``, ``W``
    orthogonal, ``S`` diagonal), :math:`B^TB = WS^2W^T` and the functional calculus gives
    :math:`\varphi(B^TB) = W\varphi(S^2)W^T`; :math:`W^T(D - (I - DD^T)B^T)U` is then a
    polynomial in the diagonal matrices ``S`` and :math:`\varphi(S^2)`, returned at one
    diagonal entry ``s`` (zero for every ``s`` exactly when the matrix equation holds).
    """
    B = sp.MatrixSymbol("B", S.d, S.d)
    D = S.MatrixFunction(phi, B.T * B) * B.T
    residual = (D - (S.I - D * D.T) * B.T).xreplace({B: _U * _S * _W.T})
    reduced = S.reduce_orthogonal(_W.T * residual * _U, (_U, _W), (_S,))
    if reduced.atoms(sp.MatrixSymbol) - {_S}:
        raise AssertionError(f"the orthogonal factors did not cancel: {reduced}")
    return sp.expand(S.diagonal_scalar(reduced, {_S: s_sym}))


def derive_phi():
    r"""Solve the reduced fixed point for :math:`\varphi`: the root that keeps the coupling PSD.

    For :math:`s > 0` the equation is :math:`s^2p^2 + p - 1 = 0` in :math:`p = \varphi(s^2)`;
    of its two roots only the positive one gives :math:`|s\,p| < 1` (a positive
    semi-definite joint covariance). It is rationalized to the form
    :math:`2/(1 + \sqrt{1 + 4g})`, finite at :math:`g = 0` (singular kernels).
    """
    p = sp.Symbol("p")
    unknown = sp.Function("phi")
    eq = reduced_fixed_point(sp.Lambda(g_sym, unknown(g_sym)))
    eq = sp.expand(eq.subs(unknown(s_sym**2), p) / s_sym)
    roots = [r for r in sp.solve(eq, p) if r.subs(s_sym, 1).is_positive]
    if len(roots) != 1:
        raise AssertionError(f"expected one positive root, got {roots}")
    root = roots[0].subs(s_sym, sp.sqrt(g_sym))
    return 1 / sp.radsimp(1 / root)


#: the scalar function phi of the closed form (derived by :func:`derive_phi`)
PHI = derive_phi()


def phi_lambda():
    r""":math:`\varphi` as a SymPy :class:`~sympy.Lambda` (reads :data:`PHI` at call time)."""
    return sp.Lambda(g_sym, PHI)


def cross(B):
    r""":math:`B\varphi(B^TB)`, printed as a call of the generated SVD helper."""
    return S.GramFunctionCross(phi_lambda(), B, HELPER)


def solve_scalar_schroedinger():
    r"""Solve the Schroedinger system for d = 1 from scratch.

    :math:`\mu = \mathcal N(\alpha,\sigma^2)`, kernel :math:`e^{a x y}`, potentials
    :math:`f(x) = g(x) = -\tfrac p2 x^2 + q x` (equal by the symmetry of the kernel).
    The coupling is Gaussian with precision :math:`\begin{pmatrix}u & -a\\-a & u
    \end{pmatrix}`, :math:`u = \sigma^{-2} + p`; the marginal constraints fix ``u`` and
    ``q``. Returns the cross-covariance :math:`C = \operatorname{Cov}_\pi(x, y)` and the
    difference with the closed form :math:`\sigma\,(B\varphi(B^2))\,\sigma`,
    :math:`B = a\sigma^2` (zero when they agree).
    """
    a = sp.Symbol("a", real=True)
    sig = sp.Symbol("sigma", positive=True)
    u = sp.Symbol("u", positive=True)
    al, q = sp.symbols("alpha q", real=True)
    det = u**2 - a**2
    var_x = u / det  # (1,1) entry of the inverse precision
    roots = [r for r in sp.solve(sp.Eq(var_x, sig**2), u) if r.is_positive is not False]
    # the admissible root makes the precision positive definite (u > |a|)
    root = [r for r in roots if sp.simplify((r**2 - a**2).subs(a, 1)).is_positive][0]
    cross_cov = sp.simplify((a / det).subs(u, root))
    # mean: precision @ (m, m) = linear coefficient (alpha/sigma^2 + q) in both slots
    m = (al / sig**2 + q) / (root - a)
    q_sol = sp.solve(sp.Eq(m, al), q)[0]
    B = a * sig**2
    closed = sig * (B * PHI.subs(g_sym, B**2)) * sig
    return {"u": root, "q": q_sol, "cross_cov": cross_cov,
            "difference": sp.simplify(sp.radsimp(cross_cov - closed))}


def check_phi_identity():
    r"""SymPy check of :math:`g\varphi(g)^2 + \varphi(g) - 1 = 0` (the reduced equation)."""
    return sp.simplify(g_sym * PHI**2 + PHI - 1)


def check_fixed_point_symbolic():
    r"""SymPy: :math:`D = \varphi(B^TB)B^T` solves :math:`D = (I - DD^T)B^T` for every ``B``.

    Through the functional calculus of :math:`B^TB` (:func:`reduced_fixed_point`): the
    residual vanishes on every singular value, zero included.
    """
    return sp.simplify(reduced_fixed_point(phi_lambda())) == 0


def check_coupling_is_psd():
    r"""SymPy: :math:`0 \le s\varphi(s^2) < 1`, so the joint covariance of ``(u, v)`` is PSD.

    The singular values of ``D`` are :math:`s\varphi(s^2)`; the joint covariance
    :math:`\begin{pmatrix}I & D\\D^T & I\end{pmatrix}` is PSD exactly when they are at most 1.
    """
    s = sp.Symbol("s", nonnegative=True)
    f = s * PHI.subs(g_sym, s**2)
    values = sp.calculus.util.function_range(f, s, sp.Interval(0, sp.oo))
    return bool(values.is_subset(sp.Interval.Ropen(0, 1)))


# ------------------------------------------------------------------ the field


@dataclasses.dataclass(frozen=True)
class SinkhornField:
    r"""The derived Sinkhorn field for a factor ``L`` of :math:`\Sigma`: every step."""

    B: sp.MatrixExpr        # whitened kernel L^T A L
    D: sp.MatrixExpr        # Cov(u, v) = phi(B^T B) B^T
    M: sp.MatrixExpr        # linear part of the field, V L D^T L^{-1}
    b: sp.MatrixExpr        # constant part, Gamma(0)
    mean_rhs: sp.MatrixExpr
    factor_rhs: sp.MatrixExpr   # L' = M L
    cov_rhs: sp.MatrixExpr      # Sigma' = M Sigma + Sigma M^T, Sigma = L L^T


def whitened_kernel():
    r"""``B``: the cross term of the score :math:`y^TAx` in whitened coordinates.

    With :math:`x = \alpha + Lu`, :math:`y = \alpha + Lv` the score is
    :math:`v^TBu` plus terms in ``u`` or ``v`` alone (absorbed in the potentials), so
    :math:`B = \partial^2 s / \partial v\,\partial u`.
    """
    score = (S.alpha + S.L * v).T * A * (S.alpha + S.L * u)
    return S.jacobian(S.gradient(score, v), u)


def derive():
    r"""The Sinkhorn field from the closed-form coupling, by matrix calculus.

    :math:`\mathbb E[v\mid u] = D^Tu` (the coupling of ``(u, v)`` has covariance
    :math:`\begin{pmatrix}I & D\\D^T & I\end{pmatrix}`), so
    :math:`\Gamma(x) = V(\alpha + L D^T L^{-1}(x - \alpha))`, :math:`M = \partial\Gamma/\partial x`,
    :math:`b = \Gamma(0)` and the moment equations of the affine field follow
    (:func:`derivations._symbolic.moment_equations`).
    """
    B = whitened_kernel()
    phi = S.MatrixFunction(phi_lambda(), B.T * B)
    D = phi * B.T
    # SymPy's matrix calculus does not know MatrixFunction: differentiate with a plain
    # symbol in its place (it does not depend on x) and put it back
    Phi = sp.MatrixSymbol("Phi", S.d, S.d)
    velocity = S.V * (S.alpha + S.L * ((Phi * B.T).T * (S.L.I * (S.x - S.alpha))))
    velocity = S.symmetric(sp.expand(velocity).doit(), Phi)
    M = S.jacobian(velocity, S.x).xreplace({Phi: phi})
    b = sp.expand(velocity.subs(S.x, S.zero_vec)).doit().xreplace({Phi: phi})
    mean_rhs, _, _ = S.moment_equations(M, b)
    factor_rhs = sp.expand(M * S.L).doit()
    cov = S.L * S.L.T
    cov_rhs = sp.expand(M * cov + cov * M.T).doit()
    return SinkhornField(B=B, D=D, M=M, b=b, mean_rhs=sp.expand(mean_rhs).doit(),
                         factor_rhs=factor_rhs, cov_rhs=cov_rhs)


def _at_square_root(expr):
    r"""``expr`` with the factor ``L`` taken as :math:`R = \Sigma^{1/2}` (symmetric, :math:`RR^T = \Sigma`)."""
    return expr.xreplace({S.L: S.PsdSqrt(S.Sigma)}).doit()


# ------------------------------------------------------------ printed programs

_B, _BPhi, _R, _C, _VC, _Rp, _M = (sp.MatrixSymbol(n, S.d, S.d)
                                   for n in ("B", "BPhi", "R", "C", "VC", "Rp", "M"))


def programs():
    r"""The printed straight-line programs, as SymPy expressions (checked by :func:`check_programs`).

    ``B phi(B^T B)`` is :func:`cross` (the SVD helper); the covariance form takes the
    factor :math:`R = \Sigma^{1/2}`; ``field_matrix`` divides by ``R`` with a
    pseudo-inverse (the inverse where :math:`\Sigma` is invertible).
    """
    cov_steps = [(A, A_DEF), (_R, S.PsdSqrt(S.Sigma)), (_B, _R * A * _R), (_BPhi, cross(_B)),
                 (_C, _R * _BPhi * _R), (_VC, S.V * _C)]
    # the kernel: weights (A, V) hoisted, products grouped as the fast closure evaluates them
    kernel = S.Program([(A, A_DEF), (_B, sp.MatMul(S.L.T, sp.MatMul(A, S.L)))],
                       (sp.MatMul(S.V, sp.MatMul(S.L, cross(_B))),))
    return {
        "field_matrix": S.Program(cov_steps[:4] + [(_Rp, S.PseudoInverse(_R)),
                                                   (_M, S.V * _R * _BPhi * _Rp)], (_M,)),
        "field_offset": S.Program([], (S.V * S.alpha - _M * S.alpha,)),
        "moment_rhs": S.Program(cov_steps, (S.V * S.alpha, _VC + _VC.T)),
        "cov_rhs": S.Program(cov_steps, (_VC + _VC.T,)),
        "factor_rhs": S.Program([(A, A_DEF), (_B, S.L.T * A * S.L), (_BPhi, cross(_B))],
                                (S.V * S.L * _BPhi,)),
        "kernel": kernel,
    }


# ------------------------------------------------------------ the compiled head

#: the weights packed into the compiled head's ``data``: ``[A, V]``, :math:`A = cK^TQ`
INPUTS = ((A, "A", "d", "d"), (S.V, "V", "d", "d"))
#: the interaction matrix's definition from the weights (for the checks and the tests)
DEFINITIONS = {A: A_DEF}
_AL, _VL = (sp.MatrixSymbol(n, S.d, S.d) for n in ("AL", "VL"))


def head_programs():
    r"""The compiled head: :math:`L' = (VL)\,B\varphi(B^TB)`, :math:`B = L^T(AL)`; :math:`\alpha' = V\alpha`.

    :math:`B\varphi(B^TB)` from the SVD of ``B`` (:class:`~derivations._symbolic.GramFunctionCross`,
    its scalar :math:`s\varphi(s^2)` printed from :data:`PHI`). No closed-form Jacobian:
    the integrators take differences.
    """
    field = S.Program([(_AL, sp.MatMul(A, S.L)), (_B, sp.MatMul(S.L.T, _AL)),
                       (_BPhi, cross(_B)), (_VL, sp.MatMul(S.V, S.L))],
                      (sp.MatMul(_VL, _BPhi),))
    mean = S.Program([], (sp.MatMul(S.V, S.alpha),))
    return field, mean


def check_head_programs():
    r"""SymPy: the compiled head's programs composed back are :math:`L' = ML` and :math:`\alpha' = b + M\alpha`."""
    field, (prog, mean) = derive(), head_programs()
    return (prog.check(field.factor_rhs)
            and S.is_zero_matrix(S.expand_nodes(mean.composed()[0] - field.mean_rhs)))


_BODY_DOC = r"""Sinkhorn attention: the compiled head's :math:`Z' = [L' \mid \alpha']`.

:math:`L' = (VL)\,B\varphi(B^TB)`, :math:`B = L^T(AL)`, from the SVD
:math:`B = U\operatorname{{diag}}(s)W^T` as :math:`U\operatorname{{diag}}(s\varphi(s^2))W^T`;
:math:`\alpha' = V\alpha`. NaN where :math:`B` is not finite. ``data = [A, V]``
(row-major, :math:`A = cK^TQ`); ``y``: the state :math:`Z = [L \mid \alpha]` (``d x m``,
row-major); ``ws``: scratch. Plain Python, compiled by Numba
(``gaussian_pde.attention._compiled_fields``).
"""


def compiled_functions():
    """The printed head body (``field_body``; no Jacobian parts)."""
    field, mean = head_programs()
    return [S.head_body("field_body", _BODY_DOC.replace("{{", "{").replace("}}", "}"), INPUTS,
                        field, mean)]


def check_programs():
    r"""SymPy: every printed program, composed back, equals the derivation.

    ``factor_rhs`` and the kernel: :math:`L' = ML`; the covariance forms:
    :math:`M\Sigma + \Sigma M^T` at :math:`L = \Sigma^{1/2}`; ``field_matrix``: ``M`` there;
    ``field_offset``: ``b`` with ``M`` the derived one; the mean: :math:`b + M\alpha`.
    """
    field, progs = derive(), programs()
    weights = {A: A_DEF}
    at_R = {k: _at_square_root(getattr(field, k).xreplace(weights))
            for k in ("M", "b", "mean_rhs", "cov_rhs")}
    offset = progs["field_offset"].composed()[0].xreplace({_M: at_R["M"]})
    return {
        "factor_rhs": progs["factor_rhs"].check(field.factor_rhs.xreplace(weights)),
        "kernel": progs["kernel"].check(field.factor_rhs.xreplace(weights)),
        "field_matrix": progs["field_matrix"].check(at_R["M"]),
        "field_offset": S.is_zero_matrix(S.expand_nodes(offset - at_R["b"])),
        "moment_rhs": progs["moment_rhs"].check(at_R["mean_rhs"], at_R["cov_rhs"]),
        "cov_rhs": progs["cov_rhs"].check(at_R["cov_rhs"]),
    }


def helper_function():
    r"""The generated helper :math:`B\varphi(B^TB)` (its scalar printed from :data:`PHI`)."""
    return S.gram_cross_helper(cross(_B))


def compiled_helper():
    """The printed helper, compiled (for the numerical checks)."""
    namespace = {"np": np}
    exec(compile(S.function_source(helper_function()), "<sinkhorn helper>", "exec"), namespace)
    return namespace[HELPER]


def check_matrix_fixed_point(seed=0, trials=20):
    r"""Check the printed closed form against the Schroedinger fixed point on random matrices.

    For each trial draws ``d`` in 1..5, ``k`` in 1..d (singular ``A`` when ``k < d``),
    a covariance of random rank, and checks, with :math:`D^T = B\varphi(B^TB)` from the
    generated helper, (i) :math:`D = (I - DD^T)B^T`, (ii) the
    joint covariance is positive semi-definite with both marginals :math:`\Sigma`, and
    (iii) where :math:`\Sigma` is invertible, the cross block of the joint precision is
    :math:`-A` (the kernel), so the plan has exactly the form
    :math:`e^{y^TAx + f(x) + g(y)}\mu\otimes\mu` (this residual is divided by
    ``1e-4`` times the condition number of the joint covariance, the accuracy of a
    computed inverse). Returns the largest residual.
    """
    helper = compiled_helper()
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(trials):
        d = int(rng.integers(1, 6))
        k = int(rng.integers(1, d + 1))
        r = int(rng.integers(1, d + 1))
        Q, K = rng.standard_normal((k, d)), rng.standard_normal((k, d))
        A_ = K.T @ Q / np.sqrt(k)
        G = rng.standard_normal((d, r))
        Sig = G @ G.T
        w, U = np.linalg.eigh(Sig)
        L = (U * np.sqrt(np.clip(w, 0, None))) @ U.T
        B = L.T @ A_ @ L
        D = helper(B).T
        if not np.all(np.isfinite(D)):
            return np.inf
        worst = max(worst, np.abs(D - (np.eye(d) - D @ D.T) @ B.T).max())
        C_xy = L @ D @ L.T
        joint = np.block([[Sig, C_xy], [C_xy.T, Sig]])
        worst = max(worst, -min(np.linalg.eigvalsh(joint).min(), 0.0) / np.abs(joint).max())
        if r == d:
            prec = np.linalg.inv(joint)
            # an inverse is accurate to cond * eps: scale the residual by the condition number
            err = np.abs(prec[d:, :d] + A_).max() / max(1.0, np.abs(A_).max())
            worst = max(worst, err / np.linalg.cond(joint) * 1e4)
    return worst


def check_svd_form(trials=20, seed=0):
    """Largest relative difference between the printed helper and the package's helpers.

    ``gaussian_pde._common.linalg.sinkhorn_cross(B)`` and ``B @ sinkhorn_phi(B^T B)``
    (used outside the generated code) against the generated ``B phi(B^T B)``, on random
    well-conditioned and singular ``B``. The helpers are loaded by file path: the package
    itself needs the generated modules.
    """
    linalg = S.load_linalg()
    helper = compiled_helper()
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(trials):
        d = int(rng.integers(1, 6))
        B = rng.standard_normal((d, d))
        if d > 1 and rng.random() < 0.5:
            B[:, 0] = 0.0                       # singular
        ref = helper(B)
        scale = max(np.abs(ref).max(), 1e-300)
        for other in (linalg.sinkhorn_cross(B), B @ linalg.sinkhorn_phi(B.T @ B)):
            err = np.abs(other - ref).max() / scale
            worst = max(worst, err if np.isfinite(err) else np.inf)
    return worst


def _doc(text, *params):
    docs = {"Sigma": "Sigma : ndarray, shape (..., d, d)\n    Covariance.\n",
            "alpha": "alpha : ndarray, shape (..., d)\n    Mean.\n",
            "L": "L : ndarray, shape (..., d, d)\n    Factor of the covariance.\n"}
    return text + "\n" + S.STATE_DOC + "".join(docs[p] for p in params)


def functions():
    """Generated-code functions for Sinkhorn attention, printed from :func:`programs`."""
    progs = programs()
    code = {name: prog.code(S.NumpyMatrixPrinter({"alpha": "alpha[..., None]"}))
            for name, prog in progs.items() if name != "kernel"}
    vec = "[..., 0]"
    return [
        helper_function(),
        S.Function(
            "field_matrix", S.SIGNATURE + ("Sigma",),
            _doc(r"Sinkhorn attention: :math:`M = V C \Sigma^{+}` with "
                 r":math:`C = S B\varphi(B^TB)S`, :math:`S = \Sigma^{1/2}`, :math:`B = SAS`;"
                 "\ncomputed as :math:`V S B\\varphi(B^TB) S^{+}`.", "Sigma"),
            *code["field_matrix"]),
        S.Function(
            "field_offset", S.SIGNATURE + ("alpha", "Sigma"),
            _doc(r"Sinkhorn attention: :math:`b = (V - M)\alpha`, so that "
                 r":math:`\Gamma(\alpha) = V\alpha`.", "alpha", "Sigma"),
            [("M", "field_matrix(Q, K, V, scale, Sigma)")],
            (code["field_offset"][1][0] + vec,)),
        S.Function(
            "moment_rhs", S.SIGNATURE + ("alpha", "Sigma"),
            _doc(r"Sinkhorn attention: :math:`\alpha' = V\alpha`, :math:`\Sigma' = VC + C^TV^T`.",
                 "alpha", "Sigma"),
            code["moment_rhs"][0], (code["moment_rhs"][1][0] + vec, code["moment_rhs"][1][1])),
        S.Function(
            "cov_rhs", S.SIGNATURE + ("Sigma",),
            _doc(r"Sinkhorn attention: :math:`\Sigma' = VC + C^TV^T`, "
                 r":math:`C = S B\varphi(B^TB)S`.", "Sigma"),
            *code["cov_rhs"]),
        S.Function(
            "factor_rhs", S.SIGNATURE + ("L",),
            _doc(r"Sinkhorn attention, factor form: :math:`L' = V L B\varphi(B^TB)`, "
                 r":math:`B = L^TAL`.", "L"),
            *code["factor_rhs"]),
    ] + compiled_functions()


def equations_latex():
    """LaTeX lines of the Sinkhorn section of ``equations.md``, printed from the expressions."""
    B = sp.MatrixSymbol("B", S.d, S.d)
    phi = S.MatrixFunction(phi_lambda(), B.T * B)
    R = sp.MatrixSymbol("S", S.d, S.d)
    C = sp.MatrixSymbol("C", S.d, S.d)
    lx = S.latex_matrix
    return [f"$$B = {lx(whitened_kernel())},\\quad \\varphi(g) = {sp.latex(PHI)},\\quad "
            f"L' = {lx(S.V * S.L * B * phi)},\\quad \\alpha' = {lx(derive().mean_rhs)}$$", "",
            f"$$\\Sigma' = {lx(S.V * C + C.T * S.V.T)},\\quad C = {lx(R * B * phi * R)},\\quad "
            f"B = {lx(R * A * R)},\\quad S = \\Sigma^{{1/2}}$$", ""]


CHECKS = {
    "scalar Schroedinger system solved by SymPy equals the closed form":
        lambda: solve_scalar_schroedinger()["difference"] == 0,
    "phi identity g phi^2 + phi - 1 = 0": lambda: check_phi_identity() == 0,
    "fixed point D = (I - D D^T) B^T through the functional calculus of B^T B":
        check_fixed_point_symbolic,
    "joint covariance of the closed form is PSD (0 <= s phi(s^2) < 1)": check_coupling_is_psd,
    "the SVD helper's s phi(s^2) is B phi(B^T B) reduced (B = U S W^T)":
        lambda: S.check_gram_cross_svd(cross(_B)),
    "printed programs compose back to the derived field": lambda: all(check_programs().values()),
    "the compiled head's programs compose back to the derived field": check_head_programs,
    "matrix fixed point on random (singular) matrices": lambda: check_matrix_fixed_point() < 1e-9,
    "printed helper equals the package's sinkhorn_cross and B sinkhorn_phi(B^T B)":
        lambda: check_svd_form() < 1e-12,
}


if __name__ == "__main__":
    print(TITLE)
    sol = solve_scalar_schroedinger()
    print("  phi(g) =", PHI)
    print("  scalar: u =", sol["u"], "  Cov(x, y) =", sol["cross_cov"])
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
