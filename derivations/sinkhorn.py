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
:math:`G = B^TB`, the equation reduces on each eigenvalue to the scalar identity
:math:`g\,\varphi(g)^2 + \varphi(g) - 1 = 0`, which SymPy checks below. Then
:math:`\mathbb E[v\mid u] = D^T u` and, pushing the flow back,

.. math::

    L' = V L\,B\,\varphi(B^TB),\qquad \alpha' = V\alpha,\qquad
    \Sigma' = V C + C^T V^T,\quad C = \operatorname{Cov}_\pi(y, x) = S B\varphi(B^TB) S,

with :math:`S = \Sigma^{1/2}` in the covariance form. Nothing is inverted: the formula holds
for singular ``A`` (``k < d``) and singular :math:`\Sigma` (where :math:`B` vanishes,
:math:`\varphi = 1` and :math:`D = 0`). The scalar case is solved from scratch by
:func:`solve_scalar_schroedinger`, and the matrix closed form is checked against the
fixed-point equations on random (also singular) matrices by :func:`check_matrix_fixed_point`.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

try:
    from . import _symbolic as S
except ImportError:  # run as a script
    import _symbolic as S

NAME = "sinkhorn"
TITLE = "Sinkhorn attention"

g_sym = sp.Symbol("g", nonnegative=True)
#: the scalar function phi of the closed form
PHI = 2 / (1 + sp.sqrt(1 + 4 * g_sym))


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
    cross = sp.simplify((a / det).subs(u, root))
    # mean: precision @ (m, m) = linear coefficient (alpha/sigma^2 + q) in both slots
    m = (al / sig**2 + q) / (root - a)
    q_sol = sp.solve(sp.Eq(m, al), q)[0]
    B = a * sig**2
    closed = sig * (B * PHI.subs(g_sym, B**2)) * sig
    return {"u": root, "q": q_sol, "cross_cov": cross,
            "difference": sp.simplify(sp.radsimp(cross - closed))}


def check_phi_identity():
    r"""SymPy check of :math:`g\varphi(g)^2 + \varphi(g) - 1 = 0` (the reduced equation)."""
    return sp.simplify(g_sym * PHI**2 + PHI - 1)


def closed_form_whitened(B):
    r"""Numerical :math:`D = \varphi(B^TB)B^T` for a square ``B``."""
    w, U = np.linalg.eigh(B.T @ B)
    f = 2.0 / (1.0 + np.sqrt(1.0 + 4.0 * np.clip(w, 0.0, None)))
    return (U * f) @ U.T @ B.T


def check_matrix_fixed_point(seed=0, trials=20):
    r"""Check the closed form against the Schroedinger fixed point on random matrices.

    For each trial draws ``d`` in 1..5, ``k`` in 1..d (singular ``A`` when ``k < d``),
    a covariance of random rank, and checks (i) :math:`D = (I - DD^T)B^T`, (ii) the
    joint covariance is positive semi-definite with both marginals :math:`\Sigma`, and
    (iii) where :math:`\Sigma` is invertible, the cross block of the joint precision is
    :math:`-A` (the kernel), so the plan has exactly the form
    :math:`e^{y^TAx + f(x) + g(y)}\mu\otimes\mu` (this residual is divided by
    ``1e-4`` times the condition number of the joint covariance, the accuracy of a
    computed inverse). Returns the largest residual.
    """
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(trials):
        d = int(rng.integers(1, 6))
        k = int(rng.integers(1, d + 1))
        r = int(rng.integers(1, d + 1))
        Q, K = rng.standard_normal((k, d)), rng.standard_normal((k, d))
        A = K.T @ Q / np.sqrt(k)
        G = rng.standard_normal((d, r))
        Sig = G @ G.T
        w, U = np.linalg.eigh(Sig)
        L = (U * np.sqrt(np.clip(w, 0, None))) @ U.T
        B = L.T @ A @ L
        D = closed_form_whitened(B)
        worst = max(worst, np.abs(D - (np.eye(d) - D @ D.T) @ B.T).max())
        C_xy = L @ D @ L.T
        joint = np.block([[Sig, C_xy], [C_xy.T, Sig]])
        worst = max(worst, -min(np.linalg.eigvalsh(joint).min(), 0.0) / np.abs(joint).max())
        if r == d:
            prec = np.linalg.inv(joint)
            # an inverse is accurate to cond * eps: scale the residual by the condition number
            err = np.abs(prec[d:, :d] + A).max() / max(1.0, np.abs(A).max())
            worst = max(worst, err / np.linalg.cond(joint) * 1e4)
    return worst


