"""Mutation tests: an error planted in each derivation makes some check fail.

Each test plants one error (a sign, a factor, a transpose) in a derivation's SymPy
expression, in the printed code, or in the machinery, and shows that the derivation's own
checks or the numerical comparisons (quadrature, the Schroedinger system, lambdify) catch
it. The unmutated versions pass the same checks (tests/test_derivations.py and
tests/test_generated.py).
"""

import types

import numpy as np
import pytest
import sympy as sp

from derivations import _symbolic as S
from derivations import l2, multihead, sinkhorn, softmax
from gaussian_pde._generated import sinkhorn as gen_sinkhorn
from tests.test_generated import _lambdified, schroedinger_residual

g = sinkhorn.g_sym


def _module(source, name):
    module = types.ModuleType(name)
    source = source.replace(      # a mutant's compiled head is run as plain Python, never marked
        "from .._common.compiled import compiled_later as _compiled_later",
        "def _compiled_later(**options):\n    return lambda fn: fn")
    source = source.replace("from .._common", "from gaussian_pde._common")
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)
    return module


def _sinkhorn_source():
    return S.render_module("sinkhorn.py", "mutant\n", sinkhorn.functions())


def _sinkhorn_residual(module, rng, trials=4):
    worst = 0.0
    for d, k in ((2, 2), (3, 1)):
        for _ in range(trials):
            Q, K = rng.standard_normal((k, d)), rng.standard_normal((k, d))
            L = rng.standard_normal((d, d)) + 2 * np.eye(d)
            worst = max(worst, schroedinger_residual(module, Q, K, 0.8, L))
    return worst


def test_unmutated_sinkhorn_passes(rng):
    assert _sinkhorn_residual(_module(_sinkhorn_source(), "sinkhorn_ok"), rng) < 1e-8


# ------------------------------------------------------------------ Sinkhorn: phi


@pytest.mark.parametrize("mutant", [2 / (1 + sp.sqrt(1 + 2 * g)),     # a factor
                                    2 / (1 - sp.sqrt(1 + 4 * g)),     # a sign: the other root
                                    1 / (1 + sp.sqrt(1 + 4 * g))],    # a factor
                         ids=["factor-in-sqrt", "sign", "factor-2"])
def test_sinkhorn_wrong_phi_is_caught(monkeypatch, mutant, rng):
    """A wrong phi fails the symbolic checks of the closed form, changes the printed code
    (it is printed from PHI) and the printed code no longer solves the Schroedinger system.

    The sign mutant is the other root of g phi^2 + phi - 1 = 0: it solves the fixed point,
    but the coupling is not PSD and the scalar Schroedinger system rejects it."""
    committed = _sinkhorn_source()
    monkeypatch.setattr(sinkhorn, "PHI", mutant)
    assert not sinkhorn.check_coupling_is_psd() or not sinkhorn.check_fixed_point_symbolic()
    assert sinkhorn.solve_scalar_schroedinger()["difference"] != 0
    source = _sinkhorn_source()
    assert source != committed
    assert sinkhorn.check_svd_form() > 1e-3               # the package's helper disagrees now
    assert sinkhorn.check_matrix_fixed_point() > 1e-3
    assert _sinkhorn_residual(_module(source, "sinkhorn_phi_mutant"), rng) > 1e-3
    if mutant != 2 / (1 - sp.sqrt(1 + 4 * g)):
        assert sinkhorn.check_phi_identity() != 0
        assert not sinkhorn.check_fixed_point_symbolic()


def test_sinkhorn_wrong_printed_helper_is_caught(monkeypatch):
    """A sign planted in the printed scalar of the SVD helper fails the reduction check
    B phi(B^T B) = U diag(s phi(s^2)) W^T and the numerical comparison with the package."""
    original = S.gram_cross_helper

    def mutated(node):
        f = original(node)
        target, code = f.body[1]
        assert "+ 1)" in code
        return S.Function(f.name, f.args, f.doc, [f.body[0], (target, code.replace("+ 1)", "- 3)"))],
                          f.returns)

    monkeypatch.setattr(S, "gram_cross_helper", mutated)
    assert not S.check_gram_cross_svd(sinkhorn.cross(sinkhorn._B))
    assert sinkhorn.check_svd_form() > 1e-3


