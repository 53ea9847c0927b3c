r"""Checks that an attention type offers what its capability attributes claim.

Shared by ``tests/attention/test_capabilities.py`` (every registered type) and by
``tests/test_derivations.py`` (a user-defined type registered on the fly), so a new type
passes exactly the checks the built-in ones pass. Each check takes an instance (usually
``cls.example(d, rng)``):

* :func:`check_declared`: the attributes exist with well-formed values;
* :func:`check_moments`: Gaussian-preserving types give a finite ``moment_rhs``,
  consistent with ``cov_rhs``, ``factor_rhs`` and the event loop's field (a type whose field
  matrix depends on the mean, ``field_sees_mean``: with ``field_matrix_with_mean``, and
  the mean-free hooks and solvers refuse), that matches a particle estimate;
  the others refuse it with a clear ``TypeError``;
* :func:`check_jacobian`: the factor field is analytic (the complex-step Jacobian
  equals central differences), and the closed-form Jacobian that ``gp.solve`` hands its
  stiff solver (the compiled field's) exists exactly for ``exact_jacobian`` types and
  is right;
* :func:`check_closure`: non-Gaussian-preserving types work with the closure they declare
  (and it matches the particle estimate at the initial Gaussian);
* :func:`check_particles`: the particle kernel gives finite velocities of shape (n, d).

The particle estimate of the moment equations at :math:`\mathcal N(\alpha,\Sigma)`:
tokens :math:`x_i = \alpha + L\Phi^{-1}(u_i)` from a scrambled Sobol sequence ``u`` (a
quasi-Monte Carlo sample, error close to :math:`1/n` rather than :math:`n^{-1/2}`), then
:math:`\alpha' \approx \bar v`, :math:`\Sigma' \approx C + C^T` with
:math:`C = \frac1n\sum_i (x_i - \bar x)v_i^T`. At ``n = 1024``, ``d = 2`` it agrees with
the exact right-hand sides to below 1% of their size (3% for masked attention, whose
early tokens see short prefixes); the tolerance is 5% (15% masked).
"""

import numpy as np
import pytest
from scipy.special import ndtri
from scipy.stats import qmc

import gaussian_pde as gp
from gaussian_pde.attention._base import CLOSURES
from gaussian_pde.attention._kernels import ParticleDiagnostics, make_options
from gaussian_pde.attention._registry import _check_capabilities
from gaussian_pde.closure._masked import masked_closure_rhs

#: tokens of the quasi-Monte Carlo particle estimate (a power of two for Sobol)
N_PARTICLES = 1024
#: relative tolerance of the particle estimate (masked: short causal prefixes)
PARTICLE_RTOL = {None: 5e-2, "quadrature": 5e-2, "block_causal": 0.15}


def gaussian_state(d, rng):
    """A mean and a well-conditioned covariance of order one, with a Cholesky factor."""
    mean = 0.5 * rng.standard_normal(d)
    G = rng.standard_normal((d, d))
    cov = 0.5 * (G @ G.T / d + 0.5 * np.eye(d))
    return mean, cov, np.linalg.cholesky(cov)


def qmc_tokens(mean, L, n=N_PARTICLES, seed=0):
    """Low-discrepancy sample of N(mean, L L^T), shape (n, d)."""
    z = ndtri(qmc.Sobol(L.shape[0], scramble=True, seed=seed).random(n))
    return mean + z @ L.T


def particle_moment_rhs(att, mean, L):
    """Particle estimate of (alpha', Sigma') at N(mean, L L^T) (see the module docstring)."""
    x = qmc_tokens(mean, L)
    v, _ = att.particle_velocity(x)
    C = (x - x.mean(axis=0)).T @ v / x.shape[0]
    return v.mean(axis=0), C + C.T


def assert_close_rel(actual, expected, rtol, what):
    """``actual`` equals ``expected`` to ``rtol`` times the largest entry of ``expected``."""
    scale = max(np.abs(expected).max(), 1e-12)
    err = np.abs(np.asarray(actual) - expected).max() / scale
    assert err <= rtol, f"{what}: relative error {err:.3g} > {rtol:g}"


def check_declared(att):
    """The capability attributes exist, are well formed, and the instance agrees with its class."""
    cls = type(att)
    _check_capabilities(cls)                       # what register_attention checks
    for attr in ("gaussian_preserving", "exact_jacobian", "uses_positions"):
        assert isinstance(getattr(att, attr), bool), attr
    assert att.closure is None or att.closure in CLOSURES
    assert att.gaussian_preserving == cls.gaussian_preserving
    assert att.closure == cls.closure
    # the class value holds for every instance (MultiHead: instances may have more)
    if cls.exact_jacobian:
        assert att.exact_jacobian
    if att.exact_jacobian:
        assert att.gaussian_preserving
    assert (att.closure is None) or not att.gaussian_preserving
    assert att.d >= 1


