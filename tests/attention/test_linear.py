"""Linear attention (no normalisation), added through its two files alone.

Its field matrix :math:`M = V(\\Sigma + \\alpha\\alpha^T)A` depends on the mean. Checked
against an independent quadrature of the mean-field velocity (the score written out here,
not the type's), against the closed-form blow-up of the second moment
:math:`P = \\Sigma + \\alpha\\alpha^T` (which follows softmax's covariance Riccati
equation), against the scalar solution, and through every solver: ``solve`` with
events, ``solve_batch`` with means (compiled), particles and ``compare``. The
registry-wide checks (particle estimate of the moment equations, the refusals without a
mean) run on it from ``tests/attention/test_capabilities.py``.
"""

import re

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss

import gaussian_pde as gp
from gaussian_pde._common.differences import central_jacobian
from gaussian_pde.cli._compare import compare_examples
from gaussian_pde.cli._main_job import default_examples
from tests.attention.test_compiled_fields import _python_head

NAME = "linear"


@pytest.fixture
def cls():
    return gp.get_attention(NAME)


def _psd_sqrt(S):
    w, U = np.linalg.eigh(S)
    return (U * np.sqrt(np.clip(w, 0, None))) @ U.T


def _riccati_blowup(A, P0):
    """1 / lambda_max(P0^1/2 (A + A^T) P0^1/2): softmax's Riccati blow-up (V = I)."""
    R = _psd_sqrt(P0)
    return 1.0 / np.linalg.eigvalsh(R @ (A + A.T) @ R).max()


def _quadrature_velocity(Q, K, V, c, mean, cov, X, n=6):
    """Gauss-Hermite (probabilists') product rule for V E[s(x, y) y], y ~ N(mean, cov).

    The integrand is a polynomial of degree 2 in y: the rule is exact.
    """
    t, w = hermegauss(n)
    d = mean.size
    grids = np.meshgrid(*([t] * d), indexing="ij")
    Z = np.stack([g.ravel() for g in grids], axis=1)
    W = np.prod(np.meshgrid(*([w] * d), indexing="ij"), axis=0).ravel()
    W = W / W.sum()
    Y = mean + Z @ np.linalg.cholesky(cov).T
    return np.array([V @ ((W * (c * (Y @ K.T) @ (Q @ x))) @ Y) for x in X])


def _example_state(rng, d):
    G = rng.standard_normal((d, d))
    return 0.5 * rng.standard_normal(d), 0.3 * G @ G.T / d + 0.2 * np.eye(d)


def test_field_matches_an_independent_quadrature(cls, rng):
    d, k = 3, 2
    Q, K = rng.standard_normal((k, d)), rng.standard_normal((k, d))
    V = rng.standard_normal((d, d))
    att = cls(Q, K, V, scale=0.8)
    mean, cov = _example_state(rng, d)
    X = rng.standard_normal((5, d))
    want = _quadrature_velocity(Q, K, V, 0.8, mean, cov, X)
    np.testing.assert_allclose(att.velocity(mean, cov, X), want, rtol=1e-11, atol=1e-12)
    # the mean enters the field matrix: a shifted mean changes the field at the same x
    assert np.abs(att.velocity(mean + 0.5, cov, X) - want).max() > 1e-2
    # and the moment equations are those of the affine field b + M x with b = 0
    M = att.field_matrix_with_mean(cov, mean)
    dm, dc = gp.moment_rhs(att, mean, cov)
    np.testing.assert_allclose(dm, M @ mean, rtol=1e-13)
    np.testing.assert_allclose(dc, M @ cov + cov @ M.T, rtol=1e-12)
    np.testing.assert_allclose(att.field_offset(mean, cov), 0.0)


