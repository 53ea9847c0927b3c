"""Generated code: no drift from the derivations, and agreement with lambdify."""

import difflib
import importlib
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import sympy as sp

from derivations import _symbolic as S
from derivations import generate, l2, softmax
from gaussian_pde._generated import l2 as gen_l2
from gaussian_pde._generated import sinkhorn as gen_sinkhorn
from gaussian_pde._generated import softmax as gen_softmax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_generated_code_is_up_to_date(tmp_path):
    """Regenerate into a temporary folder; any difference with the committed files fails."""
    generate.generate(tmp_path, tmp_path / "equations.md")
    committed = {p.name: p for p in (ROOT / "gaussian_pde" / "_generated").glob("*.py")}
    fresh = {p.name: p for p in tmp_path.glob("*.py")}
    assert set(committed) == set(fresh)
    fresh["equations.md"] = tmp_path / "equations.md"
    committed["equations.md"] = ROOT / "derivations" / "equations.md"
    for name in fresh:
        old = committed[name].read_text().splitlines(keepends=True)
        new = fresh[name].read_text().splitlines(keepends=True)
        diff = "".join(difflib.unified_diff(old, new, f"committed/{name}", f"fresh/{name}"))
        assert not diff, ("generated code is stale; run `python derivations/generate.py`\n"
                          + diff)


CLEAN_SLATE = """
import sys
sys.path.insert(0, ".")
from derivations import _symbolic as S, generate, sinkhorn
ok = S.run_checks(sinkhorn.CHECKS)      # numerical checks included: they need no package
rc = generate.main(["--no-checks"])
assert "gaussian_pde" not in sys.modules, "the derivations imported gaussian_pde"
sys.exit(rc or not ok)
"""


