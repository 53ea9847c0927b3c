"""The symbolic derivations: quadratic-score field, Sinkhorn system, multi-head, user scores."""

import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest
import sympy as sp

import gaussian_pde as gp
from derivations import _symbolic as S
from derivations import biased_softmax, generate, l2, linear, multihead, sinkhorn, softmax
from gaussian_pde.attention._kernels import ParticleDiagnostics, normalized_average
from tests.attention import capability_checks

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_softmax_field_is_derived():
    field = softmax.derive()
    assert field.parts.H in (0, sp.ZeroMatrix(S.d, S.d))
    assert sp.expand(field.parts.A - S.scale * S.K.T * S.Q).doit() in (0, sp.ZeroMatrix(S.d, S.d))
    # M = V Sigma A, b = V alpha (docs/math.md section 3.3)
    assert sp.expand(field.M - S.scale * S.V * S.Sigma * S.K.T * S.Q).doit() in \
        (0, sp.ZeroMatrix(S.d, S.d))
    assert field.b == S.V * S.alpha


def test_l2_decomposition():
    parts = l2.derive().parts
    assert sp.expand(parts.H - 2 * S.scale * S.K.T * S.K).doit() in (0, sp.ZeroMatrix(S.d, S.d))
    assert sp.expand(parts.A - 2 * S.scale * S.K.T * S.Q).doit() in (0, sp.ZeroMatrix(S.d, S.d))


def test_not_quadratic_score_is_rejected():
    cubic = S.scale * ((S.K * S.y).T * (S.K * S.y)) * ((S.Q * S.x).T * (S.K * S.y))
    with pytest.raises(ValueError, match="quadratic"):
        S.decompose_quadratic_score(cubic)


def test_sinkhorn_scalar_system_solved_from_scratch():
    sol = sinkhorn.solve_scalar_schroedinger()
    assert sol["difference"] == 0
    # the admissible root gives a positive-definite coupling: u > |a|
    a, s = sp.Rational(3, 2), sp.Rational(1, 3)
    u = sol["u"].subs({sp.Symbol("a", real=True): a, sp.Symbol("sigma", positive=True): s})
    assert u > abs(a)


def test_sinkhorn_phi_identity():
    assert sinkhorn.check_phi_identity() == 0


def test_sinkhorn_matrix_fixed_point_random_singular():
    """Closed form satisfies the Schroedinger fixed point, singular A and Sigma included."""
    assert sinkhorn.check_matrix_fixed_point(seed=1, trials=40) < 1e-9


def test_sinkhorn_phi_is_solved_from_the_reduced_fixed_point():
    g = sinkhorn.g_sym
    assert sp.simplify(sinkhorn.derive_phi() - 2 / (1 + sp.sqrt(1 + 4 * g))) == 0


def test_sinkhorn_fixed_point_through_the_functional_calculus():
    assert sinkhorn.check_fixed_point_symbolic()
    assert sinkhorn.check_coupling_is_psd()
    assert S.check_gram_cross_svd(sinkhorn.cross(sinkhorn._B))


def test_sinkhorn_printed_programs_equal_the_derivation():
    assert sinkhorn.check_programs() == dict.fromkeys(
        ("factor_rhs", "kernel", "field_matrix", "field_offset", "moment_rhs", "cov_rhs"), True)
    assert sinkhorn.check_svd_form() < 1e-12


def test_sinkhorn_generated_code_is_printed_from_phi():
    """The printed helper carries the scalar s phi(s^2) of the derived PHI."""
    helper = sinkhorn.helper_function()
    s = sp.Symbol("s", nonnegative=True)
    printed = sp.sympify(helper.body[1][1].replace("np.", ""), locals={"s": s})
    assert sp.simplify(printed - s * sinkhorn.PHI.subs(sinkhorn.g_sym, s**2)) == 0


def test_softmax_kernel_is_printed_from_the_checked_program():
    assert softmax.thin_factor_form()


def test_multihead_linearity():
    assert multihead.check_linearity()