def test_second_moment_follows_softmax_riccati(cls, rng):
    """P = Sigma + alpha alpha^T solves softmax's covariance equation started at P0."""
    d = 3
    Q, K = 0.5 * rng.standard_normal((d, d)), 0.5 * rng.standard_normal((d, d))
    V = rng.standard_normal((d, d)) / np.sqrt(d)
    mean, cov = _example_state(rng, d)
    t_eval = [0.1, 0.2, 0.3]
    lin = gp.solve(cls(Q, K, V), mean, cov, (0.0, 0.3), t_eval=t_eval, rtol=1e-11, atol=1e-13)
    soft = gp.solve(gp.Softmax(Q, K, V), None, cov + np.outer(mean, mean), (0.0, 0.3),
                    t_eval=t_eval, rtol=1e-11, atol=1e-13)
    assert lin.status == soft.status == gp.Status.FINISHED
    P = lin.cov + lin.mean[:, :, None] * lin.mean[:, None, :]
    np.testing.assert_allclose(P, soft.cov, rtol=1e-8, atol=1e-10)
    # the generated second-moment equation is softmax's covariance equation
    P0 = cov + np.outer(mean, mean)
    np.testing.assert_allclose(gp.moment_rhs(gp.Softmax(Q, K, V), mean, P0)[1],
                               _gen_second_moment(Q, K, V, P0), rtol=1e-12)


def _gen_second_moment(Q, K, V, P):
    from gaussian_pde._generated import linear as gen

    return gen.second_moment_rhs(Q, K, V, 1.0 / np.sqrt(Q.shape[0]), P)


@pytest.mark.parametrize("d", [1, 2, 4])
def test_blowup_time_is_the_riccati_closed_form(cls, rng, d):
    Q, K = rng.standard_normal((d, d)), rng.standard_normal((d, d))
    att = cls(Q, K, np.eye(d))
    mean, cov = _example_state(rng, d)
    S = att.A + att.A.T
    if np.linalg.eigvalsh(S).max() <= 0:
        S = -S
        att = cls(Q, -K, np.eye(d))
    t_star = _riccati_blowup(att.A, cov + np.outer(mean, mean))
    sol = gp.solve(att, mean, cov, (0.0, 2.0 * t_star))
    assert sol.status == gp.Status.BLOWUP, sol.message
    assert abs(sol.t_blowup - t_star) < 1e-6 * t_star
    # a larger mean blows up sooner; a zero mean is plain softmax's covariance
    assert gp.solve(att, 2 * mean, cov, (0.0, 2.0 * t_star)).t_blowup < sol.t_blowup
    zero = gp.solve(att, np.zeros(d), cov, (0.0, 4.0 * t_star))
    soft = gp.solve(gp.Softmax(att.Q, att.K, np.eye(d)), None, cov, (0.0, 4.0 * t_star))
    assert zero.status == soft.status
    if soft.status == gp.Status.BLOWUP:
        assert abs(zero.t_blowup - soft.t_blowup) < 1e-6 * soft.t_blowup