def check_moments(att, rng):
    """Exact moment equations (Gaussian-preserving), or a clear refusal."""
    d = att.d
    mean, cov, L = gaussian_state(d, rng)
    if not att.gaussian_preserving:
        with pytest.raises(TypeError, match="does not preserve Gaussians"):
            gp.moment_rhs(att, mean, cov)
        with pytest.raises(TypeError, match="does not preserve Gaussians"):
            att.moment_rhs(mean, cov)
        with pytest.raises(TypeError, match="does not preserve Gaussians"):
            gp.solve(att, mean, cov, (0.0, 1.0))
        return
    dm, dc = gp.moment_rhs(att, mean, cov)
    assert dm.shape == (d,) and dc.shape == (d, d)
    assert np.all(np.isfinite(dm)) and np.all(np.isfinite(dc))
    np.testing.assert_allclose(dc, dc.T, rtol=0, atol=1e-13 * np.abs(dc).max())
    # the hooks agree with each other: affine field, covariance-only and factor forms
    M, b = att.field_matrix_with_mean(cov, mean), att.field_offset(mean, cov)
    tol = dict(rtol=1e-10, atol=1e-12 * max(np.abs(dc).max(), 1.0))
    np.testing.assert_allclose(dm, b + M @ mean, **tol)
    np.testing.assert_allclose(dc, M @ cov + cov @ M.T, **tol)
    Z = np.hstack([L, mean[:, None]])
    dZ = _event_loop_field(att, True)(Z)
    np.testing.assert_allclose(dZ[:, d], dm, **tol)
    np.testing.assert_allclose(dZ[:, :d] @ L.T + L @ dZ[:, :d].T, dc, **tol)
    if att.field_sees_mean:
        # the field matrix depends on the mean: the mean-free hooks refuse, and so do
        # the solvers without a mean
        for call in (lambda: att.field_matrix(cov), lambda: att.cov_rhs(cov),
                     lambda: att.factor_rhs(L), lambda: _event_loop_field(att, False)(L)):
            with pytest.raises(TypeError, match="depends on the mean"):
                call()
        with pytest.raises(ValueError, match="`mean0` is required"):
            gp.solve(att, None, cov, (0.0, 1.0))
        with pytest.raises(ValueError, match="`mean0s` is required"):
            gp.solve_batch(att, cov[None], (0.0, 1.0))
    else:
        np.testing.assert_allclose(M, att.field_matrix(cov), **tol)
        np.testing.assert_allclose(att.cov_rhs(cov), dc, **tol)
        dL = att.factor_rhs(L)
        np.testing.assert_allclose(dL @ L.T + L @ dL.T, dc, **tol)
        np.testing.assert_allclose(_event_loop_field(att, False)(L), dL, **tol)
    # a declared mean generator N: alpha' = N alpha at any covariance (two of them here)
    N = att.mean_generator()
    if N is not None:
        assert N.shape == (d, d) and np.all(np.isfinite(N))
        _, cov2, _ = gaussian_state(d, rng)
        for c in (cov, 3.0 * cov2):
            np.testing.assert_allclose(gp.moment_rhs(att, mean, c)[0], N @ mean, **tol)
    # ... and match the particle system at the Gaussian
    pm, pc = particle_moment_rhs(att, mean, L)
    assert_close_rel(pm, dm, PARTICLE_RTOL[None], f"{att.name}: dmean vs particles")
    assert_close_rel(pc, dc, PARTICLE_RTOL[None], f"{att.name}: dcov vs particles")


def _fd_jacobian(f, L, rel=1e-6):
    """Central-difference Jacobian of ``L -> f(L)``, ``J[:, a*d + b] = dF/dL_ab``."""
    d = L.shape[0]
    J = np.empty((d * d, d * d))
    h = rel * max(np.abs(L).max(), 1.0)
    for a in range(d):
        for b in range(d):
            E = np.zeros((d, d))
            E[a, b] = h
            J[:, a * d + b] = ((f(L + E) - f(L - E)) / (2 * h)).ravel()
    return J


def _complex_step_jacobian(f, L, h=1e-30):
    """Complex-step Jacobian: exact to rounding when ``f`` is analytic in ``L``."""
    d = L.shape[0]
    J = np.empty((d * d, d * d))
    for a in range(d):
        for b in range(d):
            E = np.zeros((d, d), dtype=complex)
            E[a, b] = 1j * h
            J[:, a * d + b] = (np.imag(f(L + E)) / h).ravel()
    return J


def _event_loop_field(att, with_mean):
    """``Z -> Z'``: the right-hand side of ``gp.solve``'s event loop (a new array per call)."""
    from gaussian_pde.integrate._moment_field import state_field

    return state_field(att, with_mean)


def _integrator_jacobian(att, L):
    """``(analytic_flag, J or None)``: the exact Jacobian that ``gp.solve`` hands its stiff
    solver (:func:`gaussian_pde.integrate._moment_field.moment_jacobian`, None without one)."""
    from gaussian_pde.integrate._moment_field import moment_jacobian

    jac = moment_jacobian(att, False)
    if jac is None:
        return False, None
    d = L.shape[0]
    return True, jac(0.0, L.ravel()).reshape(d * d, d * d)