def test_user_defined_quadratic_score(tmp_path, rng):
    """Documented example: a new attention type from a SymPy score (README, 'Adding a type').

    The score c<Qx, Ky> - c/2 |Ky|^2 is quadratic in y; the derived field must equal the
    velocity computed by Gauss-Hermite quadrature of the attention integral.
    """
    score = S.scale * (S.Q * S.x).T * (S.K * S.y) \
        - S.scale / 2 * (S.K * S.y).T * (S.K * S.y)
    source = S.derive_module(score, "tempered", "Tempered attention")
    path = tmp_path / "tempered.py"
    path.write_text(source)
    namespace = {}
    exec(compile(source.replace("from .._common.linalg", "from gaussian_pde._common.linalg"), str(path),
                 "exec"), namespace)
    d, k = 2, 2
    Q, K, V = rng.standard_normal((k, d)), rng.standard_normal((k, d)), rng.standard_normal((d, d))
    c = 0.6
    alpha = rng.standard_normal(d)
    G = rng.standard_normal((d, d))
    Sigma = G @ G.T / 2
    M = namespace["field_matrix"](Q, K, V, c, Sigma)
    b = namespace["field_offset"](Q, K, V, c, alpha, Sigma)
    from gaussian_pde.closure._quadrature import gauss_hermite_gaussian
    ys, w = gauss_hermite_gaussian(alpha, Sigma, 60)
    for x in rng.standard_normal((4, d)):
        s = c * (ys @ K.T) @ (Q @ x) - c / 2 * np.sum((ys @ K.T) ** 2, axis=1)
        p = w * np.exp(s - s.max())
        field = V @ (p @ ys / p.sum())
        np.testing.assert_allclose(b + M @ x, field, rtol=1e-9, atol=1e-10)
    # the fast kernel of the user's type (an inverse involving the state: a solve)
    L = np.linalg.cholesky(Sigma)
    kernel = namespace["factor_kernel"](Q, K, V, c)
    np.testing.assert_allclose(kernel(L), namespace["factor_rhs"](Q, K, V, c, L), rtol=1e-12)
    np.testing.assert_allclose(kernel(L), M @ L, rtol=1e-12)


def _tempered_module():
    """The generated module of the documented example score, as an importable module."""
    score = S.scale * (S.Q * S.x).T * (S.K * S.y) \
        - S.scale / 2 * (S.K * S.y).T * (S.K * S.y)
    source = S.derive_module(score, "tempered", "Tempered attention")
    module = types.ModuleType("tempered")
    exec(compile(source.replace("from .._common.linalg", "from gaussian_pde._common.linalg"),
                 "tempered.py", "exec"), module.__dict__)
    return module


@pytest.fixture
def restore_registry():
    """Put the registry back as it was, whatever the test registered."""
    saved = dict(gp.ATTENTIONS)
    yield gp.ATTENTIONS
    gp.ATTENTIONS.clear()
    gp.ATTENTIONS.update(saved)


def test_user_defined_type_registers_and_offers_its_capabilities(restore_registry, rng):
    """One derivation script and one short class: the new type is registered, declares its
    capabilities and passes the checks every built-in type passes
    (tests/attention/capability_checks.py)."""

    class Tempered(gp.SingleHeadAttention):
        r"""Score :math:`c\langle Qx, Ky\rangle - \tfrac c2 |Ky|^2` (quadratic in y)."""

        name = "tempered"
        generated = _tempered_module()

        def particle_kernel(self, x, opts):
            qx, kx = self._projections(x)
            a = np.column_stack([self.scale * qx, np.ones(len(x))])
            b = np.column_stack([kx, -0.5 * self.scale * np.sum(kx**2, axis=1)])
            avg, ess = normalized_average(a, b, x, chunk_size=opts.chunk_size,
                                          dtype=opts.dtype, want_ess=opts.want_ess)
            return avg @ self.V.T, ParticleDiagnostics(ess=ess)

    assert "tempered" not in gp.ATTENTIONS
    assert gp.register_attention(Tempered) is Tempered
    assert gp.ATTENTIONS["tempered"] is Tempered and gp.get_attention("tempered") is Tempered
    assert (Tempered.gaussian_preserving, Tempered.exact_jacobian, Tempered.closure) == \
        (True, False, None)
    capability_checks.check_all(Tempered, rng)
    # the solvers take it: solve (with the mean), particles, the closure; solve_batch runs
    # the compiled integrator, which needs a compiled field, and says so
    att = Tempered.example(2, rng)
    mean0, cov0 = np.array([0.3, -0.2]), np.array([[1.0, 0.2], [0.2, 0.5]])
    sol = gp.solve(att, mean0, cov0, (0.0, 0.5), t_eval=[0.5])
    assert sol.status == gp.Status.FINISHED
    with pytest.raises(TypeError, match=r"`attentions_or_weights\[0\]` is Tempered.*compiled field"):
        gp.solve_batch([att, att], np.stack([cov0, 2 * cov0]), (0.0, 0.5), t_eval=[0.5])
    clo = gp.solve_closure(att, mean0, cov0, (0.0, 0.5), t_eval=[0.5])
    np.testing.assert_allclose(clo.cov[-1], sol.cov[-1], rtol=1e-6)
    ps = gp.simulate_particles(att, gp.sample_gaussian(mean0, cov0, 2000, seed=1), (0.0, 0.5),
                               t_eval=[0.5])
    # 2000 tokens: the empirical mean is within a few standard errors of the ODE's
    assert np.abs(ps.mean[-1] - sol.mean[-1]).max() < 5 * np.sqrt(np.trace(cov0) / 2000)
    # the sweeps see it too (a Gaussian-preserving single-head type)
    from gaussian_pde.sweep._spec import SweepSpec, WeightSpec

    assert SweepSpec(attention=["tempered"], dims=[2], draws=1).attention == ("tempered",)
    assert WeightSpec(head_type="tempered").head_type == "tempered"