def check_svd_form(trials=20, seed=0):
    """Largest relative difference between ``sinkhorn_cross(B)`` and ``B phi(B^T B)``.

    On random well-conditioned and singular ``B`` (where the Gram form is accurate too).
    """
    from gaussian_pde._common.linalg import sinkhorn_cross, sinkhorn_phi

    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(trials):
        d = int(rng.integers(1, 6))
        B = rng.standard_normal((d, d))
        if d > 1 and rng.random() < 0.5:
            B[:, 0] = 0.0                       # singular
        ref = B @ sinkhorn_phi(B.T @ B)
        worst = max(worst, np.abs(sinkhorn_cross(B) - ref).max() / max(np.abs(ref).max(), 1e-300))
    return worst


def _sinkhorn_body(factor):
    """Assignments of the Sinkhorn closed form, either in factor or covariance form."""
    # B phi(B^T B) is computed from the SVD of B (_linalg.sinkhorn_cross): the Gram
    # matrix B^T B would square the condition number
    body = [("A", "scale * (_T(K) @ Q)")]
    if factor:
        body += [("B", "_T(L) @ A @ L"), ("BPhi", "_sinkhorn_cross(B)")]
    else:
        body += [("R", "_psd_sqrt(Sigma)"), ("B", "R @ A @ R"),
                 ("BPhi", "_sinkhorn_cross(B)"), ("C", "R @ BPhi @ R")]
    return body


def functions():
    """Generated-code functions for Sinkhorn attention (same layout as the others)."""
    doc = S.STATE_DOC
    sig_doc = "Sigma : ndarray, shape (..., d, d)\n    Covariance.\n"
    al_doc = "alpha : ndarray, shape (..., d)\n    Mean.\n"
    return [
        S.Function(
            "field_matrix", S.SIGNATURE + ("Sigma",),
            r"Sinkhorn attention: :math:`M = V C \Sigma^{+}` with "
            r":math:`C = S B\varphi(B^TB)S`, :math:`S = \Sigma^{1/2}`, :math:`B = SAS`;"
            "\ncomputed as :math:`V S B\\varphi(B^TB) S^{+}`.\n" + doc + sig_doc,
            _sinkhorn_body(False)
            + [("Rp", "np.linalg.pinv(R, rcond=1e-12, hermitian=True)"),
               ("M", "V @ R @ BPhi @ Rp")], ("M",)),
        S.Function(
            "field_offset", S.SIGNATURE + ("alpha", "Sigma"),
            r"Sinkhorn attention: :math:`b = (V - M)\alpha`, so that :math:`\Gamma(\alpha) = V\alpha`."
            "\n" + doc + al_doc + sig_doc,
            [("M", "field_matrix(Q, K, V, scale, Sigma)")],
            ("(V @ alpha[..., None] - M @ alpha[..., None])[..., 0]",)),
        S.Function(
            "moment_rhs", S.SIGNATURE + ("alpha", "Sigma"),
            r"Sinkhorn attention: :math:`\alpha' = V\alpha`, :math:`\Sigma' = VC + C^TV^T`."
            "\n" + doc + al_doc + sig_doc,
            _sinkhorn_body(False) + [("VC", "V @ C")],
            ("(V @ alpha[..., None])[..., 0]", "VC + _T(VC)")),
        S.Function(
            "cov_rhs", S.SIGNATURE + ("Sigma",),
            r"Sinkhorn attention: :math:`\Sigma' = VC + C^TV^T`, :math:`C = S B\varphi(B^TB)S`."
            "\n" + doc + sig_doc,
            _sinkhorn_body(False) + [("VC", "V @ C")], ("VC + _T(VC)",)),
        S.Function(
            "factor_rhs", S.SIGNATURE + ("L",),
            r"Sinkhorn attention, factor form: :math:`L' = V L B\varphi(B^TB)`, :math:`B = L^TAL`."
            "\n" + doc + "L : ndarray, shape (..., d, d)\n    Factor of the covariance.\n",
            _sinkhorn_body(True), ("V @ L @ BPhi",)),
        S.Kernel(
            "Sinkhorn attention", r"V L B\varphi(B^TB),\ B = L^TAL",
            [("_w0", "scale * (_T(K) @ Q)"), ("_w1", "V")],
            [("B", "_dot(L.T, _dot(_w0, L))")], "_dot(_w1, _dot(L, _sinkhorn_cross(B)))",
            [("B", "_T(L) @ (_w0 @ L)")], "_w1 @ (L @ _sinkhorn_cross(B))"),
    ]


CHECKS = {
    "scalar Schroedinger system solved by SymPy equals the closed form":
        lambda: solve_scalar_schroedinger()["difference"] == 0,
    "phi identity g phi^2 + phi - 1 = 0": lambda: check_phi_identity() == 0,
    "matrix fixed point on random (singular) matrices": lambda: check_matrix_fixed_point() < 1e-9,
    "SVD form of B phi(B^T B) (used by the generated code) equals the Gram form":
        lambda: check_svd_form() < 1e-12,
}


if __name__ == "__main__":
    print(TITLE)
    sol = solve_scalar_schroedinger()
    print("  scalar: u =", sol["u"], "  Cov(x, y) =", sol["cross_cov"])
    raise SystemExit(0 if S.run_checks(CHECKS) else 1)