# ------------------------------------------------------- Sinkhorn: the matrix field


def _mutate_program(name, steps=None, returns=None):
    original = sinkhorn.programs

    def programs():
        progs = original()
        p = progs[name]
        progs[name] = S.Program(steps(p.steps) if steps else p.steps,
                                returns(p.returns) if returns else p.returns)
        return progs

    return programs


L, A, V = S.L, sinkhorn.A, S.V
SINKHORN_PROGRAM_MUTANTS = {
    # factor_rhs: B = L A L (a transpose dropped)
    "factor_rhs-transpose": ("factor_rhs", lambda st: [(t, L * A * L if t == sinkhorn._B else e)
                                                       for t, e in st], None),
    # kernel: L' = V^T L B phi (a transpose planted)
    "kernel-transpose": ("kernel", None, lambda r: (sp.MatMul(V.T, sp.MatMul(L, sinkhorn.cross(
        sinkhorn._B))),)),
    # covariance: Sigma' = VC - C^T V^T (a sign)
    "cov-sign": ("cov_rhs", None, lambda r: (sinkhorn._VC - sinkhorn._VC.T,)),
    # field_matrix: a factor 2
    "field-factor": ("field_matrix", lambda st: st[:-1] + [(st[-1][0], 2 * st[-1][1])], None),
    # mean: alpha' = V^T alpha
    "mean-transpose": ("moment_rhs", None, lambda r: (V.T * S.alpha, r[1])),
    # field_offset: b = (V + M) alpha
    "offset-sign": ("field_offset", None, lambda r: (V * S.alpha + sinkhorn._M * S.alpha,)),
}


@pytest.mark.parametrize("mutant", list(SINKHORN_PROGRAM_MUTANTS))
def test_sinkhorn_wrong_printed_program_is_caught(monkeypatch, mutant, rng):
    """An error in a printed program fails its symbolic comparison with the derivation
    and the generated code's numerical Schroedinger residual."""
    name, steps, returns = SINKHORN_PROGRAM_MUTANTS[mutant]
    monkeypatch.setattr(sinkhorn, "programs", _mutate_program(name, steps, returns))
    assert not sinkhorn.check_programs()[name]
    if name != "kernel":     # the kernel program is not printed (the compiled head is written)
        module = _module(_sinkhorn_source(), f"sinkhorn_{name}")
        assert _sinkhorn_residual(module, rng) > 1e-3


def test_sinkhorn_wrong_whitening_is_caught(monkeypatch):
    """A transpose planted in the derivation (B = L^T A^T L) no longer matches the code."""
    monkeypatch.setattr(sinkhorn, "whitened_kernel", lambda: L.T * A.T * L)
    results = sinkhorn.check_programs()
    assert not results["factor_rhs"] and not results["kernel"] and not results["cov_rhs"]


def test_sinkhorn_wrong_conditional_mean_is_caught(monkeypatch):
    """E[v | u] = D u instead of D^T u (a transpose in the step from D to L')."""
    def derive():
        B = sinkhorn.whitened_kernel()
        phi = S.MatrixFunction(sinkhorn.phi_lambda(), B.T * B)
        D = phi * B.T
        velocity = V * (S.alpha + L * (D * (L.I * (S.x - S.alpha))))
        velocity = sp.expand(velocity).doit()
        Phi = sp.MatrixSymbol("Phi", S.d, S.d)
        velocity = velocity.xreplace({phi: Phi})
        M = S.jacobian(velocity, S.x).xreplace({Phi: phi})
        b = sp.expand(velocity.subs(S.x, S.zero_vec)).doit().xreplace({Phi: phi})
        cov = L * L.T
        return sinkhorn.SinkhornField(B=B, D=D, M=M, b=b, mean_rhs=sp.expand(b + M * S.alpha).doit(),
                                      factor_rhs=sp.expand(M * L).doit(),
                                      cov_rhs=sp.expand(M * cov + cov * M.T).doit())

    assert all(sinkhorn.check_programs().values())
    monkeypatch.setattr(sinkhorn, "derive", derive)
    results = sinkhorn.check_programs()
    assert not results["factor_rhs"] and not results["cov_rhs"]