def check_jacobian(att, rng):
    """``exact_jacobian``: the factor field is analytic and the integrator's Jacobian is exact."""
    if not att.gaussian_preserving:
        assert not att.exact_jacobian
        return
    d = att.d
    mean, _, L = gaussian_state(d, rng)
    if att.field_sees_mean:
        # no covariance-only field to differentiate: the whole state [L | mean]
        from gaussian_pde._common.differences import central_jacobian
        from gaussian_pde.integrate._moment_field import moment_jacobian

        Z = np.column_stack([L, mean])
        J_fd = central_jacobian(_event_loop_field(att, True), Z)
        assert np.all(np.isfinite(J_fd))
        jac = moment_jacobian(att, True)
        assert (jac is not None) == att.exact_jacobian, att.name
        if jac is not None:
            np.testing.assert_allclose(jac(0.0, Z.ravel()), J_fd, rtol=0,
                                       atol=1e-7 * np.abs(J_fd).max(), err_msg=att.name)
        return
    kernel = att.factor_rhs
    J_fd = _fd_jacobian(kernel, L)
    assert np.all(np.isfinite(J_fd))
    flag, J_int = _integrator_jacobian(att, L)
    # the integrator uses a closed form exactly for the types that declare one
    assert flag == att.exact_jacobian, (att.name, flag, att.exact_jacobian)
    if not att.exact_jacobian:
        return
    scale = np.abs(J_fd).max()
    J_cs = _complex_step_jacobian(kernel, L)
    np.testing.assert_allclose(J_cs, J_fd, rtol=0, atol=1e-7 * scale)
    if J_int is not None:
        np.testing.assert_allclose(J_int, J_cs, rtol=0, atol=1e-11 * scale)


def check_closure(att, rng):
    """A non-Gaussian-preserving type works with the closure it declares."""
    if att.gaussian_preserving:
        assert att.closure is None
        return
    d = att.d
    mean, cov, L = gaussian_state(d, rng)
    t_eval = [0.0, 0.1, 0.2]
    if att.closure == "quadrature":
        dm, dc = gp.closure_moment_rhs(att, mean, cov)
        sol = gp.solve_closure(att, mean, cov, (0.0, 0.2), t_eval=t_eval)
        assert sol.status == "finished", sol.message
        assert np.all(np.isfinite(sol.cov))
        depth = gp.propagate_gaussian(gp.Stack(att, n_layers=2, h=0.1), mean, cov)
    elif att.closure == "block_causal":
        assert att.uses_positions
        # one position block: the closure of the whole sequence at the initial Gaussian
        dmb, dLb = masked_closure_rhs(att, mean[None], L[None])
        dm, dc = dmb[0], dLb[0] @ L.T + L @ dLb[0].T
        means0 = np.stack([mean, -mean])           # position-dependent data, two blocks
        sol = gp.solve_masked_closure(att, means0, cov, (0.0, 0.2), t_eval=t_eval)
        assert sol.status == "finished", sol.message
        assert np.all(np.isfinite(sol.covs)) and sol.covs.shape == (3, 2, d, d)
        depth = gp.propagate_gaussian(gp.Stack(att, n_layers=2, h=0.1), means0, cov,
                                      n_blocks=2)
    else:
        # particles only: the closure engine refuses it by its declaration
        assert att.closure is None
        with pytest.raises(TypeError, match="no Gaussian closure"):
            gp.AttentionField(att)
        return
    assert depth.status == "finished", depth.message
    assert np.all(np.isfinite(depth.cov)) and not np.any(depth.exact)
    assert np.all(np.isfinite(dm)) and np.all(np.isfinite(dc))
    rtol = PARTICLE_RTOL[att.closure]
    pm, pc = particle_moment_rhs(att, mean, L)
    assert_close_rel(pm, dm, rtol, f"{att.name}: closure dmean vs particles")
    assert_close_rel(pc, dc, rtol, f"{att.name}: closure dcov vs particles")


def check_particles(att, rng, n=50):
    """The particle kernel: velocities of shape (n, d), finite, with diagnostics."""
    d = att.d
    x = rng.standard_normal((n, d))
    v, diag = att.particle_velocity(x, chunk_size=16, want_ess=True)
    assert v.shape == (n, d) and v.dtype == np.float64
    assert np.all(np.isfinite(v))
    assert isinstance(diag, ParticleDiagnostics)
    assert diag.ess.shape == (n,) and np.all(diag.ess > 0)
    # the unchecked hook is what the public entry calls
    v2, _ = att.particle_kernel(x, make_options(n, chunk_size=16))
    np.testing.assert_allclose(v2, v, rtol=1e-10, atol=1e-12 * np.abs(v).max())
    if att.uses_positions:
        vp, _ = att.particle_velocity(x, positions=rng.uniform(size=n))
        assert vp.shape == (n, d) and np.all(np.isfinite(vp))


def check_all(cls, rng, d=2):
    """Every check on ``cls.example(d, rng)``."""
    att = cls.example(d, rng)
    assert type(att) is cls and att.d == d
    check_declared(att)
    check_moments(att, rng)
    check_jacobian(att, rng)
    check_closure(att, rng)
    check_particles(att, rng)