def test_scalar_solution(cls):
    att = cls(np.array([[0.7]]), np.array([[0.9]]), np.array([[1.3]]), scale=0.5)
    m0, s0 = 0.6, 0.8
    t = np.array([0.1, 0.3, 0.5])
    mean, var = gp.scalar_solution(att, m0, s0, t)
    sol = gp.solve(att, [m0], [[s0]], (0.0, 0.5), t_eval=t, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(sol.mean[:, 0], mean, rtol=1e-8)
    np.testing.assert_allclose(sol.cov[:, 0, 0], var, rtol=1e-8)
    va = 0.5 * 0.7 * 0.9 * 1.3
    assert abs(gp.solve(att, [m0], [[s0]], (0.0, 5.0)).t_blowup
               - 1 / (2 * va * (s0 + m0**2))) < 1e-6


def test_solve_with_events(cls):
    ex = cls.example_setting()
    att, mean0, cov0 = ex["attention"], ex["mean0"], ex["cov0"]
    t_star = _riccati_blowup(att.A, cov0 + np.outer(mean0, mean0))
    assert 0.4 < t_star < 0.6
    for method in ("auto", "Radau", "DOP853"):
        sol = gp.solve(att, mean0, cov0, (0.0, ex["horizon"]), method=method)
        assert sol.status == gp.Status.BLOWUP, (method, sol.message)
        assert abs(sol.t_blowup - t_star) < 1e-5 * t_star, method

    def event(t, mean, cov):
        return np.trace(cov) - 10.0

    event.terminal = True
    sol = gp.solve(att, mean0, cov0, (0.0, ex["horizon"]), events=[event])
    assert sol.status != gp.Status.BLOWUP and sol.t_final < t_star
    assert abs(np.trace(sol.cov_final) - 10.0) < 1e-6
    with pytest.raises(ValueError, match="`mean0` is required"):
        gp.solve(att, None, cov0, (0.0, 1.0))
    with pytest.raises(TypeError, match="depends on the mean"):
        att.cov_rhs(cov0)


def test_solve_batch_with_means_matches_solve(cls, rng):
    """The compiled path carries the mean in its own units (the equation is cubic in it)."""
    d = 3
    atts, covs, means = [], [], []
    for b in range(5):
        Q, K = 0.5 * rng.standard_normal((d, d)), 0.5 * rng.standard_normal((d, d))
        atts.append(cls(Q, K, rng.standard_normal((d, d)) / np.sqrt(d)))
        mean, cov = _example_state(rng, d)
        # a mean of a few units (a homogeneous equation would hold it in units 2^-k)
        covs.append(cov)
        means.append(mean * (5.0 if b == 0 else 1.0))
    covs, means = np.array(covs), np.array(means)
    t_eval = [0.5, 1.0]
    bat = gp.solve_batch(atts, covs, (0.0, 1.0), t_eval=t_eval, mean0s=means)
    assert bat.path == "compiled"
    for b in range(5):
        one = gp.solve(atts[b], means[b], covs[b], (0.0, 1.0), t_eval=t_eval)
        assert str(bat.status[b]) == str(one.status)
        if one.status == gp.Status.BLOWUP:
            assert abs(bat.t_blowup[b] - one.t_blowup) < 1e-3 * one.t_blowup
        else:
            np.testing.assert_allclose(bat.cov_final[b], one.cov_final, rtol=1e-6, atol=1e-9)
            np.testing.assert_allclose(bat.mean_final[b], one.mean_final, rtol=1e-6,
                                       atol=1e-9)
    with pytest.raises(ValueError, match="`mean0s` is required"):
        gp.solve_batch(atts, covs, (0.0, 1.0))


def test_mixture_closure_is_exact(cls, rng):
    """The field against a mixture is linear in x, with the mixture's second moment
    ``S = sum_k w_k (Sigma_k + alpha_k alpha_k^T)``: every token moves by one map, so the
    closure is exact. The mixture's total mean and covariance follow ``solve`` of the
    Gaussian with those moments; each component is carried by the same flow F(t)
    (``alpha_k(t) = F alpha_k(0)``, ``Sigma_k(t) = F Sigma_k(0) F^T``)."""
    d, K = 2, 3
    att = cls(0.6 * rng.standard_normal((d, d)), 0.6 * rng.standard_normal((d, d)),
              rng.standard_normal((d, d)) / 2)
    w = np.array([0.2, 0.3, 0.5])
    means = 0.7 * rng.standard_normal((K, d))
    covs = np.array([_example_state(rng, d)[1] * 0.5 for _ in range(K)])
    mix = gp.GaussianMixture(w, means, covs)
    # the field, from its definition on a fine quadrature of each component
    X = rng.standard_normal((4, d))
    Y, logw = [], []
    for k in range(K):
        t, wq = hermegauss(12)
        Z = np.stack([g.ravel() for g in np.meshgrid(t, t, indexing="ij")], axis=1)
        Y.append(means[k] + Z @ np.linalg.cholesky(covs[k]).T)
        logw.append(np.log(w[k]) + np.log(np.outer(wq, wq).ravel() / (2 * np.pi)))
    S = att.scale * np.einsum("nj,xi,ki,kj,n->xn", np.concatenate(Y), X, att.Q, att.K,
                              np.exp(np.concatenate(logw)))
    ref = S @ np.concatenate(Y) @ att.V.T                  # V sum_n w_n s(x, y_n) y_n
    np.testing.assert_allclose(gp.mixture_velocity(att, mix, X), ref, rtol=1e-10, atol=1e-12)
    t_eval = np.linspace(0.0, 0.3, 4)
    sol = gp.solve_mixture(att, mix, (0.0, 0.3), t_eval=t_eval, rtol=1e-11, atol=1e-13)
    mbar = np.einsum("k,tki->ti", w, sol.means)
    second = np.einsum("k,tkij->tij", w, sol.covs + sol.means[..., :, None] * sol.means[..., None, :])
    m0 = w @ means
    cov0 = np.einsum("k,kij->ij", w, covs + means[:, :, None] * means[:, None, :]) - np.outer(m0, m0)
    one = gp.solve(att, m0, cov0, (0.0, 0.3), t_eval=t_eval, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(mbar, one.mean, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(second - mbar[:, :, None] * mbar[:, None, :], one.cov,
                               rtol=1e-8, atol=1e-10)
    # one flow F(t) for all components: F = [alpha_k(t)] [alpha_k(0)]^+ on K = 3 > d means
    F = np.linalg.lstsq(means, sol.means[-1], rcond=None)[0].T
    np.testing.assert_allclose(sol.means[-1], means @ F.T, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(sol.covs[-1], F @ covs @ F.T, rtol=1e-8, atol=1e-10)


def test_multihead_with_a_linear_head(cls, rng):
    d = 2
    lin = cls.example(d, rng)
    soft = gp.Softmax.example(d, rng)
    mh = gp.MultiHead([lin, soft])
    assert mh.field_sees_mean and not soft.field_sees_mean
    mean, cov = _example_state(rng, d)
    dm, dc = gp.moment_rhs(mh, mean, cov)
    parts = [gp.moment_rhs(h, mean, cov) for h in (lin, soft)]
    np.testing.assert_allclose(dm, parts[0][0] + parts[1][0], rtol=1e-13)
    np.testing.assert_allclose(dc, parts[0][1] + parts[1][1], rtol=1e-13)
    np.testing.assert_allclose(mh.field_matrix_with_mean(cov, mean),
                               lin.field_matrix_with_mean(cov, mean) + soft.field_matrix(cov))
    sol = gp.solve(mh, mean, cov, (0.0, 0.2), t_eval=[0.2])
    assert sol.status == gp.Status.FINISHED
    bat = gp.solve_batch(mh, cov[None], (0.0, 0.2), mean0s=mean[None])
    np.testing.assert_allclose(bat.cov_final[0], sol.cov_final, rtol=1e-7)
    np.testing.assert_allclose(bat.mean_final[0], sol.mean_final, rtol=1e-7, atol=1e-10)
    with pytest.raises(ValueError, match="`mean0` is required"):
        gp.solve(mh, None, cov, (0.0, 0.2))


def _field_of(field, d, m):
    """``Z -> Z'`` of a compiled field at the state layout ``d x m``."""
    ws = np.zeros(field.ws_size)

    def f(Z):
        out = np.empty(d * m)
        field.rhs(field.params, d, m, np.ascontiguousarray(Z).ravel(), out, ws)
        return out.reshape(d, m)

    return f


def _jacobian_of(jac, field, Z):
    """The closed-form Jacobian of ``field``'s kernel ``jac`` at ``Z`` (it must hold)."""
    d, m = Z.shape
    J = np.zeros((d * m, d * m))
    assert jac(field.params, d, m, np.ascontiguousarray(Z).ravel(), J, np.zeros(field.ws_size))
    return J


@pytest.mark.parametrize("d", [2, 3, 4, 5, 6])
def test_closed_form_jacobian_against_central_differences(cls, rng, d, uncompiled):
    r"""The compiled field's closed-form Jacobian of :math:`Z' = cVZZ^TK^TQZ`, over the
    whole state (the factor rows depend on the mean: :math:`\partial L'/\partial\alpha
    \neq 0`), against central differences of the compiled field, with the mean's column
    (``m = d + 1``) and without (``m = d``: :math:`P = LL^T`); then the same source run
    as plain Python (the head's parts, the shared assembly) gives the same matrices."""
    k = 1 + d % 3
    att = cls(rng.standard_normal((k, d)), rng.standard_normal((k, d)),
              rng.standard_normal((d, d)) / np.sqrt(d))
    field = att.compiled_field()
    assert field.exact_jacobian and att.exact_jacobian
    states = [rng.standard_normal((d, d)) / 2,
              np.column_stack([rng.standard_normal((d, d)) / 2, rng.standard_normal(d)])]
    compiled = []
    for Z in states:
        J = _jacobian_of(field.jac, field, Z)
        ref = central_jacobian(_field_of(field, d, Z.shape[1]), Z)
        np.testing.assert_allclose(J, ref, rtol=1e-6, atol=1e-7 * np.abs(ref).max())
        compiled.append(J)
    m = d + 1                                    # the mean's columns of the factor rows
    mean_cols = compiled[1].reshape(d, m, d, m)[:, :d, :, d]
    assert np.abs(mean_cols).max() > 1e-3 * np.abs(compiled[1]).max()
    uncompiled()
    _, jac = _python_head(field.heads[0])
    assert not hasattr(field.heads[0].parts, "py_func")
    for Z, J in zip(states, compiled):
        np.testing.assert_allclose(_jacobian_of(jac, field, Z), J, rtol=1e-12,
                                   atol=1e-14 * np.abs(J).max())


def test_closed_form_jacobian_of_a_sum_with_a_linear_head(cls, rng):
    """A linear head summed with a softmax head: every head has a closed form, so the sum
    has one, against central differences over ``[L | mean]``."""
    d = 3
    mh = gp.MultiHead([cls.example(d, rng), gp.Softmax.example(d, rng)])
    field = mh.compiled_field()
    assert field.exact_jacobian and mh.exact_jacobian
    Z = np.column_stack([rng.standard_normal((d, d)) / 2, rng.standard_normal(d)])
    ref = central_jacobian(_field_of(field, d, d + 1), Z)
    np.testing.assert_allclose(_jacobian_of(field.jac, field, Z), ref, rtol=1e-6,
                               atol=1e-7 * np.abs(ref).max())


def test_closure_engine_quadrature_of_the_definition(cls, rng):
    """The closure engine's field from the definition (Gauss-Hermite atoms) is the affine one."""
    d = 2
    att = cls.example(d, rng)
    mean, cov = _example_state(rng, d)
    X = rng.standard_normal((4, d))
    quad = gp.AttentionField(att, n_inner=4)(mean, cov, X)
    np.testing.assert_allclose(quad, att.velocity(mean, cov, X), rtol=1e-10, atol=1e-12)
    clo = gp.solve_closure(att, mean, cov, (0.0, 0.2), t_eval=[0.2])
    ode = gp.solve(att, mean, cov, (0.0, 0.2), t_eval=[0.2])
    np.testing.assert_allclose(clo.cov[-1], ode.cov[-1], rtol=1e-6)
    np.testing.assert_allclose(clo.mean[-1], ode.mean[-1], rtol=1e-6, atol=1e-9)


def _particle_errors(att, mean0, cov0, t1, ns, seeds):
    ode = gp.solve(att, mean0, cov0, (0.0, t1), t_eval=[t1])
    errs = []
    for n in ns:
        e = []
        for seed in range(seeds):
            x0 = gp.sample_gaussian(mean0, cov0, n, seed=seed)
            ps = gp.simulate_particles(att, x0, (0.0, t1), t_eval=[t1])
            e.append(max(np.abs(ps.mean[-1] - ode.mean[-1]).max(),
                         np.abs(ps.cov[-1] - ode.cov[-1]).max()))
        errs.append(np.mean(e))
    return errs


def test_particles_follow_the_moment_equations(cls):
    ex = cls.example_setting()
    att, mean0, cov0 = ex["attention"], ex["mean0"], ex["cov0"]
    (err,) = _particle_errors(att, mean0, cov0, 0.2, [4000], 3)
    # n^-1/2 error bar on moments of order one (a few standard errors)
    assert err < 5.0 * np.sqrt(np.trace(cov0) / 4000)


@pytest.mark.slow
def test_particle_error_shrinks_like_inverse_sqrt_n(cls):
    ex = cls.example_setting()
    errs = _particle_errors(ex["attention"], ex["mean0"], ex["cov0"], 0.2, [500, 8000], 6)
    assert errs[1] < 0.5 * errs[0]          # n^-1/2: a factor 4 expected


def test_cli_sees_it(cls):
    assert NAME in compare_examples() and NAME in default_examples()


def test_the_recipe_two_hand_written_files():
    """docs/adding_an_attention_type.md: the type's registry name appears, as a string, in
    its derivation, its attention module and the generated module only, and the recipe
    names those files."""
    import pathlib

    root = pathlib.Path(gp.__file__).resolve().parents[1]
    sources = list((root / "gaussian_pde").rglob("*.py")) + list((root / "derivations").glob("*.py"))
    pattern = re.compile(r"""(NAME|name) = ["']linear["']|_generated import linear|"linear\"""")
    naming = sorted(str(p.relative_to(root)) for p in sources if pattern.search(p.read_text()))
    assert naming == ["derivations/linear.py", "gaussian_pde/attention/_linear.py"]
    recipe = (root / "docs" / "adding_an_attention_type.md").read_text()
    for path in ("derivations/linear.py", "gaussian_pde/attention/_linear.py",
                 "field_matrix_with_mean", "python derivations/generate.py"):
        assert path in recipe


def test_sweep_spec_runs_with_means_and_blows_up_on_time():
    """examples/sweep_linear.toml: every recorded blow-up time is the Riccati closed form."""
    import pathlib

    from gaussian_pde.sweep import SweepSpec, compute_batch, draw_mean, draw_setting

    root = pathlib.Path(gp.__file__).resolve().parents[1]
    spec = SweepSpec.from_toml(root / "examples" / "sweep_linear.toml")
    assert spec.attention == (NAME,) and spec.initial.mean_std > 0
    attention, d, lo, hi = spec.task(0)
    res = compute_batch(spec, 0)
    seen = 0
    for row, draw in enumerate(range(lo, hi)):
        att, cov0 = draw_setting(spec, attention, d, draw)
        mean0 = draw_mean(spec, att, d, draw)
        assert mean0 is not None and np.abs(mean0).max() > 0
        P0 = cov0 + np.outer(mean0, mean0)
        R = _psd_sqrt(P0)
        lam = np.linalg.eigvalsh(R @ (att.A + att.A.T) @ R).max()
        status = res["status"][row]
        if lam > 0 and 1.0 / lam < 0.9 * spec.solver.horizon:
            assert status == list(gp.Status).index(gp.Status.BLOWUP)
            assert abs(res["t_blowup"][row] - 1.0 / lam) < 1e-3 / lam
            seen += 1
    assert seen >= 3
    # the other types' settings do not change with the mean's spread: no mean drawn
    assert draw_mean(spec, gp.Softmax(att.Q, att.K, att.V), d, 0) is None


_SLOW_CHECK = "direct integration, d = 2"


def _derivation():
    from derivations import linear

    return linear


@pytest.mark.parametrize("check", [c for c in _derivation().CHECKS if c != _SLOW_CHECK])
def test_derivation_checks(check):
    """The SymPy checks of derivations/linear.py (direct integration in d = 1 included)."""
    assert _derivation().CHECKS[check]()


@pytest.mark.slow
def test_derivation_direct_integration_2d():
    assert _derivation().CHECKS[_SLOW_CHECK]()


def test_derivation_checks_can_fail(monkeypatch):
    """A wrong field (M doubled, or the mean's outer product dropped) fails the checks."""
    import sympy as sp

    lin = _derivation()
    S = lin.S
    right = lin.derive()
    monkeypatch.setattr(lin, "derive", lambda: S.AffineField(
        M=2 * right.M, b=right.b, tilted_mean=right.tilted_mean, parts=right.parts))
    assert not lin.check_1d()
    dropped = sp.expand(S.V * S.Sigma * right.parts.A).doit()
    monkeypatch.setattr(lin, "derive", lambda: S.AffineField(
        M=dropped, b=right.b, tilted_mean=right.tilted_mean, parts=right.parts))
    assert not lin.check_1d()
    assert not lin.check_second_moment_riccati()