def test_fixed_point_check_sees_a_wrong_equation():
    """The reduction itself: D = (I + D D^T) B^T (a sign) is not solved by phi."""
    B = sp.MatrixSymbol("B", S.d, S.d)
    D = S.MatrixFunction(sinkhorn.phi_lambda(), B.T * B) * B.T
    U, W, Sd = sinkhorn._U, sinkhorn._W, sinkhorn._S
    residual = (D - (S.I + D * D.T) * B.T).xreplace({B: U * Sd * W.T})
    reduced = S.reduce_orthogonal(W.T * residual * U, (U, W), (Sd,))
    assert sp.simplify(S.diagonal_scalar(reduced, {Sd: sinkhorn.s_sym})) != 0


# --------------------------------------------------------------- softmax and L2


def test_softmax_wrong_kernel_program_is_caught(monkeypatch):
    """((cVL)(QL)^T)(KL) instead of ((cVL)(KL)^T)(QL): a transpose in the printed kernel."""
    def mutated():
        P, d, k = softmax.P, S.d, S.k
        VL, KL, QL = P[:d, :], P[d:d + k, :], P[d + k:, :]
        return S.Program([(P, sp.MatMul(softmax.W, L))],
                         (sp.MatMul(sp.MatMul(VL, sp.Transpose(QL)), KL),))

    assert softmax.thin_factor_form()
    monkeypatch.setattr(softmax, "kernel_program", mutated)
    assert not softmax.thin_factor_form()


def _quadrature_residual(field, score, rng, d=2, k=2):
    """Largest difference between the derived affine field and Gauss-Hermite quadrature of
    the attention integral with the score written in NumPy (independent of SymPy)."""
    from gaussian_pde.closure._quadrature import gauss_hermite_gaussian

    w = (S.Q, S.K, S.V, S.scale)
    f_M = _lambdified(field.M, [*w, S.Sigma], d, k)
    f_b = _lambdified(field.b, [*w, S.alpha, S.Sigma], d, k)
    Q, K, V_ = rng.standard_normal((k, d)), rng.standard_normal((k, d)), rng.standard_normal((d, d))
    c, alpha = 0.4, rng.standard_normal(d)
    G = rng.standard_normal((d, d))
    Sigma = G @ G.T / 2 + 0.2 * np.eye(d)
    ys, wts = gauss_hermite_gaussian(alpha, Sigma, 50)
    M, b = f_M(Q, K, V_, c, Sigma), f_b(Q, K, V_, c, alpha[:, None], Sigma)[:, 0]
    worst = 0.0
    for x in rng.standard_normal((3, d)):
        s = score(c, Q, K, x, ys)
        p = wts * np.exp(s - s.max())
        worst = max(worst, np.abs(b + M @ x - V_ @ (p @ ys / p.sum())).max())
    return worst


SCORES = {
    "softmax": (softmax, lambda c, Q, K, x, ys: c * (ys @ K.T) @ (Q @ x)),
    "l2": (l2, lambda c, Q, K, x, ys: -c * np.sum((Q @ x - ys @ K.T) ** 2, axis=1)),
}
FIELD_MUTANTS = {
    "M-transpose": lambda f: f.__class__(M=f.M.T, b=f.b, tilted_mean=f.tilted_mean, parts=f.parts),
    "M-factor": lambda f: f.__class__(M=2 * f.M, b=f.b, tilted_mean=f.tilted_mean, parts=f.parts),
    "b-sign": lambda f: f.__class__(M=f.M, b=-f.b, tilted_mean=f.tilted_mean, parts=f.parts),
}


@pytest.mark.parametrize("name", list(SCORES))
def test_quadratic_field_unmutated_matches_quadrature(name, rng):
    mod, score = SCORES[name]
    assert _quadrature_residual(mod.derive(), score, rng) < 1e-6     # 50-point quadrature


@pytest.mark.parametrize("mutant", list(FIELD_MUTANTS))
@pytest.mark.parametrize("name", list(SCORES))
def test_quadratic_field_mutation_is_caught(name, mutant, rng):
    """A transpose, a factor or a sign planted in the derived field fails quadrature."""
    mod, score = SCORES[name]
    assert _quadrature_residual(FIELD_MUTANTS[mutant](mod.derive()), score, rng) > 1e-3