def test_registry_is_restored_after_the_user_type():
    assert "tempered" not in gp.ATTENTIONS


@pytest.mark.slow
@pytest.mark.parametrize("mod", [softmax, l2])
@pytest.mark.parametrize("check", ["direct integration, d = 1", "direct integration, d = 2"])
def test_direct_symbolic_integration(mod, check):
    """Independent check: SymPy integrates the attention-weighted Gaussian directly."""
    assert mod.CHECKS[check]()


def test_sinkhorn_cross_is_accurate_when_ill_conditioned(rng):
    """B phi(B^T B) from the SVD of B: exact by construction for B = U diag(s) W^T with
    singular values over 12 orders of magnitude (the Gram form B^T B would square it)."""
    from gaussian_pde._common.linalg import sinkhorn_cross, sinkhorn_phi

    for d in (2, 5):
        U, _ = np.linalg.qr(rng.standard_normal((d, d)))
        W, _ = np.linalg.qr(rng.standard_normal((d, d)))
        s = np.logspace(4, -8, d)
        B = (U * s) @ W.T
        exact = (U * (2 * s / (1 + np.sqrt(1 + 4 * s**2)))) @ W.T
        err = np.abs(sinkhorn_cross(B) - exact).max()
        assert err < 50 * np.finfo(float).eps * s[0]        # rounding of the SVD of B
        if d == 5:   # the Gram form it replaced loses about three more digits here
            assert np.abs(B @ sinkhorn_phi(B.T @ B) - exact).max() > 10 * err
        # batched, and zero singular values
        stack = np.stack([B, np.zeros((d, d))])
        np.testing.assert_allclose(sinkhorn_cross(stack)[0], sinkhorn_cross(B), rtol=1e-14)
        assert np.all(sinkhorn_cross(stack)[1] == 0)


_IMPORT_ALL = """
import importlib, pathlib, sys
names = sorted(p.stem for p in pathlib.Path("derivations").glob("*.py")
               if p.stem not in ("__init__", "generate"))
prefix = sys.argv[1]
if not prefix:                       # as `python derivations/X.py` sees it
    sys.path.insert(0, "derivations")
for name in names:
    importlib.import_module(prefix + name)
print(" ".join(names))
"""


@pytest.mark.parametrize("how, prefix", [("python derivations/X.py", ""),
                                         ("python -m derivations.X", "derivations.")])
def test_every_derivation_imports_both_as_a_script_and_as_a_module(how, prefix):
    """Each derivation module imports its helpers whichever way it is run: as a script
    (``derivations/`` first on ``sys.path``) or as a module of the ``derivations`` package
    (the ``__main__`` blocks then only run the checks)."""
    run = subprocess.run([sys.executable, "-c", _IMPORT_ALL, prefix], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{how}:\n{run.stderr}"
    names = run.stdout.split()
    assert {mod.NAME for mod in generate.ALL_TYPES} <= set(names), names


@pytest.mark.parametrize("check", [
    softmax.thin_factor_form, softmax.mean_form, softmax.jacobian_parts,
    lambda: softmax.mean_form(biased_softmax.derive, bias=biased_softmax.q),
    lambda: softmax.jacobian_parts(biased_softmax.derive, bias=biased_softmax.q),
    linear.check_kernel_program, linear.check_parts, sinkhorn.check_head_programs,
    lambda: l2.check_head_programs(shapes=((2, 1),))],
    ids=["softmax-field", "softmax-mean", "softmax-parts", "biased-mean", "biased-parts",
         "linear-field", "linear-parts", "sinkhorn-field", "l2-exact"])
def test_compiled_head_programs_are_the_derived_field(check):
    """The programs printed into the compiled heads, composed back, are the derived field,
    and their Jacobian parts the derivatives they state (the derivations' own checks)."""
    assert check()