def test_regenerates_from_a_clean_slate(tmp_path):
    """Copy derivations/ and gaussian_pde/, delete the generated modules, regenerate them in a
    subprocess: the derivations need nothing from the package they generate, and the
    result is byte-identical to the committed files."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("derivations", "gaussian_pde"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=ignore)
    generated = tmp_path / "gaussian_pde" / "_generated"
    for path in generated.glob("*.py"):
        path.unlink()
    (tmp_path / "derivations" / "equations.md").unlink()
    run = subprocess.run([sys.executable, "-c", CLEAN_SLATE], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    committed = sorted(p.name for p in (ROOT / "gaussian_pde" / "_generated").glob("*.py"))
    assert sorted(p.name for p in generated.glob("*.py")) == committed
    for name in committed:
        assert (generated / name).read_bytes() == \
            (ROOT / "gaussian_pde" / "_generated" / name).read_bytes(), name
    assert (tmp_path / "derivations" / "equations.md").read_bytes() == \
        (ROOT / "derivations" / "equations.md").read_bytes()


def schroedinger_residual(gen, Q, K, scale, L):
    r"""How far a generated Sinkhorn module is from solving the Gaussian Schroedinger system.

    Independent of the closed form: with ``V = I``, ``factor_rhs`` is :math:`LD^T`, so the
    plan's cross-covariance is :math:`C = \operatorname{Cov}(x, y) = (L' L^T)^T`. The plan
    :math:`e^{y^TAx + f(x) + g(y)}\mu\otimes\mu` with both marginals :math:`\Sigma = LL^T`
    is the Gaussian whose joint covariance ``[[Sigma, C], [C^T, Sigma]]`` is PSD and whose
    precision has the cross block :math:`-A`, :math:`A = cK^TQ`. Also checks ``cov_rhs``
    (:math:`C + C^T`), ``field_matrix`` (:math:`M\Sigma = C^T`), ``moment_rhs`` (a non-symmetric
    ``V``: :math:`V\alpha`, :math:`VC^T + CV^T`) and ``field_offset``. Returns
    the largest relative residual (``L`` invertible and well conditioned).
    """
    try:
        return _schroedinger_residual(gen, Q, K, scale, L)
    except np.linalg.LinAlgError:        # NaN or a singular joint covariance
        return np.inf


def _schroedinger_residual(gen, Q, K, scale, L):
    d = L.shape[-1]
    eye = np.eye(d)
    Sig, A = L @ L.T, scale * K.T @ Q
    C = (gen.factor_rhs(Q, K, eye, scale, L) @ L.T).T
    if not np.all(np.isfinite(C)):
        return np.inf
    joint = np.block([[Sig, C], [C.T, Sig]])
    prec = np.linalg.inv(joint)
    size = np.abs(Sig).max()
    res = [np.abs(prec[d:, :d] + A).max() / max(np.abs(A).max(), 1.0) / np.linalg.cond(joint),
           -min(np.linalg.eigvalsh(joint).min(), 0.0) / np.abs(joint).max(),
           np.abs(gen.cov_rhs(Q, K, eye, scale, Sig) - C - C.T).max() / size,
           np.abs(gen.field_matrix(Q, K, eye, scale, Sig) @ Sig - C.T).max() / size]
    a = np.arange(1.0, d + 1)
    Vn = 2 * eye + np.triu(np.ones((d, d)), 1)      # not symmetric
    dm, dS = gen.moment_rhs(Q, K, Vn, scale, a, Sig)
    res += [np.abs(dm - Vn @ a).max() / d, np.abs(dS - Vn @ C.T - C @ Vn.T).max() / size,
            np.abs(gen.field_offset(Q, K, eye, scale, a, Sig)
                   + gen.field_matrix(Q, K, eye, scale, Sig) @ a - a).max() / d]
    return float(max(res)) if np.all(np.isfinite(res)) else np.inf


@pytest.mark.parametrize("d, k", [(1, 1), (3, 2), (4, 4)])
def test_generated_sinkhorn_solves_the_schroedinger_system(d, k, rng):
    """The generated Sinkhorn field against the defining properties of the plan (not the
    closed form): marginals, PSD coupling, the kernel in the precision's cross block."""
    for _ in range(5):
        Q, K = rng.standard_normal((k, d)), rng.standard_normal((k, d))
        L = rng.standard_normal((d, d)) + 2 * np.eye(d)
        assert schroedinger_residual(gen_sinkhorn, Q, K, float(rng.uniform(0.2, 2.0)), L) < 1e-8


def test_generated_files_carry_header():
    for path in (ROOT / "gaussian_pde" / "_generated").glob("*.py"):
        if path.name == "__init__.py":
            continue
        text = path.read_text()
        assert "GENERATED FILE - DO NOT EDIT" in text
        assert "derivations/generate.py" in text


def _lambdified(expr, args, d, k):
    dims = {S.d: d, S.k: k}
    concrete = [a.subs(dims) if isinstance(a, sp.MatrixSymbol) else a for a in args]
    return sp.lambdify(concrete, expr.subs(dims), "numpy")


@pytest.mark.parametrize("mod, gen", [(softmax, gen_softmax), (l2, gen_l2)])
@pytest.mark.parametrize("d, k", [(1, 1), (3, 2), (4, 4)])
def test_generated_matches_lambdify(mod, gen, d, k, rng):
    """Generated (batched, solve-based) code equals lambdify of the SymPy expressions."""
    field = mod.derive()
    mean_rhs, cov_rhs, factor_rhs = S.moment_equations(field.M, field.b)
    w = (S.Q, S.K, S.V, S.scale)
    f_M = _lambdified(field.M, [*w, S.Sigma], d, k)
    f_b = _lambdified(field.b, [*w, S.alpha, S.Sigma], d, k)
    f_mean = _lambdified(mean_rhs, [*w, S.alpha, S.Sigma], d, k)
    f_cov = _lambdified(cov_rhs, [*w, S.alpha, S.Sigma], d, k)
    f_L = _lambdified(factor_rhs, [*w, S.L], d, k)
    for _ in range(5):
        Q, K = rng.standard_normal((k, d)), rng.standard_normal((k, d))
        V = rng.standard_normal((d, d))
        c = float(rng.uniform(0.2, 2.0))
        L = rng.standard_normal((d, d))
        Sig = L @ L.T
        a = rng.standard_normal(d)
        np.testing.assert_allclose(gen.field_matrix(Q, K, V, c, Sig), f_M(Q, K, V, c, Sig),
                                   rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(gen.field_offset(Q, K, V, c, a, Sig),
                                   f_b(Q, K, V, c, a[:, None], Sig)[:, 0], rtol=1e-10, atol=1e-12)
        dm, dS = gen.moment_rhs(Q, K, V, c, a, Sig)
        np.testing.assert_allclose(dm, f_mean(Q, K, V, c, a[:, None], Sig)[:, 0],
                                   rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(dS, f_cov(Q, K, V, c, a[:, None], Sig), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(gen.cov_rhs(Q, K, V, c, Sig), dS, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(gen.factor_rhs(Q, K, V, c, L), f_L(Q, K, V, c, L),
                                   rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gen", [gen_softmax, gen_l2])
def test_generated_broadcasts_over_batches(gen, rng):
    """A stack of states gives the same as a loop over states."""
    d, k, B = 3, 2, 7
    Q, K, V = rng.standard_normal((k, d)), rng.standard_normal((k, d)), rng.standard_normal((d, d))
    Ls = rng.standard_normal((B, d, d))
    Sig = Ls @ np.swapaxes(Ls, -1, -2)
    a = rng.standard_normal((B, d))
    dm, dS = gen.moment_rhs(Q, K, V, 0.7, a, Sig)
    for i in range(B):
        dm_i, dS_i = gen.moment_rhs(Q, K, V, 0.7, a[i], Sig[i])
        np.testing.assert_allclose(dm[i], dm_i, rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(dS[i], dS_i, rtol=1e-13, atol=1e-14)
        np.testing.assert_allclose(gen.factor_rhs(Q, K, V, 0.7, Ls)[i],
                                   gen.factor_rhs(Q, K, V, 0.7, Ls[i]), rtol=1e-13, atol=1e-14)


def test_kernel_printer_hoists_weight_products():
    """Weights are hoisted one factor at a time (the scale folded into V); only the state
    is left in the body, in factor_rhs's left-to-right order of products."""
    e = S.scale * S.V * S.L * S.L.T * S.K.T * S.Q * S.L
    for batched in (False, True):
        printer = S.KernelPrinter(S.L, batched=batched)
        body = printer(e)
        hoisted = dict(printer.hoisted)
        assert sorted(hoisted.values()) == ["(scale * V)", "Q", "_T(K)"]
        assert "Q" not in body and "V" not in body and "K" not in body
        assert body.count("_dot(" if not batched else " @ ") == 5


#: the derivations whose generated module has a printed compiled head (``field_body``),
#: and those of them with printed Jacobian parts (``field_parts``)
HEAD_TYPES = [mod for mod in generate.GENERATED_TYPES if hasattr(mod, "INPUTS")]
PARTS_TYPES = [mod for mod in HEAD_TYPES
               if hasattr(importlib.import_module(f"gaussian_pde._generated.{mod.NAME}"), "field_parts")]


def _generated(mod):
    return importlib.import_module(f"gaussian_pde._generated.{mod.NAME}")


def _head_numbers(mod, d, k, rng):
    """Random weights of a type (its generated signature), their pack ``data`` (the
    derivation's ``INPUTS``, lambdified) and the lambdified field ``M(alpha, Sigma)``,
    ``b(alpha, Sigma)``."""
    dims = {S.d: d, S.k: k}
    names = getattr(mod, "SIGNATURE", S.SIGNATURE)
    symbols = [S.scale if n == "scale" else getattr(S, n) if n in "QKV" else getattr(mod, n)
               for n in names]
    values = [float(rng.uniform(0.2, 2.0)) if s == S.scale
              else rng.standard_normal(tuple(int(n) for n in s.subs(dims).shape)) for s in symbols]
    concrete = [s.subs(dims) if isinstance(s, sp.MatrixSymbol) else s for s in symbols]
    defs = getattr(mod, "DEFINITIONS", {})          # auxiliary scalars (L2's s = sqrt(2c))
    data = np.concatenate([np.ravel(sp.lambdify(concrete, e.xreplace(defs).subs(dims), "numpy")(*values))
                           for e, *_ in mod.INPUTS])
    field = mod.derive()
    state = [S.alpha.subs(dims), S.Sigma.subs(dims)]
    f_M, f_b = (sp.lambdify(concrete + state, e.subs(dims), "numpy") for e in (field.M, field.b))
    return (data, lambda a, Sig: f_M(*values, a[:, None], Sig),
            lambda a, Sig: np.broadcast_to(f_b(*values, a[:, None], Sig), (d, 1))[:, 0])


@pytest.mark.parametrize("mod", PARTS_TYPES, ids=lambda m: m.NAME)
@pytest.mark.parametrize("d, k, rank", [(1, 1, 1), (3, 2, 3), (4, 4, 2), (3, 5, 3)])
def test_printed_head_equals_the_lambdified_field(mod, d, k, rank, rng):
    """The printed head body (plain Python) against lambdify of the derivation's M and b:
    Z' = [M(LL^T) L | b + M alpha] (a second-moment head: M(alpha, LL^T) Z), with k < d,
    k > d and rank-deficient factors; the printed Jacobian parts against the identities
    they state, dM[dSigma] = A dSigma C (a second-moment head's M is linear in
    P = Sigma + alpha alpha^T), N alpha = alpha'(alpha) - alpha'(0) and
    dalpha'[dSigma] = A dSigma r, the derivatives by central differences."""
    gen = _generated(mod)
    second = getattr(mod, "SECOND_MOMENT", False)
    for _ in range(3):
        data, f_M, f_b = _head_numbers(mod, d, k, rng)
        L = np.zeros((d, d))
        L[:, :rank] = rng.standard_normal((d, rank))
        a = rng.standard_normal(d)
        Sig = L @ L.T
        M = f_M(a, Sig)
        want = np.column_stack([M @ L, f_b(a, Sig) + M @ a])
        scale = np.abs(want).max()
        for m in (d + 1,) if second else (d, d + 1):
            Z = np.ascontiguousarray(np.column_stack([L, a])[:, :m])
            out = np.full(d * m, np.nan)
            gen.field_body(data, k, d, m, Z.ravel(), out, np.full(8 * (d + k + 2) ** 2, np.nan))
            np.testing.assert_allclose(out.reshape(d, m), want[:, :m], rtol=1e-12,
                                       atol=1e-13 * scale)
        A, C, Mp, N = (np.full((d, d), np.nan) for _ in range(4))
        r = np.full(d, np.nan)
        Z = np.column_stack([L, a])
        assert gen.field_parts(data, k, d, d + 1, Z, A, C, Mp, N, r)
        np.testing.assert_allclose(Mp, M, rtol=1e-12, atol=1e-13 * np.abs(M).max())
        G = rng.standard_normal((d, d))
        dSig = G + G.T                                   # any direction, not only PSD
        h = 1e-5

        def along(f, h=h, dSig=dSig, Sig=Sig):
            return (f(Sig + h * dSig) - f(Sig - h * dSig)) / (2 * h)

        dM = along(lambda S_, a=a, f_M=f_M: f_M(a, S_))
        np.testing.assert_allclose(A @ dSig @ C, dM, rtol=1e-6, atol=1e-7 * np.abs(dM).max())
        if second:
            continue

        def mean(alpha, S_, f_M=f_M, f_b=f_b):
            return f_b(alpha, S_) + f_M(alpha, S_) @ alpha

        np.testing.assert_allclose(N @ a, mean(a, Sig) - mean(0 * a, Sig), rtol=1e-11,
                                   atol=1e-12 * scale)
        dmean = along(lambda S_, a=a, mean=mean: mean(a, S_))
        np.testing.assert_allclose(A @ dSig @ r, dmean, rtol=1e-6,
                                   atol=1e-7 * np.abs(dmean).max())


@pytest.mark.parametrize("mod", [m for m in HEAD_TYPES if m not in PARTS_TYPES],
                         ids=lambda m: m.NAME)
@pytest.mark.parametrize("d, k, rank", [(1, 1, 1), (3, 2, 3), (4, 4, 2)])
def test_printed_head_equals_the_generated_numpy_field(mod, d, k, rank, rng):
    """A printed head without Jacobian parts (Sinkhorn: its scalar function through an SVD,
    which lambdify cannot print) against the other printed form of the same derivation,
    the generated NumPy ``factor_rhs`` and ``moment_rhs``, with k < d, k > d and
    rank-deficient factors."""
    gen = _generated(mod)
    dims = {S.d: d, S.k: k}
    weights = [S.Q, S.K, S.V, S.scale]
    concrete = [w.subs(dims) if isinstance(w, sp.MatrixSymbol) else w for w in weights]
    for _ in range(3):
        Q, K, V = rng.standard_normal((k, d)), rng.standard_normal((k, d)), rng.standard_normal((d, d))
        c = float(rng.uniform(0.2, 2.0))
        data = np.concatenate([np.ravel(sp.lambdify(concrete, e.xreplace(mod.DEFINITIONS).subs(dims),
                                                    "numpy")(Q, K, V, c)) for e, *_ in mod.INPUTS])
        L = np.zeros((d, d))
        L[:, :rank] = rng.standard_normal((d, rank))
        a = rng.standard_normal(d)
        dmean, _ = gen.moment_rhs(Q, K, V, c, a, L @ L.T)
        want = np.column_stack([gen.factor_rhs(Q, K, V, c, L), dmean])
        for m in (d, d + 1):
            Z = np.ascontiguousarray(np.column_stack([L, a])[:, :m])
            out = np.full(d * m, np.nan)
            gen.field_body(data, k, d, m, Z.ravel(), out, np.full(8 * (d + k + 2) ** 2, np.nan))
            np.testing.assert_allclose(out.reshape(d, m), want[:, :m], rtol=1e-11,
                                       atol=1e-12 * np.abs(want).max())


def test_printed_head_keeps_small_fields_accurate(rng):
    """Near a steady state (K = -Q, QL -> 0) the field is ~1e-9 while L is O(1): the order
    of the products decides how much cancels. The printed softmax head (plain Python)
    must stay as accurate as factor_rhs against an extended-precision reference
    (multiplying K^T Q first lost three digits here)."""
    import gaussian_pde as gp

    d = 4
    Q, G = rng.standard_normal((d // 2, d)), rng.standard_normal((d, d))
    att = gp.Softmax(Q, -Q, G.T @ G, scale=1 / np.sqrt(d))
    L = gp.solve(att, None, G @ G.T, (0, 1e6), t_eval=[1e6], method="LSODA",
                 rtol=1e-10, atol=1e-14).factor[-1]
    x = np.longdouble
    ref = (x(att.scale) * att.V.astype(x)) @ (L.astype(x) @ L.T.astype(x)) \
        @ att.K.T.astype(x) @ att.Q.astype(x) @ L.astype(x)
    size = float(np.abs(ref).max())
    assert size < 1e-6 * np.abs(L).max() ** 3            # a small field from O(1) factors
    c = att.scale
    data = np.concatenate([[c], (c * att.V).ravel(), att.K.ravel(), att.Q.ravel()])

    def printed(X):
        out = np.empty(d * d)
        gen_softmax.field_body(data, d // 2, d, d, np.ascontiguousarray(X).ravel(), out,
                               np.zeros(8 * (2 * d + 2) ** 2))
        return out.reshape(d, d)

    err = {name: float(np.abs(f(L) - ref).max()) / size
           for name, f in (("factor_rhs", att.factor_rhs), ("field_body", printed))}
    assert max(err.values()) < 2e-8, err   # about 2e-9 here; K^T Q first: 1.3e-7