def test_completing_the_square_mutation_is_caught(monkeypatch):
    """A sign planted in the machinery (the tilted precision Sigma^{-1} - H) is refused by
    quadratic_score_field's own check of the completed square."""
    original = S.decompose_quadratic_score

    def mutated(score):
        parts = original(score)
        return S.QuadraticScore(H=-parts.H, A=parts.A, g=parts.g)

    monkeypatch.setattr(S, "decompose_quadratic_score", mutated)
    with pytest.raises(AssertionError, match="completing the square"):
        l2.derive()


@pytest.mark.parametrize("name, old, new", [
    ("softmax", "((V @ (Sigma @ _T(K))) @ Q)", "((V @ (Sigma @ _T(Q))) @ K)"),  # a transpose
    ("l2", "(V @ R @ G @ Q)", "(V @ R @ G @ K)"),                    # a wrong factor
])
def test_printed_text_mutation_is_caught(name, old, new, rng):
    """An error planted in the printed code fails the comparison with lambdify of the
    derived expressions (tests/test_generated.py)."""
    mod = SCORES[name][0]
    source = S.render_module(f"{name}.py", "mutant\n", mod.functions())
    assert old in source
    module = _module(source.replace(old, new), f"{name}_mutant")
    d = k = 3
    f_M = _lambdified(mod.derive().M, [S.Q, S.K, S.V, S.scale, S.Sigma], d, k)
    Q, K, V_ = rng.standard_normal((k, d)), rng.standard_normal((k, d)), rng.standard_normal((d, d))
    G = rng.standard_normal((d, d))
    Sigma = G @ G.T
    assert np.abs(module.field_matrix(Q, K, V_, 0.7, Sigma) - f_M(Q, K, V_, 0.7, Sigma)).max() > 1e-3


def test_multihead_nonlinear_moment_equations_are_caught(monkeypatch):
    """The multi-head derivation rests on the moment equations being linear in (M, b): a
    planted quadratic term (Sigma' = M Sigma M^T) fails its additivity check."""
    def mutated(M, b):
        return b + M * S.alpha, M * S.Sigma * M.T, M * L
    assert multihead.check_linearity()
    monkeypatch.setattr(S, "moment_equations", mutated)
    assert not multihead.check_linearity()


def test_generated_sinkhorn_module_is_unmutated_reference(rng):
    """The committed module passes the residual the mutants fail."""
    assert _sinkhorn_residual(gen_sinkhorn, rng) < 1e-8


# ------------------------------------------------------- the printed compiled head


def test_softmax_wrong_mean_program_is_caught(monkeypatch, rng):
    """The mean column without its 1/c (cV alpha for V alpha) fails the derivation's check
    of the printed program, and the printed head then disagrees with factor_rhs's model."""
    d, k = S.d, S.k
    wrong = S.Program([(softmax.Pa, sp.MatMul(softmax.W, S.alpha))],
                      (sp.MatAdd(sp.MatMul(softmax.B, softmax.Pa[d + k:d + 2 * k, :]),
                                 softmax.Pa[:d, :]),))
    monkeypatch.setattr(softmax, "mean_program", lambda bias=None: wrong)
    assert not softmax.mean_form()
    source = S.render_module("softmax.py", "mutant\n", softmax.functions())
    module = _module(source, "softmax_mean_mutant")
    n, kk, c = 3, 2, 0.7
    Q, K, V = rng.standard_normal((kk, n)), rng.standard_normal((kk, n)), rng.standard_normal((n, n))
    Z = rng.standard_normal((n, n + 1))
    data = np.concatenate([[c], (c * V).ravel(), K.ravel(), Q.ravel()])
    out = np.empty(n * (n + 1))
    module.field_body(data, kk, n, n + 1, Z.ravel(), out, np.zeros(200))
    dmean, _ = module.moment_rhs(Q, K, V, c, Z[:, n], Z[:, :n] @ Z[:, :n].T)
    assert np.abs(out.reshape(n, n + 1)[:, n] - dmean).max() > 1e-3
